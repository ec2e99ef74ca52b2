//! Local mode: the whole loop on one machine. The same InferencePool/TierPolicy YAML as in a
//! cluster, every pool of the files run by the outer loop (`outer_loop`) through the same
//! driver and planner as the cluster's controller, over local mode's ports: engine and
//! router processes (`workload_runtime::local`), the engines' /metrics
//! (`metrics_source::direct`), a registry file per pool (`registry_store::file`) and the
//! console (`status_sink::console`). A built-in tidal load per pool, through the pool's
//! router, shows each pool scale up, pause new tenants at its ceiling, reopen and scale down.
//!
//! Invariants: every engine and router started here is stopped before the command returns;
//! each pool's summary counts every request its load generator sent exactly once; with the
//! load, the command fails unless every pool settled (admission open, `replicas.min`, no
//! drain) after it.

mod front_door;
pub mod loadgen;
pub mod outer_loop;
mod summary;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tidegate_api::{AdmissionState, InferencePool};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admin_token::random_token;
use crate::driver::{Driver, TickOutcome};
use crate::engine_control::http::HttpEngineControl;
use crate::manifests::load_manifests;
use crate::metrics_source::direct::DirectMetrics;
use crate::registry_store::file::FileRegistry;
use crate::status_sink::console::ConsoleSink;
use crate::workload_runtime::local::{LocalRuntime, LocalRuntimeConfig};
use front_door::FrontDoor;
use loadgen::{Tally, TideShape};
use outer_loop::LocalPool;
use summary::Summary;

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

/// Local mode's driver: the control loop over local mode's ports.
type LocalDriver = Driver<LocalRuntime, DirectMetrics, HttpEngineControl, FileRegistry>;

/// Runs local mode: every pool of the files until the load ends and they settle (or Ctrl-C).
pub async fn run(args: LocalArgs) -> anyhow::Result<()> {
    let manifests = load_manifests(&args.files)?;
    let mut pools = outer_loop::resolve(&manifests, &args.files)?;
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
    for p in &pools {
        ensure_model(&engine_bin, &base_dir, &p.pool)?;
    }
    std::fs::create_dir_all(&args.state_dir)?;
    let runtime = LocalRuntime::new(LocalRuntimeConfig {
        engine_bin,
        base_dir,
        log_dir: args.state_dir.join("logs"),
        admin_token: anyhow::Context::context(random_token(), "making an admin token")?,
        extra_args: Vec::new(),
        file_sd_path: None,
        // Local mode stops its engines when it ends: nothing to adopt.
        engine_book: None,
        routers_file: None,
        secrets: manifests.secrets.clone(),
    });
    let driver = Driver::new(
        runtime,
        DirectMetrics::new(),
        HttpEngineControl::new(),
        FileRegistry::new(args.state_dir.join("registry")),
    );
    let started = Instant::now();
    let sink = ConsoleSink::new(started);
    let mut watches: Vec<PoolWatch> = pools
        .iter()
        .map(|p| PoolWatch::start(p, &args, &sink))
        .collect();
    sink.header();
    let unsettled = run_loop(&args, &driver, &sink, &mut pools, &mut watches, started).await;
    let grace = pools
        .iter()
        .map(|p| p.pool.spec.engine.drain_grace_period.as_std())
        .max()
        .unwrap_or_default();
    driver.runtime.shutdown(grace).await;
    for (p, w) in pools.iter().zip(&watches) {
        w.print_summary(p, started.elapsed());
    }
    // Let engines finish their drain and exit before we go.
    tokio::time::sleep(Duration::from_millis(500)).await;
    anyhow::ensure!(
        !unsettled,
        "after the load, a pool did not reopen admission and scale down to replicas.min \
         within --settle-timeout {:?}",
        args.settle_timeout.0
    );
    Ok(())
}

