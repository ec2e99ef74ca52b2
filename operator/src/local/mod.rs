//! Local mode: the whole loop on one machine. The same InferencePool/TierPolicy YAML as in a
//! cluster, engine processes as the workload runtime, engines' /metrics as the metrics
//! source, the same driver and planner, and a built-in tidal load that shows the pool scale
//! up, pause new tenants at its ceiling, reopen and scale down.
//!
//! Invariants: every engine started here is stopped before the command returns; the
//! summary counts every request the load generator sent exactly once.

pub mod engine_book;
pub mod files;
mod front_door;
pub mod loadgen;
mod process;
mod router_process;
pub mod runtime;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tidegate_api::status::InferencePoolStatus;
use tidegate_api::{AdmissionState, InferencePool, TierPolicySpec};
use tokio::sync::watch;
use tracing::info;

use crate::direct_metrics::DirectMetrics;
use crate::driver::{Driver, TickInput, TickOutcome};
use crate::engine_client::HttpEngineControl;
use crate::ports::PoolRef;
use files::FileRegistry;
use loadgen::TideShape;
use runtime::{LocalRuntime, LocalRuntimeConfig};

/// Options of `tidegate-operator local`.
#[derive(Clone, Debug, clap::Args)]
pub struct LocalArgs {
    /// InferencePool and TierPolicy manifests: files or folders of YAML.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    /// The tidegate-engine binary (default: next to this binary).
    #[arg(long, env = "TIDEGATE_ENGINE_BIN")]
    pub engine_bin: Option<PathBuf>,
    /// Folder for engine logs and the tenant registry.
    #[arg(long, default_value = ".tidegate-local")]
    pub state_dir: PathBuf,
    /// Run the engines and the control loop without the built-in load; stop with Ctrl-C.
    #[arg(long)]
    pub no_load: bool,
    /// Stretch (>1) or shrink (<1) the load scenario's phases.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Concurrent users at high tide.
    #[arg(long, default_value_t = 48)]
    pub peak_users: usize,
    /// Existing tenants active from the start.
    #[arg(long, default_value_t = 6)]
    pub base_users: usize,
    /// Output tokens per request of the load (clamped by each tier's maxOutputTokens).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
    /// Give up waiting for the pool to settle after the load this long after it ends.
    #[arg(long, default_value = "180s")]
    pub settle_timeout: humantime_duration::HumanDuration,
}

/// Minimal duration flag parsing ("90s", "5m") through tidegate's own Duration type.
pub mod humantime_duration {
    use std::str::FromStr;

    /// A duration given on the command line.
    #[derive(Clone, Copy, Debug)]
    pub struct HumanDuration(pub std::time::Duration);

