//! Driver scenarios over fake ports (no I/O): a replica is removed only after it drained, a
//! drain victim that vanished is forgotten and replaced, a metrics outage removes nothing,
//! one pool's hanging tick does not hold up another's, the spec is re-applied once per
//! generation, and a restarted operator keeps the admission state and its since, the
//! scale-down window and every tenant of the stored registry; a tenant a router accepted is in
//! the policy pushed the same tick, and routers learn how many of them are ready.

use std::sync::{Arc, Mutex, MutexGuard};

use tidegate_api::engine_admin::{
    AdmittedTenant, AdmittedTenants, DrainState, DrainStatus, EnginePolicy,
};
use tidegate_api::router::RouterEndpoints;

use super::*;
use crate::plan::{MetricsProblem, PoolMetrics};
use crate::ports::{ControlError, Endpoint, RegistryError};
use tidegate_api::AdmissionState;

/// The world the fakes share.
#[derive(Default)]
struct World {
    endpoints: Vec<Endpoint>,
    replicas: i32,
    /// Every `apply` call: (replicas, remove_first).
    applied: Vec<(i32, Vec<String>)>,
    /// Engines asked to drain, in order.
    drain_calls: Vec<String>,
    /// Engines that report Drained.
    drained: Vec<String>,
    metrics_down: bool,
    next_name: usize,
    /// What the registry store holds.
    stored_registry: Registry,
    /// Every policy pushed, in order.
    pushed: Vec<EnginePolicy>,
    /// The pool's routers.
    routers: Vec<Endpoint>,
    /// What each router (by name) reports it accepted.
    accepted: Vec<(String, AdmittedTenant)>,
    /// Every endpoint push, in order: (router, the set).
    endpoint_pushes: Vec<(String, RouterEndpoints)>,
    /// Routers that hold no policy yet (until one is pushed to them).
    without_policy: Vec<String>,
    /// Where each policy push went, in order.
    policy_to: Vec<String>,
}

impl World {
    fn spawn(&mut self) {
        let name = format!("e{}", self.next_name);
        self.next_name += 1;
        self.endpoints.push(Endpoint {
            api_url: format!("http://{name}"),
            admin_url: format!("http://{name}-admin"),
            name,
            ready: true,
        });
    }
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<World>>);

impl Fake {
    fn with_replicas(n: i32) -> Self {
        let f = Fake::default();
        {
            let mut w = f.world();
            w.replicas = n;
            for _ in 0..n {
                w.spawn();
            }
        }
        f
    }

    fn world(&self) -> MutexGuard<'_, World> {
        self.0.lock().expect("world lock")
    }
}

impl WorkloadRuntime for Fake {
    async fn observe(&self, _pool: &PoolRef) -> Result<WorkloadState, RuntimeError> {
        let w = self.world();
        Ok(WorkloadState {
            replicas: Some(w.replicas),
            ready_replicas: w.endpoints.iter().filter(|e| e.ready).count() as i32,
            endpoints: w.endpoints.clone(),
            selector: "pool=p".into(),
            routers: w.routers.clone(),
            model_problem: None,
        })
    }

    async fn apply(
        &self,
        _pool: &PoolRef,
        _spec: &InferencePoolSpec,
        replicas: i32,
        remove_first: &[String],
    ) -> Result<(), RuntimeError> {
        let mut w = self.world();
        w.applied.push((replicas, remove_first.to_vec()));
        w.endpoints.retain(|e| !remove_first.contains(&e.name));
        w.replicas = replicas;
        while (w.endpoints.len() as i32) < replicas {
            w.spawn();
        }
        Ok(())
    }

    async fn admin_token(&self, _pool: &PoolRef) -> Result<String, RuntimeError> {
        Ok("token".into())
    }
}

impl MetricsSource for Fake {
    async fn read(
        &self,
        pool: &PoolRef,
        _spec: &InferencePoolSpec,
        endpoints: &[Endpoint],
        now_ms: u64,
    ) -> Result<PoolMetrics, MetricsProblem> {
        if pool.name == "hangs" {
            // A Prometheus that accepts the query and never answers.
            std::future::pending::<()>().await;
        }
        if self.world().metrics_down {
            return Err(MetricsProblem::Unreachable("connection refused".into()));
        }
        // Light load: one replica is plenty.
        Ok(PoolMetrics {
            decode_tokens_per_second: 50.0,
            running: 2.0,
            waiting: 0.0,
            queue_wait_p99_seconds: Some(0.01),
            kv_utilization: 0.05,
            evictions_per_second: 0.0,
            overload_refusals_per_second: 0.0,
            pods_reporting: endpoints.len() as i32,
            sampled_at: now_ms,
            ..PoolMetrics::default()
        })
    }
}

