//! The engine launch contract: how an `InferencePoolSpec` becomes the command line and
//! environment of `tidegate-engine serve`, plus the ports and health paths its pod exposes.
//!
//! One definition, three users: the engine's own CLI declares its flags and variables with
//! the names in [`flag`] and [`env`], and both workload runtimes (the Kubernetes Deployment
//! builder and the local process runtime) call [`engine_launch`]. A test in the operator
//! crate parses what [`engine_launch`] produces for every example pool with the engine's own
//! parser, so a flag one side knows and the other does not fails there, not as a crash loop
//! in a cluster.
//!
//! Invariants:
//! - Every spec field that reaches the engine is passed explicitly, even when it equals the
//!   engine's default: the pool, not the binary's defaults, decides (an absent
//!   `kvCache.hostOffload` is `--kv-host-offload 0`, not the engine's 1Gi default).
//! - `engine.extraArgs` come last, so a user's flag overrides the generated one (clap keeps
//!   the last occurrence of a flag).
//! - The admin token is the only value that is not a literal: each runtime supplies it its
//!   own way (a Secret reference in Kubernetes, a literal in local mode).

use crate::inference_pool::InferencePoolSpec;
use crate::launch_args::{Args, token_env};
pub use crate::launch_args::{EnvValue, whole_seconds};

/// Port of the OpenAI-compatible API, `/metrics` and the health endpoints.
pub const HTTP_PORT: u16 = 8000;
/// Port of the admin API.
pub const ADMIN_PORT: u16 = 8001;
/// Liveness: the process is up (the startup and liveness probes).
pub const HEALTHZ_PATH: &str = "/healthz";
/// Readiness: weights loaded and not draining (the readiness probe).
pub const READYZ_PATH: &str = "/readyz";
/// Prometheus text exposition.
pub const METRICS_PATH: &str = "/metrics";
/// The engine subcommand the pods run.
pub const SERVE: &str = "serve";

/// Long flag names of `tidegate-engine serve` (without the leading `--`).
pub mod flag {
    pub const MODEL: &str = "model";
    pub const MODEL_FORMAT: &str = "model-format";
    pub const SERVED_MODEL_NAME: &str = "served-model-name";
    pub const LISTEN: &str = "listen";
    pub const ADMIN_LISTEN: &str = "admin-listen";
    pub const MAX_BATCH_SIZE: &str = "max-batch-size";
    pub const MAX_BATCH_TOKENS: &str = "max-batch-tokens";
    pub const MAX_QUEUED_REQUESTS: &str = "max-queued-requests";
    pub const MAX_CONTEXT_TOKENS: &str = "max-context-tokens";
    pub const KV_BLOCKS: &str = "kv-blocks";
    pub const KV_BLOCK_TOKENS: &str = "kv-block-tokens";
    pub const KV_MEMORY_FRACTION: &str = "kv-memory-fraction";
    pub const MEMORY_LIMIT: &str = "memory-limit";
    pub const KV_HOST_OFFLOAD: &str = "kv-host-offload";
    pub const KV_DISK_OFFLOAD: &str = "kv-disk-offload";
    pub const KV_DISK_DIR: &str = "kv-disk-dir";
    pub const DRAIN_GRACE: &str = "drain-grace";
    pub const LOG_FORMAT: &str = "log-format";
    pub const DEVICE: &str = "device";
}

/// Environment variables of `tidegate-engine serve` (each flag has one; these are the ones
/// the runtimes set).
pub mod env {
    /// The admin bearer token.
    pub use crate::launch_args::env::ADMIN_TOKEN;
}

/// Where one engine runs: what differs between a pod and a local process.
#[derive(Clone, Debug)]
pub struct LaunchSite {
    /// Path of the weights as the engine sees it.
    pub model_path: String,
    /// Host the API and admin listeners bind (`0.0.0.0` in a pod, `127.0.0.1` locally).
    pub bind_host: String,
    pub api_port: u16,
    pub admin_port: u16,
    /// Directory for spilled KV files; required when the pool has `kvCache.diskOffload`.
    pub kv_disk_dir: Option<String>,
    /// `json` in a cluster (log collectors), `text` on a terminal.
    pub log_format: &'static str,
}

