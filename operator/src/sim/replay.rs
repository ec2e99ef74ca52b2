//! `simulate -f POOL.yaml --trace-file ARRIVALS`: a trace file replayed through the user's own
//! pool (its replicas, SLO, scaling and admission settings, engine batch and queue, tiers),
//! by tidegate, the HPA/KEDA baselines, both oracles and a static pool, side by side.
//!
//! Invariants: every policy replays the same requests in the same order through pools built
//! from the same spec; output depends only on the arguments and files (seeded), never on the
//! machine, except for the wall-clock figures. The oracles know the file's own arrivals per
//! minute (smoothed over ±1 minute), which is what foresight means for a recorded trace.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::arrivals::{FileSource, Source};
use super::dynamics::TimePoint;
use super::manifests;
use super::pod_model_file::{self, ItlLine};
use super::policy::PolicyKind;
use super::report::{RunResult, table_with_tiers};
use super::run::{Driver, RunOutput, Scenario, run_scenario};
use super::trace_file;
use super::{BaselineSettings, PodModel, SimConfig};

/// The built-in pod model's step time (the one `SimConfig::new` holds).
const BUILTIN_ITL: (f64, f64) = (0.020, 0.001_875);

/// What a replay is given.
pub struct ReplayArgs<'a> {
    pub manifests: &'a [PathBuf],
    pub trace_file: &'a Path,
    pub pod_model: Option<&'a Path>,
    pub startup_s: (f64, f64),
    pub static_replicas: Option<i32>,
    pub known_tenants: bool,
    pub seed: u64,
    pub baselines: BaselineSettings,
    pub threads: usize,
}

/// A replay's report (`--json`).
#[derive(Debug, Serialize)]
pub struct ReplayReport {
    pub trace_file: String,
    pub pool: String,
    pub requests: usize,
    pub tenants: usize,
    pub sessions: u32,
    pub duration_hours: f64,
    pub replicas_min: i32,
    pub replicas_max: i32,
    pub static_replicas: i32,
    pub tiers: Vec<String>,
    pub tiers_from: String,
    pub pod_model: PodModelReport,
    pub startup_seconds: (f64, f64),
    pub results: Vec<RunResult>,
    /// GPU-hours ÷ GPUs per pod ÷ hours, per policy (start-up and draining included).
    pub mean_replicas: Vec<(String, f64)>,
    /// Each run's replica timeline, in the results' order (`--timeline-minutes`).
    #[serde(skip)]
    pub timelines: Vec<Vec<TimePoint>>,
}

#[derive(Debug, Serialize)]
pub struct PodModelReport {
    pub itl_base_seconds: f64,
    pub itl_per_sequence_seconds: f64,
    pub max_batch: u32,
    pub max_queue: u32,
    pub saturated_tokens_per_second: f64,
    pub origin: String,
}

/// Runs every policy and the static pool on the trace file.
pub fn replay(a: &ReplayArgs<'_>) -> anyhow::Result<ReplayReport> {
    let m = manifests::load(a.manifests)?;
    let (tiers, tiers_from) = m.tiers()?;
    let source = FileSource::new(trace_file::load(a.trace_file, &tiers)?);
    let itl = match a.pod_model {
        Some(p) => pod_model_file::load(p)?,
        None => ItlLine {
            itl_base_s: BUILTIN_ITL.0,
            itl_per_seq_s: BUILTIN_ITL.1,
            origin: "the built-in pod model (no --pod-model)".into(),
        },
    };
    let cfg = config(a, &m.spec, &itl)?;
    let static_n = a.static_replicas.unwrap_or(m.spec.replicas.max);
    let scn = Scenario {
        source: Source::File(&source),
        spec: m.spec.clone(),
        tiers,
        known_tenants: a.known_tenants,
    };
    let mut drivers: Vec<Driver> = PolicyKind::ALL.iter().map(|&p| Driver::Policy(p)).collect();
    drivers.push(Driver::Static(static_n));
    let outputs = run_all(&scn, &drivers, &cfg, a.threads)?;
    let hours = source.duration_s() as f64 / 3600.0;
    let gpus = f64::from(m.spec.engine.resources.gpus.max(1));
    let (results, timelines): (Vec<RunResult>, Vec<_>) =
        outputs.into_iter().map(|o| (o.result, o.timeline)).unzip();
    let mean_replicas = results
        .iter()
        .map(|r| (r.policy.to_string(), r.gpu_hours / gpus / hours))
        .collect();
    Ok(ReplayReport {
        trace_file: source.trace.name.clone(),
        pool: m.pool_name,
        requests: source.trace.arrivals.len(),
        tenants: source.trace.tenant_tiers.len(),
        sessions: source.trace.sessions,
        duration_hours: hours,
        replicas_min: m.spec.replicas.min,
        replicas_max: crate::plan::ceiling(&m.spec),
        static_replicas: static_n,
        tiers: scn.tiers.names.clone(),
        tiers_from,
        pod_model: PodModelReport {
            itl_base_seconds: cfg.model.itl_base_s,
            itl_per_sequence_seconds: cfg.model.itl_per_seq_s,
            max_batch: cfg.model.max_batch,
            max_queue: cfg.model.max_queue,
            saturated_tokens_per_second: cfg.model.saturated_tokens_per_second(),
            origin: itl.origin,
        },
        startup_seconds: a.startup_s,
        results,
        mean_replicas,
        timelines,
    })
}