impl EngineControl for Fake {
    async fn push_endpoints(
        &self,
        router: &Endpoint,
        _token: &str,
        set: &RouterEndpoints,
    ) -> Result<tidegate_api::router::EndpointsView, ControlError> {
        let mut w = self.world();
        w.endpoint_pushes.push((router.name.clone(), set.clone()));
        Ok(tidegate_api::router::EndpointsView {
            policy_pushed: !w.without_policy.contains(&router.name),
            ..tidegate_api::router::EndpointsView::default()
        })
    }

    async fn push_policy(
        &self,
        ep: &Endpoint,
        _token: &str,
        policy: &EnginePolicy,
    ) -> Result<(), ControlError> {
        let mut w = self.world();
        w.pushed.push(policy.clone());
        w.policy_to.push(ep.name.clone());
        w.without_policy.retain(|r| r != &ep.name);
        Ok(())
    }

    async fn tenants_since(
        &self,
        ep: &Endpoint,
        _token: &str,
        since_ms: u64,
    ) -> Result<AdmittedTenants, ControlError> {
        let w = self.world();
        let mine = w.accepted.iter().filter(|(r, _)| r == &ep.name);
        Ok(AdmittedTenants {
            now_ms: since_ms,
            tenants: mine.map(|(_, t)| t.clone()).collect(),
        })
    }

    async fn drain(
        &self,
        ep: &Endpoint,
        token: &str,
        _grace_seconds: u64,
    ) -> Result<DrainStatus, ControlError> {
        self.world().drain_calls.push(ep.name.clone());
        self.drain_status(ep, token).await
    }

    async fn drain_status(&self, ep: &Endpoint, _token: &str) -> Result<DrainStatus, ControlError> {
        let drained = self.world().drained.contains(&ep.name);
        Ok(DrainStatus {
            state: if drained {
                DrainState::Drained
            } else {
                DrainState::Draining
            },
            in_flight: u64::from(!drained),
        })
    }
}

impl RegistryStore for Fake {
    async fn load(&self, _pool: &PoolRef) -> Result<Registry, RegistryError> {
        Ok(self.world().stored_registry.clone())
    }

    async fn save(&self, _pool: &PoolRef, registry: &Registry) -> Result<(), RegistryError> {
        self.world().stored_registry = registry.clone();
        Ok(())
    }
}

fn spec() -> InferencePoolSpec {
    serde_saphyr::from_str(
        r#"
model: {name: m, uri: "file:///m"}
engine: {image: e, drainGracePeriod: 10m}
replicas: {min: 1, max: 5}
slo: {tokensPerSecondPerSession: 20, queueWaitP99: 1s, targetUtilization: 0.7}
scaling: {interval: 1s, scaleDownStabilization: 0s, maxScaleDownStep: 1, capacityHintTokensPerSecond: 1000}
"#,
    )
    .expect("spec")
}

type FakeDriver = Driver<Fake, Fake, Fake, Fake>;

fn driver(world: &Fake) -> FakeDriver {
    Driver::new(world.clone(), world.clone(), world.clone(), world.clone())
}

fn pool() -> PoolRef {
    PoolRef {
        namespace: "ns".into(),
        name: "p".into(),
    }
}

fn input<'a>(pool: &'a PoolRef, spec: &'a InferencePoolSpec, now: Millis) -> TickInput<'a> {
    TickInput {
        pool,
        spec,
        tiers: None,
        api_keys: &[],
        previous: None,
        generation: None,
        now,
    }
}

async fn tick(d: &FakeDriver, now: Millis) -> TickOutcome {
    let (pool, spec) = (pool(), spec());
    d.tick(&input(&pool, &spec, now)).await.expect("tick")
}

const T0: Millis = 1_700_000_000_000;

