//! What a tick does, decided before anything is done: pure functions from the plan, the
//! workload the runtime reported and the pool's memory to this tick's actions. The driver
//! only carries them out, so every rule of the loop is tested here without fake ports.
//!
//! Two decisions need an answer the tick gets while acting, and are pure functions of it:
//! whether the victims may be removed (their drain answers: [`removal_due`]) and whether the
//! policy push is due (the registry merged from the engines' reports: [`push_due`]).
//!
//! Invariants (the driver's, see its header):
//! - A scale-down removes only victims that reported Drained or whose grace ran out; until
//!   then nothing is applied but the spec (see `reapply_at`).
//! - Victims are chosen once and kept until removed; a victim that left is forgotten.
//! - A drain is asked once (Start), then only polled.
//! - The workload is re-applied when the pool's generation changed and this tick applies
//!   nothing else, so a spec change that keeps the count still rolls out.

use std::collections::BTreeMap;

use tidegate_api::engine_admin::{
    AdmissionPush, AdmittedTenants, ApiKeyEntry, DrainState, EnginePolicy,
};
use tidegate_api::{InferencePoolSpec, TierPolicySpec};

use crate::plan::{AdmissionPlan, Millis};
use crate::ports::{Endpoint, WorkloadState};
use crate::registry::Registry;

/// Longest time between two pushes of the same policy to an engine.
pub const PUSH_EVERY_MS: Millis = 30_000;

/// What the driver remembers of its own actions on a pool between ticks (the planner's
/// memory is `PlanState`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ActionMemory {
    /// Replica name → when its drain started.
    pub draining: BTreeMap<String, Millis>,
    /// The policy last pushed to every ready engine, and when.
    pub last_push: Option<(EnginePolicy, Millis)>,
    /// Generation whose spec the workload was last applied with.
    pub applied_generation: Option<i64>,
}

/// What `decide` looks at.
#[derive(Clone, Copy, Debug)]
pub struct DecideInput<'a> {
    pub spec: &'a InferencePoolSpec,
    /// The replicas the plan wants run (`Plan::replicas`).
    pub target: i32,
    pub workload: &'a WorkloadState,
    pub memory: &'a ActionMemory,
    pub generation: Option<i64>,
    pub now: Millis,
}

/// The drain call a victim gets this tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainCall {
    /// Ask it to drain (it was chosen this tick).
    Start,
    /// Ask how its drain goes.
    Poll,
}

/// A replica chosen for removal.
#[derive(Clone, Debug, PartialEq)]
pub struct Victim {
    pub endpoint: Endpoint,
    pub call: DrainCall,
    /// Its drain grace period ran out: it is removed whatever it answers.
    pub expired: bool,
}

/// How a victim answered its drain call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainAnswer {
    Answered(DrainState),
    /// The admin call failed (logged by the driver).
    Failed,
}

impl Victim {
    /// Whether this victim is done draining, from its answer. A failed Start is not done
    /// (it is removed after its grace period); a failed Poll of an engine that is no longer
    /// ready is: it stopped answering because it drained and left.
    pub fn done(&self, answer: DrainAnswer) -> bool {
        match (answer, self.call) {
            (DrainAnswer::Answered(state), _) => state == DrainState::Drained,
            (DrainAnswer::Failed, DrainCall::Start) => false,
            (DrainAnswer::Failed, DrainCall::Poll) => !self.endpoint.ready,
        }
    }
}

/// What happens to the replica count this tick.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplicaAction {
    /// Nothing to change.
    Hold,
    /// Run this many replicas (scale up, or the workload's first apply).
    Apply { replicas: i32 },
    /// Scale down to `to`, removing `victims`, once [`removal_due`] says so.
    RemoveWhenDrained { to: i32, victims: Vec<Victim> },
}

/// Drains that ended without a removal this tick: the scale-down was called off, or it
/// completed because the drained replicas left by themselves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndedDrains {
    pub names: Vec<String>,
    /// The count the pool runs now.
    pub to: i32,
    /// Some of them still run (a started drain cannot be undone: they leave when done).
    pub still_running: bool,
}

/// This tick's replica actions.
#[derive(Clone, Debug, PartialEq)]
pub struct Actions {
    pub replicas: ReplicaAction,
    /// The drain book once the drain calls are made; the driver clears it on removal.
    pub draining: BTreeMap<String, Millis>,
    pub ended_drains: Option<EndedDrains>,
    /// The pool's spec changed since the workload was applied: apply it at this count if
    /// `replicas` applies nothing this tick.
    pub reapply_at: Option<i32>,
}

