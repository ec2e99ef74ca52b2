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
use clap::Args;
use tidegate_api::Quantity;
use tidegate_api::engine_admin::EnginePolicy;
use tidegate_api::engine_launch::flag;
use tokio::net::TcpListener;

use crate::api::{ServerConfig, start};
use crate::backend::Engine;
use crate::engine_loop::{LoopConfig, LoopEngine};
use crate::metrics::Metrics;
use tidegate_http::auth::{AdminAuth, AdminFlags};
use tidegate_http::logging::{LogFormat, init_logging};
use tidegate_http::shutdown::shutdown_signal;
use tidegate_kv::kv_sizing::{
    KvRequest, KvSize, check_device_fit, read_memory_facts, size_device_kv_pool, size_kv_pool,
};
use tidegate_runner::candle::{CandleRunner, device_weight_bytes};
use tidegate_runner::echo::EchoConfig;
use tidegate_runner::model::{ModelFiles, ModelFormat};
use tidegate_runner::select::{candle_dtype, device_memory};
use tidegate_runner::{DeviceChoice, KvDtype, PackedRunner, Placement, RunnerChoice, WeightChoice};

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("{s:?}: expected a fraction in (0, 1], e.g. 0.9")),
    }
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    s.parse()
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
    #[arg(long = flag::MODEL, env = "TIDEGATE_MODEL", required_unless_present = "fake_model")]
    pub model: Option<PathBuf>,
    /// Weight format of --model.
    #[arg(long = flag::MODEL_FORMAT, env = "TIDEGATE_MODEL_FORMAT", value_enum, default_value_t = ModelFormat::Auto)]
    pub model_format: ModelFormat,
    /// Serve the deterministic echo runner instead of a model (tests and demos): the real
    /// engine loop, scheduler and KV cache, with a model that echoes the last user message.
    #[arg(long, env = "TIDEGATE_FAKE_MODEL")]
    pub fake_model: bool,
    /// Name clients use in `model` (defaults to the model directory's name, or `fake`).
    #[arg(long = flag::SERVED_MODEL_NAME, env = "TIDEGATE_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Address of the OpenAI-compatible API, /metrics and health endpoints.
    #[arg(long = flag::LISTEN, env = "TIDEGATE_LISTEN", default_value = "0.0.0.0:8000")]
    pub listen: SocketAddr,
    /// Address of the admin API (policy push, tenants, drain).
    #[arg(long = flag::ADMIN_LISTEN, env = "TIDEGATE_ADMIN_LISTEN", default_value = "0.0.0.0:8001")]
    pub admin_listen: SocketAddr,
    #[command(flatten)]
    pub secrets: AdminFlags,
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
    #[arg(long = flag::DRAIN_GRACE, env = "TIDEGATE_DRAIN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub drain_grace: Duration,
    /// Requests decoded together in one batched step.
    #[arg(long = flag::MAX_BATCH_SIZE, env = "TIDEGATE_MAX_BATCH_SIZE", default_value_t = 16)]
    pub max_batch_size: usize,
    /// Queue bound: requests waiting for admission beyond this are refused with 429.
    #[arg(long = flag::MAX_QUEUED_REQUESTS, env = "TIDEGATE_MAX_QUEUED_REQUESTS", default_value_t = 64)]
    pub max_queued_requests: usize,
    /// Log format.
    #[arg(long = flag::LOG_FORMAT, env = "TIDEGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Longest context (prompt + output tokens) a request may have; longer ones get 400.
    /// Default: the model's own limit (and never more than the KV pool holds).
    #[arg(long = flag::MAX_CONTEXT_TOKENS, env = "TIDEGATE_MAX_CONTEXT_TOKENS")]
    pub max_context_tokens: Option<usize>,
    /// KV cache blocks in the device pool. Given, it wins over --kv-memory-fraction.
    /// Neither given: 2048 blocks.
    #[arg(long = flag::KV_BLOCKS, env = "TIDEGATE_KV_BLOCKS")]
    pub kv_blocks: Option<usize>,
    /// Size the KV pool as this fraction of the memory left for it: on CPU, of
    /// --memory-limit (or the cgroup's limit, or else the free memory) less what the process
    /// already holds (weights) and the host offload tier.
    #[arg(long = flag::KV_MEMORY_FRACTION, env = "TIDEGATE_KV_MEMORY_FRACTION", value_parser = parse_fraction)]
    pub kv_memory_fraction: Option<f64>,
    /// The container's memory limit (a quantity, e.g. 64Gi): the KV pool is sized inside it.
    /// Default: the cgroup's limit when there is one.
    #[arg(long = flag::MEMORY_LIMIT, env = "TIDEGATE_MEMORY_LIMIT")]
    pub memory_limit: Option<Quantity>,
    /// Tokens per KV block.
    #[arg(long = flag::KV_BLOCK_TOKENS, env = "TIDEGATE_KV_BLOCK_TOKENS", default_value_t = 16)]
    pub kv_block_tokens: usize,
    /// The KV pool's element type on the packed (CPU) runner: f16 (half the bytes, so twice
    /// the tokens in a memory budget and half what attention reads; values rounded to 2⁻¹¹
    /// relative) or f32. The candle runner keeps its own (bf16 on CUDA, f32 on CPU).
    #[arg(long, env = "TIDEGATE_KV_CACHE_DTYPE", default_value_t = KvDtype::F16)]
    pub kv_cache_dtype: KvDtype,
    /// Host RAM for KV offloaded from the device pool, a quantity (e.g. 32Gi; 0 disables it).
    #[arg(long = flag::KV_HOST_OFFLOAD, visible_alias = "kv-host-bytes", env = "TIDEGATE_KV_HOST_OFFLOAD", default_value = "1Gi")]
    pub kv_host_offload: Quantity,
    /// Disk space for KV spilled from host RAM, a quantity (e.g. 200Gi; needs --kv-disk-dir).
    #[arg(long = flag::KV_DISK_OFFLOAD, visible_alias = "kv-disk-bytes", env = "TIDEGATE_KV_DISK_OFFLOAD", default_value = "0")]
    pub kv_disk_offload: Quantity,
    /// Directory for spilled KV files.
    #[arg(long = flag::KV_DISK_DIR, env = "TIDEGATE_KV_DISK_DIR")]
    pub kv_disk_dir: Option<PathBuf>,
    /// Tokens computed per step over all sequences (decode tokens + prefill chunks).
    #[arg(long = flag::MAX_BATCH_TOKENS, env = "TIDEGATE_MAX_BATCH_TOKENS", default_value_t = 512)]
    pub max_batch_tokens: usize,
    /// Compute threads for the forward pass (default: available parallelism).
    #[arg(long, env = "TIDEGATE_THREADS")]
    pub threads: Option<usize>,
    /// Where the model runs: cpu, cuda or cuda:N (CUDA needs a build with the `cuda` feature,
    /// the engine's -cuda image).
    #[arg(long = flag::DEVICE, env = "TIDEGATE_DEVICE", default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Which runner: packed (this crate's CPU kernels; CPU only, the CPU default) or candle
    /// (candle tensors on the device; the CUDA default).
    #[arg(long, env = "TIDEGATE_RUNNER", value_enum)]
    pub runner: Option<RunnerChoice>,
    /// Format the weights are served in: as the file stores them, or converted at load.
    #[arg(long, env = "TIDEGATE_WEIGHTS", value_enum, default_value_t = WeightChoice::AsFile)]
    pub weights: WeightChoice,
    /// Fake model (echo runner): time one batched step takes.
    #[arg(long, env = "TIDEGATE_FAKE_TOKEN_DELAY", default_value = "5ms", value_parser = parse_duration)]
    pub fake_token_delay: Duration,
    /// Fake model: context length in tokens (bytes of UTF-8 text).
    #[arg(long, env = "TIDEGATE_FAKE_CONTEXT_LENGTH", default_value_t = 4096)]
    pub fake_context_length: u32,
    /// Fake model: KV cache blocks (--kv-block-tokens each) unless --kv-blocks is given.
    #[arg(long, env = "TIDEGATE_FAKE_KV_BLOCKS", default_value_t = 4096)]
    pub fake_kv_blocks: u64,
    /// Fake model: time before /readyz turns ready (simulated loading).
    #[arg(long, env = "TIDEGATE_FAKE_LOAD_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub fake_load_delay: Duration,
}

