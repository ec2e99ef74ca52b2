//! The `simulate` subcommand: runs every policy on the chosen built-in traces, or on a trace
//! file through the user's own pool (`-f POOL.yaml --trace-file ARRIVALS`), and prints the
//! comparison tables (or JSON).
//!
//! Invariant: output depends only on the arguments and the files given (seeded), never on
//! the machine, except for the wall-clock figures.

use std::path::PathBuf;
use std::time::Instant;

use super::replay::{ReplayArgs, replay, words};
use super::{SimConfig, Trace, TraceKind, TraceReport, legend, run_trace, steady_state, table};

/// Built-in traces: `simulate [--trace steady|tidal|flash|ramp|all]`. Your own pool and
/// traffic: `simulate -f POOL.yaml [-f TIERS.yaml] --trace-file ARRIVALS.jsonl` replays
/// every line of the file (JSON Lines or CSV: t, tenant, tier, prompt_tokens,
/// output_tokens[, session]) through the pool's own spec (replicas, SLO, scaling, admission,
/// engine batch and queue) and tiers, under tidegate, HPA, KEDA, the oracles and a static pool.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Trace files: one arrival per line, in time order.
  JSON Lines: {\"t\": 12.5, \"tenant\": \"acme\", \"tier\": \"standard\", \"prompt_tokens\": 800, \"output_tokens\": 200, \"session\": \"s1\"}
  CSV (.csv): a header naming the same columns, then one row per arrival.
  t is seconds from the start; session is optional (a later request of the session reuses its KV
  within the tier's idle TTL); blank lines and # comments are skipped. Tiers must be the pool's
  (its TierPolicy given with -f; without tierPolicyRef, the one tier \"default\").
Example: simulate -f examples/traces/llmd-pool.yaml --trace-file examples/traces/llmd-ramp.csv --startup-seconds 100")]
pub struct Args {
    /// Built-in trace: steady, tidal, holiday, flash, ramp or all (default all; not with --trace-file).
    #[arg(long)]
    pub trace: Option<String>,
    /// An InferencePool manifest, and optionally a TierPolicy one (repeat -f, or several
    /// documents in one file), for --trace-file.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub filenames: Vec<PathBuf>,
    /// Replay this trace file (JSON Lines, or CSV by its .csv extension) through the -f pool.
    #[arg(long, value_name = "ARRIVALS")]
    pub trace_file: Option<PathBuf>,
    /// The pods' step-time line for --trace-file: an InferencePool status holding
    /// status.podModel (kubectl get tgpool NAME -o yaml), or `tidegate-engine bench --json`
    /// output. Default: the built-in 20 ms + 1.875 ms × batch.
    #[arg(long, value_name = "FILE")]
    pub pod_model: Option<PathBuf>,
    /// Seconds from ordering a pod to its being ready: MIN or MIN-MAX (uniform). Default
    /// 120-420.
    #[arg(long, value_name = "MIN[-MAX]")]
    pub startup_seconds: Option<String>,
    /// Replicas of the static pool compared with --trace-file (default: the pool's max).
    #[arg(long, value_name = "N")]
    pub static_replicas: Option<i32>,
    /// With --trace-file: every tenant in the file counts as admitted just before the start
    /// (an existing tenant); without it, a tenant is new until its first request is admitted.
    #[arg(long)]
    pub known_tenants: bool,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Scale of populations and replica bounds (1.0 = full size: up to 1,000 pods).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Also print each policy's replica timeline, one point every this many minutes: ready/current,
    /// P while paused, !N when N requests missed their target (or were refused for overload) since
    /// the point before.
    #[arg(long)]
    pub timeline_minutes: Option<u32>,
    /// slo.targetUtilization of tidegate's pool (sensitivity; the API default is 0.7).
    #[arg(long, default_value_t = 0.7)]
    pub target_utilization: f64,
    /// admission.pauseWhileScaling of tidegate's pool (the API default is true).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub pause_while_scaling: bool,
    /// scaling.forecast of tidegate's pool: true is Auto, false is Off (the API default).
    /// With it, a daily trace (tidal, holiday) is preceded by a tidal day the planner learns
    /// from, not counted.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub forecast: bool,
    /// The HPA baselines' utilization target (sensitivity: compare at equal attainment).
    #[arg(long, default_value_t = 0.7)]
    pub hpa_target_utilization: f64,
    /// Batch occupancy both oracles hold (sensitivity: the oracle-now bound at an attainment).
    #[arg(long, default_value_t = 0.95)]
    pub oracle_occupancy: f64,
    /// Worker threads (one run per policy each).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

pub fn simulate(args: &Args) -> anyhow::Result<()> {
    check_ranges(args)?;
    let startup = startup_seconds(args.startup_seconds.as_deref())?;
    if let Some(trace_file) = &args.trace_file {
        return simulate_file(args, trace_file, startup);
    }
    if !args.filenames.is_empty() {
        anyhow::bail!("-f gives the pool a --trace-file is replayed through; add --trace-file");
    }
    for (set, what) in [
        (args.pod_model.is_some(), "--pod-model"),
        (args.static_replicas.is_some(), "--static-replicas"),
        (args.known_tenants, "--known-tenants"),
    ] {
        if set {
            anyhow::bail!("{what} applies to --trace-file runs only");
        }
    }
    let trace = args.trace.as_deref().unwrap_or("all");
    let kinds = TraceKind::parse(trace).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown trace {trace:?}: expected steady, tidal, holiday, flash, ramp or all"
        )
    })?;
    let mut cfg = SimConfig::new(args.seed, args.scale);
    cfg.baselines.oracle_occupancy = args.oracle_occupancy;
    cfg.target_utilization = args.target_utilization;
    cfg.pause_while_scaling = args.pause_while_scaling;
    cfg.forecast = args.forecast;
    cfg.baselines.hpa_target_utilization = args.hpa_target_utilization;
    if let Some((lo, hi)) = startup {
        cfg.startup_min_s = lo;
        cfg.startup_max_s = hi;
    }
    run_builtin(args, &kinds, &cfg)
}

fn check_ranges(args: &Args) -> anyhow::Result<()> {
    if !(args.scale > 0.0 && args.scale <= 10.0) {
        anyhow::bail!("--scale must be in (0, 10], got {}", args.scale);
    }
    if !(0.1..=1.0).contains(&args.target_utilization) {
        anyhow::bail!(
            "--target-utilization must be in [0.1, 1], got {}",
            args.target_utilization
        );
    }
    if !(0.1..=1.0).contains(&args.hpa_target_utilization) {
        anyhow::bail!(
            "--hpa-target-utilization must be in [0.1, 1], got {}",
            args.hpa_target_utilization
        );
    }
    if !(0.1..=1.0).contains(&args.oracle_occupancy) {
        anyhow::bail!(
            "--oracle-occupancy must be in [0.1, 1], got {}",
            args.oracle_occupancy
        );
    }
    Ok(())
}

/// `--startup-seconds MIN[-MAX]`.
fn startup_seconds(s: Option<&str>) -> anyhow::Result<Option<(f64, f64)>> {
    let Some(s) = s else { return Ok(None) };
    let bad = || {
        anyhow::anyhow!(
            "--startup-seconds {s:?}: expected MIN or MIN-MAX in seconds, e.g. 100 or 120-420"
        )
    };
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let lo: f64 = lo.trim().parse().map_err(|_| bad())?;
    let hi: f64 = hi.trim().parse().map_err(|_| bad())?;
    if !(lo.is_finite() && hi.is_finite() && 0.0 <= lo && lo <= hi && hi <= 86_400.0) {
        return Err(bad());
    }
    Ok(Some((lo, hi)))
}

fn simulate_file(
    args: &Args,
    trace_file: &std::path::Path,
    startup: Option<(f64, f64)>,
) -> anyhow::Result<()> {
    if args.trace.is_some() {
        anyhow::bail!("--trace picks a built-in trace; --trace-file replays a file: give one");
    }
    if args.filenames.is_empty() {
        anyhow::bail!("--trace-file needs the pool to replay it through: -f POOL.yaml");
    }
    if args.scale != 1.0 {
        anyhow::bail!("--scale applies to the built-in traces; a trace file is replayed as it is");
    }
    for (changed, what) in [
        (args.target_utilization != 0.7, "--target-utilization"),
        (!args.pause_while_scaling, "--pause-while-scaling"),
        (args.forecast, "--forecast"),
    ] {
        if changed {
            anyhow::bail!(
                "{what} sets the built-in pool; a trace file runs through the -f pool's own spec: set it there"
            );
        }
    }
    let defaults = SimConfig::new(args.seed, 1.0);
    let mut baselines = defaults.baselines;
    baselines.oracle_occupancy = args.oracle_occupancy;
    baselines.hpa_target_utilization = args.hpa_target_utilization;
    let t0 = Instant::now();
    let report = replay(&ReplayArgs {
        manifests: &args.filenames,
        trace_file,
        pod_model: args.pod_model.as_deref(),
        startup_s: startup.unwrap_or((defaults.startup_min_s, defaults.startup_max_s)),
        static_replicas: args.static_replicas,
        known_tenants: args.known_tenants,
        seed: args.seed,
        baselines,
        threads: args.threads,
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", words(&report));
        if let Some(every) = args.timeline_minutes {
            let runs = report.results.iter().zip(&report.timelines);
            print_timelines(runs.map(|(r, t)| (r.policy, t.as_slice())), every);
        }
        println!("total wall time {:.1}s", t0.elapsed().as_secs_f64());
    }
    Ok(())
}

fn run_builtin(args: &Args, kinds: &[TraceKind], cfg: &SimConfig) -> anyhow::Result<()> {
    let cfg = cfg.clone();
    let started = Instant::now();
    let mut reports = Vec::new();
    for &kind in kinds {
        let t0 = Instant::now();
        let trace = Trace::new(kind, cfg.scale, cfg.seed);
        let outputs = run_trace(kind, &cfg, args.threads)?;
        if let (Some(every), false) = (args.timeline_minutes, args.json) {
            let runs = outputs.iter();
            print_timelines(
                runs.map(|o| (o.result.policy, o.timeline.as_slice())),
                every,
            );
        }
        let results: Vec<_> = outputs.into_iter().map(|o| o.result).collect();
        if !args.json {
            println!(
                "trace {} ({:.0} h, max {} replicas, seed {}) — {:.1}s wall",
                kind.name(),
                trace.duration_s as f64 / 3600.0,
                trace.max_replicas,
                cfg.seed,
                t0.elapsed().as_secs_f64()
            );
            println!("{}", table(&results, "hpa-gpu-util"));
        }
        reports.push(TraceReport {
            trace: kind.name(),
            duration_hours: trace.duration_s as f64 / 3600.0,
            max_replicas: trace.max_replicas,
            results,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        let steady = steady_state(&cfg);
        println!("{}\n", steady.words(&cfg));
        if kinds.contains(&TraceKind::Tidal) {
            println!("{}\n", steady.burst_words(&cfg));
        }
        println!("{}", legend(&cfg));
        println!("total wall time {:.1}s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// One line per run: ready/current replicas every `every_minutes` (P: a tier paused; !N: N
/// requests missed since the point before).
fn print_timelines<'a>(
    runs: impl Iterator<Item = (&'a str, &'a [super::dynamics::TimePoint])>,
    every_minutes: u32,
) {
    let every = f64::from(every_minutes.max(1)) * 60.0;
    for (policy, timeline) in runs {
        let (mut next, mut missed) = (0.0, timeline.first().map_or(0, |p| p.missed));
        let mut line = format!("{policy:<13}");
        for p in timeline {
            if p.t_s >= next {
                let paused = p.paused.iter().filter(|&&x| x).count();
                let late = p.missed - missed;
                missed = p.missed;
                line.push_str(&format!(
                    " {}/{}{}{}",
                    p.ready,
                    p.current,
                    if paused > 0 { "P" } else { "" },
                    if late > 0 {
                        format!("!{late}")
                    } else {
                        String::new()
                    }
                ));
                next += every;
            }
        }
        println!("{line}");
    }
}