/// Ticks the pools until the load has ended and every pool settled (false), the settle
/// timeout ran out (true), or Ctrl-C (false).
async fn run_loop(
    args: &LocalArgs,
    driver: &LocalDriver,
    sink: &ConsoleSink,
    pools: &mut [LocalPool],
    watches: &mut [PoolWatch],
    started: Instant,
) -> bool {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_else(|_| reqwest::Client::new());
    let mut load_done_at: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = outer_loop::wait_due(pools) => {}
            _ = tokio::signal::ctrl_c() => { println!("interrupted"); return false; }
        }
        for (p, w) in pools.iter().zip(watches.iter()) {
            sink.set_users(&p.pref, w.users(started.elapsed()));
        }
        for t in outer_loop::tick_due(driver, sink, pools, now_ms()).await {
            let p = &pools[t.index];
            match t.outcome {
                Ok(out) => {
                    watches[t.index]
                        .after_tick(driver, &http, p, &out, started)
                        .await
                }
                Err(e) => println!("{}: tick failed: {e} (retrying)", p.pref),
            }
        }
        for (p, w) in pools.iter().zip(watches.iter_mut()) {
            w.collect_load(p).await;
        }
        if load_done_at.is_none() && !args.no_load && watches.iter().all(|w| w.load.is_none()) {
            load_done_at = Some(Instant::now());
        }
        if let Some(done) = load_done_at {
            let settled = watches.iter().all(|w| w.settled);
            if settled || done.elapsed() > args.settle_timeout.0 {
                if !settled {
                    println!("pools did not settle within {:?}", args.settle_timeout.0);
                }
                return !settled;
            }
        }
    }
}

/// What local mode follows of one pool besides its ticks: its load generator, its router's
/// figures, its summary and whether it settled.
struct PoolWatch {
    shape: TideShape,
    load: Option<JoinHandle<Arc<Tally>>>,
    tally: Option<Arc<Tally>>,
    /// The load goes to the pool's front door: its router, once the first apply started it.
    front_tx: watch::Sender<Option<String>>,
    front: FrontDoor,
    summary: Summary,
    /// At its last tick: admission open, at `replicas.min`, nothing draining.
    settled: bool,
}

impl PoolWatch {
    /// Starts the pool's load (unless `--no-load`), waiting for its router.
    fn start(p: &LocalPool, args: &LocalArgs, sink: &ConsoleSink) -> PoolWatch {
        let spec = &p.pool.spec;
        println!(
            "tidegate local: pool {}, model {}, replicas {}..{}, tick every {}",
            p.pref, spec.model.name, spec.replicas.min, spec.replicas.max, spec.scaling.interval
        );
        sink.watch(&p.pref, &spec.model.name);
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
            model: spec.model.name.clone(),
        };
        let (front_tx, front_rx) = watch::channel(None::<String>);
        let load = (!args.no_load).then(|| tokio::spawn(loadgen::run(shape.clone(), front_rx)));
        PoolWatch {
            shape,
            load,
            tally: None,
            front_tx,
            front: FrontDoor::default(),
            summary: Summary::default(),
            settled: false,
        }
    }

    /// The load's users now (0 once it ended, or without one).
    fn users(&self, since_start: Duration) -> usize {
        self.shape.users_at(since_start) * usize::from(self.load.is_some())
    }

    /// Follows one tick: the router's figures, where the load goes, the summary.
    async fn after_tick(
        &mut self,
        driver: &LocalDriver,
        http: &reqwest::Client,
        p: &LocalPool,
        out: &TickOutcome,
        started: Instant,
    ) {
        let router = driver.runtime.router_url(&p.pref).await;
        if let Some(url) = &router {
            self.front
                .sample(http, url, out.workload.ready_replicas)
                .await;
        }
        self.front_tx.send_if_modified(|cur| {
            let changed = *cur != router;
            if changed {
                cur.clone_from(&router);
            }
            changed
        });
        self.summary.record(out, &p.pool, started);
        self.settled = out.plan.admission.state == AdmissionState::Open
            && out.workload.replicas == Some(p.pool.spec.replicas.min)
            && out.draining.is_empty();
    }

    /// Takes the load's tally once it has finished.
    async fn collect_load(&mut self, p: &LocalPool) {
        if let Some(handle) = &mut self.load
            && handle.is_finished()
        {
            self.tally = handle.await.ok();
            self.load = None;
            println!(
                "{}: load finished; waiting for admission to reopen and the pool to scale down",
                p.pref
            );
        }
    }

    fn print_summary(&self, p: &LocalPool, elapsed: Duration) {
        println!(
            "\n==== tidegate local summary: {} ({:.0}s)",
            p.pref,
            elapsed.as_secs_f64()
        );
        for line in self.summary.lines(self.tally.as_deref()) {
            println!("{line}");
        }
        for line in self.front.lines() {
            println!("{line}");
        }
    }
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
