//! `tidegate-operator run`: the operator against an API server (in a cluster or from a
//! kubeconfig).
//!
//! `main` wires the adapters: `--workload kubernetes` (Deployment/Service/PDB, ConfigMap
//! registry, Events) or `--workload local` (engine processes on this machine, file registry,
//! an API server that only serves the custom resources). Either way a pool's metrics come
//! from Prometheus or from its engines directly, per `spec.scaling.metrics.source`.
//! [`run_with`] runs the controller over any WorkloadRuntime + MetricsSource +
//! EngineControl + RegistryStore and brings the rest: metrics endpoint, leader election,
//! status, events.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use kube::Client;
use tracing::{error, info};

use crate::admin_token::random_token;
use crate::driver::Driver;
use crate::engine_control::http::HttpEngineControl;
use crate::k8s::cache::Caches;
use crate::k8s::controller::Context;
use crate::k8s::leader::LeaderElector;
use crate::k8s::manager::{ControllerOptions, run_controller};
use crate::k8s::metrics::{self, OperatorMetrics};
use crate::k8s::owners::OwnerBook;
use crate::k8s::shutdown::Shutdown;
use crate::metrics_source::direct::DirectMetrics;
use crate::metrics_source::prometheus::PrometheusMetrics;
use crate::metrics_source::switch::SourceSwitch;
use crate::ports::{EngineControl, MetricsSource, RegistryStore, WorkloadRuntime};
use crate::registry_store::config_map::ConfigMapRegistry;
use crate::registry_store::file::FileRegistry;
use crate::status_sink::kubernetes::EventSink;
use crate::workload_runtime::kubernetes::K8sRuntime;
use crate::workload_runtime::local::{LocalRuntime, LocalRuntimeConfig};

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// Where engine replicas run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// A Deployment, Service and PodDisruptionBudget per pool.
    Kubernetes,
    /// Engine processes on this machine; the API server only holds the custom resources.
    Local,
}

/// Flags of `run` (each also from an environment variable).
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// Kubeconfig file; default: kube's inference (KUBECONFIG, ~/.kube/config, then the
    /// in-cluster service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Namespaces to watch, comma-separated; empty watches all.
    #[arg(long, env = "TIDEGATE_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Prometheus base URL for pools that do not name their own.
    #[arg(long, env = "TIDEGATE_PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,
    /// Address of /metrics and /healthz.
    #[arg(long, env = "TIDEGATE_METRICS_LISTEN", default_value = "0.0.0.0:8080")]
    pub metrics_listen: SocketAddr,
    /// Act only while holding the Lease `tidegate-operator` (namespace: POD_NAMESPACE).
    #[arg(long, env = "TIDEGATE_LEADER_ELECTION")]
    pub leader_election: bool,
    /// Namespace of the leader Lease; default POD_NAMESPACE, then the client's namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Log format.
    #[arg(long, env = "TIDEGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Where engine replicas run.
    #[arg(long, env = "TIDEGATE_WORKLOAD", value_enum, default_value_t = Workload::Kubernetes)]
    pub workload: Workload,
    /// --workload local: the tidegate-engine binary (default: next to this binary).
    #[arg(long, env = "TIDEGATE_ENGINE_BIN")]
    pub engine_bin: Option<PathBuf>,
    /// --workload local: folder for engine logs, tenant registries and the engine book (the
    /// engines a killed operator left running, which the next one adopts).
    #[arg(long, default_value = ".tidegate-local")]
    pub local_state_dir: PathBuf,
    /// --workload local: write the engines' /metrics targets here (Prometheus file_sd).
    #[arg(long)]
    pub file_sd: Option<PathBuf>,
}

/// What the API server offers besides the custom resources.
#[derive(Clone, Copy, Debug)]
pub struct Capabilities {
    /// Watch owned Deployments, Services and PodDisruptionBudgets.
    pub watch_owned: bool,
    /// Publish Kubernetes Events.
    pub events: bool,
    /// Read API-key Secrets of tier policies.
    pub secrets: bool,
}

impl Capabilities {
    /// A full cluster.
    pub const CLUSTER: Capabilities = Capabilities {
        watch_owned: true,
        events: true,
        secrets: true,
    };
    /// An API server that serves only the custom resources.
    pub const CRDS_ONLY: Capabilities = Capabilities {
        watch_owned: false,
        events: false,
        secrets: false,
    };
}

/// Sets up logging (RUST_LOG, default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// A client from --kubeconfig, or kube's default inference.
pub async fn client(args: &RunArgs) -> anyhow::Result<Client> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    Client::try_from(config).context("building the Kubernetes client")
}

