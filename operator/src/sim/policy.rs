//! The scaling policies compared: tidegate (the operator's own planner, with its admission
//! pause wired into the simulated engines' gate), HPA on a utilization target, KEDA on queue
//! length, and an oracle with perfect foresight of the arrival rate.
//!
//! Baselines follow the Kubernetes HPA replica calculator and default behaviour: 15 s sync,
//! 10% tolerance, scale up at once by at most max(100%, 4 pods) per sync, scale down to the
//! highest recommendation of the last 300 s. For a per-pod metric, pods without a sample
//! (still starting) count as 0 when scaling up and as the target when scaling down, as the
//! HPA does. KEDA's Prometheus scaler feeds an HPA an external metric with an AverageValue
//! target, so desired = ceil(total waiting ÷ threshold). Missing metrics: every policy holds.
//!
//! tidegate runs the driver's own steps after observing: `plan`, then `decide` (the replica
//! action the cluster's driver carries out); the simulated pool's drain is immediate (its
//! draining pods leave the count at once and finish their work), so a scale-down's victims
//! answer Drained on the tick that chose them.
//!
//! Invariants: policies see the pool only through the metrics pipeline (the oracle excepted,
//! which reads the trace's expected rate); every result lies within [min, max].

use std::collections::VecDeque;

use serde::Serialize;
use tidegate_api::engine_admin::DrainState;
use tidegate_api::{InferencePoolSpec, TierPolicySpec};

use crate::driver::decide::{self, ActionMemory, DecideInput, DrainAnswer, ReplicaAction};
use crate::plan::{self, Forecaster, LeadTime, Observation, PlanState};
use crate::ports::{Endpoint, WorkloadState};

use super::arrivals::Foresight;
use super::metrics::Pipeline;
use super::pool::{PodState, Pool};
use super::tenants::{NTIERS, TIERS};

/// Which policy drives the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    Tidegate,
    /// HPA on GPU utilization (pod decode throughput ÷ its saturated throughput).
    HpaGpu,
    /// HPA on batch (KV slot) occupancy: running ÷ max batch.
    HpaKv,
    /// KEDA on queue length (num_requests_waiting per pod).
    Keda,
    Oracle,
    /// The oracle without foresight: the trace's expected rate now, with no scrape or rate
    /// window delay. No policy that reacts to the present can do better at its occupancy:
    /// the bound for what a reactive planner can reach.
    OracleNow,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Tidegate,
        PolicyKind::HpaGpu,
        PolicyKind::HpaKv,
        PolicyKind::Keda,
        PolicyKind::Oracle,
        PolicyKind::OracleNow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Tidegate => "tidegate",
            PolicyKind::HpaGpu => "hpa-gpu-util",
            PolicyKind::HpaKv => "hpa-kv-util",
            PolicyKind::Keda => "keda-queue",
            PolicyKind::Oracle => "oracle",
            PolicyKind::OracleNow => "oracle-now",
        }
    }
}

/// What a controller decided this tick.
#[derive(Clone, Debug, PartialEq)]
pub struct Action {
    pub replicas: i32,
    pub paused: [bool; NTIERS],
}

/// Inputs a controller may read.
pub struct Ctx<'a> {
    /// Simulation time, for the metrics pipeline.
    pub now_us: u64,
    /// Time since the trace's start, for the oracle's foresight.
    pub trace_now_s: f64,
    pub pool: &'a Pool,
    pub pipeline: &'a Pipeline,
    pub trace: &'a dyn Foresight,
    /// Mean work per request (decode-step equivalents) of the requests generated so far:
    /// part of what the oracle knows.
    pub work_per_request: f64,
    /// Requests per session start (follow-up turns included), for the oracle.
    pub requests_per_session: f64,
    pub min: i32,
    pub max: i32,
}

#[derive(Clone, Copy, Debug)]
enum HpaMetric {
    GpuUtilization { saturated_tokens_per_second: f64 },
    BatchOccupancy { max_batch: f64 },
    QueueLength,
}