#[tokio::test]
async fn a_replica_is_removed_only_after_it_reports_drained() {
    let world = Fake::with_replicas(3);
    let d = driver(&world);
    let first = tick(&d, T0).await;
    assert!(
        first.plan.replicas < 3,
        "light load should scale down: {:?}",
        first.plan
    );
    assert_eq!(
        world.world().drain_calls,
        ["e2"],
        "newest replica drains first"
    );
    assert!(
        world.world().applied.is_empty(),
        "nothing removed before the drain ends"
    );

    let second = tick(&d, T0 + 1_000).await;
    assert_eq!(second.draining, ["e2"]);
    assert_eq!(world.world().drain_calls, ["e2"], "the drain is asked once");
    assert!(world.world().applied.is_empty());

    world.world().drained.push("e2".into());
    tick(&d, T0 + 2_000).await;
    assert_eq!(world.world().applied, [(2, vec!["e2".to_string()])]);
    let names: Vec<String> = world
        .world()
        .endpoints
        .iter()
        .map(|e| e.name.clone())
        .collect();
    assert_eq!(names, ["e0", "e1"]);
}

#[tokio::test]
async fn a_drain_victim_that_vanished_is_forgotten_and_another_drains() {
    let world = Fake::with_replicas(3);
    let d = driver(&world);
    tick(&d, T0).await;
    assert_eq!(world.world().drain_calls, ["e2"]);
    {
        // e2 crashes; the runtime replaces it with a new replica.
        let mut w = world.world();
        w.endpoints.retain(|e| e.name != "e2");
        w.spawn();
    }
    let out = tick(&d, T0 + 1_000).await;
    assert_eq!(out.draining, ["e3"], "the gone victim is not waited for");
    assert_eq!(world.world().drain_calls, ["e2", "e3"]);
    assert!(world.world().applied.is_empty());
}

#[tokio::test]
async fn a_metrics_outage_removes_no_replica() {
    let world = Fake::with_replicas(3);
    world.world().metrics_down = true;
    let d = driver(&world);
    for i in 0..5 {
        let out = tick(&d, T0 + i * 1_000).await;
        assert_eq!(out.plan.replicas, 3);
    }
    assert!(world.world().drain_calls.is_empty());
    assert!(world.world().applied.iter().all(|(n, _)| *n >= 3));
}

#[tokio::test]
async fn a_pool_whose_metrics_hang_does_not_hold_up_another_pool() {
    let world = Fake::with_replicas(2);
    let d = driver(&world);
    let hangs = PoolRef {
        namespace: "ns".into(),
        name: "hangs".into(),
    };
    let spec = spec();
    let stuck_input = input(&hangs, &spec, T0);
    let stuck = d.tick(&stuck_input);
    let other = tokio::time::timeout(std::time::Duration::from_secs(5), tick(&d, T0));
    tokio::select! {
        _ = stuck => panic!("a metrics read that never answers finished"),
        out = other => {
            let out = out.expect("the other pool ticked while the first one hung");
            assert_eq!(out.workload.replicas, Some(2));
        }
    }
}

#[tokio::test]
async fn the_spec_is_reapplied_once_per_generation_at_the_current_count() {
    let world = Fake::with_replicas(3);
    // Metrics down: the count holds, so only a re-apply applies anything.
    world.world().metrics_down = true;
    let d = driver(&world);
    let (pool, spec) = (pool(), spec());
    let at = |generation, now| TickInput {
        generation: Some(generation),
        ..input(&pool, &spec, now)
    };
    let first = d.tick(&at(1, T0)).await.expect("tick");
    assert!(first.reapplied, "a new operator applies the spec it found");
    d.tick(&at(1, T0 + 1_000)).await.expect("tick");
    assert_eq!(world.world().applied, [(3, vec![])], "once per generation");
    let changed = d.tick(&at(2, T0 + 2_000)).await.expect("tick");
    assert!(changed.reapplied);
    assert_eq!(world.world().applied, [(3, vec![]), (3, vec![])]);
}