/// The `serve` subcommand's parser as the binary builds it: what a launch-contract test
/// checks the operator's command lines against.
pub fn serve_command() -> clap::Command {
    ServeArgs::augment_args(clap::Command::new(tidegate_api::engine_launch::SERVE))
}

/// Parses `serve ARGS…` (the first item is the subcommand) as the binary would.
pub fn parse_serve<I, T>(args: I) -> Result<ServeArgs, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = serve_command().try_get_matches_from(args)?;
    <ServeArgs as clap::FromArgMatches>::from_arg_matches(&matches)
}

fn admin_auth(args: &ServeArgs) -> anyhow::Result<AdminAuth> {
    args.secrets.admin_auth()
}

fn load_engine(args: &ServeArgs, metrics: &Arc<Metrics>) -> anyhow::Result<Arc<dyn Engine>> {
    if args.fake_model {
        return load_echo(args, metrics);
    }
    let Some(path) = args.model.as_deref() else {
        bail!("--model is required unless --fake-model is set");
    };
    // Before loading anything: a device this build cannot use is an error at once.
    let placement = Placement::resolve(args.device, args.runner)?;
    if let Some(threads) = args.threads {
        // Fails only if a pool was already built (tests); the existing one is kept.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .build_global();
    }
    let files = ModelFiles::load_as(path, args.model_format)
        .with_context(|| format!("loading {}", path.display()))?;
    let model_id = args.served_model_name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".to_string())
    });
    tracing::info!(
        model = %model_id,
        layers = files.config.num_hidden_layers,
        device = %placement.device,
        runner = %placement.runner,
        "model loaded"
    );
    let kv = kv_pool_size(args, &files, placement)?;
    tracing::info!(blocks = kv.blocks, why = %kv.why, "KV pool sized");
    let mut config = loop_config(args, model_id, kv.blocks);
    config.placement = placement;
    let engine = LoopEngine::start(files, config, Arc::clone(metrics))?;
    let info = engine.model_info();
    tracing::info!(weights = %info.weights, kernels = %info.kernels, "weights served");
    Ok(engine)
}

