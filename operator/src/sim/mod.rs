//! A discrete-event simulator of an inference pool under internet-scale traffic, driving the
//! operator's own planner and decision step (`crate::plan::plan`, then
//! `crate::driver::decide::decide`, not copies) and, side by side, the scaling
//! policies users deploy today (HPA on utilization, KEDA on queue length) and an oracle.
//!
//! Model (see each file for its invariants):
//! - `trace`: session starts per second from a population of tenants with a tidal, flash or
//!   ramp shape, plus a stream of new tenants; `tenants`: tiers, rate limits, the registry of
//!   admitted tenants and the engines' admission gate; `pool`: pods with continuous batching
//!   (batch-dependent inter-token latency), bounded tier-priority queues, a least-loaded
//!   router, 2–7 min start-up and draining, queue timeouts at the tier's target;
//!   `metrics`: Prometheus scrape and rate windows;
//!   `policy`: the controllers; `run`: the event loop; `report`: outcomes and the table;
//!   `steady`: what the pod model alone implies for GPU-hours, before any controller runs.
//! - Your own pool and traffic (`replay`): `manifests` reads the InferencePool and TierPolicy
//!   (`tiers` maps the TierPolicy onto the simulator's tier slots), `trace_file` parses a
//!   recorded trace (JSON Lines or CSV), `arrivals` is the run's source of arrivals (the
//!   analytic trace or the file) and what the oracles know of it, `pod_model_file` reads the
//!   pods' step-time line from a pool's status or an engine bench.
//!
//! Approximations, stated honestly:
//! - Arrivals are drawn per one-second bucket (Poisson count, uniform offsets), not from a
//!   per-request continuous process; service is exact and event-driven.
//! - Prefill is charged as decode-step equivalents in the request's own slot
//!   (`prefill_cost` per prompt token), not as a separate compute phase; no chunked-prefill
//!   interference between sequences.
//! - KV reuse: a returning session pays only its new turn's prefill when it returns within
//!   its tier's idle TTL (session-affine routing or host offload assumed); otherwise it
//!   recomputes its whole context. KV capacity does not limit residency beyond max batch.
//! - Routing is least-loaded over ready pods (an inference gateway's endpoint picker), so a
//!   request waits only when every pod is full; the engine then queues it (bounded) on one
//!   pod. A queued request that has waited past its tier's queue-wait target is dropped
//!   (`queue_timeout`, a miss), as the engine's scheduler drops it, and frees its place for
//!   the requests behind it; the engine checks every step, the simulated pod when it next
//!   completes a request or its queue is full, so only when a timed-out request is refused
//!   differs, not whether.
//! - The admitted-tenant registry and the admission state reach every engine at once (the
//!   operator's push latency is not modelled). A request refused for overload (queue full or
//!   timed out) is sent again after the engines' Retry-After of 1 s, twice at most (the
//!   OpenAI clients' default), and counted once, as its first attempt; one refused by the
//!   pause or a rate limit ends its session.
//! - Draining pods finish their running and queued requests without a grace deadline; a
//!   scale-down's victims answer Drained on the tick `decide` chose them, and the pool, not
//!   `decide`'s victim order, picks which pods leave (starting ones, then the least loaded).
//! - Rates use the first and last sample in the window (no extrapolation).

mod arrivals;
pub mod cli;
mod dynamics;
mod manifests;
mod metrics;
mod pod_model_file;
mod policy;
mod pool;
mod replay;
mod report;
mod rng;
mod run;
mod steady;
mod tenants;
#[cfg(test)]
mod tests;
mod tiers;
mod trace;
mod trace_file;

use serde::Serialize;
use tidegate_api::{InferencePoolSpec, TierPolicySpec};

pub use dynamics::TimePoint;
pub use policy::{BaselineSettings, PlanMemory, PolicyKind};
pub use pool::PodModel;
pub use report::{RunResult, table};
pub use run::{Driver, RunOutput, Scenario, run, run_scenario};
pub use steady::{SteadyState, steady_state};
pub use trace::{Trace, TraceKind};