#[derive(Debug)]
pub struct Hpa {
    metric: HpaMetric,
    target: f64,
    tolerance: f64,
    down_window_us: u64,
    recs: VecDeque<(u64, i32)>,
}

impl Hpa {
    fn raw(&self, ctx: &Ctx<'_>) -> Option<i32> {
        let current = ctx.pool.current();
        let per_pod = |values: Vec<f64>| -> Option<i32> {
            if values.is_empty() {
                return None;
            }
            let count = values.len() as f64;
            let sum: f64 = values.iter().sum();
            let missing = f64::from((current - values.len() as i32).max(0));
            let ratio = sum / count / self.target;
            if missing > 0.0 {
                let total = count + missing;
                let new_ratio = if ratio > 1.0 {
                    sum / (total * self.target)
                } else {
                    (sum + missing * self.target) / (total * self.target)
                };
                if (new_ratio - 1.0).abs() <= self.tolerance
                    || (ratio > 1.0 && new_ratio < 1.0)
                    || (ratio < 1.0 && new_ratio > 1.0)
                {
                    return Some(current);
                }
                return Some((new_ratio * total).ceil() as i32);
            }
            if (ratio - 1.0).abs() <= self.tolerance {
                return Some(current);
            }
            Some((ratio * count).ceil() as i32)
        };
        match self.metric {
            HpaMetric::GpuUtilization {
                saturated_tokens_per_second,
            } => {
                let rates = ctx.pipeline.pod_rates(ctx.pool, ctx.now_us).ok()?;
                per_pod(
                    rates
                        .into_iter()
                        .map(|r| r / saturated_tokens_per_second)
                        .collect(),
                )
            }
            HpaMetric::BatchOccupancy { max_batch } => {
                let running = ctx.pipeline.pod_running(ctx.pool, ctx.now_us).ok()?;
                per_pod(running.into_iter().map(|r| r / max_batch).collect())
            }
            HpaMetric::QueueLength => {
                let total = ctx.pipeline.waiting(ctx.now_us).ok()?;
                let ratio = total / (self.target * f64::from(current.max(1)));
                if (ratio - 1.0).abs() <= self.tolerance {
                    return Some(current);
                }
                Some((total / self.target).ceil() as i32)
            }
        }
    }

    fn tick(&mut self, ctx: &Ctx<'_>) -> i32 {
        let current = ctx.pool.current();
        let Some(raw) = self.raw(ctx) else {
            return current;
        };
        let raw = raw.clamp(ctx.min, ctx.max);
        self.recs.push_back((ctx.now_us, raw));
        while self
            .recs
            .front()
            .is_some_and(|(t, _)| ctx.now_us.saturating_sub(*t) > self.down_window_us)
        {
            self.recs.pop_front();
        }
        let next = if raw > current {
            raw.min((current * 2).max(current + 4))
        } else if raw < current {
            let stabilized = self.recs.iter().map(|(_, r)| *r).max().unwrap_or(raw);
            stabilized.min(current)
        } else {
            current
        };
        next.clamp(ctx.min, ctx.max)
    }
}

/// A controller with its state.
pub enum Controller {
    Tidegate {
        spec: Box<InferencePoolSpec>,
        tiers: Box<TierPolicySpec>,
        state: Box<PlanState>,
        /// What the decision step remembers of its own actions (drains under way).
        actions: Box<ActionMemory>,
    },
    Hpa(Hpa),
    Oracle {
        occupancy: f64,
        horizon_s: f64,
        max_batch: f64,
    },
}

/// The pool as the driver's decision step sees a workload: one endpoint per pod that counts
/// (starting or ready), named in pod order.
fn workload_of(pool: &Pool) -> WorkloadState {
    let endpoints = (pool.pods.iter().enumerate())
        .filter(|(_, p)| matches!(p.state, PodState::Starting | PodState::Ready))
        .map(|(i, p)| Endpoint {
            name: format!("pod-{i:05}"),
            api_url: String::new(),
            admin_url: String::new(),
            ready: p.state == PodState::Ready,
        })
        .collect();
    WorkloadState {
        replicas: Some(pool.current()),
        ready_replicas: pool.ready(),
        endpoints,
        routers: Vec::new(),
        selector: String::new(),
        model_problem: None,
    }
}