/// `--fake-model`: the real engine loop (scheduler, KV manager, admission) on the echo
/// runner. The pool is `--kv-blocks` when given, else `--fake-kv-blocks`.
fn load_echo(args: &ServeArgs, metrics: &Arc<Metrics>) -> anyhow::Result<Arc<dyn Engine>> {
    let echo = EchoConfig {
        step_time: args.fake_token_delay,
        context_length: args.fake_context_length as usize,
        load_delay: args.fake_load_delay,
    };
    let model_id = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| "fake".to_string());
    let blocks = args
        .kv_blocks
        .unwrap_or(usize::try_from(args.fake_kv_blocks).unwrap_or(usize::MAX));
    let config = loop_config(args, model_id, blocks);
    tracing::info!(blocks = config.kv_blocks, "echo runner (--fake-model)");
    Ok(LoopEngine::start_echo(echo, config, Arc::clone(metrics))?)
}

/// The loop's sizing from the flags, with the pool's block count already decided.
fn loop_config(args: &ServeArgs, model_id: String, kv_blocks: usize) -> LoopConfig {
    LoopConfig {
        model_id,
        kv_blocks: kv_blocks.max(1),
        kv_block_tokens: args.kv_block_tokens.max(1),
        kv_host_bytes: quantity_bytes(&args.kv_host_offload),
        kv_disk_bytes: quantity_bytes(&args.kv_disk_offload),
        kv_disk_dir: args.kv_disk_dir.clone(),
        max_batch_tokens: args.max_batch_tokens.max(1),
        max_batch_seqs: args.max_batch_size.max(1),
        max_waiting: args.max_queued_requests.max(1),
        max_context_tokens: args.max_context_tokens,
        weights: args.weights,
        kv_dtype: args.kv_cache_dtype,
        ..LoopConfig::default()
    }
}

fn quantity_bytes(q: &Quantity) -> usize {
    // FromStr already refused what to_bytes cannot read.
    q.to_bytes()
        .map_or(0, |b| usize::try_from(b).unwrap_or(usize::MAX))
}

/// The KV pool's block count: explicit, from the memory fraction (of host memory, or of the
/// GPU's on CUDA), or the default.
fn kv_pool_size(args: &ServeArgs, files: &ModelFiles, at: Placement) -> anyhow::Result<KvSize> {
    let bs = args.kv_block_tokens.max(1);
    let dtype = candle_dtype(at.device);
    let block_bytes = match at.runner {
        RunnerChoice::Packed => {
            PackedRunner::block_bytes_for(&files.config, bs, args.kv_cache_dtype)
        }
        RunnerChoice::Candle => CandleRunner::block_bytes_for(&files.config, bs, dtype),
    };
    let request = KvRequest {
        explicit_blocks: args.kv_blocks,
        memory_fraction: args.kv_memory_fraction,
        block_bytes,
        host_offload_bytes: quantity_bytes(&args.kv_host_offload) as u64,
    };
    if let Some((free, _total)) = device_memory(at.device)? {
        // The weights go up after this: size from what they will leave, and refuse at once
        // a pool (or weights) that would not fit.
        let weights = device_weight_bytes(&files.config, dtype);
        let size = size_device_kv_pool(&request, free, weights)?;
        check_device_fit(free, weights, size.blocks, block_bytes)?;
        return Ok(size);
    }
    let limit = args.memory_limit.as_ref().and_then(Quantity::to_bytes);
    Ok(size_kv_pool(&request, &read_memory_facts(limit))?)
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
        router_token: args.secrets.router_token(),
    };
    let server = start(config, api, admin_listener, engine, metrics)?;
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