    impl FromStr for HumanDuration {
        type Err = tidegate_api::duration::ParseDurationError;
        fn from_str(s: &str) -> Result<Self, Self::Err> {
            s.parse::<tidegate_api::Duration>()
                .map(|d| HumanDuration(d.as_std()))
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What the summary reports.
#[derive(Default)]
struct Summary {
    peak_replicas: i32,
    /// Every replica count the pool ran, in order, without repeats.
    path: Vec<i32>,
    first_scale_up: Option<Duration>,
    paused_since: Option<Instant>,
    paused_total: Duration,
    pauses: u32,
    max_tier_count_paused: usize,
}

/// Runs local mode.
pub async fn run(args: LocalArgs) -> anyhow::Result<()> {
    let manifests = files::load_manifests(&args.files)?;
    anyhow::ensure!(
        !manifests.pools.is_empty(),
        "no InferencePool found in {:?}",
        args.files
    );
    let policies: HashMap<String, TierPolicySpec> = manifests
        .policies
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), p.spec.clone()))
        .collect();
    let engine_bin = match &args.engine_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("tidegate-engine"),
    };
    anyhow::ensure!(
        engine_bin.exists(),
        "engine binary {} not found (build it or pass --engine-bin)",
        engine_bin.display()
    );
    let base_dir = std::env::current_dir()?;
    for pool in &manifests.pools {
        ensure_model(&engine_bin, &base_dir, pool)?;
    }
    std::fs::create_dir_all(&args.state_dir)?;
    let runtime = LocalRuntime::new(LocalRuntimeConfig {
        engine_bin,
        base_dir,
        log_dir: args.state_dir.join("logs"),
        admin_token: anyhow::Context::context(
            crate::k8s::objects::random_token(),
            "making an admin token",
        )?,
        extra_args: Vec::new(),
        file_sd_path: None,
        // Local mode stops its engines when it ends: nothing to adopt.
        engine_book: None,
        routers_file: None,
    });
    let driver = Driver::new(
        runtime,
        DirectMetrics::new(),
        HttpEngineControl::new(),
        FileRegistry::new(args.state_dir.join("registry")),
    );

    let pool = manifests.pools[0].clone();
    let pref = PoolRef {
        namespace: pool
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name: pool.metadata.name.clone().unwrap_or_else(|| "pool".into()),
    };
    let tiers = pool
        .spec
        .tier_policy_ref
        .as_ref()
        .and_then(|r| policies.get(&r.name))
        .cloned();
    if let Some(r) = &pool.spec.tier_policy_ref {
        anyhow::ensure!(
            tiers.is_some(),
            "TierPolicy {} referenced by {pref} is not in {:?}",
            r.name,
            args.files
        );
    }
    let interval = pool
        .spec
        .scaling
        .interval
        .as_std()
        .max(Duration::from_millis(200));
    println!(
        "tidegate local: pool {pref}, model {}, replicas {}..{}, tick every {}",
        pool.spec.model.name,
        pool.spec.replicas.min,
        pool.spec.replicas.max,
        pool.spec.scaling.interval
    );

    // The load goes to the pool's front door: its router, once the first apply started it.
    let (front_tx, front_rx) = watch::channel(None::<String>);
    let mut front = front_door::FrontDoor::default();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_else(|_| reqwest::Client::new());
    let scale = args.time_scale.max(0.05);
    let secs = |s: f64| Duration::from_secs_f64(s * scale);
    let shape = TideShape {
        warmup: secs(20.0),
        ramp_up: secs(30.0),
        high: secs(60.0),
        ramp_down: secs(20.0),
        base_users: args.base_users,
        peak_users: args.peak_users.max(args.base_users),
        max_tokens: args.max_tokens,
        model: pool.spec.model.name.clone(),
    };
    let started = Instant::now();
    let mut load = (!args.no_load).then(|| tokio::spawn(loadgen::run(shape.clone(), front_rx)));
    let mut load_done_at: Option<Instant> = None;
    let mut tally = None;
    let mut unsettled = false;
    let mut status: Option<InferencePoolStatus> = None;
    let mut summary = Summary::default();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    print_header();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = tokio::signal::ctrl_c() => { println!("interrupted"); break; }
        }
        let input = TickInput {
            pool: &pref,
            spec: &pool.spec,
            tiers: tiers.as_ref(),
            api_keys: &[],
            previous: status.as_ref(),
            // The manifest is read once: one generation for the whole run.
            generation: Some(1),
            now: now_ms(),
        };
        let out = match driver.tick(&input).await {
            Ok(out) => out,
            Err(e) => {
                println!("tick failed: {e} (retrying)");
                continue;
            }
        };
        let router = driver.runtime.router_url(&pref).await;
        if let Some(url) = &router {
            front.sample(&http, url, out.workload.ready_replicas).await;
        }
        front_tx.send_if_modified(|cur| {
            let changed = *cur != router;
            if changed {
                cur.clone_from(&router);
            }
            changed
        });
        record(&mut summary, &out, &pool, started);
        print_row(
            &pref,
            &pool,
            &out,
            started,
            shape.users_at(started.elapsed()) * usize::from(load.is_some()),
        );
        for e in &out.plan.events {
            println!("    event {:?} {}: {}", e.kind, e.reason, e.note);
        }
        status = Some(out.status.clone());
        if let Some(handle) = &mut load
            && handle.is_finished()
        {
            tally = handle.await.ok();
            load = None;
            load_done_at = Some(Instant::now());
            println!("load finished; waiting for admission to reopen and the pool to scale down");
        }
        if let Some(done) = load_done_at {
            let settled = out.plan.admission.state == AdmissionState::Open
                && out.workload.replicas == Some(pool.spec.replicas.min)
                && out.draining.is_empty();
            if settled || done.elapsed() > args.settle_timeout.0 {
                if !settled {
                    println!("pool did not settle within {:?}", args.settle_timeout.0);
                    unsettled = true;
                }
                break;
            }
        }
    }
    driver
        .runtime
        .shutdown(pool.spec.engine.drain_grace_period.as_std())
        .await;
    print_summary(&summary, tally.as_deref(), started.elapsed());
    for line in front.lines() {
        println!("{line}");
    }
    // Let engines finish their drain and exit before we go.
    tokio::time::sleep(Duration::from_millis(500)).await;
    if unsettled {
        anyhow::bail!(
            "after the load, the pool did not reopen admission and scale down to replicas.min \
             within --settle-timeout {:?}",
            args.settle_timeout.0
        );
    }
    Ok(())
}

