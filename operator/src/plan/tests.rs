//! Scenario tests of the planner: a tiny pool model driven by 15-second ticks.

use tidegate_api::*;

use super::*;

const TICK: Millis = 15_000;
/// Tokens/s one pod serves at the SLO in these scenarios: 50 sessions × r.
const POD_CAPACITY: f64 = 1000.0;
/// r: tokens/s per session (slo default is 20).
const R: f64 = 20.0;
/// The pods' step time: 50 sessions each still get r (ITL(50) = 1/r = 50 ms).
const LINE: Line = Line {
    base_seconds: 0.025,
    per_sequence_seconds: 0.0005,
};
// The spec's capacity hint, 1123 tok/s at the default full batch of 64, is 64 ÷ ITL(64).
/// How long a request holds its slot in these scenarios (Little's law: finished = running ÷ it).
const HOLDING_S: f64 = 30.0;

fn spec(min: i32, max: i32) -> InferencePoolSpec {
    let yaml = format!(
        r#"
model: {{name: m, uri: "file:///m"}}
engine: {{image: e}}
replicas: {{min: {min}, max: {max}}}
slo: {{tokensPerSecondPerSession: {R}, queueWaitP99: 1s, targetUtilization: 0.7}}
scaling: {{interval: 15s, scaleDownStabilization: 5m, maxScaleUpStep: 4, capacityHintTokensPerSecond: 1123}}
admission: {{pauseThreshold: 0.95, resumeThreshold: 0.8, pauseAfter: 1m, holdTime: 5m, pauseWhileScaling: false}}
"#
    );
    serde_saphyr::from_str(&yaml).expect("spec")
}

fn tiers() -> TierPolicySpec {
    serde_saphyr::from_str(
        r#"
defaultTier: free
tiers:
  - {name: enterprise, priority: 100, admission: {pausable: false}}
  - {name: standard, priority: 50}
  - {name: free, priority: 10}
"#,
    )
    .expect("tiers")
}

/// A pool whose pods become ready at once and behave like the resource model says.
struct Pool {
    spec: InferencePoolSpec,
    tiers: TierPolicySpec,
    state: PlanState,
    now: Millis,
    replicas: i32,
    prometheus_up: bool,
    plans: Vec<Plan>,
}

impl Pool {
    fn new(spec: InferencePoolSpec) -> Self {
        Pool {
            spec,
            tiers: tiers(),
            state: PlanState::default(),
            now: 1_700_000_000_000,
            replicas: 1,
            prometheus_up: true,
            plans: Vec::new(),
        }
    }

    /// Metrics for `sessions` concurrent sessions on the current replicas.
    fn metrics(&self, sessions: f64) -> Result<PoolMetrics, MetricsProblem> {
        if !self.prometheus_up {
            return Err(MetricsProblem::Unreachable("connection refused".into()));
        }
        let per_pod = (POD_CAPACITY / R).min(f64::from(self.spec.engine.max_batch_size));
        let slots = f64::from(self.replicas) * per_pod;
        let running = sessions.min(slots);
        let waiting = (sessions - running).max(0.0);
        let saturated = waiting > 0.0;
        let batch = running / f64::from(self.replicas.max(1));
        Ok(PoolMetrics {
            decode_tokens_per_second: running * R,
            step_samples: vec![
                StepSample {
                    batch,
                    itl_seconds: LINE.itl(batch),
                };
                self.replicas.max(0) as usize
            ],
            requests_finished_per_second: running / HOLDING_S,
            waiting_growth_per_second: 0.0,
            running,
            waiting,
            queue_wait_p99_seconds: Some(if saturated { 3.0 } else { 0.05 }),
            kv_utilization: running / slots.max(1.0),
            evictions_per_second: 0.0,
            overload_refusals_per_second: 0.0,
            pods_reporting: self.replicas,
            sampled_at: self.now,
        })
    }

    fn tick(&mut self, sessions: f64) -> &Plan {
        self.now += TICK;
        let obs = Observation {
            now: self.now,
            current_replicas: self.replicas,
            ready_replicas: self.replicas,
            metrics: self.metrics(sessions),
            held_requests: 0,
            router_queued: 0,
        };
        let plan = super::plan(&self.spec, Some(&self.tiers), &obs, &mut self.state);
        self.replicas = plan.replicas;
        self.plans.push(plan);
        self.plans.last().expect("just pushed")
    }

    /// One tick with only `ready` of the replicas ready (the rest still starting); the
    /// replica count stays as it is.
    fn tick_starting(&mut self, sessions: f64, ready: i32) -> Plan {
        self.now += TICK;
        let obs = Observation {
            now: self.now,
            current_replicas: self.replicas,
            ready_replicas: ready,
            metrics: self.metrics(sessions),
            held_requests: 0,
            router_queued: 0,
        };
        super::plan(&self.spec, Some(&self.tiers), &obs, &mut self.state)
    }

    fn scale_events(&self) -> usize {
        self.plans
            .iter()
            .filter(|p| p.decision.as_ref().is_some_and(|d| d.applied))
            .count()
    }
}