/// GPUs one engine process serves on: `--device cuda` is device 0 (no tensor parallelism
/// yet). A pod given more requests GPUs that sit idle; the planner says so in the pool's
/// ResourcesUsed condition.
pub const ENGINE_GPUS_PER_POD: i32 = 1;

/// GPUs per pod that `engine.resources.gpus` requests and the engine does not use.
pub fn idle_gpus_per_pod(gpus: i32) -> i32 {
    (gpus - ENGINE_GPUS_PER_POD).max(0)
}

/// The engine's command line (starting with the subcommand) and environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineLaunch {
    pub args: Vec<String>,
    pub env: Vec<(&'static str, EnvValue)>,
}

/// Why a pool cannot be launched at a site.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LaunchError {
    #[error(
        "spec.engine.kvCache.diskOffload is set but this runtime gives the engine no directory for it"
    )]
    NoDiskDir,
    #[error("spec.engine.{field} {value:?} is not a byte quantity (e.g. 32Gi)")]
    BadQuantity { field: &'static str, value: String },
}

/// A byte quantity as the engine takes it: the spec's own text (`32Gi`), `0` when absent.
/// Checked here too, so a value the engine would refuse is an operator error, not a crash loop.
fn quantity_arg(field: &'static str, q: Option<&crate::Quantity>) -> Result<String, LaunchError> {
    let Some(q) = q else {
        return Ok("0".to_string());
    };
    match q.to_bytes() {
        Some(_) => Ok(q.0.trim().to_string()),
        None => Err(LaunchError::BadQuantity {
            field,
            value: q.0.clone(),
        }),
    }
}

/// `--model-format` value of a pool's `model.format`.
pub fn model_format_arg(format: crate::ModelFormat) -> &'static str {
    match format {
        crate::ModelFormat::Auto => "auto",
        crate::ModelFormat::Safetensors => "safetensors",
        crate::ModelFormat::Gguf => "gguf",
    }
}