/// A pool with a scale-down window and pausable tiers, and the status an earlier operator
/// wrote for it: 3 replicas desired (measured 2 s ago), new tenants of `free` paused since
/// `paused_since`.
fn restart_scene(paused_since: Millis) -> (InferencePoolSpec, TierPolicySpec, InferencePoolStatus) {
    let spec: InferencePoolSpec = serde_saphyr::from_str(
        r#"
model: {name: m, uri: "file:///m"}
engine: {image: e, drainGracePeriod: 10m}
replicas: {min: 1, max: 3}
slo: {tokensPerSecondPerSession: 20, queueWaitP99: 1s, targetUtilization: 0.7}
scaling: {interval: 1s, scaleDownStabilization: 60s, maxScaleDownStep: 1, capacityHintTokensPerSecond: 1000}
admission: {holdTime: 30s}
"#,
    )
    .expect("spec");
    let tiers: TierPolicySpec = serde_saphyr::from_str(
        r#"
defaultTier: free
tiers:
  - {name: standard, priority: 50}
  - {name: free, priority: 10}
"#,
    )
    .expect("tiers");
    let previous: InferencePoolStatus = serde_json::from_value(serde_json::json!({
        "replicas": 3,
        "readyReplicas": 3,
        "desiredReplicas": 3,
        "measured": tidegate_api::status::Measured {
            per_replica_capacity: 1000.0,
            observed_at: Some(crate::plan::to_time(T0 - 2_000)),
            ..Default::default()
        },
        "admission": {
            "state": "PausedNewTenants",
            "since": crate::plan::rfc3339(paused_since),
            "reason": "at the ceiling and over the SLO",
            "pausedTiers": ["free"],
        },
    }))
    .expect("status");
    (spec, tiers, previous)
}

#[tokio::test]
async fn a_restarted_operator_keeps_the_admission_state_and_its_since() {
    let paused_since = T0 - 120_000;
    let (spec, tiers, previous) = restart_scene(paused_since);
    let world = Fake::with_replicas(3);
    let d = driver(&world);
    let pool = pool();
    let out = d
        .tick(&TickInput {
            tiers: Some(&tiers),
            previous: Some(&previous),
            ..input(&pool, &spec, T0)
        })
        .await
        .expect("tick");
    assert_eq!(out.plan.admission.state, AdmissionState::PausedNewTenants);
    assert_eq!(out.plan.admission.since, Some(paused_since));
    assert_eq!(out.plan.admission.paused_tiers, ["free"]);
    let pushed = world.world().pushed.last().cloned().expect("a push");
    assert_eq!(pushed.admission.state, AdmissionState::PausedNewTenants);
}

#[tokio::test]
async fn a_restarted_operator_waits_out_the_scale_down_window_it_found() {
    let (spec, tiers, previous) = restart_scene(T0 - 120_000);
    let world = Fake::with_replicas(3);
    let d = driver(&world);
    let pool = pool();
    let mut status = previous;
    // The light load wants 1 replica; the window from before the restart holds 3 until it
    // has passed (60 s after the last measurement, 2 s before the restart).
    for now in [T0, T0 + 30_000, T0 + 57_000] {
        let out = d
            .tick(&TickInput {
                tiers: Some(&tiers),
                previous: Some(&status),
                ..input(&pool, &spec, now)
            })
            .await
            .expect("tick");
        assert_eq!(out.plan.replicas, 3, "at {}s", (now - T0) / 1000);
        status = out.status;
    }
    assert!(world.world().drain_calls.is_empty());
    let out = d
        .tick(&TickInput {
            tiers: Some(&tiers),
            previous: Some(&status),
            ..input(&pool, &spec, T0 + 59_000)
        })
        .await
        .expect("tick");
    assert_eq!(out.plan.replicas, 2, "the window has passed");
}

#[tokio::test]
async fn a_restarted_operator_pushes_every_tenant_of_the_stored_registry() {
    let world = Fake::with_replicas(2);
    let admitted = |tenant: &str| tidegate_api::engine_admin::AdmittedTenant {
        tenant: tenant.into(),
        tier: "free".into(),
        first_admitted_ms: T0 - 60_000,
    };
    world.world().stored_registry.merge(
        "e-before-restart",
        &AdmittedTenants {
            now_ms: T0 - 60_000,
            tenants: vec![admitted("tenant-a"), admitted("tenant-b")],
        },
    );
    let d = driver(&world);
    tick(&d, T0).await;
    let w = world.world();
    let pushed = w.pushed.last().expect("a push");
    assert_eq!(pushed.admitted_tenants, ["tenant-a", "tenant-b"]);
    assert_eq!(w.stored_registry.tenant_ids(), ["tenant-a", "tenant-b"]);
}

#[test]
fn a_restart_keeps_the_learned_pod_model() {
    let status: InferencePoolStatus = serde_json::from_value(serde_json::json!({
        "desiredReplicas": 3,
        "podModel": {"itlBaseSeconds": 0.012, "itlPerSequenceSeconds": 0.0021, "sessionsAtSLO": 18.1, "samples": 900}
    }))
    .expect("status");
    let state = restore_plan_state(Some(&status));
    let line = state.pod_model.line(&spec());
    assert_eq!(line.base_seconds, 0.012);
    assert_eq!(line.per_sequence_seconds, 0.0021);
}