/// The `run` subcommand.
pub fn main(args: RunArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = client(&args).await?;
    let metrics = SourceSwitch {
        prometheus: PrometheusMetrics::new(args.prometheus_url.clone()),
        direct: DirectMetrics::new(),
    };
    match args.workload {
        Workload::Kubernetes => {
            let owners = OwnerBook::new();
            let caches = Caches::default();
            let driver = Driver::new(
                K8sRuntime::new(client.clone(), owners.clone(), caches.clone()),
                metrics,
                HttpEngineControl::new(),
                ConfigMapRegistry::new(client.clone(), owners.clone()),
            );
            run_with(&args, client, driver, owners, caches, Capabilities::CLUSTER).await
        }
        Workload::Local => {
            let engine_bin = match &args.engine_bin {
                Some(b) => b.clone(),
                None => std::env::current_exe()?.with_file_name("tidegate-engine"),
            };
            anyhow::ensure!(
                engine_bin.exists(),
                "engine binary {} not found (pass --engine-bin)",
                engine_bin.display()
            );
            std::fs::create_dir_all(&args.local_state_dir)?;
            let runtime = LocalRuntime::new(LocalRuntimeConfig {
                engine_bin,
                base_dir: std::env::current_dir()?,
                log_dir: args.local_state_dir.join("logs"),
                admin_token: random_token().context("making an admin token")?,
                extra_args: Vec::new(),
                file_sd_path: args.file_sd.clone(),
                // A killed operator's engines keep running; the next one adopts them.
                engine_book: Some(args.local_state_dir.join("engines.json")),
                routers_file: Some(args.local_state_dir.join("routers.json")),
                // Pools come from the API server here: credentials from the environment.
                secrets: Default::default(),
            });
            let driver = Driver::new(
                runtime,
                metrics,
                HttpEngineControl::new(),
                FileRegistry::new(args.local_state_dir.join("registry")),
            );
            run_with(
                &args,
                client,
                driver,
                OwnerBook::new(),
                Caches::default(),
                Capabilities::CRDS_ONLY,
            )
            .await
        }
    }
}

/// Runs the controller over any adapters until SIGTERM / Ctrl-C (or a lost Lease): serves
/// /metrics and /healthz, waits for the Lease if --leader-election, then reconciles. A
/// signal ends it within `shutdown::DRAIN_LIMIT` at any of these stages.
/// `owners` must be the book the runtime and registry record owner references in, and
/// `caches` the caches the runtime reads (the controller starts them).
pub async fn run_with<W, M, E, R>(
    args: &RunArgs,
    client: Client,
    driver: Driver<W, M, E, R>,
    owners: OwnerBook,
    caches: Caches,
    caps: Capabilities,
) -> anyhow::Result<()>
where
    W: WorkloadRuntime + 'static,
    M: MetricsSource + 'static,
    E: EngineControl + 'static,
    R: RegistryStore + 'static,
{
    let shutdown = Shutdown::on_signals();
    let metrics = Arc::new(OperatorMetrics::new());
    let server = tokio::spawn(metrics::serve(args.metrics_listen, metrics.clone()));
    info!(listen = %args.metrics_listen, "serving /metrics and /healthz");

    let leader = if args.leader_election {
        let ns = args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let elector = LeaderElector::new(client.clone(), &ns, LeaderElector::default_identity());
        tokio::select! {
            _ = elector.acquire() => {}
            _ = shutdown.requested() => {
                info!("shut down while waiting for the Lease");
                return Ok(());
            }
        }
        Some(elector)
    } else {
        None
    };

    let events = if caps.events {
        EventSink::new(client.clone())
    } else {
        EventSink::disabled()
    };
    let mut ctx = Context::new(client, driver, owners, events, metrics);
    ctx.read_secrets = caps.secrets;
    ctx.caches = caches;
    let opts = ControllerOptions {
        namespaces: args
            .namespaces
            .iter()
            .filter(|n| !n.is_empty())
            .cloned()
            .collect(),
        watch_owned: caps.watch_owned,
    };
    let controller = run_controller(Arc::new(ctx), opts, shutdown);
    let lost = async {
        match &leader {
            Some(l) => l.hold().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = controller => Ok(()),
        why = lost => {
            error!(reason = %why, "lost leadership; exiting");
            anyhow::bail!("lost leadership: {why}")
        }
        res = server => match res {
            Ok(Err(e)) => Err(e),
            _ => anyhow::bail!("metrics server stopped"),
        },
    }
}
