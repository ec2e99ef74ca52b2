//! The `simulate` subcommand: runs every policy on the chosen traces and prints the
//! comparison tables (or JSON).
//!
//! Invariant: output depends only on the arguments (seeded), never on the machine, except
//! for the wall-clock figures.

use std::time::Instant;

use super::{SimConfig, Trace, TraceKind, TraceReport, legend, run_trace, steady_state, table};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Which trace: steady, tidal, flash, ramp or all.
    #[arg(long, default_value = "all")]
    pub trace: String,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Scale of populations and replica bounds (1.0 = full size: up to 1,000 pods).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Also print each policy's replica timeline, one point every this many minutes.
    #[arg(long)]
    pub timeline_minutes: Option<u32>,
    /// slo.targetUtilization of tidegate's pool (sensitivity; the API default is 0.7).
    #[arg(long, default_value_t = 0.7)]
    pub target_utilization: f64,
    /// admission.pauseWhileScaling of tidegate's pool (the API default is true).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub pause_while_scaling: bool,
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
    let kinds = TraceKind::parse(&args.trace).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown trace {:?}: expected steady, tidal, flash, ramp or all",
            args.trace
        )
    })?;
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
    let mut cfg = SimConfig::new(args.seed, args.scale);
    cfg.baselines.oracle_occupancy = args.oracle_occupancy;
    cfg.target_utilization = args.target_utilization;
    cfg.pause_while_scaling = args.pause_while_scaling;
    cfg.baselines.hpa_target_utilization = args.hpa_target_utilization;
    let started = Instant::now();
    let mut reports = Vec::new();
    for &kind in &kinds {
        let t0 = Instant::now();
        let trace = Trace::new(kind, cfg.scale, cfg.seed);
        let outputs = run_trace(kind, &cfg, args.threads)?;
        if let (Some(every), false) = (args.timeline_minutes, args.json) {
            print_timelines(&outputs, every);
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

fn print_timelines(outputs: &[super::RunOutput], every_minutes: u32) {
    let every = f64::from(every_minutes.max(1)) * 60.0;
    for o in outputs {
        let mut next = 0.0;
        let mut line = format!("{:<13}", o.result.policy);
        for p in &o.timeline {
            if p.t_s >= next {
                let paused = p.paused.iter().filter(|&&x| x).count();
                line.push_str(&format!(
                    " {}/{}{}",
                    p.ready,
                    p.current,
                    if paused > 0 { "P" } else { "" }
                ));
                next += every;
            }
        }
        println!("{line}");
    }
}