/// Deterministic ±5% noise.
fn noise(i: u64) -> f64 {
    let x = (i.wrapping_mul(2_654_435_761) % 1000) as f64 / 1000.0;
    0.95 + 0.1 * x
}

#[test]
fn steady_load_never_flaps_over_an_hour() {
    let mut pool = Pool::new(spec(1, 10));
    // 140 sessions × 20 tok/s = 2800 tok/s ⇒ 2800 / (1000 × 0.7) = 4 replicas.
    for i in 0..(3600 / 15) {
        pool.tick(140.0 * noise(i));
    }
    let settled: Vec<i32> = pool.plans.iter().skip(8).map(|p| p.replicas).collect();
    assert!(
        settled.iter().all(|&r| r == settled[0]),
        "replicas flapped: {settled:?}"
    );
    assert!((4..=5).contains(&settled[0]), "settled at {}", settled[0]);
    assert!(
        pool.scale_events() <= 3,
        "{} scale events",
        pool.scale_events()
    );
}

#[test]
fn steady_load_with_nine_percent_noise_holds_its_replicas() {
    let mut pool = Pool::new(spec(1, 10));
    // 140 sessions ⇒ exactly 4 replicas at the target. Upward noise may add one replica
    // (the target is a ceiling, not a band), but no noise scales it back: a scale-down
    // needs 10% below the target, so the count moves at most once and never reverses.
    for _ in 0..8 {
        pool.tick(140.0);
    }
    let settled = pool.replicas;
    let before = pool.scale_events();
    for i in 0..(3600 / 15) {
        let x = ((i as u64).wrapping_mul(2_654_435_761) % 1000) as f64 / 1000.0;
        pool.tick(140.0 * (0.91 + 0.18 * x));
    }
    assert!((settled..=settled + 1).contains(&pool.replicas));
    assert!(
        pool.scale_events() <= before + 1,
        "flapped under ±9% noise: {} scale events",
        pool.scale_events() - before
    );
}

#[test]
fn a_replica_counts_for_at_most_max_batch_sessions_of_demand() {
    // A fast engine (1000 tok/s) that holds only 4 sequences serves at most 4 × r = 80 tok/s
    // of demand, however many tokens/s it produces.
    let mut s = spec(1, 20);
    s.engine.max_batch_size = 4;
    let mut pool = Pool::new(s);
    let plan = pool.tick(40.0);
    let m = plan.measured.as_ref().expect("measured");
    assert_eq!(m.pod.capacity_tokens_per_second, 80.0);
    assert!((m.utilization - 10.0).abs() < 1e-9, "{m:?}");
    // 800 tok/s ÷ (80 × 0.7) ⇒ 15 replicas, 4 per step.
    assert_eq!(plan.replicas, 5);
}

#[test]
fn the_queue_wait_raise_waits_for_replicas_already_starting() {
    let mut pool = Pool::new(spec(1, 20));
    pool.replicas = 3;
    // Demand fits 2 replicas, but the queue is over its target.
    let queued = || PoolMetrics {
        decode_tokens_per_second: 1200.0,
        running: 60.0,
        queue_wait_p99_seconds: Some(3.0),
        pods_reporting: 3,
        ..PoolMetrics::default()
    };
    let tick = |pool: &mut Pool, ready: i32| {
        pool.now += TICK;
        let obs = Observation {
            now: pool.now,
            current_replicas: 3,
            ready_replicas: ready,
            metrics: Ok(PoolMetrics {
                sampled_at: pool.now,
                ..queued()
            }),
            held_requests: 0,
            router_queued: 0,
        };
        super::plan(&pool.spec, Some(&pool.tiers), &obs, &mut pool.state)
    };
    // One replica is still starting: it is the raise of an earlier tick.
    let p = tick(&mut pool, 2);
    assert_eq!(p.desired_replicas, 3, "{}", p.explanation);
    assert!(
        p.explanation
            .contains("not raised: 1 replicas still starting"),
        "{}",
        p.explanation
    );
    // All ready and still queueing: raise by one.
    let p = tick(&mut pool, 3);
    assert_eq!(p.desired_replicas, 4, "{}", p.explanation);
}

/// Over the queue-wait target, demand for one replica, for longer than the scale-down window.
fn ticks_over_target(pool: &mut Pool, current: i32, ready: i32, ticks: u32) -> Vec<Plan> {
    (0..ticks)
        .map(|_| {
            pool.now += TICK;
            let obs = Observation {
                now: pool.now,
                current_replicas: current,
                ready_replicas: ready,
                metrics: Ok(PoolMetrics {
                    decode_tokens_per_second: 200.0,
                    running: 10.0,
                    queue_wait_p99_seconds: Some(3.0),
                    pods_reporting: ready,
                    sampled_at: pool.now,
                    ..PoolMetrics::default()
                }),
                held_requests: 0,
                router_queued: 0,
            };
            super::plan(&pool.spec, Some(&pool.tiers), &obs, &mut pool.state)
        })
        .collect()
}