/// The command line and environment of the engine for `spec` at `site`.
pub fn engine_launch(
    spec: &InferencePoolSpec,
    site: &LaunchSite,
) -> Result<EngineLaunch, LaunchError> {
    let e = &spec.engine;
    let kv = &e.kv_cache;
    let mut a = Args(vec![SERVE.to_string()]);
    a.flag(flag::MODEL, &site.model_path);
    a.flag(flag::MODEL_FORMAT, model_format_arg(spec.model.format));
    a.flag(flag::SERVED_MODEL_NAME, &spec.model.name);
    a.flag(
        flag::LISTEN,
        format!("{}:{}", site.bind_host, site.api_port),
    );
    a.flag(
        flag::ADMIN_LISTEN,
        format!("{}:{}", site.bind_host, site.admin_port),
    );
    a.flag(flag::MAX_BATCH_SIZE, e.max_batch_size);
    a.flag(flag::MAX_BATCH_TOKENS, e.max_batch_tokens);
    a.flag(flag::MAX_QUEUED_REQUESTS, e.max_queued_requests);
    if let Some(ctx) = spec.model.max_context_tokens {
        a.flag(flag::MAX_CONTEXT_TOKENS, ctx);
    }
    a.flag(flag::KV_BLOCK_TOKENS, kv.block_tokens);
    a.flag(flag::KV_MEMORY_FRACTION, kv.memory_fraction);
    if let Some(mem) = &e.resources.memory {
        // The container's limit (requests = limits): the KV pool is sized inside it.
        a.flag(
            flag::MEMORY_LIMIT,
            quantity_arg("resources.memory", Some(mem))?,
        );
    }
    a.flag(
        flag::KV_HOST_OFFLOAD,
        quantity_arg("kvCache.hostOffload", kv.host_offload.as_ref())?,
    );
    a.flag(
        flag::KV_DISK_OFFLOAD,
        quantity_arg("kvCache.diskOffload", kv.disk_offload.as_ref())?,
    );
    if kv.disk_offload.is_some() {
        let dir = site.kv_disk_dir.as_ref().ok_or(LaunchError::NoDiskDir)?;
        a.flag(flag::KV_DISK_DIR, dir);
    }
    if e.resources.gpus > 0 {
        // A pod given GPUs serves on them (the engine's default runner there is candle), on
        // ENGINE_GPUS_PER_POD of them.
        a.flag(flag::DEVICE, "cuda");
    }
    a.flag(flag::DRAIN_GRACE, whole_seconds(&e.drain_grace_period));
    a.flag(flag::LOG_FORMAT, site.log_format);
    a.0.extend(e.extra_args.iter().cloned());
    Ok(EngineLaunch {
        args: a.0,
        // The router proves itself with the pool's admin token: one Secret, one trust domain.
        env: token_env(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml_engine_extra: serde_json::Value) -> InferencePoolSpec {
        let mut v = serde_json::json!({
            "model": {"name": "m", "uri": "file:///models/m"},
            "engine": {"image": "img"},
            "replicas": {"min": 1, "max": 2}
        });
        if let Some(obj) = yaml_engine_extra.as_object() {
            for (k, val) in obj {
                v["engine"][k] = val.clone();
            }
        }
        serde_json::from_value(v).expect("spec")
    }

    fn site(disk: Option<&str>) -> LaunchSite {
        LaunchSite {
            model_path: "/models/m".into(),
            bind_host: "0.0.0.0".into(),
            api_port: HTTP_PORT,
            admin_port: ADMIN_PORT,
            kv_disk_dir: disk.map(str::to_string),
            log_format: "json",
        }
    }

    fn value_of<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
        let f = format!("--{name}");
        args.iter()
            .position(|a| *a == f)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    }

    #[test]
    fn an_absent_host_offload_is_zero_bytes_not_the_engine_default() {
        let l = engine_launch(&spec(serde_json::json!({})), &site(None)).expect("launch");
        assert_eq!(value_of(&l.args, flag::KV_HOST_OFFLOAD), Some("0"));
        assert_eq!(value_of(&l.args, flag::KV_DISK_OFFLOAD), Some("0"));
        assert_eq!(value_of(&l.args, flag::KV_DISK_DIR), None);
        assert_eq!(l.args[0], SERVE);
    }

    #[test]
    fn a_pool_with_gpus_runs_its_engine_on_cuda() {
        let gpu = spec(serde_json::json!({"resources": {"gpus": 1}}));
        let l = engine_launch(&gpu, &site(None)).expect("launch");
        assert_eq!(value_of(&l.args, flag::DEVICE), Some("cuda"));
        let cpu = spec(serde_json::json!({"resources": {"gpus": 0}}));
        let l = engine_launch(&cpu, &site(None)).expect("launch");
        assert_eq!(
            value_of(&l.args, flag::DEVICE),
            None,
            "the engine's default: cpu"
        );
    }

    #[test]
    fn quantities_become_bytes_and_disk_offload_needs_a_directory() {
        let s = spec(serde_json::json!({
            "kvCache": {"hostOffload": "32Gi", "diskOffload": "1Gi"},
            "resources": {"memory": "64Gi"},
            "extraArgs": ["--threads", "2"]
        }));
        assert_eq!(
            engine_launch(&s, &site(None)),
            Err(LaunchError::NoDiskDir),
            "no directory for the disk tier"
        );
        let l = engine_launch(&s, &site(Some("/kv"))).expect("launch");
        assert_eq!(value_of(&l.args, flag::KV_HOST_OFFLOAD), Some("32Gi"));
        assert_eq!(value_of(&l.args, flag::KV_DISK_OFFLOAD), Some("1Gi"));
        assert_eq!(value_of(&l.args, flag::KV_DISK_DIR), Some("/kv"));
        assert_eq!(value_of(&l.args, flag::MEMORY_LIMIT), Some("64Gi"));
        assert_eq!(&l.args[l.args.len() - 2..], ["--threads", "2"]);
    }
}
