//! The per-pool control loop step, over the ports: observe → plan → decide → execute →
//! report. The same code runs under the Kubernetes controller and in local mode. What to do
//! is decided by the pure functions of [`decide`]; this file only observes and carries out.
//!
//! Invariants:
//! - A replica is removed only after it was asked to drain and reported Drained, or its
//!   drain grace period ran out; until then the pool keeps its current count.
//! - Victims of a scale-down are chosen once and kept until removed.
//! - Engines get the tier policy, admission state and tenant registry whenever it changes
//!   and at least every `PUSH_EVERY_MS`, so a restarted engine catches up within that time;
//!   a router that answers the endpoint push without a policy (it just started, and is not
//!   ready until it has one) gets it the same tick.
//! - Routers get the engine set and the count of ready routers every tick (each enforces
//!   1/R of the rate limits), and are asked every tick for the tenants they accepted.
//! - The registry is saved whenever it changed, before the tick reports success.
//! - A failing engine admin call is logged and retried next tick; it never fails the tick.
//! - A spec change that keeps the replica count still reaches the workload: the driver
//!   re-applies the spec once per generation (and once after an operator restart).
//! - Ticks of different pools run concurrently; ticks of one pool run one at a time (each
//!   pool's memory has its own lock), so a slow pool never holds up the others.

pub mod decide;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Mutex as AsyncMutex;

use futures::future::join_all;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tidegate_api::conditions::{status as cstatus, types};
use tidegate_api::engine_admin::{ApiKeyEntry, EnginePolicy};
use tidegate_api::status::InferencePoolStatus;
use tidegate_api::{InferencePoolSpec, TierPolicySpec};
use tracing::{info, warn};

use crate::plan::{
    self, AdmissionMachine, Forecaster, LeadTime, Line, Millis, Observation, Plan, PlanState,
    PodModel,
};
use crate::ports::{
    EngineControl, MetricsSource, PoolRef, RegistryStore, RuntimeError, WorkloadRuntime,
    WorkloadState,
};
use crate::registry::Registry;
use crate::status_build;

pub use decide::PUSH_EVERY_MS;
use decide::{ActionMemory, Actions, DecideInput, DrainAnswer, DrainCall, ReplicaAction, Victim};

/// One tick's input: the pool as the API server (or the manifest) has it now.
#[derive(Clone, Copy, Debug)]
pub struct TickInput<'a> {
    pub pool: &'a PoolRef,
    pub spec: &'a InferencePoolSpec,
    pub tiers: Option<&'a TierPolicySpec>,
    pub api_keys: &'a [ApiKeyEntry],
    /// The status the previous tick (or an earlier operator) wrote.
    pub previous: Option<&'a InferencePoolStatus>,
    /// The pool's metadata.generation.
    pub generation: Option<i64>,
    pub now: Millis,
}

/// What one tick decided and reports.
#[derive(Clone, Debug)]
pub struct TickOutcome {
    pub plan: Plan,
    pub status: InferencePoolStatus,
    pub workload: WorkloadState,
    /// Replicas being drained before removal.
    pub draining: Vec<String>,
    pub registry_size: usize,
    /// The spec was re-applied at the current count (its generation changed, or this
    /// operator had not applied it yet).
    pub reapplied: bool,
}

/// Errors that fail a tick (the caller retries with backoff).
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("workload runtime: {0}")]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Registry(#[from] crate::ports::RegistryError),
}

impl DriverError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            DriverError::Runtime(_) => "runtime",
            DriverError::Registry(_) => "registry",
        }
    }
}

/// Memory of one pool between ticks.
#[derive(Default)]
struct PoolMemory {
    plan: PlanState,
    registry: Option<Registry>,
    /// When this operator last saved the registry.
    registry_saved_at: Option<Millis>,
    actions: ActionMemory,
}

/// The control loop step for many pools.
pub struct Driver<W, M, E, R> {
    pub runtime: W,
    pub metrics: M,
    pub control: E,
    pub registry: R,
    pools: Mutex<HashMap<PoolRef, Arc<AsyncMutex<PoolMemory>>>>,
}