fn record(s: &mut Summary, out: &TickOutcome, pool: &InferencePool, started: Instant) {
    let replicas = out.workload.replicas.unwrap_or(0);
    s.peak_replicas = s.peak_replicas.max(replicas);
    if s.path.last() != Some(&replicas) {
        s.path.push(replicas);
    }
    if replicas > pool.spec.replicas.min && s.first_scale_up.is_none() {
        s.first_scale_up = Some(started.elapsed());
    }
    let paused = out.plan.admission.state == AdmissionState::PausedNewTenants;
    match (paused, s.paused_since) {
        (true, None) => {
            s.paused_since = Some(Instant::now());
            s.pauses += 1;
        }
        (false, Some(since)) => {
            s.paused_total += since.elapsed();
            s.paused_since = None;
        }
        _ => {}
    }
    s.max_tier_count_paused = s
        .max_tier_count_paused
        .max(out.plan.admission.paused_tiers.len());
}

fn print_header() {
    println!(
        "{:<8} {:<16} {:<22} {:>5} {:>7} {:>9} {:>9} {:>5} {:<26} {:>5}",
        "TIME",
        "NAME",
        "MODEL",
        "READY",
        "DESIRED",
        "TOKENS/S",
        "QUEUE-P99",
        "UTIL",
        "ADMISSION",
        "USERS"
    );
}

fn print_row(
    pref: &PoolRef,
    pool: &InferencePool,
    out: &TickOutcome,
    started: Instant,
    users: usize,
) {
    let m = out.status.measured.as_ref();
    let admission = match out.plan.admission.state {
        AdmissionState::Open => "Open".to_string(),
        AdmissionState::PausedNewTenants => {
            format!("Paused({})", out.plan.admission.paused_tiers.join(","))
        }
    };
    println!(
        "{:<8} {:<16} {:<22} {:>5} {:>7} {:>9.1} {:>9} {:>5.2} {:<26} {:>5}",
        format!("{:.0}s", started.elapsed().as_secs_f64()),
        pref.name,
        pool.spec.model.name,
        out.status.ready_replicas,
        out.status.desired_replicas,
        m.map_or(0.0, |m| m.decode_tokens_per_second),
        m.map_or("-".to_string(), |m| m.queue_wait_p99.clone()),
        m.map_or(0.0, |m| m.utilization),
        admission,
        users
    );
    info!(decision = %out.plan.explanation, "tick");
}