#[test]
fn never_scales_down_while_queue_wait_is_over_target() {
    // (current, ready) below the ceiling of 4 and at it, all ready and some starting; each
    // for 30 ticks (7.5 min, past the 5-minute scale-down window) with demand for 1 replica.
    for (current, ready) in [(3, 3), (3, 2), (4, 4), (4, 3)] {
        let mut pool = Pool::new(spec(1, 4));
        for p in ticks_over_target(&mut pool, current, ready, 30) {
            assert!(
                p.desired_replicas >= current,
                "current {current}, ready {ready}: scaled down to {} while over target: {}",
                p.desired_replicas,
                p.explanation
            );
        }
    }
}

#[test]
fn a_step_up_scales_within_one_interval() {
    let mut pool = Pool::new(spec(1, 20));
    for _ in 0..10 {
        pool.tick(20.0);
    }
    let before = pool.replicas;
    let plan = pool.tick(200.0); // 4000 tok/s ⇒ 6 replicas; max step 4
    assert!(
        plan.replicas > before,
        "no scale-up on the first tick after the step"
    );
    assert!(plan.events.iter().any(|e| e.reason == "ScaledUp"));
    for _ in 0..3 {
        pool.tick(200.0);
    }
    assert!(pool.replicas >= 6, "got {}", pool.replicas);
}

#[test]
fn scale_down_waits_for_the_stabilization_window() {
    let mut pool = Pool::new(spec(1, 20));
    for _ in 0..20 {
        pool.tick(200.0);
    }
    let high = pool.replicas;
    // Load drops: nothing happens for 5 minutes (20 ticks), then one step at a time.
    for i in 0..19 {
        let p = pool.tick(20.0);
        assert_eq!(p.replicas, high, "scaled down after {} ticks", i + 1);
    }
    for _ in 0..30 {
        pool.tick(20.0);
    }
    assert!(pool.replicas < high);
}

#[test]
fn at_the_ceiling_new_tenants_pause_and_reopen_only_after_the_hold_time() {
    let mut pool = Pool::new(spec(1, 3));
    // 300 sessions need 6000 / 700 ⇒ 9 replicas; max is 3.
    let mut paused_at = None;
    for i in 0..20 {
        let p = pool.tick(300.0);
        if p.admission.state == AdmissionState::PausedNewTenants && paused_at.is_none() {
            paused_at = Some(i);
        }
    }
    assert_eq!(pool.replicas, 3);
    let paused_at = paused_at.expect("never paused");
    let last = pool.plans.last().expect("plan");
    // Lowest priority first, escalation to standard, never enterprise.
    assert_eq!(
        last.admission.paused_tiers,
        vec!["free".to_string(), "standard".to_string()]
    );
    let exhausted = last
        .conditions
        .iter()
        .find(|c| c.type_ == "CapacityExhausted")
        .expect("condition");
    assert_eq!(exhausted.status, "True");
    assert!(
        exhausted.message.contains("max replicas (3) since"),
        "{}",
        exhausted.message
    );
    assert!(
        paused_at >= 3,
        "paused before pauseAfter (1m = 4 ticks): tick {paused_at}"
    );

    // Load falls to 80 sessions: utilization 1600 / 3000 = 0.53 < 0.8.
    let mut reopened_after = None;
    for i in 0..40 {
        let p = pool.tick(80.0);
        if p.admission.state == AdmissionState::Open {
            reopened_after = Some(i + 1);
            assert!(p.events.iter().any(|e| e.reason == "AdmissionReopened"));
            break;
        }
    }
    let ticks = reopened_after.expect("never reopened");
    // holdTime 5m = 20 ticks.
    assert!((20..=21).contains(&ticks), "reopened after {ticks} ticks");
}

#[test]
fn no_pause_while_ceiling_replicas_are_still_starting() {
    let mut pool = Pool::new(spec(1, 3));
    pool.replicas = 3;
    // Three replicas requested, two ready: over the SLO, but capacity is on its way.
    for _ in 0..20 {
        let p = pool.tick_starting(300.0, 2);
        assert_eq!(p.admission.state, AdmissionState::Open);
    }
    // Once all three are ready and it is still over, the pause comes after pauseAfter.
    for _ in 0..10 {
        pool.tick(300.0);
    }
    assert_eq!(
        pool.plans.last().expect("plan").admission.state,
        AdmissionState::PausedNewTenants
    );
}

#[test]
fn with_pause_while_scaling_new_tenants_pause_at_once_while_capacity_arrives() {
    let mut s = spec(1, 10);
    s.admission.pause_while_scaling = true;
    let mut pool = Pool::new(s);
    pool.replicas = 3;
    // Far over the SLO: the tick that orders more replicas pauses at once (no pauseAfter).
    let p = pool.tick_starting(300.0, 3);
    assert!(p.desired_replicas > 3, "{}", p.explanation);
    assert_eq!(
        p.admission.state,
        AdmissionState::PausedNewTenants,
        "{}",
        p.admission.reason
    );
    assert_eq!(p.admission.paused_tiers, vec!["free".to_string()]);
    assert!(
        p.admission.reason.contains("still starting"),
        "{}",
        p.admission.reason
    );
    let c = p
        .conditions
        .iter()
        .find(|c| c.type_ == types::CAPACITY_EXHAUSTED)
        .expect("condition");
    assert_eq!((c.status, c.reason), ("True", reasons::SCALING_UP_OVER_SLO));
    assert!(p.events.iter().any(|e| e.reason == "NewTenantsPaused"));
    pool.replicas = p.desired_replicas;
    // Still starting a minute later: still paused, now the next tier too (pauseAfter).
    for _ in 0..4 {
        let p = pool.tick_starting(300.0, 3);
        assert_eq!(p.admission.state, AdmissionState::PausedNewTenants);
    }
    // The replicas are ready and the load fits them: reopened after holdTime, not before.
    let mut reopened = None;
    for i in 0..30 {
        let p = pool.tick(100.0);
        if p.admission.state == AdmissionState::Open {
            reopened = Some(i + 1);
            break;
        }
    }
    let ticks = reopened.expect("never reopened");
    assert!((20..=21).contains(&ticks), "reopened after {ticks} ticks");
}

