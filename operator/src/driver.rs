//! The per-pool control loop step, over the ports: observe → measure → plan → act → report.
//! The same code runs under the Kubernetes controller and in local mode.
//!
//! Invariants:
//! - A replica is removed only after it was asked to drain and reported Drained, or its
//!   drain grace period ran out; until then the pool keeps its current count.
//! - Engines get the tier policy, admission state and tenant registry whenever it changes
//!   and at least every `PUSH_EVERY_MS`, so a restarted engine catches up within that time.
//! - The registry is saved whenever it changed, before the tick reports success.
//! - A failing engine admin call is logged and retried next tick; it never fails the tick.
//! - Ticks of different pools run concurrently; ticks of one pool run one at a time (each
//!   pool's memory has its own lock), so a slow pool never holds up the others.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Mutex as AsyncMutex;

use tidegate_api::engine_admin::{AdmissionPush, ApiKeyEntry, DrainState, EnginePolicy};
use tidegate_api::status::InferencePoolStatus;
use tidegate_api::{InferencePoolSpec, TierPolicySpec};
use tracing::{info, warn};

use crate::plan::{self, AdmissionMachine, Line, Millis, Observation, Plan, PlanState, PodModel};
use crate::ports::{
    Endpoint, EngineControl, MetricsSource, PoolRef, RegistryStore, RuntimeError, WorkloadRuntime,
    WorkloadState,
};
use crate::registry::Registry;
use crate::status_build;

/// Longest time between two pushes of the same policy to an engine.
pub const PUSH_EVERY_MS: Millis = 30_000;

/// What one tick decided and reports.
#[derive(Clone, Debug)]
pub struct TickOutcome {
    pub plan: Plan,
    pub status: InferencePoolStatus,
    pub workload: WorkloadState,
    /// Replicas being drained before removal.
    pub draining: Vec<String>,
    pub registry_size: usize,
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
    last_push: Option<(EnginePolicy, Millis)>,
    /// Replica name → when its drain started.
    draining: BTreeMap<String, Millis>,
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