impl<W: WorkloadRuntime, M: MetricsSource, E: EngineControl, R: RegistryStore> Driver<W, M, E, R> {
    pub fn new(runtime: W, metrics: M, control: E, registry: R) -> Self {
        Driver {
            runtime,
            metrics,
            control,
            registry,
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets a deleted pool.
    pub fn forget(&self, pool: &PoolRef) {
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(pool);
    }

    /// The memory of one pool (created from the status an earlier operator wrote).
    fn memory(
        &self,
        pool: &PoolRef,
        previous: Option<&InferencePoolStatus>,
    ) -> Arc<AsyncMutex<PoolMemory>> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .entry(pool.clone())
            .or_insert_with(|| {
                Arc::new(AsyncMutex::new(PoolMemory {
                    plan: restore_plan_state(previous),
                    ..PoolMemory::default()
                }))
            })
            .clone()
    }

    /// One tick for one pool: observe → plan → decide → execute → report.
    pub async fn tick(&self, input: &TickInput<'_>) -> Result<TickOutcome, DriverError> {
        let TickInput {
            pool, spec, now, ..
        } = *input;
        let slot = self.memory(pool, input.previous);
        let mut guard = slot.lock().await;
        let mem = &mut *guard;

        let workload = self.runtime.observe(pool).await?;
        let token = self.runtime.admin_token(pool).await.unwrap_or_default();
        let at_routers = self
            .push_endpoints(pool, &workload, &token, &mem.actions.draining)
            .await;
        let metrics = self
            .metrics
            .read(pool, spec, &workload.endpoints, now)
            .await;
        let obs = Observation {
            now,
            current_replicas: workload.replicas.unwrap_or(0),
            ready_replicas: workload.ready_replicas,
            metrics,
            held_requests: at_routers.held,
            router_queued: at_routers.queued,
        };
        let plan = plan::plan(spec, input.tiers, &obs, &mut mem.plan);
        info!(pool = %pool, decision = %plan.explanation, "plan");

        let actions = decide::decide(&DecideInput {
            spec,
            target: plan.replicas,
            workload: &workload,
            memory: &mem.actions,
            generation: input.generation,
            now,
        });
        let drains_before: Vec<String> = mem.actions.draining.keys().cloned().collect();
        let reapplied = self
            .execute_replicas(input, &token, actions, &mut mem.actions)
            .await?;
        if mem
            .actions
            .draining
            .keys()
            .any(|k| !drains_before.contains(k))
        {
            // Routers stop sending to a replica the moment its drain starts.
            self.push_endpoints(pool, &workload, &token, &mem.actions.draining)
                .await;
        }
        let registry = self
            .execute_registry(
                input,
                &workload,
                &token,
                &mut mem.registry,
                &mut mem.registry_saved_at,
            )
            .await?;
        let policy =
            decide::policy_for(spec, input.tiers, input.api_keys, &plan.admission, registry);
        let due = decide::push_due(mem.actions.last_push.as_ref(), &policy, now);
        let targets = decide::policy_targets(&workload, due, &at_routers.without_policy);
        if self.push_policy(pool, &targets, &token, &policy).await && due {
            mem.actions.last_push = Some((policy, now));
        }

        let status = status_build::build(
            input.previous,
            &plan,
            &workload,
            input.generation,
            now,
            mem.plan.last_scale_time,
        );
        Ok(TickOutcome {
            plan,
            status,
            draining: mem.actions.draining.keys().cloned().collect(),
            registry_size: registry.len(),
            workload,
            reapplied,
        })
    }

    /// Carries out the replica actions: drain calls, then the removal once due, or the
    /// scale-up; the spec is re-applied when nothing else was. Returns whether it was.
    async fn execute_replicas(
        &self,
        input: &TickInput<'_>,
        token: &str,
        actions: Actions,
        memory: &mut ActionMemory,
    ) -> Result<bool, DriverError> {
        let TickInput { pool, spec, .. } = *input;
        memory.draining = actions.draining;
        if let Some(ended) = &actions.ended_drains {
            if ended.still_running {
                info!(pool = %pool, replicas = ?ended.names, "scale-down no longer wanted; draining replicas finish and leave");
            } else {
                info!(pool = %pool, removed = ?ended.names, to = ended.to, "drained; scaled down");
            }
        }
        let applied = match actions.replicas {
            ReplicaAction::Hold => false,
            ReplicaAction::Apply { replicas } => {
                self.runtime.apply(pool, spec, replicas, &[]).await?;
                true
            }
            ReplicaAction::RemoveWhenDrained { to, victims } => {
                let answers = self.drain_calls(pool, spec, token, &victims).await;
                let names: Vec<String> = victims.iter().map(|v| v.endpoint.name.clone()).collect();
                if decide::removal_due(&victims, &answers) {
                    info!(pool = %pool, removed = ?names, to, "drained; scaling down");
                    self.runtime.apply(pool, spec, to, &names).await?;
                    memory.draining.clear();
                    true
                } else {
                    info!(pool = %pool, draining = ?memory.draining.keys().collect::<Vec<_>>(), "waiting for drain before scale-down");
                    false
                }
            }
        };
        let reapply = actions.reapply_at.filter(|_| !applied);
        if let Some(current) = reapply {
            info!(pool = %pool, replicas = current, generation = ?input.generation, "re-applying the spec at the current count");
            self.runtime.apply(pool, spec, current, &[]).await?;
        }
        if applied || reapply.is_some() {
            memory.applied_generation = input.generation;
        }
        Ok(reapply.is_some())
    }

    /// Makes each victim's drain call; a failure is logged and answered as such.
    async fn drain_calls(
        &self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        token: &str,
        victims: &[Victim],
    ) -> Vec<DrainAnswer> {
        let grace_s = spec.engine.drain_grace_period.as_std().as_secs();
        let mut answers = Vec::with_capacity(victims.len());
        for v in victims {
            let answer = match v.call {
                DrainCall::Start => self.control.drain(&v.endpoint, token, grace_s).await,
                DrainCall::Poll => self.control.drain_status(&v.endpoint, token).await,
            };
            answers.push(match answer {
                Ok(s) => DrainAnswer::Answered(s.state),
                Err(e) => {
                    if v.call == DrainCall::Start {
                        warn!(pool = %pool, error = %e, "drain request failed; removing after the grace period");
                    }
                    DrainAnswer::Failed
                }
            });
        }
        answers
    }

    /// The registry: loaded once, merged with what the ready engines admitted since their
    /// last answer, saved when its tenants changed (and its watermarks now and then).
    async fn execute_registry<'m>(
        &self,
        input: &TickInput<'_>,
        workload: &WorkloadState,
        token: &str,
        slot: &'m mut Option<Registry>,
        saved_at: &mut Option<Millis>,
    ) -> Result<&'m Registry, DriverError> {
        let pool = input.pool;
        let registry = match slot {
            Some(r) => r,
            None => slot.insert(self.registry.load(pool).await?),
        };
        let asks = decide::collect_from(workload, registry);
        let answers = join_all(
            asks.iter()
                .map(|(ep, since)| self.control.tenants_since(ep, token, *since)),
        )
        .await;
        let mut reports = Vec::new();
        for ((ep, _), answer) in asks.into_iter().zip(answers) {
            match answer {
                Ok(report) => reports.push((ep.name, report)),
                Err(e) => warn!(pool = %pool, error = %e, "could not collect admitted tenants"),
            }
        }
        let merged = decide::merge_reports(registry, &reports, workload, input.spec, input.now);
        for (engine, added) in &merged.added {
            info!(pool = %pool, engine = %engine, added, total = registry.len(), "new tenants admitted");
        }
        if decide::registry_save_due(&merged, *saved_at, input.now) {
            self.registry.save(pool, registry).await?;
            *saved_at = Some(input.now);
        }
        Ok(registry)
    }

    /// Gives every router the pool's engines (draining ones as not accepting); returns the
    /// requests the routers hold for want of a ready engine. A failed push is logged and
    /// retried next tick (routers keep the last set and probe it themselves).
    async fn push_endpoints(
        &self,
        pool: &PoolRef,
        workload: &WorkloadState,
        token: &str,
        draining: &BTreeMap<String, Millis>,
    ) -> AtRouters {
        let set = decide::router_endpoints(workload, |name| draining.contains_key(name));
        let mut at = AtRouters::default();
        let answers = join_all(
            workload
                .routers
                .iter()
                .map(|router| self.control.push_endpoints(router, token, &set)),
        )
        .await;
        for (router, answer) in workload.routers.iter().zip(answers) {
            match answer {
                Ok(view) => {
                    at.held += view.held;
                    at.queued += view.queued;
                    if !view.policy_pushed {
                        at.without_policy.push(router.name.clone());
                    }
                }
                Err(e) => {
                    warn!(pool = %pool, error = %e, "endpoint push to a router failed; retrying next tick")
                }
            }
        }
        if at.held > 0 {
            info!(pool = %pool, held = at.held, engines = set.endpoints.len(), "requests held at the routers for want of a ready engine");
        }
        at
    }

    /// Pushes the policy to the targets; true when every push succeeded.
    async fn push_policy(
        &self,
        pool: &PoolRef,
        targets: &[&crate::ports::Endpoint],
        token: &str,
        policy: &EnginePolicy,
    ) -> bool {
        let answers = join_all(
            targets
                .iter()
                .map(|ep| self.control.push_policy(ep, token, policy)),
        )
        .await;
        let mut ok = true;
        for e in answers.into_iter().filter_map(Result::err) {
            warn!(pool = %pool, error = %e, "policy push failed; retrying next tick");
            ok = false;
        }
        ok
    }
}