#[test]
fn without_pause_while_scaling_arriving_capacity_pauses_nobody() {
    let mut pool = Pool::new(spec(1, 10));
    pool.replicas = 6;
    for _ in 0..10 {
        let p = pool.tick_starting(300.0, 3);
        assert_eq!(p.admission.state, AdmissionState::Open);
        let c = p
            .conditions
            .iter()
            .find(|c| c.type_ == types::CAPACITY_EXHAUSTED)
            .expect("condition");
        assert_eq!(c.status, "False");
    }
}

#[test]
fn the_equilibrium_requirement_holds_still_when_scaling_changes_the_sessions_seen() {
    // The same traffic read at 4 replicas and at 6: fewer replicas run larger, slower
    // batches, so more sessions are open at once; the requirement is the same.
    let at = |replicas: i32| {
        let mut pool = Pool::new(spec(1, 20));
        pool.replicas = replicas;
        let steps = 4.0 * 45.0 / LINE.itl(45.0);
        let per = steps / f64::from(replicas);
        // k solving k = per × ITL(k).
        let k = per * LINE.base_seconds / (1.0 - per * LINE.per_sequence_seconds);
        for _ in 0..30 {
            pool.tick_starting(k * f64::from(replicas), replicas);
        }
        let p = pool.tick_starting(k * f64::from(replicas), replicas);
        let m = p.measured.expect("m");
        m.demand.replicas_for(m.pod.line, 35.0, true)
    };
    let (four, six) = (at(4), at(6));
    assert!((four - six).abs() < 0.15, "{four} vs {six}");
}

#[test]
fn replicas_that_never_become_ready_stop_holding_back_the_pause() {
    // A pool whose pods start within 5 minutes (engine.startupGracePeriod; default 15m).
    let mut s = spec(1, 3);
    s.engine.startup_grace_period = std::time::Duration::from_secs(300).into();
    let mut pool = Pool::new(s);
    pool.replicas = 3;
    // Three replicas requested, one never becomes ready (no GPU left to schedule it).
    let grace_ms = pool.spec.engine.startup_grace_period.as_std().as_millis() as u64;
    let grace_ticks = (grace_ms / TICK) as usize;
    let mut warnings = 0;
    let mut paused_at = None;
    for i in 0..grace_ticks + 10 {
        let p = pool.tick_starting(300.0, 2);
        warnings += p
            .events
            .iter()
            .filter(|e| e.reason == "ReplicasNotReady" && e.kind == EventKind::Warning)
            .count();
        if p.admission.state == AdmissionState::PausedNewTenants && paused_at.is_none() {
            paused_at = Some(i);
        }
    }
    let paused_at = paused_at.expect("never paused");
    // Not before the grace (5 min = 20 ticks) and pauseAfter (1 min = 4 ticks) have passed.
    assert!(
        (grace_ticks + 3..=grace_ticks + 5).contains(&paused_at),
        "paused at tick {paused_at}"
    );
    assert_eq!(warnings, 1, "one warning per stretch");
}

#[test]
fn load_between_thresholds_keeps_the_pause() {
    let mut pool = Pool::new(spec(1, 3));
    for _ in 0..10 {
        pool.tick(300.0);
    }
    assert_eq!(
        pool.plans.last().expect("plan").admission.state,
        AdmissionState::PausedNewTenants
    );
    // 130 sessions ⇒ 2600 / 3000 = 0.87: between resume (0.8) and pause (0.95).
    for _ in 0..60 {
        let p = pool.tick(130.0);
        assert_eq!(p.admission.state, AdmissionState::PausedNewTenants);
    }
}

#[test]
fn a_prometheus_outage_causes_no_scale_down_and_no_pause() {
    let mut pool = Pool::new(spec(1, 3));
    for _ in 0..10 {
        pool.tick(130.0);
    }
    let before = pool.replicas;
    pool.prometheus_up = false;
    for _ in 0..60 {
        let p = pool.tick(0.0);
        assert_eq!(p.replicas, before);
        assert_eq!(p.admission.state, AdmissionState::Open);
        let m = p
            .conditions
            .iter()
            .find(|c| c.type_ == "MetricsAvailable")
            .expect("condition");
        assert_eq!((m.status, m.reason), ("False", "MetricsUnreachable"));
    }
    assert_eq!(
        pool.plans
            .iter()
            .filter(|p| p.events.iter().any(|e| e.reason == "MetricsUnavailable"))
            .count(),
        1
    );
    pool.prometheus_up = true;
    let p = pool.tick(130.0);
    let m = p
        .conditions
        .iter()
        .find(|c| c.type_ == "MetricsAvailable")
        .expect("condition");
    assert_eq!(m.status, "True");
}