/// Decides this tick's replica actions. Replicas being drained are leaving: the plan counts
/// them as gone already, and the count applied on removal is the plan's.
pub fn decide(input: &DecideInput<'_>) -> Actions {
    let workload = input.workload;
    let current = workload.replicas.unwrap_or(0);
    let target = input.target;
    let reapply_at = workload
        .replicas
        .filter(|_| input.memory.applied_generation != input.generation);
    if target < current {
        let (victims, draining) = choose_victims(input, (current - target) as usize);
        return Actions {
            replicas: ReplicaAction::RemoveWhenDrained {
                to: target,
                victims,
            },
            draining,
            ended_drains: None,
            reapply_at,
        };
    }
    let ended_drains = (!input.memory.draining.is_empty()).then(|| EndedDrains {
        names: input.memory.draining.keys().cloned().collect(),
        to: target,
        still_running: workload
            .endpoints
            .iter()
            .any(|e| input.memory.draining.contains_key(&e.name)),
    });
    let replicas = if target != current || workload.replicas.is_none() {
        ReplicaAction::Apply { replicas: target }
    } else {
        ReplicaAction::Hold
    };
    Actions {
        replicas,
        draining: BTreeMap::new(),
        ended_drains,
        reapply_at,
    }
}

/// The victims of a scale-down by `wanted` replicas, and the drain book with them in it.
/// Victims are chosen once and kept until removed, so a drain is never abandoned half-way
/// because readiness changed (a draining engine stops being ready). A victim that is gone
/// already (it crashed, or was removed) is forgotten.
fn choose_victims(
    input: &DecideInput<'_>,
    wanted: usize,
) -> (Vec<Victim>, BTreeMap<String, Millis>) {
    let endpoints = &input.workload.endpoints;
    let mut draining = input.memory.draining.clone();
    draining.retain(|name, _| endpoints.iter().any(|e| &e.name == name));
    let mut chosen: Vec<Endpoint> = endpoints
        .iter()
        .filter(|e| draining.contains_key(&e.name))
        .cloned()
        .collect();
    if chosen.is_empty() {
        chosen = pick_victims(endpoints, wanted);
    }
    chosen.truncate(wanted);
    let grace_ms = input.spec.engine.drain_grace_period.as_std().as_millis() as u64;
    let victims = chosen
        .into_iter()
        .map(|endpoint| {
            let (call, started) = match draining.get(&endpoint.name) {
                Some(started) => (DrainCall::Poll, *started),
                None => (DrainCall::Start, input.now),
            };
            draining.insert(endpoint.name.clone(), started);
            Victim {
                endpoint,
                call,
                expired: input.now.saturating_sub(started) >= grace_ms,
            }
        })
        .collect();
    (victims, draining)
}

/// Replicas to remove on a scale-down: not-ready ones first, then the newest names.
pub fn pick_victims(endpoints: &[Endpoint], n: usize) -> Vec<Endpoint> {
    let mut eps: Vec<&Endpoint> = endpoints.iter().collect();
    eps.sort_by(|a, b| a.ready.cmp(&b.ready).then_with(|| b.name.cmp(&a.name)));
    eps.into_iter().take(n).cloned().collect()
}

/// Whether the victims may be removed now: every one drained or ran out of grace.
/// `answers` are the victims' drain answers, in order.
pub fn removal_due(victims: &[Victim], answers: &[DrainAnswer]) -> bool {
    victims.len() == answers.len()
        && victims
            .iter()
            .zip(answers)
            .all(|(v, a)| v.expired || v.done(*a))
}

/// The ready engines and every router to ask for newly admitted tenants, each with the
/// watermark of its last answer (its own clock). Routers are asked first-hand: a tenant is
/// existing from the moment a router accepted its request into the pool, which may be long
/// before an engine admits it (it waits in the router's queue), so the registry pushed with a
/// pause already holds it. A router is asked whether or not it is ready yet (its admin API
/// answers from its start); one that does not answer is logged and asked again next tick.
pub fn collect_from(workload: &WorkloadState, registry: &Registry) -> Vec<(Endpoint, u64)> {
    let engines = workload.endpoints.iter().filter(|e| e.ready);
    engines
        .chain(&workload.routers)
        .map(|e| {
            let since = registry.watermarks.get(&e.name).copied().unwrap_or(0);
            (e.clone(), since)
        })
        .collect()
}

/// What merging the engines' reports did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// Engine name → tenants new to the registry from it (only engines that added some).
    pub added: Vec<(String, usize)>,
    /// The tenants changed (added, re-seen, pruned): saved before the tick succeeds.
    pub changed: bool,
    /// Only the engines' watermarks moved (they move on every answer): saved now and then
    /// (`registry_save_due`).
    pub watermarks_moved: bool,
}