/// What the pool's routers answered an endpoint push with (requests summed over routers).
#[derive(Clone, Debug, Default)]
struct AtRouters {
    /// Held for want of a ready engine (scale from zero).
    held: u64,
    /// Waiting for an engine with room.
    queued: u64,
    /// Routers that hold no policy yet (just started): they get it this tick.
    without_policy: Vec<String>,
}

/// Rebuilds planner memory from the status an earlier operator wrote (restart loses nothing
/// that matters: the learned pod model, the admission state and its since, and the
/// scale-down window).
fn restore_plan_state(previous: Option<&InferencePoolStatus>) -> PlanState {
    let mut state = PlanState::default();
    let Some(prev) = previous else {
        return state;
    };
    if let Some(m) = &prev.pod_model {
        state.pod_model = PodModel::restored(Line {
            base_seconds: m.itl_base_seconds,
            per_sequence_seconds: m.itl_per_sequence_seconds,
        });
    }
    if let Some(m) = &prev.measured {
        // The last decision counts in the stabilization windows from when it was measured:
        // a restart does not let the pool scale down sooner than the earlier operator would
        // have (a restart mid-window otherwise acts on a single fresh sample).
        if let Some(at) = &m.observed_at {
            state
                .recommendations
                .record(unix_millis(at), prev.desired_replicas);
        }
    }
    if let Some(a) = &prev.admission {
        let since = a.since.as_ref().map(unix_millis);
        state.admission =
            AdmissionMachine::restored(a.state, since, a.reason.clone(), a.paused_tiers.clone());
    }
    if let Some(f) = &prev.forecast {
        let at = prev
            .measured
            .as_ref()
            .and_then(|m| m.observed_at.as_ref())
            .map(unix_millis)
            .unwrap_or_default();
        state.forecast = Forecaster::restored(&f.history, f.recent_error, at);
        if let (true, Ok(lead)) = (
            f.lead_time_measured,
            f.lead_time.parse::<tidegate_api::Duration>(),
        ) {
            state.lead_time = LeadTime::restored(lead.as_std().as_millis() as u64);
        }
    }
    state.last_desired = Some(prev.desired_replicas);
    state.last_scale_time = prev.last_scale_time.as_ref().map(unix_millis);
    state.metrics_were_available = prev
        .conditions
        .iter()
        .find(|c| c.type_ == types::METRICS_AVAILABLE)
        .map(|c| c.status == cstatus::TRUE);
    state
}

fn unix_millis(t: &Time) -> Millis {
    t.0.as_millisecond().max(0) as u64
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