#[test]
fn after_an_outage_scale_down_waits_a_full_stabilization_window() {
    let mut pool = Pool::new(spec(1, 20));
    for _ in 0..20 {
        pool.tick(200.0);
    }
    let high = pool.replicas;
    // Load drops while Prometheus is down for 10 minutes.
    pool.prometheus_up = false;
    for _ in 0..40 {
        pool.tick(20.0);
    }
    pool.prometheus_up = true;
    // The first fresh samples must not scale down at once: the 5-minute window restarts.
    for i in 0..19 {
        let p = pool.tick(20.0);
        assert_eq!(
            p.replicas,
            high,
            "scaled down {} ticks after the outage",
            i + 1
        );
    }
    for _ in 0..30 {
        pool.tick(20.0);
    }
    assert!(pool.replicas < high);
}

#[test]
fn an_outage_while_paused_keeps_the_pause_without_escalating() {
    let mut pool = Pool::new(spec(1, 3));
    for _ in 0..6 {
        pool.tick(300.0);
    }
    let paused = pool.plans.last().expect("plan").admission.clone();
    assert_eq!(paused.state, AdmissionState::PausedNewTenants);
    pool.prometheus_up = false;
    for _ in 0..40 {
        let p = pool.tick(0.0);
        assert_eq!(p.admission.paused_tiers, paused.paused_tiers);
        assert_eq!(p.replicas, 3);
    }
}

#[test]
fn advisory_mode_never_changes_replicas_or_admission() {
    let mut s = spec(1, 3);
    s.scaling.mode = ScalingMode::Advisory;
    let mut pool = Pool::new(s);
    for i in 0..100 {
        let p = pool.tick(if i < 50 { 300.0 } else { 0.0 });
        assert_eq!(p.replicas, 1);
        assert_eq!(p.admission.state, AdmissionState::Open);
    }
    assert!(
        pool.plans.iter().any(|p| p.desired_replicas == 3),
        "never recommended scaling up"
    );
    assert!(
        pool.plans
            .iter()
            .any(|p| p.events.iter().any(|e| e.reason == "ScalingRecommended"))
    );
}

#[test]
fn manual_mode_holds_the_scaled_count() {
    let mut s = spec(1, 8);
    s.scaling.mode = ScalingMode::Manual;
    s.replicas.manual = Some(5);
    let mut pool = Pool::new(s);
    for _ in 0..10 {
        assert_eq!(pool.tick(1000.0).replicas, 5);
    }
}

#[test]
fn the_gpu_budget_lowers_the_ceiling() {
    let mut s = spec(1, 10);
    s.engine.resources.gpus = 2;
    s.gpu_budget = Some(6);
    assert_eq!(ceiling(&s), 3);
    let mut pool = Pool::new(s);
    for _ in 0..20 {
        pool.tick(1000.0);
    }
    assert_eq!(pool.replicas, 3);
    let c = pool
        .plans
        .last()
        .expect("plan")
        .conditions
        .iter()
        .find(|c| c.type_ == "CapacityExhausted")
        .cloned()
        .expect("c");
    assert!(c.message.contains("GPU budget"), "{}", c.message);
}

#[test]
fn without_pausable_tiers_nothing_is_paused_but_exhaustion_is_reported() {
    let mut pool = Pool::new(spec(1, 2));
    pool.tiers = TierPolicySpec::single_default();
    for _ in 0..20 {
        let p = pool.tick(500.0);
        assert_eq!(p.admission.state, AdmissionState::Open);
    }
    let c = pool
        .plans
        .last()
        .expect("plan")
        .conditions
        .iter()
        .find(|c| c.type_ == "CapacityExhausted")
        .cloned()
        .expect("c");
    assert_eq!(c.status, "True");
}

#[test]
fn the_pod_model_is_learned_from_the_engines_latency() {
    // A hint far off (300 tok/s at full batch): the engines' latency corrects it.
    let mut s = spec(1, 3);
    s.scaling.capacity_hint_tokens_per_second = Some(300.0);
    let mut pool = Pool::new(s);
    for i in 0..40 {
        pool.tick(60.0 + f64::from(i % 9) * 10.0);
    }
    let m = pool
        .plans
        .last()
        .and_then(|p| p.measured.clone())
        .expect("measured");
    assert!(
        (m.pod.line.itl(40.0) - LINE.itl(40.0)).abs() < 0.002,
        "{:?}",
        m.pod
    );
    assert!((m.pod.sessions - 50.0).abs() < 8.0, "k* {:?}", m.pod);
    assert!(
        (m.pod.capacity_tokens_per_second - POD_CAPACITY).abs() < 120.0,
        "{m:?}"
    );
}