    /// One tick for one pool.
    #[allow(clippy::too_many_arguments)]
    pub async fn tick(
        &self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        tiers: Option<&TierPolicySpec>,
        api_keys: &[ApiKeyEntry],
        previous: Option<&InferencePoolStatus>,
        generation: Option<i64>,
        now: Millis,
    ) -> Result<TickOutcome, DriverError> {
        let slot = self.memory(pool, previous);
        let mut guard = slot.lock().await;
        let mem = &mut *guard;
        let workload = self.runtime.observe(pool).await?;
        let token = self.runtime.admin_token(pool).await.unwrap_or_default();
        let metrics = self
            .metrics
            .read(pool, spec, &workload.endpoints, now)
            .await;
        // Replicas being drained are leaving: plan as if they were gone already.
        let current = workload.replicas.unwrap_or(0);
        let obs = Observation {
            now,
            current_replicas: current,
            ready_replicas: workload.ready_replicas,
            metrics,
        };
        let plan = plan::plan(spec, tiers, &obs, &mut mem.plan);
        info!(pool = %pool, decision = %plan.explanation, "plan");

        // Act on replicas.
        let target = plan.replicas;
        if target >= current {
            if !mem.draining.is_empty() {
                let names: Vec<&String> = mem.draining.keys().collect();
                let still_here = workload
                    .endpoints
                    .iter()
                    .any(|e| mem.draining.contains_key(&e.name));
                if still_here {
                    // A started drain cannot be undone: the engine leaves when it is done.
                    info!(pool = %pool, replicas = ?names, "scale-down no longer wanted; draining replicas finish and leave");
                } else {
                    info!(pool = %pool, removed = ?names, to = target, "drained; scaled down");
                }
                mem.draining.clear();
            }
            if target != current || workload.replicas.is_none() {
                self.runtime.apply(pool, spec, target, &[]).await?;
            }
        } else {
            // Victims are chosen once and kept until removed, so a drain is never abandoned
            // half-way because readiness changed (a draining engine stops being ready). A
            // victim that is gone already (it crashed, or was removed) is forgotten.
            mem.draining
                .retain(|name, _| workload.endpoints.iter().any(|e| &e.name == name));
            let wanted = (current - target) as usize;
            let mut victims: Vec<Endpoint> = workload
                .endpoints
                .iter()
                .filter(|e| mem.draining.contains_key(&e.name))
                .cloned()
                .collect();
            if victims.is_empty() {
                victims = pick_victims(&workload.endpoints, wanted);
            }
            victims.truncate(wanted);
            let grace_ms = spec.engine.drain_grace_period.as_std().as_millis() as u64;
            let mut all_done = true;
            for v in &victims {
                let started = *mem.draining.entry(v.name.clone()).or_insert(now);
                let done = if started == now {
                    match self.control.drain(v, &token, grace_ms / 1000).await {
                        Ok(s) => s.state == DrainState::Drained,
                        Err(e) => {
                            warn!(pool = %pool, error = %e, "drain request failed; removing after the grace period");
                            false
                        }
                    }
                } else {
                    match self.control.drain_status(v, &token).await {
                        Ok(s) => s.state == DrainState::Drained,
                        Err(_) => !v.ready,
                    }
                };
                let expired = now.saturating_sub(started) >= grace_ms;
                all_done &= done || expired;
            }
            if all_done {
                let names: Vec<String> = victims.iter().map(|v| v.name.clone()).collect();
                info!(pool = %pool, removed = ?names, to = target, "drained; scaling down");
                self.runtime.apply(pool, spec, target, &names).await?;
                mem.draining.clear();
            } else {
                info!(pool = %pool, draining = ?mem.draining.keys().collect::<Vec<_>>(), "waiting for drain before scale-down");
            }
        }

        // Registry: load once, merge what engines admitted, forget the old, save on change.
        if mem.registry.is_none() {
            mem.registry = Some(self.registry.load(pool).await?);
        }
        let registry = mem.registry.get_or_insert_with(Registry::default);
        let before = registry.clone();
        for ep in workload.endpoints.iter().filter(|e| e.ready) {
            let since = registry.watermarks.get(&ep.name).copied().unwrap_or(0);
            match self.control.tenants_since(ep, &token, since).await {
                Ok(report) => {
                    let added = registry.merge(&ep.name, &report);
                    if added > 0 {
                        info!(pool = %pool, engine = %ep.name, added, total = registry.len(), "new tenants admitted");
                    }
                }
                Err(e) => warn!(pool = %pool, error = %e, "could not collect admitted tenants"),
            }
        }
        let window = spec.admission.tenant_memory.as_std().as_millis() as u64;
        registry.prune(now, window);
        let live: Vec<&str> = workload.endpoints.iter().map(|e| e.name.as_str()).collect();
        registry
            .watermarks
            .retain(|k, _| live.contains(&k.as_str()));
        if *registry != before {
            self.registry.save(pool, registry).await?;
        }

        // Push policy + admission + registry to every ready engine.
        let policy = EnginePolicy {
            tier_policy: tiers.cloned(),
            api_keys: api_keys.to_vec(),
            admission: AdmissionPush {
                state: plan.admission.state,
                paused_tiers: plan.admission.paused_tiers.clone(),
                retry_after_seconds: spec.admission.retry_after.as_std().as_secs().max(1),
                reason: plan.admission.reason.clone(),
            },
            admitted_tenants: registry.tenant_ids(),
        };
        let due = match &mem.last_push {
            Some((last, at)) => *last != policy || now.saturating_sub(*at) >= PUSH_EVERY_MS,
            None => true,
        };
        if due {
            let mut ok = true;
            for ep in workload.endpoints.iter().filter(|e| e.ready) {
                if let Err(e) = self.control.push_policy(ep, &token, &policy).await {
                    warn!(pool = %pool, error = %e, "policy push failed; retrying next tick");
                    ok = false;
                }
            }
            if ok {
                mem.last_push = Some((policy, now));
            }
        }

        let status = status_build::build(
            previous,
            &plan,
            &workload,
            generation,
            now,
            mem.plan.last_scale_time,
        );
        Ok(TickOutcome {
            plan,
            status,
            draining: mem.draining.keys().cloned().collect(),
            registry_size: registry.len(),
            workload,
        })
    }
}

/// Replicas to remove on a scale-down: not-ready ones first, then the newest names.
fn pick_victims(endpoints: &[Endpoint], n: usize) -> Vec<Endpoint> {
    let mut eps: Vec<&Endpoint> = endpoints.iter().collect();
    eps.sort_by(|a, b| a.ready.cmp(&b.ready).then_with(|| b.name.cmp(&a.name)));
    eps.into_iter().take(n).cloned().collect()
}

/// Rebuilds planner memory from the status an earlier operator wrote (restart loses nothing
/// that matters: the learned pod model and the admission state).
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
    if let Some(a) = &prev.admission {
        let since = a.since.as_ref().map(|t| t.0.as_millisecond().max(0) as u64);
        state.admission =
            AdmissionMachine::restored(a.state, since, a.reason.clone(), a.paused_tiers.clone());
    }
    state.last_desired = Some(prev.desired_replicas);
    state
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