/// The run's settings from the pool's spec: its control interval, rate window, SLO, engine
/// batch and queue; no warm-up and no follow-up turns (the file is the whole traffic).
fn config(
    a: &ReplayArgs<'_>,
    spec: &tidegate_api::InferencePoolSpec,
    itl: &ItlLine,
) -> anyhow::Result<SimConfig> {
    let mut cfg = SimConfig::new(a.seed, 1.0);
    cfg.warmup_s = 0.0;
    cfg.startup_min_s = a.startup_s.0;
    cfg.startup_max_s = a.startup_s.1;
    cfg.control_interval_s = spec.scaling.interval.as_std().as_secs_f64().max(1.0);
    cfg.rate_window_s = spec
        .scaling
        .metrics
        .rate_window
        .as_std()
        .as_secs_f64()
        .max(1.0);
    cfg.model = PodModel {
        max_batch: u32::try_from(spec.engine.max_batch_size.max(1))?,
        max_queue: u32::try_from(spec.engine.max_queued_requests.max(0))?,
        itl_base_s: itl.itl_base_s,
        itl_per_seq_s: itl.itl_per_seq_s,
        prefill_cost: cfg.model.prefill_cost,
    };
    cfg.tokens_per_second_per_session = spec.slo.tokens_per_second_per_session;
    cfg.target_utilization = spec.slo.target_utilization;
    cfg.pause_while_scaling = spec.admission.pause_while_scaling;
    cfg.p_return = 0.0;
    cfg.max_turns = 1;
    cfg.baselines = a.baselines;
    Ok(cfg)
}

/// Every driver on one scenario, results in the drivers' order, on up to `threads`.
fn run_all(
    scn: &Scenario<'_>,
    drivers: &[Driver],
    cfg: &SimConfig,
    threads: usize,
) -> anyhow::Result<Vec<RunOutput>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&d) = drivers.get(i) else { break };
                    let r = run_scenario(scn, d, cfg);
                    if let Ok(mut slots) = slots.lock() {
                        slots.push((i, r));
                    }
                }
            });
        }
    });
    let mut out = slots
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a simulation thread panicked"))?;
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// The report as text: a header, the table, mean replicas against the static pool, legend.
pub fn words(r: &ReplayReport) -> String {
    let mut s = format!(
        "trace file {} ({} requests, {} tenants, {} sessions, {:.2} h) through InferencePool {} \
         (replicas {}–{})\n",
        r.trace_file,
        r.requests,
        r.tenants,
        r.sessions,
        r.duration_hours,
        r.pool,
        r.replicas_min,
        r.replicas_max
    );
    s.push_str(&table_with_tiers(&r.results, "hpa-gpu-util", &r.tiers));
    let stat = r
        .mean_replicas
        .iter()
        .find(|(p, _)| p == "static")
        .map_or(f64::NAN, |m| m.1);
    s.push_str(&format!(
        "\nmean replicas (static = {}):",
        r.static_replicas
    ));
    for (p, m) in &r.mean_replicas {
        s.push_str(&format!(" {p} {m:.2} ({:.2}×)", m / stat));
    }
    s.push('\n');
    s.push_str(&legend(r));
    s
}

fn legend(r: &ReplayReport) -> String {
    let m = &r.pod_model;
    let (lo, hi) = r.startup_seconds;
    format!(
        "\npod: {origin}: ITL {a:.1}ms + {b:.3}ms × batch, max batch {mb} and queue {mq} per pod \
         (engine.maxBatchSize, maxQueuedRequests), T = {t:.0} tok/s; prefill 0.02 decode steps \
         per prompt token; start-up {lo:.0}–{hi:.0} s.\n\
         tiers: {tiers} ({from}).\n\
         attainment: requests that started decoding within their tier's queue-wait target / \
         (started + refused for overload); existing = tenant admitted within the pool's \
         tenantMemory before this request. Each line is one request: no follow-up turns; a \
         session id reuses the KV its last request left within the tier's idle TTL.\n\
         tidegate: the operator's planner on this pool's spec. hpa-*, keda-queue: as for the \
         built-in traces. oracle: the file's own arrivals per minute (smoothed ±1 min) {hi:.0} s \
         ahead; oracle-now: the same now. static: {n} replicas ready throughout. mean replicas: \
         GPU-hours ÷ GPUs per pod ÷ hours (start-up and draining included).",
        origin = m.origin,
        a = m.itl_base_seconds * 1e3,
        b = m.itl_per_sequence_seconds * 1e3,
        mb = m.max_batch,
        mq = m.max_queue,
        t = m.saturated_tokens_per_second,
        tiers = r.tiers.join(" > "),
        from = r.tiers_from,
        n = r.static_replicas,
    )
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