#[test]
fn conditions_keep_their_transition_time_while_status_holds() {
    let planned = vec![ConditionPlan {
        type_: "Ready",
        status: "True",
        reason: "AllReplicasReady",
        message: "1/1".into(),
    }];
    let first = merge_conditions(&[], &planned, 1_000_000, Some(1));
    let second = merge_conditions(&first, &planned, 2_000_000, Some(2));
    assert_eq!(
        first[0].last_transition_time,
        second[0].last_transition_time
    );
    assert_eq!(second[0].observed_generation, Some(2));
    let flipped = vec![ConditionPlan {
        status: "False",
        ..planned[0].clone()
    }];
    let third = merge_conditions(&second, &flipped, 3_000_000, Some(2));
    assert_ne!(
        third[0].last_transition_time,
        second[0].last_transition_time
    );
}

#[test]
fn stale_metrics_are_treated_as_missing() {
    let mut pool = Pool::new(spec(1, 5));
    for _ in 0..5 {
        pool.tick(100.0);
    }
    let before = pool.replicas;
    pool.now += 10 * 60_000;
    let obs = Observation {
        now: pool.now,
        current_replicas: before,
        ready_replicas: before,
        metrics: Ok(PoolMetrics {
            sampled_at: pool.now - 5 * 60_000,
            pods_reporting: 1,
            ..Default::default()
        }),
        held_requests: 0,
        router_queued: 0,
    };
    let p = super::plan(&pool.spec, Some(&pool.tiers), &obs, &mut pool.state);
    assert_eq!(p.replicas, before);
    let m = p
        .conditions
        .iter()
        .find(|c| c.type_ == "MetricsAvailable")
        .expect("condition");
    assert_eq!(m.reason, "MetricsStale");
}

#[test]
fn a_new_pool_s_first_replicas_are_explained_as_the_floor() {
    let mut state = PlanState::default();
    let obs = Observation {
        now: 1_000,
        current_replicas: 0,
        ready_replicas: 0,
        metrics: Err(MetricsProblem::NoData(
            "no engine replicas to scrape".into(),
        )),
        held_requests: 0,
        router_queued: 0,
    };
    let p = super::plan(&spec(2, 5), Some(&tiers()), &obs, &mut state);
    assert_eq!(p.desired_replicas, 2);
    let d = p.decision.expect("a decision");
    assert!(
        d.reason == "raised to replicas.min 2 (no metrics yet)",
        "{}",
        d.reason
    );
}

#[test]
fn held_requests_scale_an_empty_pool_from_zero_and_nothing_else_does() {
    let obs = |held| Observation {
        now: 1_000,
        current_replicas: 0,
        ready_replicas: 0,
        metrics: Err(MetricsProblem::NoData(
            "no engine replicas to scrape".into(),
        )),
        held_requests: held,
        router_queued: 0,
    };
    let mut state = PlanState::default();
    let idle = super::plan(&spec(0, 5), Some(&tiers()), &obs(0), &mut state);
    assert_eq!(idle.replicas, 0, "no demand, no replica");
    let mut state = PlanState::default();
    let p = super::plan(&spec(0, 5), Some(&tiers()), &obs(3), &mut state);
    assert_eq!(p.replicas, 1);
    let d = p.decision.expect("a decision");
    assert_eq!(d.basis, Basis::ScaleFromZero, "{}", d.reason);
}

#[test]
fn a_pool_asking_more_gpus_per_pod_than_the_engine_uses_says_so() {
    let condition = |gpus: i32| {
        let mut s = spec(1, 10);
        s.engine.resources.gpus = gpus;
        let mut pool = Pool::new(s);
        let p = pool.tick(100.0);
        p.conditions
            .iter()
            .find(|c| c.type_ == types::RESOURCES_USED)
            .cloned()
            .expect("ResourcesUsed planned")
    };
    let c = condition(4);
    assert_eq!((c.status, c.reason), ("False", reasons::GPUS_IDLE));
    assert!(
        c.message.contains("gpus is 4")
            && c.message.contains("3 GPU(s) of every pod")
            && c.message.contains("up to 30 at replicas.max 10")
            && c.message.contains("set engine.resources.gpus to 1"),
        "{}",
        c.message
    );
    for gpus in [0, 1] {
        let c = condition(gpus);
        assert_eq!((c.status, c.reason), ("True", reasons::ALL_RESOURCES_USED));
    }
}

#[test]
fn requests_queued_at_the_routers_count_as_backlog_once_the_engines_are_full() {
    let mut pool = Pool::new(spec(1, 20));
    pool.replicas = 4;
    // Warm the pod model on a load that fills the engines' batches and nothing more.
    let full = 4.0 * (POD_CAPACITY / R).min(f64::from(pool.spec.engine.max_batch_size));
    for _ in 0..10 {
        pool.tick(full);
        pool.replicas = 4;
    }
    let decide = |router_queued: u64| {
        let mut state = pool.state.clone();
        let obs = Observation {
            now: pool.now + TICK,
            current_replicas: 4,
            ready_replicas: 4,
            metrics: pool.metrics(full),
            held_requests: 0,
            router_queued,
        };
        let plan = super::plan(&pool.spec, Some(&pool.tiers), &obs, &mut state);
        let utilization = plan.measured.as_ref().expect("measured").utilization;
        (plan.replicas, utilization)
    };
    let (quiet, quiet_util) = decide(0);
    let (queued, queued_util) = decide(200);
    assert!(
        queued > quiet,
        "{queued} replicas with 200 queued at the routers, {quiet} without"
    );
    assert!(
        queued_util > quiet_util + 1.0,
        "{queued_util} vs {quiet_util}"
    );
}