/// Everything a run is parameterised by, besides the trace and the policy.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    /// Simulated time before the trace starts (warm pool, load building up), not counted.
    pub warmup_s: f64,
    /// Multiplies populations and replica bounds (1.0: the full-size runs).
    pub scale: f64,
    pub startup_min_s: f64,
    pub startup_max_s: f64,
    pub scrape_interval_s: f64,
    pub rate_window_s: f64,
    pub control_interval_s: f64,
    pub model: PodModel,
    /// r: tokens/s a session needs (the pool's slo.tokensPerSecondPerSession).
    pub tokens_per_second_per_session: f64,
    pub output_median: f64,
    pub output_sigma: f64,
    pub prompt_median: f64,
    pub prompt_sigma: f64,
    /// Probability that a session returns for another turn, and the turn limit.
    pub p_return: f64,
    pub max_turns: u8,
    pub think_mean_s: f64,
    /// Prometheus unreachable between these seconds (trace time).
    pub outage_s: Option<(f64, f64)>,
    pub baselines: BaselineSettings,
    /// slo.targetUtilization of the pool tidegate plans for (the API default is 0.7).
    pub target_utilization: f64,
    /// admission.pauseWhileScaling of that pool (the API default is true).
    pub pause_while_scaling: bool,
    /// scaling.forecast of that pool: true is Auto (the API default is Off).
    pub forecast: bool,
    /// What tidegate's planner starts with (a day before it, for daily traces).
    pub planner_memory: Option<PlanMemory>,
}

impl SimConfig {
    pub fn new(seed: u64, scale: f64) -> Self {
        SimConfig {
            seed,
            warmup_s: 900.0,
            scale,
            startup_min_s: 120.0,
            startup_max_s: 420.0,
            scrape_interval_s: 15.0,
            rate_window_s: 60.0,
            control_interval_s: 15.0,
            // 16 sequences at 50 ms/token = 20 tok/s each, T = 320 tok/s per pod.
            model: PodModel {
                max_batch: 16,
                max_queue: 64,
                itl_base_s: 0.020,
                itl_per_seq_s: 0.001_875,
                prefill_cost: 0.02,
            },
            tokens_per_second_per_session: 20.0,
            output_median: 700.0,
            output_sigma: 0.9,
            prompt_median: 1000.0,
            prompt_sigma: 0.7,
            p_return: 0.5,
            max_turns: 8,
            think_mean_s: 90.0,
            outage_s: None,
            baselines: BaselineSettings {
                hpa_target_utilization: 0.7,
                keda_waiting_per_pod: 5.0,
                oracle_occupancy: 0.95,
            },
            target_utilization: 0.7,
            pause_while_scaling: true,
            forecast: false,
            planner_memory: None,
        }
    }
}

/// The InferencePool the planner is given (the same one for every trace, bar its bounds).
pub fn pool_spec(trace: &Trace, cfg: &SimConfig) -> anyhow::Result<InferencePoolSpec> {
    let m = &cfg.model;
    let max = trace.max_replicas;
    let up = (max / 10).max(4);
    let down = (max / 50).max(1);
    let yaml = format!(
        r#"
model: {{name: sim, uri: "file:///sim"}}
engine: {{image: sim, maxBatchSize: {b}, maxQueuedRequests: {q}}}
replicas: {{min: 1, max: {max}}}
slo: {{tokensPerSecondPerSession: {r}, queueWaitP99: 1s, targetUtilization: {u}}}
scaling:
  interval: 15s
  scaleUpStabilization: 0s
  scaleDownStabilization: 5m
  maxScaleUpStep: {up}
  maxScaleDownStep: {down}
  metrics: {{source: Prometheus, rateWindow: 1m, staleAfter: 2m}}
  forecast: {f}
admission: {{enabled: true, pauseThreshold: 0.95, resumeThreshold: 0.8, pauseAfter: 1m, holdTime: 5m, tenantMemory: 24h, pauseWhileScaling: {p}}}
tierPolicyRef: {{name: sim}}
"#,
        b = m.max_batch,
        q = m.max_queue,
        r = cfg.tokens_per_second_per_session,
        u = cfg.target_utilization,
        p = cfg.pause_while_scaling,
        f = if cfg.forecast { "Auto" } else { "Off" },
    );
    serde_saphyr::from_str(&yaml).map_err(|e| anyhow::anyhow!("simulator pool spec: {e}"))
}

pub fn tier_policy() -> anyhow::Result<TierPolicySpec> {
    serde_saphyr::from_str(tenants::TIER_POLICY_YAML)
        .map_err(|e| anyhow::anyhow!("simulator tier policy: {e}"))
}

