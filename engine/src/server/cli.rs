//! `tidegate-engine serve`: flags (each with an env var), logging, the engine, the server,
//! SIGTERM → drain → exit 0.
//!
//! Invariants: the process refuses to start with the admin API enabled and no token (a
//! clear error, exit 1); the admin token is never logged; a drain (admin API or SIGTERM)
//! ends the process with `Ok`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use tidegate_api::engine_admin::EnginePolicy;
use tokio::net::TcpListener;

use super::{AdminAuth, ServerConfig};
use crate::backend::Engine;
use crate::fake_engine::{FakeConfig, FakeEngine};
use crate::metrics::Metrics;

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    s.parse::<tidegate_api::Duration>()
        .map(|d| d.as_std())
        .map_err(|e| e.to_string())
}

/// Serve a model over the OpenAI-compatible HTTP API.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model directory or file (safetensors + tokenizer, or GGUF).
    #[arg(long, env = "TIDEGATE_MODEL", required_unless_present = "fake_model")]
    pub model: Option<PathBuf>,
    /// Serve the deterministic fake backend instead of a model (tests and demos).
    #[arg(long, env = "TIDEGATE_FAKE_MODEL")]
    pub fake_model: bool,
    /// Name clients use in `model` (defaults to the model directory's name, or `fake`).
    #[arg(long, env = "TIDEGATE_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Address of the OpenAI-compatible API, /metrics and health endpoints.
    #[arg(long, env = "TIDEGATE_LISTEN", default_value = "0.0.0.0:8000")]
    pub listen: SocketAddr,
    /// Address of the admin API (policy push, tenants, drain).
    #[arg(long, env = "TIDEGATE_ADMIN_LISTEN", default_value = "0.0.0.0:8001")]
    pub admin_listen: SocketAddr,
    /// File holding the admin bearer token.
    #[arg(long, env = "TIDEGATE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// The admin bearer token itself (prefer the file; this is read from the environment).
    #[arg(long, env = "TIDEGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Run without an admin API (nothing listens on --admin-listen).
    #[arg(long, env = "TIDEGATE_ADMIN_DISABLED")]
    pub admin_disabled: bool,
    /// JSON file with the policy to use until the operator pushes one (admin API body).
    #[arg(long, env = "TIDEGATE_POLICY_FILE")]
    pub policy_file: Option<PathBuf>,
    /// Largest request body accepted, in bytes.
    #[arg(long, env = "TIDEGATE_MAX_BODY_BYTES", default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Time a client gets to send its whole request body (slow uploads get 408).
    #[arg(long, env = "TIDEGATE_BODY_READ_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub body_read_timeout: Duration,
    /// Grace period for in-flight requests on drain or SIGTERM (e.g. 30s).
    #[arg(long, env = "TIDEGATE_DRAIN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub drain_grace: Duration,
    /// Requests decoded together in one batched step.
    #[arg(long, env = "TIDEGATE_MAX_BATCH_SIZE", default_value_t = 16)]
    pub max_batch_size: usize,
    /// Queue bound: requests waiting for admission beyond this are refused with 429.
    #[arg(long, env = "TIDEGATE_MAX_QUEUED_REQUESTS", default_value_t = 64)]
    pub max_queued_requests: usize,
    /// Log format.
    #[arg(long, env = "TIDEGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Fake backend: time per batched decode step.
    #[arg(long, env = "TIDEGATE_FAKE_TOKEN_DELAY", default_value = "5ms", value_parser = parse_duration)]
    pub fake_token_delay: Duration,
    /// Fake backend: context length in tokens (characters).
    #[arg(long, env = "TIDEGATE_FAKE_CONTEXT_LENGTH", default_value_t = 4096)]
    pub fake_context_length: u32,
    /// Fake backend: KV cache blocks (16 tokens each).
    #[arg(long, env = "TIDEGATE_FAKE_KV_BLOCKS", default_value_t = 4096)]
    pub fake_kv_blocks: u64,
    /// Fake backend: time before /readyz turns ready (simulated loading).
    #[arg(long, env = "TIDEGATE_FAKE_LOAD_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub fake_load_delay: Duration,
}

/// Installs the tracing subscriber (RUST_LOG filters, default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

fn admin_auth(args: &ServeArgs) -> anyhow::Result<AdminAuth> {
    if args.admin_disabled {
        return Ok(AdminAuth::Disabled);
    }
    let token = match (&args.admin_token_file, &args.admin_token) {
        (Some(path), _) => std::fs::read_to_string(path)
            .with_context(|| format!("reading admin token file {}", path.display()))?,
        (None, Some(token)) => token.clone(),
        (None, None) => bail!(super::StartError::AdminTokenMissing),
    };
    let token = token.trim().to_string();
    if token.is_empty() {
        bail!(
            "the admin token is empty: {}",
            super::StartError::AdminTokenMissing
        );
    }
    Ok(AdminAuth::Token(token))
}

fn load_engine(args: &ServeArgs, metrics: &Arc<Metrics>) -> anyhow::Result<Arc<dyn Engine>> {
    if args.fake_model {
        let config = FakeConfig {
            model_id: args
                .served_model_name
                .clone()
                .unwrap_or_else(|| "fake".to_string()),
            context_length: args.fake_context_length,
            token_delay: args.fake_token_delay,
            max_running: args.max_batch_size.max(1),
            max_waiting: args.max_queued_requests.max(1),
            kv_blocks_total: args.fake_kv_blocks.max(1),
            block_size: 16,
            load_delay: args.fake_load_delay,
        };
        return Ok(FakeEngine::start(config, Arc::clone(metrics)));
    }
    let model = args.model.as_deref().map(|p| p.display().to_string());
    bail!(
        "serving a real model ({}) needs the engine loop, which is not wired into `serve` yet; \
         use --fake-model",
        model.unwrap_or_default()
    )
}

/// Runs `serve` to completion (a drain), on its own tokio runtime.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let admin = admin_auth(&args)?;
    let initial_policy = match &args.policy_file {
        Some(path) => {
            let text = std::fs::read(path)
                .with_context(|| format!("reading policy file {}", path.display()))?;
            serde_json::from_slice::<EnginePolicy>(&text)
                .with_context(|| format!("parsing policy file {}", path.display()))?
        }
        None => EnginePolicy::default(),
    };
    let metrics = Metrics::new();
    let engine = load_engine(&args, &metrics)?;
    let api = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let admin_listener = match admin {
        AdminAuth::Token(_) => Some(
            TcpListener::bind(args.admin_listen)
                .await
                .with_context(|| format!("binding admin {}", args.admin_listen))?,
        ),
        AdminAuth::Disabled => None,
    };
    let config = ServerConfig {
        max_body_bytes: args.max_body_bytes,
        body_read_timeout: args.body_read_timeout,
        drain_grace: args.drain_grace,
        admin,
        initial_policy,
    };
    let server = super::start(config, api, admin_listener, engine, metrics)?;
    let drain = Arc::clone(&server.state.drain);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("termination signal: draining");
        drain.start(None);
    });
    server.wait().await.context("server")?;
    tracing::info!("drained; exiting");
    Ok(())
}

#[cfg(unix)]
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn shutdown_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