/// What a run with pods that are ready `startup` after they are ordered gave.
struct Ahead {
    /// Decisions taken on `basis`, after `counted_from` ticks...
    on_basis: usize,
    /// ...and the first one's reason.
    reason: Option<String>,
    /// Ticks with fewer ready replicas than the demand needs at the target, after it.
    late_ticks: usize,
    last: Plan,
}

/// Runs `ticks` ticks of `sessions(now)` (from midnight UTC, on `start` ready replicas) with
/// start-ups of `startup`, counting from tick `counted_from`.
fn run_ahead(
    mode: ForecastMode,
    start: i32,
    sessions: impl Fn(Millis) -> f64,
    ticks: u64,
    counted_from: u64,
    startup: Millis,
    basis: Basis,
) -> Ahead {
    const DAY: Millis = 86_400_000;
    let mut s = spec(1, 100);
    s.scaling.forecast = mode;
    let mut pool = Pool::new(s);
    pool.now -= pool.now % DAY;
    pool.replicas = start;
    // (ready at, replicas): pods ordered become ready `startup` later.
    let mut arriving: Vec<(Millis, i32)> = Vec::new();
    let (mut ready, mut on_basis, mut late_ticks, mut reason) = (pool.replicas, 0, 0, None);
    for i in 0..ticks {
        pool.now += TICK;
        arriving.retain(|&(at, n)| {
            if at <= pool.now {
                ready = ready.max(n);
            }
            at > pool.now
        });
        ready = ready.min(pool.replicas);
        let obs = Observation {
            now: pool.now,
            current_replicas: pool.replicas,
            ready_replicas: ready,
            metrics: pool.metrics(sessions(pool.now)),
            held_requests: 0,
            router_queued: 0,
        };
        let plan = super::plan(&pool.spec, Some(&pool.tiers), &obs, &mut pool.state);
        if plan.replicas > pool.replicas {
            arriving.push((pool.now + startup, plan.replicas));
        }
        pool.replicas = plan.replicas;
        let needed = (sessions(pool.now) / (0.7 * 50.0)).ceil() as i32;
        if i >= counted_from {
            if let Some(d) = plan.decision.as_ref().filter(|d| d.basis == basis) {
                on_basis += 1;
                reason.get_or_insert_with(|| d.reason.clone());
            }
            late_ticks += (ready < needed) as usize;
        }
        pool.plans.push(plan);
    }
    let last = pool.plans.pop().expect("ticked");
    Ahead {
        on_basis,
        reason,
        late_ticks,
        last,
    }
}

/// Two days with a business-hours jump (200 → 1000 sessions over 20 minutes at 09:00, back at
/// 18:00) and pods that take 6 minutes to be ready: on the second day, in Auto, the planner
/// orders ahead of the jump and says so; in Off the same ticks react to the demand now.
#[test]
fn the_second_day_of_a_steep_morning_is_planned_ahead() {
    const DAY: Millis = 86_400_000;
    fn sessions(now: Millis) -> f64 {
        let h = (now % DAY) as f64 / 3_600_000.0;
        let ramp = ((h - 9.0) * 3.0).clamp(0.0, 1.0) * (1.0 - ((h - 18.0) * 3.0).clamp(0.0, 1.0));
        200.0 + 800.0 * ramp
    }
    let run = |mode| {
        run_ahead(
            mode,
            1,
            sessions,
            2 * DAY / TICK,
            DAY / TICK,
            6 * 60_000,
            Basis::Forecast,
        )
    };
    let auto = run(ForecastMode::Auto);
    let forecast = auto.last.forecast.expect("metrics were fresh");
    assert_eq!(forecast.standing, Standing::InUse, "{forecast:?}");
    assert!(forecast.lead_time_measured);
    assert!(forecast.next_hour_peak_replicas.is_some());
    assert!(auto.on_basis > 0, "no scale-up was early for the forecast");
    let off = run(ForecastMode::Off);
    assert_eq!(off.on_basis, 0);
    let last_off = off.last.forecast.expect("fresh");
    assert_eq!(last_off.standing, Standing::Off);
    assert_eq!(last_off.with_auto, Standing::InUse, "Off still learns");
    // Ahead of the jump: fewer ticks short of ready replicas on the second day.
    assert!(
        auto.late_ticks < off.late_ticks,
        "short {} ticks in Auto, {} in Off",
        auto.late_ticks,
        off.late_ticks
    );
}