#[test]
fn a_restart_keeps_the_forecast_history_and_the_lead_time() {
    let mut profile = vec![String::new(); 96];
    profile[40] = "12.5".into();
    profile[41] = "13".into();
    let history = format!("v1 15m {}", profile.join(","));
    let status: InferencePoolStatus = serde_json::from_value(serde_json::json!({
        "desiredReplicas": 3,
        "forecast": {"inUse": true, "leadTime": "6m30s", "leadTimeMeasured": true,
                     "recentError": 0.04, "history": history}
    }))
    .expect("status");
    let state = restore_plan_state(Some(&status));
    assert_eq!(state.forecast.history(), history);
    assert_eq!(state.forecast.recent_error(), Some(0.04));
    assert_eq!(state.lead_time.estimate_ms(15 * 60_000), 390_000);
    // A lead time that was not measured is not restored as if it were.
    let mut unmeasured = status.clone();
    if let Some(f) = unmeasured.forecast.as_mut() {
        f.lead_time_measured = false;
    }
    assert!(!restore_plan_state(Some(&unmeasured)).lead_time.measured());
}

fn router(name: &str, ready: bool) -> Endpoint {
    Endpoint {
        name: name.into(),
        api_url: format!("http://{name}"),
        admin_url: format!("http://{name}-admin"),
        ready,
    }
}

#[tokio::test]
async fn a_tenant_a_router_accepted_reaches_every_engine_and_router_in_the_same_tick() {
    let world = Fake::with_replicas(1);
    world.world().routers = vec![router("r0", true), router("r1", true)];
    let d = driver(&world);
    tick(&d, T0).await;
    assert!(
        world
            .world()
            .pushed
            .iter()
            .all(|p| p.admitted_tenants.is_empty())
    );
    // r0 accepted "waiting" into its queue; no engine has admitted it yet.
    world.world().accepted.push((
        "r0".into(),
        AdmittedTenant {
            tenant: "waiting".into(),
            tier: "free".into(),
            first_admitted_ms: T0 + 500,
        },
    ));
    world.world().pushed.clear();
    let out = tick(&d, T0 + 1_000).await;
    assert_eq!(out.registry_size, 1);
    let pushed = world.world().pushed.clone();
    // One engine and two routers, each with the tenant.
    assert_eq!(pushed.len(), 3);
    assert!(pushed.iter().all(|p| p.admitted_tenants == ["waiting"]));
    assert!(world.world().stored_registry.contains("waiting"), "saved");
}

#[tokio::test]
async fn routers_are_told_the_count_of_ready_routers_every_tick() {
    let world = Fake::with_replicas(1);
    world.world().routers = vec![router("r0", true), router("r1", true)];
    let d = driver(&world);
    tick(&d, T0).await;
    let shares = |w: &Fake| -> Vec<(String, Option<u32>)> {
        let pushes = std::mem::take(&mut w.world().endpoint_pushes);
        pushes
            .into_iter()
            .map(|(r, s)| (r, s.ready_routers))
            .collect()
    };
    let each = |n: u32| vec![("r0".to_string(), Some(n)), ("r1".to_string(), Some(n))];
    assert_eq!(shares(&world), each(2));
    // r1 dies: the next tick tells r0 it holds the whole limit (r1 is still asked, as it
    // may be restarting; it gets the same count).
    world.world().routers[1].ready = false;
    tick(&d, T0 + 1_000).await;
    assert_eq!(shares(&world), each(1));
}

#[tokio::test]
async fn a_router_that_started_without_a_policy_gets_it_at_the_next_tick_not_in_30_s() {
    let world = Fake::with_replicas(1);
    world.world().routers = vec![router("r0", true)];
    let d = driver(&world);
    tick(&d, T0).await;
    tick(&d, T0 + 1_000).await;
    assert_eq!(
        world.world().policy_to,
        ["e0", "r0"],
        "pushed once, not due again"
    );
    // A second router is added: not ready, no policy. The policy has not changed.
    {
        let mut w = world.world();
        w.routers.push(router("r1", false));
        w.without_policy.push("r1".into());
        w.policy_to.clear();
    }
    tick(&d, T0 + 2_000).await;
    assert_eq!(
        world.world().policy_to,
        ["r1"],
        "only the router that lacked it"
    );
    tick(&d, T0 + 3_000).await;
    assert_eq!(world.world().policy_to, ["r1"], "and only once");
}
