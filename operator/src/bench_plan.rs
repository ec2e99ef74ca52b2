//! `tidegate-operator bench-plan`: reconciles many pools in memory (planner + status
//! assembly, no I/O) and prints plan() latency percentiles and CPU per reconcile.
//!
//! Invariant: inputs are synthetic and deterministic (a tide per pool, phase-shifted), so
//! runs differ only by the machine's noise; quote figures as measured on the same run.

use std::time::{Duration, Instant};

use tidegate_api::{InferencePoolSpec, TierPolicySpec};

use crate::plan::{self, Observation, PlanState, PoolMetrics, StepSample};
use crate::ports::WorkloadState;
use crate::status_build;

/// Options of `bench-plan`.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchPlanArgs {
    /// Pools reconciled per tick.
    #[arg(long, default_value_t = 1000)]
    pub pools: usize,
    /// Ticks (15 s of simulated time each).
    #[arg(long, default_value_t = 60)]
    pub ticks: usize,
}

fn spec(i: usize) -> anyhow::Result<InferencePoolSpec> {
    let yaml = format!(
        "model: {{name: m{i}, uri: \"file:///m\"}}\nengine: {{image: e}}\nreplicas: {{min: 1, max: {}}}\nscaling: {{capacityHintTokensPerSecond: 1000}}\n",
        4 + i % 60
    );
    Ok(serde_saphyr::from_str(&yaml)?)
}

fn tiers() -> Option<TierPolicySpec> {
    serde_saphyr::from_str(
        "defaultTier: free\ntiers:\n  - {name: enterprise, priority: 100, admission: {pausable: false}}\n  - {name: standard, priority: 50}\n  - {name: free, priority: 10}\n",
    )
    .ok()
}

/// Process CPU time (user + system) from /proc, when available.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

/// Runs the benchmark and prints its figures.
pub fn run(args: &BenchPlanArgs) -> anyhow::Result<()> {
    let tiers = tiers();
    let specs = (0..args.pools)
        .map(spec)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut states: Vec<PlanState> = (0..args.pools).map(|_| PlanState::default()).collect();
    let mut replicas: Vec<i32> = vec![1; args.pools];
    let mut statuses = vec![None; args.pools];
    let mut plan_times = Vec::with_capacity(args.pools * args.ticks);
    let mut reconcile_times = Vec::with_capacity(args.pools * args.ticks);
    let cpu0 = cpu_time();
    let wall0 = Instant::now();
    let mut now: u64 = 1_700_000_000_000;
    for tick in 0..args.ticks {
        now += 15_000;
        for i in 0..args.pools {
            let obs = observation(now, tick, i, specs[i].replicas.max, replicas[i]);
            let t0 = Instant::now();
            let p = plan::plan(&specs[i], tiers.as_ref(), &obs, &mut states[i]);
            let t1 = Instant::now();
            let workload = WorkloadState {
                replicas: Some(replicas[i]),
                ready_replicas: replicas[i],
                endpoints: Vec::new(),
                routers: Vec::new(),
                selector: String::new(),
                model_problem: None,
            };
            let status = status_build::build(
                statuses[i].as_ref(),
                &p,
                &workload,
                Some(1),
                now,
                states[i].last_scale_time,
            );
            let t2 = Instant::now();
            plan_times.push(t1 - t0);
            reconcile_times.push(t2 - t0);
            replicas[i] = p.replicas;
            statuses[i] = Some(status);
        }
    }
    let wall = wall0.elapsed();
    let cpu = match (cpu0, cpu_time()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    report(args, plan_times, reconcile_times, wall, cpu);
    Ok(())
}

/// One pool's observation on a tick: a tide of sessions (a sine per pool, out of phase)
/// against what `replicas` engines of 50 slots hold.
fn observation(
    now: u64,
    tick: usize,
    pool: usize,
    max_replicas: i32,
    replicas: i32,
) -> Observation {
    let phase = (tick as f64 / 20.0 + pool as f64 / 7.0).sin() * 0.5 + 0.5;
    let sessions = 10.0 + phase * 60.0 * f64::from(max_replicas);
    let slots = f64::from(replicas) * 50.0;
    let running = sessions.min(slots);
    let waiting = (sessions - running).max(0.0);
    let per_engine = running / f64::from(replicas.max(1));
    Observation {
        now,
        current_replicas: replicas,
        ready_replicas: replicas,
        metrics: Ok(PoolMetrics {
            decode_tokens_per_second: running * 20.0,
            step_samples: vec![
                StepSample {
                    batch: per_engine,
                    itl_seconds: 0.02 + 0.0005 * per_engine,
                };
                replicas.max(0) as usize
            ],
            running,
            waiting,
            queue_wait_p99_seconds: Some(if waiting > 0.0 { 2.0 } else { 0.1 }),
            kv_utilization: running / slots.max(1.0),
            evictions_per_second: 0.0,
            overload_refusals_per_second: 0.0,
            requests_finished_per_second: running / 30.0,
            waiting_growth_per_second: 0.0,
            pods_reporting: replicas,
            sampled_at: now,
        }),
        held_requests: 0,
        router_queued: 0,
    }
}

/// Prints the percentiles, the CPU per reconcile and whether the goal was met.
fn report(
    args: &BenchPlanArgs,
    mut plan_times: Vec<Duration>,
    mut reconcile_times: Vec<Duration>,
    wall: Duration,
    cpu: Option<Duration>,
) {
    plan_times.sort();
    reconcile_times.sort();
    let n = plan_times.len().max(1) as u32;
    println!(
        "bench-plan: {} pools × {} ticks = {} reconciles in memory (plan + status, no I/O)",
        args.pools, args.ticks, n
    );
    println!(
        "plan()             p50 {:>8.1?}  p99 {:>8.1?}  max {:>8.1?}",
        pct(&plan_times, 0.5),
        pct(&plan_times, 0.99),
        plan_times.last().copied().unwrap_or_default()
    );
    println!(
        "plan() + status    p50 {:>8.1?}  p99 {:>8.1?}  max {:>8.1?}",
        pct(&reconcile_times, 0.5),
        pct(&reconcile_times, 0.99),
        reconcile_times.last().copied().unwrap_or_default()
    );
    println!("wall per reconcile {:>8.1?}", wall / n);
    match cpu {
        Some(c) => println!(
            "CPU per reconcile  {:>8.1?}  (process user+system {:.2?} over {:.2?} wall)",
            c / n,
            c,
            wall
        ),
        None => println!("CPU per reconcile  unavailable (no /proc)"),
    }
    let goal = Duration::from_millis(1);
    println!(
        "goal plan() p99 < {goal:?}: {}",
        if pct(&plan_times, 0.99) < goal {
            "met"
        } else {
            "MISSED"
        }
    );
}