/// The count `decide` applies this tick for the plan's `target`: a scale-up at once, a
/// scale-down once its victims drained (here: at once, see the module header). Which pods
/// leave is the simulated pool's choice (`Pool::scale_to`).
fn decided_replicas(
    spec: &InferencePoolSpec,
    target: i32,
    pool: &Pool,
    now: plan::Millis,
    memory: &mut ActionMemory,
) -> i32 {
    let workload = workload_of(pool);
    let actions = decide::decide(&DecideInput {
        spec,
        target,
        workload: &workload,
        memory,
        generation: Some(1),
        now,
    });
    memory.draining = actions.draining;
    memory.applied_generation = Some(1);
    match actions.replicas {
        ReplicaAction::Hold => pool.current(),
        ReplicaAction::Apply { replicas } => replicas,
        ReplicaAction::RemoveWhenDrained { to, victims } => {
            let answers = vec![DrainAnswer::Answered(DrainState::Drained); victims.len()];
            if decide::removal_due(&victims, &answers) {
                memory.draining.clear();
                to
            } else {
                pool.current()
            }
        }
    }
}

/// What tidegate's planner carries from one day to the next: the forecast's profile and
/// error and the measured lead time, in the form the operator keeps in status, so the
/// simulator restores it the way an operator restart does.
#[derive(Clone, Debug, Default)]
pub struct PlanMemory {
    pub history: String,
    pub recent_error: Option<f64>,
    pub lead_ms: Option<u64>,
}

impl PlanMemory {
    fn of(state: &PlanState) -> PlanMemory {
        PlanMemory {
            history: state.forecast.history(),
            recent_error: state.forecast.recent_error(),
            lead_ms: state
                .lead_time
                .measured()
                .then(|| state.lead_time.estimate_ms(u64::MAX)),
        }
    }

    fn restore(&self) -> PlanState {
        PlanState {
            forecast: Forecaster::restored(&self.history, self.recent_error, 0),
            lead_time: self.lead_ms.map(LeadTime::restored).unwrap_or_default(),
            ..PlanState::default()
        }
    }
}

/// Baseline settings, as users configure them.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct BaselineSettings {
    pub hpa_target_utilization: f64,
    pub keda_waiting_per_pod: f64,
    pub oracle_occupancy: f64,
}

impl Controller {
    pub fn new(
        kind: PolicyKind,
        spec: &InferencePoolSpec,
        tiers: &TierPolicySpec,
        pool: &Pool,
        b: BaselineSettings,
        startup_max_s: f64,
        memory: Option<&PlanMemory>,
    ) -> Self {
        let hpa = |metric, target| {
            Controller::Hpa(Hpa {
                metric,
                target,
                tolerance: 0.1,
                down_window_us: 300_000_000,
                recs: VecDeque::new(),
            })
        };
        match kind {
            PolicyKind::Tidegate => Controller::Tidegate {
                spec: Box::new(spec.clone()),
                tiers: Box::new(tiers.clone()),
                state: Box::new(memory.map(PlanMemory::restore).unwrap_or_default()),
                actions: Box::default(),
            },
            PolicyKind::HpaGpu => hpa(
                HpaMetric::GpuUtilization {
                    saturated_tokens_per_second: pool.model.saturated_tokens_per_second(),
                },
                b.hpa_target_utilization,
            ),
            PolicyKind::HpaKv => hpa(
                HpaMetric::BatchOccupancy {
                    max_batch: f64::from(pool.model.max_batch),
                },
                b.hpa_target_utilization,
            ),
            PolicyKind::Keda => hpa(HpaMetric::QueueLength, b.keda_waiting_per_pod),
            PolicyKind::Oracle | PolicyKind::OracleNow => Controller::Oracle {
                occupancy: b.oracle_occupancy,
                horizon_s: if kind == PolicyKind::Oracle {
                    startup_max_s
                } else {
                    0.0
                },
                max_batch: f64::from(pool.model.max_batch),
            },
        }
    }