fn print_summary(s: &Summary, tally: Option<&loadgen::Tally>, elapsed: Duration) {
    let paused = s.paused_total + s.paused_since.map(|t| t.elapsed()).unwrap_or_default();
    println!(
        "\n==== tidegate local summary ({:.0}s)",
        elapsed.as_secs_f64()
    );
    println!("peak replicas:           {}", s.peak_replicas);
    println!("replica path:            {}", path_words(&s.path));
    println!(
        "time to first scale-up:  {}",
        s.first_scale_up
            .map_or("never".to_string(), |d| format!("{:.0}s", d.as_secs_f64()))
    );
    println!(
        "admission paused:        {:.0}s in {} pause(s), up to {} tier(s)",
        paused.as_secs_f64(),
        s.pauses,
        s.max_tier_count_paused
    );
    if let Some(t) = tally {
        println!(
            "requests served:         {} ({} tokens)",
            t.served.load(std::sync::atomic::Ordering::Relaxed),
            t.tokens.load(std::sync::atomic::Ordering::Relaxed)
        );
        for (k, v) in t.snapshot() {
            println!("  {k:<48} {v}");
        }
    }
}

/// Direction changes of the replica count beyond the one a load that rises and falls needs
/// (up, then down): 0 for 1 → 2 → 3 → 2 → 1, 2 for 1 → 3 → 2 → 3 → 1.
fn reversals(path: &[i32]) -> usize {
    let ups: Vec<bool> = path.windows(2).map(|w| w[1] > w[0]).collect();
    let changes = ups.windows(2).filter(|d| d[0] != d[1]).count();
    let one_peak = ups.first() == Some(&true) && changes > 0;
    changes - usize::from(one_peak)
}

/// `0 → 1 → 2 → 3 → 2 → 1 (no reversal)`.
fn path_words(path: &[i32]) -> String {
    let steps: Vec<String> = path.iter().map(i32::to_string).collect();
    let n = reversals(path);
    let verdict = if n == 0 {
        "no reversal".to_string()
    } else {
        format!("{n} reversal(s)")
    };
    format!("{} ({verdict})", steps.join(" → "))
}

/// Makes sure the pool's model exists: SmolLM2 is fetched with the repo's script, any other
/// missing path gets a small random-weight model generated by the engine.
fn ensure_model(
    engine_bin: &std::path::Path,
    base: &std::path::Path,
    pool: &InferencePool,
) -> anyhow::Result<()> {
    let Some(path) = pool.spec.model.uri.strip_prefix("file://") else {
        return Ok(());
    };
    let p = base.join(path);
    if p.exists() {
        return Ok(());
    }
    let status = if path.contains("smollm2") {
        println!(
            "model {} missing: fetching SmolLM2 with scripts/fetch-model.sh",
            p.display()
        );
        std::process::Command::new("bash")
            .arg(base.join("scripts/fetch-model.sh"))
            .status()?
    } else {
        println!(
            "model {} missing: generating a random-weight model",
            p.display()
        );
        std::process::Command::new(engine_bin)
            .arg("gen-random-model")
            .arg("--out")
            .arg(&p)
            .status()?
    };
    anyhow::ensure!(
        status.success() && p.exists(),
        "could not provide model {}",
        p.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{path_words, reversals};

    #[test]
    fn a_rise_and_fall_is_no_reversal_and_a_flap_is() {
        assert_eq!(reversals(&[]), 0);
        assert_eq!(reversals(&[1]), 0);
        assert_eq!(reversals(&[0, 1, 2, 3, 2, 1]), 0);
        assert_eq!(reversals(&[1, 2, 3]), 0);
        assert_eq!(reversals(&[3, 2, 1]), 0);
        assert_eq!(reversals(&[1, 3, 2, 3, 1]), 2);
        assert_eq!(reversals(&[3, 2, 3]), 1);
        assert_eq!(path_words(&[0, 1, 3, 1]), "0 → 1 → 3 → 1 (no reversal)");
        assert_eq!(path_words(&[1, 2, 1, 2]), "1 → 2 → 1 → 2 (1 reversal(s))");
    }
}