/// A pool's first hour: 200 sessions, then from minute 10 a climb to 1000 over 15 minutes,
/// pods ready 2 minutes after they are ordered. No profile covers the hour (the forecast is
/// learning), so in Auto the rising trend orders ahead of the climb and says so; Off reacts.
#[test]
fn a_first_day_climb_is_ordered_ahead_of_by_its_trend() {
    fn sessions(now: Millis) -> f64 {
        let min = (now % 86_400_000) as f64 / 60_000.0;
        200.0 + 800.0 * ((min - 10.0) / 15.0).clamp(0.0, 1.0)
    }
    let run = |mode| run_ahead(mode, 6, sessions, 40 * 4, 0, 2 * 60_000, Basis::Trend);
    let auto = run(ForecastMode::Auto);
    let f = auto.last.forecast.as_ref().expect("fresh");
    assert_eq!(f.standing, Standing::Learning, "{f:?}");
    assert!(auto.on_basis > 0, "no scale-up was early for the trend");
    let reason = auto.reason.as_deref().unwrap_or_default();
    assert!(reason.contains("early for the rising demand"), "{reason}");
    let off = run(ForecastMode::Off);
    assert_eq!(off.on_basis, 0, "Off never orders for a trend");
    assert!(
        auto.late_ticks < off.late_ticks,
        "short {} ticks in Auto, {} in Off",
        auto.late_ticks,
        off.late_ticks
    );
    // Once the climb is over the trend is gone: nothing rises in the last ten minutes.
    assert_eq!(f.trend, None, "{f:?}");
}

/// A steady load with ±10% noise for an hour on a pool sized for it, in Auto with no
/// profile: the noise is never read as a rising trend.
#[test]
fn noise_on_a_steady_load_is_not_a_trend() {
    fn sessions(now: Millis) -> f64 {
        // Fixed pseudo-random noise, ±10% around 600.
        let x = (now / TICK).wrapping_mul(2_654_435_761) % 1000;
        600.0 * (0.9 + 0.2 * x as f64 / 1000.0)
    }
    let auto = run_ahead(
        ForecastMode::Auto,
        18,
        sessions,
        60 * 4,
        0,
        2 * 60_000,
        Basis::Trend,
    );
    assert_eq!(auto.on_basis, 0, "noise ordered replicas as a trend");
}

/// Ten minutes at 1000 sessions, then a descent to 200 over 16 minutes: in Auto the clear
/// fall shortens the scale-down window to 2 minutes and the pool follows the demand down
/// sooner than in Off, which waits out its 5; neither ever holds fewer replicas than the
/// demand needs at the target.
#[test]
fn a_clear_descent_is_followed_down_sooner_in_auto() {
    let sessions = |i: u64| 1000.0 - 800.0 * ((i as f64 - 40.0) / 64.0).clamp(0.0, 1.0);
    let run = |mode| {
        let mut s = spec(1, 100);
        s.scaling.forecast = mode;
        let mut pool = Pool::new(s);
        pool.replicas = 30;
        let (mut replica_ticks, mut reason) = (0, None::<String>);
        for i in 0..140 {
            let p = pool.tick(sessions(i));
            let needed = (sessions(i) / (0.7 * 50.0)).ceil() as i32;
            assert!(p.replicas >= needed, "{mode:?} tick {i}: {}", p.explanation);
            if i >= 40 {
                replica_ticks += p.replicas;
            }
            if p.explanation.contains("scale-down window") {
                reason.get_or_insert_with(|| p.explanation.clone());
            }
        }
        (replica_ticks, reason)
    };
    let (auto, why) = run(ForecastMode::Auto);
    let (off, none) = run(ForecastMode::Off);
    assert!(
        auto < off,
        "replica-ticks in the descent: Auto {auto}, Off {off}"
    );
    let why = why.expect("Auto says why it scaled down early");
    assert!(why.contains("scale-down window 2m (not 5m)"), "{why}");
    assert_eq!(none, None, "Off keeps its window");
}

#[test]
fn basis_names_are_distinct_and_fit_the_schema() {
    let names: Vec<&str> = Basis::ALL.iter().map(|b| b.name()).collect();
    for (i, n) in names.iter().enumerate() {
        assert!(!names[..i].contains(n), "{n} twice");
        assert!(n.len() <= 32, "{n}");
        assert_eq!(
            format!("{:?}", Basis::ALL[i]),
            *n,
            "names follow the variants"
        );
    }
}

#[test]
fn decisions_say_what_they_rest_on() {
    let basis = |p: &Plan| p.decision.as_ref().map(|d| d.basis);
    // Below the floor: lifted to replicas.min.
    let mut pool = Pool::new(spec(2, 4));
    assert_eq!(basis(pool.tick(0.0)), Some(Basis::Floor));
    // Demand beyond the ceiling: cut to it.
    let mut pool = Pool::new(spec(1, 2));
    assert_eq!(basis(pool.tick(500.0)), Some(Basis::Ceiling));
    // Demand within the bounds: the demand now.
    let mut pool = Pool::new(spec(1, 20));
    assert_eq!(basis(pool.tick(100.0)), Some(Basis::Demand));
    // Manual mode: replicas.manual.
    let mut manual = spec(1, 10);
    manual.scaling.mode = ScalingMode::Manual;
    manual.replicas.manual = Some(5);
    let mut pool = Pool::new(manual);
    assert_eq!(basis(pool.tick(0.0)), Some(Basis::Manual));
}