/// How long watermark-only changes may wait to be saved. A restarted operator that reads
/// older watermarks asks engines for tenants since then and merges the ones it knew again,
/// which changes nothing; saving them on every tick would be a write per pool per interval.
pub const WATERMARK_SAVE_MS: Millis = 300_000;

/// Whether this tick saves the registry: at once when tenants changed; when only watermarks
/// moved, once `WATERMARK_SAVE_MS` passed since the last save (or none since this operator
/// started).
pub fn registry_save_due(merged: &Merged, saved_at: Option<Millis>, now: Millis) -> bool {
    merged.changed
        || (merged.watermarks_moved
            && saved_at.is_none_or(|at| now.saturating_sub(at) >= WATERMARK_SAVE_MS))
}

/// Merges what engines and routers reported, forgets tenants not seen within the pool's
/// tenant memory and the watermarks of engines and routers that are gone.
pub fn merge_reports(
    registry: &mut Registry,
    reports: &[(String, AdmittedTenants)],
    workload: &WorkloadState,
    spec: &InferencePoolSpec,
    now: Millis,
) -> Merged {
    let before = registry.clone();
    let mut added = Vec::new();
    for (engine, report) in reports {
        let n = registry.merge(engine, report);
        if n > 0 {
            added.push((engine.clone(), n));
        }
    }
    let window = spec.admission.tenant_memory.as_std().as_millis() as u64;
    registry.prune(now, window);
    let live =
        |name: &str| (workload.endpoints.iter().chain(&workload.routers)).any(|e| e.name == name);
    registry.watermarks.retain(|name, _| live(name));
    Merged {
        added,
        changed: registry.tenants != before.tenants,
        watermarks_moved: registry.watermarks != before.watermarks,
    }
}

/// The policy every engine of the pool gets: tiers, API keys, admission and the registry.
pub fn policy_for(
    spec: &InferencePoolSpec,
    tiers: Option<&TierPolicySpec>,
    api_keys: &[ApiKeyEntry],
    admission: &AdmissionPlan,
    registry: &Registry,
) -> EnginePolicy {
    EnginePolicy {
        tier_policy: tiers.cloned(),
        api_keys: api_keys.to_vec(),
        admission: AdmissionPush {
            state: admission.state,
            paused_tiers: admission.paused_tiers.clone(),
            retry_after_seconds: spec.admission.retry_after.as_std().as_secs().max(1),
            reason: admission.reason.clone(),
        },
        admitted_tenants: registry.tenant_ids(),
    }
}

/// Whether `policy` must be pushed now: it changed, or the last push is `PUSH_EVERY_MS` old
/// (a restarted engine catches up), or it was never pushed.
pub fn push_due(last: Option<&(EnginePolicy, Millis)>, policy: &EnginePolicy, now: Millis) -> bool {
    match last {
        Some((pushed, at)) => pushed != policy || now.saturating_sub(*at) >= PUSH_EVERY_MS,
        None => true,
    }
}

/// Where this tick's policy push goes: every ready engine and router when the push is due,
/// and in any case every router that answered the endpoint push without a policy (it just
/// started and stays not ready until it has one, so readiness cannot be what picks it).
pub fn policy_targets<'w>(
    workload: &'w WorkloadState,
    due: bool,
    without_policy: &[String],
) -> Vec<&'w Endpoint> {
    let engines = workload.endpoints.iter().filter(|e| due && e.ready);
    let routers = workload
        .routers
        .iter()
        .filter(|r| (due && r.ready) || without_policy.contains(&r.name));
    engines.chain(routers).collect()
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;

/// The engine set a router gets: every replica the runtime runs, accepting unless it is
/// being drained (the router probes readiness itself), and the count of ready routers, each
/// of which enforces 1/R of every tenant's limits: the routers that take traffic now, not
/// the spec's count, so a router that died leaves its share to the others at this push.
/// With no router ready the count is left out and each keeps its share.
pub fn router_endpoints(
    workload: &WorkloadState,
    draining: impl Fn(&str) -> bool,
) -> tidegate_api::router::RouterEndpoints {
    let ready = workload.routers.iter().filter(|r| r.ready).count();
    tidegate_api::router::RouterEndpoints {
        ready_routers: u32::try_from(ready).ok().filter(|&r| r > 0),
        endpoints: workload
            .endpoints
            .iter()
            .map(|e| tidegate_api::router::RouterEndpoint {
                name: e.name.clone(),
                url: e.api_url.clone(),
                accepting: !draining(&e.name),
            })
            .collect(),
    }
}