    /// What tidegate's planner would carry into the next day (None for other policies).
    pub fn memory(&self) -> Option<PlanMemory> {
        match self {
            Controller::Tidegate { state, .. } => Some(PlanMemory::of(state)),
            _ => None,
        }
    }

    /// One control tick.
    pub fn tick(&mut self, ctx: &Ctx<'_>) -> Action {
        match self {
            Controller::Tidegate {
                spec,
                tiers,
                state,
                actions,
            } => {
                let obs = Observation {
                    now: ctx.now_us / 1000,
                    current_replicas: ctx.pool.current(),
                    ready_replicas: ctx.pool.ready(),
                    metrics: ctx.pipeline.query(ctx.pool, ctx.now_us),
                    held_requests: 0,
                    router_queued: 0,
                };
                let p = plan::plan(spec, Some(tiers), &obs, state);
                let mut paused = [false; NTIERS];
                for t in &p.admission.paused_tiers {
                    if let Some(i) = TIERS.iter().position(|n| n == t) {
                        paused[i] = true;
                    }
                }
                let now = ctx.now_us / 1000;
                Action {
                    replicas: decided_replicas(spec, p.replicas, ctx.pool, now, actions),
                    paused,
                }
            }
            Controller::Hpa(h) => Action {
                replicas: h.tick(ctx),
                paused: [false; NTIERS],
            },
            Controller::Oracle {
                occupancy,
                horizon_s,
                max_batch,
            } => {
                let now = ctx.trace_now_s;
                let need = |t: f64| {
                    let rate = ctx.trace.expected_base_rate(t) * ctx.requests_per_session;
                    // Sessions per pod at this occupancy, each taking work × itl(batch) seconds.
                    let batch = *max_batch * *occupancy;
                    let slot_s = ctx.work_per_request * ctx.pool.model.itl(batch.ceil() as u32);
                    (rate * slot_s / batch).ceil()
                };
                let steps = (*horizon_s / 30.0).ceil() as usize;
                let want = (0..=steps)
                    .map(|i| need(now + 30.0 * i as f64))
                    .fold(0.0, f64::max);
                Action {
                    replicas: (want as i32).clamp(ctx.min, ctx.max),
                    paused: [false; NTIERS],
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::trace::{Trace, TraceKind};
    use crate::sim::{SimConfig, pool_spec};

    #[test]
    fn the_plans_target_goes_through_decide_and_a_scale_down_drains_at_once() {
        let cfg = SimConfig::new(1, 1.0);
        let spec = pool_spec(&Trace::new(TraceKind::Tidal, 1.0, 1), &cfg).expect("spec");
        let mut pool = Pool::new(cfg.model);
        for _ in 0..3 {
            pool.add_ready(0);
        }
        let mut created = Vec::new();
        pool.scale_to(4, 0, &mut created);
        let workload = workload_of(&pool);
        let ready: Vec<bool> = workload.endpoints.iter().map(|e| e.ready).collect();
        assert_eq!(
            ready,
            [true, true, true, false],
            "a starting pod is not ready"
        );

        let mut memory = ActionMemory::default();
        assert_eq!(decided_replicas(&spec, 6, &pool, 1_000, &mut memory), 6);
        assert_eq!(decided_replicas(&spec, 4, &pool, 2_000, &mut memory), 4);
        assert_eq!(decided_replicas(&spec, 2, &pool, 3_000, &mut memory), 2);
        assert!(memory.draining.is_empty(), "the victims drained and left");
        assert_eq!(memory.applied_generation, Some(1));
    }
}