/// All policies on one trace, results in `PolicyKind::ALL` order. Runs on up to `threads`.
pub fn run_trace(
    kind: TraceKind,
    cfg: &SimConfig,
    threads: usize,
) -> anyhow::Result<Vec<RunOutput>> {
    let trace = Trace::new(kind, cfg.scale, cfg.seed);
    let with_memory;
    let cfg = match day_before(kind, cfg)? {
        Some(memory) => {
            with_memory = SimConfig {
                planner_memory: Some(memory),
                ..cfg.clone()
            };
            &with_memory
        }
        None => cfg,
    };
    let policies = PolicyKind::ALL;
    let mut out: Vec<Option<anyhow::Result<RunOutput>>> = policies.iter().map(|_| None).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots = std::sync::Mutex::new(&mut out);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&p) = policies.get(i) else { break };
                    let r = run(&trace, p, cfg);
                    if let Ok(mut slots) = slots.lock() {
                        slots[i] = Some(r);
                    }
                }
            });
        }
    });
    out.into_iter().flatten().collect()
}

/// For a day of a daily pattern, tidegate's planner first lives the day before (the same
/// kind of day, other bursts: its seed differs) and carries what it learned into the day
/// that is measured, as an operator does from one day to the next.
fn day_before(kind: TraceKind, cfg: &SimConfig) -> anyhow::Result<Option<PlanMemory>> {
    let Some(before) = kind.day_before() else {
        return Ok(None);
    };
    if !cfg.forecast || cfg.planner_memory.is_some() {
        return Ok(None);
    }
    let trace = Trace::new(before, cfg.scale, cfg.seed.wrapping_add(0x5eed));
    Ok(run(&trace, PolicyKind::Tidegate, cfg)?.memory)
}

/// The report of one trace, for `--json`.
#[derive(Debug, Serialize)]
pub struct TraceReport {
    pub trace: &'static str,
    pub duration_hours: f64,
    pub max_replicas: i32,
    pub results: Vec<RunResult>,
}

/// Legend printed under the tables, with the settings of this run.
pub fn legend(cfg: &SimConfig) -> String {
    let hpa = cfg.baselines.hpa_target_utilization * 100.0;
    format!(
        "\
attainment: requests that started decoding within their tier's queue-wait target \
(enterprise 500ms, standard 2s, free 5s) / (started + refused for overload or queue timeout); \
existing = tenant admitted within the 24h memory window, new = not; \
ref pause/rate/overload: refused by the new-tenant pause, per-tenant rate limits, full queues; \
ovl exist: overload refusals of existing tenants; timeout exist: existing tenants' requests the \
engines dropped for waiting past their tier's target (as the engine's scheduler does); react: step start → first scale-up decision; \
scales: control ticks that changed the replica count; rev: reversals (changes of direction \
of the replica count within 10 min of the move before: a climb of several steps after a step \
down is one); overshoot: replicas ordered beyond what the policy \
still ran 10–20 min later (worst case) / its max step; GPU-h includes start-up and draining.
pool: 1 GPU/pod, max batch 16, ITL 20ms + 1.875ms × batch (T = 320 tok/s; tidegate learns it \
from the engines' inter-token latency), queue 64/pod, \
start-up 2–7 min, scrape 15s, rate window 1m, least-loaded routing.
tidegate: the operator's planner on an InferencePool with slo r = 20 tok/s, queueWaitP99 1s, \
targetUtilization {tidegate}, no capacity hint; pause ≥ 0.95, resume < 0.8, pauseAfter 1m, holdTime 5m, \
pauseWhileScaling {pws}; \
tiers enterprise (never paused) > standard > free.
hpa-*: Kubernetes HPA algorithm and default behaviour (15s sync, 10% tolerance, up max(100%, 4 pods) \
per sync, down to the highest recommendation of 300s; starting pods count as 0 when scaling up), \
target {hpa:.0}% of GPU utilization (decode tokens/s ÷ T per pod) or of KV/batch occupancy (running ÷ \
max batch). keda-queue: HPA on sum(num_requests_waiting) with AverageValue {keda} per pod. \
oracle: the trace's expected rate 7 min ahead, {oracle:.0}% batch occupancy, no stabilization; \
oracle-now: the same without foresight (the expected rate now, no scrape or window delay), the \
bound for any policy that reacts to the present.",
        tidegate = cfg.target_utilization,
        pws = cfg.pause_while_scaling,
        keda = cfg.baselines.keda_waiting_per_pod,
        oracle = cfg.baselines.oracle_occupancy * 100.0,
    )
}
