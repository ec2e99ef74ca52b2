//! `InferencePool` (tidegate.dev/v1alpha1): one model served by a set of identical engine pods.
//!
//! Every field carries a doc comment: it becomes `kubectl explain` text. Every default is
//! declared with serde so the schema advertises it and the API server fills it in. Cross-field
//! rules are CEL (`x-kubernetes-validations`) so a bad manifest is refused by the API server,
//! not discovered later by the operator.
//!
//! Every duration is bounded by the schema as `FromStr` bounds it (see `duration`); the ones
//! where zero would make the operator spin (interval), divide by nothing (rateWindow) or
//! refuse everything (queueWaitP99) use `positive_schema` and refuse `0s` as well.

// The kube derive takes one `printcolumn(...)`/`shortname` per column or name, which clippy
// mistakes for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;
use crate::quantity::Quantity;

/// Desired state of an InferencePool: which model, on which engine, how far it may scale,
/// the service level it must keep, and what to do at the ceiling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "kube",
    derive(kube::CustomResource),
    kube(
        group = "tidegate.dev",
        version = "v1alpha1",
        kind = "InferencePool",
        plural = "inferencepools",
        singular = "inferencepool",
        shortname = "tgpool",
        shortname = "tgpools",
        category = "tidegate",
        namespaced,
        status = "crate::status::InferencePoolStatus",
        doc = "A pool of identical LLM engine pods serving one model. tidegate scales it from measured decode throughput and queue latency, and pauses admission of new tenants when it is at its ceiling.",
        scale(
            spec_replicas_path = ".spec.replicas.manual",
            status_replicas_path = ".status.replicas",
            label_selector_path = ".status.selector"
        ),
        printcolumn(
            name = "Model",
            type_ = "string",
            json_path = ".spec.model.name",
            description = "Served model name"
        ),
        printcolumn(
            name = "Ready",
            type_ = "integer",
            json_path = ".status.readyReplicas",
            description = "Engine pods ready to serve"
        ),
        printcolumn(
            name = "Desired",
            type_ = "integer",
            json_path = ".status.desiredReplicas",
            description = "Replicas the operator wants"
        ),
        printcolumn(
            name = "Tokens/s",
            type_ = "number",
            json_path = ".status.measured.decodeTokensPerSecond",
            description = "Measured decode tokens per second, whole pool"
        ),
        printcolumn(
            name = "Queue-P99",
            type_ = "string",
            json_path = ".status.measured.queueWaitP99",
            description = "Measured p99 queue wait"
        ),
        printcolumn(
            name = "Admission",
            type_ = "string",
            json_path = ".status.admission.state",
            description = "Open, or PausedNewTenants at the ceiling"
        ),
        printcolumn(
            name = "Age",
            type_ = "date",
            json_path = ".metadata.creationTimestamp"
        ),
        printcolumn(
            name = "Util",
            type_ = "number",
            json_path = ".status.measured.utilization",
            description = "Demand over capacity",
            priority = 1
        ),
        printcolumn(
            name = "Max",
            type_ = "integer",
            json_path = ".spec.replicas.max",
            description = "Replica ceiling",
            priority = 1
        ),
        printcolumn(
            name = "Mode",
            type_ = "string",
            json_path = ".spec.scaling.mode",
            description = "Auto, Advisory or Manual",
            priority = 1
        )
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.gpuBudget) || self.gpuBudget >= self.replicas.min * self.engine.resources.gpus",
        "message": "gpuBudget must cover at least replicas.min × engine.resources.gpus"
    }
]))]
pub struct InferencePoolSpec {
    /// The model this pool serves.
    pub model: ModelSpec,
    /// The engine each pod runs: image, resources, KV cache sizing and batching.
    pub engine: EngineSpec,
    /// Replica bounds. The operator never goes below min or above max.
    pub replicas: ReplicaBounds,
    /// Optional cap on the GPUs the whole pool may hold (replicas × engine.resources.gpus).
    /// When it binds before replicas.max, the pool is at its ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub gpu_budget: Option<i32>,
    /// The service level the pool is scaled to keep.
    #[serde(default)]
    pub slo: Slo,
    /// How and how often the operator scales the pool.
    #[serde(default)]
    pub scaling: Scaling,
    /// When to pause and resume admission of new tenants at the ceiling.
    #[serde(default)]
    pub admission: Admission,
    /// The TierPolicy (same namespace) that maps requests to tenants and tiers. Without it,
    /// every request is served in one default tier that is never paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier_policy_ref: Option<LocalObjectReference>,
    /// The pool's front door: the router that picks an engine per request (KV affinity),
    /// applies pool-wide admission and holds requests while the pool scales from zero.
    #[serde(default)]
    pub router: RouterSpec,
}

/// The pool router (`tidegate-engine route`): CPU-only pods in front of the engines.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouterSpec {
    /// Router pods (at least 2 for availability; each enforces 1/replicas of every tenant's
    /// rate limit, so the pool-wide limit is the tier's).
    #[serde(default = "default_router_replicas")]
    #[schemars(range(min = 1, max = 64))]
    pub replicas: i32,
    /// How much more than the mean load one engine may take before a session spills to the
    /// next engine on the ring (consistent hashing with bounded load).
    #[serde(default = "default_load_factor")]
    #[schemars(range(min = 1.0, max = 4.0))]
    pub load_factor: f64,
    /// How long a request is held while the pool has no ready engine (scale from zero, or
    /// every engine restarting); past it the request gets 503 + Retry-After.
    #[serde(default = "default_hold_timeout")]
    #[schemars(schema_with = "crate::duration::positive_schema")]
    pub hold_timeout: Duration,
    /// Requests held at most, per router, while no engine is ready; more get 503 at once.
    #[serde(default = "default_max_held")]
    #[schemars(range(min = 0, max = 100000))]
    pub max_held_requests: u32,
}

fn default_router_replicas() -> i32 {
    2
}
fn default_load_factor() -> f64 {
    1.25
}
fn default_hold_timeout() -> Duration {
    Duration::from_secs(300)
}
fn default_max_held() -> u32 {
    256
}

impl Default for RouterSpec {
    fn default() -> Self {
        RouterSpec {
            replicas: default_router_replicas(),
            load_factor: default_load_factor(),
            hold_timeout: default_hold_timeout(),
            max_held_requests: default_max_held(),
        }
    }
}

/// A reference to an object in the same namespace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LocalObjectReference {
    /// Name of the referenced object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The model: the name clients ask for and where the weights are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.source) || self.uri.startsWith('s3://') || self.uri.startsWith('hf://')",
        "message": "model.source is for fetched models only (uri s3://… or hf://…)"
    },
    {
        "rule": "!has(self.source) || !has(self.source.region) || self.uri.startsWith('s3://')",
        "message": "model.source.region is for s3:// models only"
    }
]))]
pub struct ModelSpec {
    /// Name clients send in the OpenAI `model` field, e.g. `llama-3.1-8b-instruct`.
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    )]
    pub name: String,
    /// Where the weights are. Read in place: a path inside the pod (`file:///models/llama`),
    /// a volume the engine mounts (`pvc://CLAIM/PATH`), or an OCI image whose files are the
    /// model, mounted as an image volume (`oci://REGISTRY/NAME:TAG` or `@sha256:DIGEST`;
    /// Kubernetes 1.33+ with the ImageVolume feature, GA in 1.36). Fetched before the engine
    /// starts (an init container downloads, verifies and caches them; see source):
    /// `s3://BUCKET/PREFIX` (every object under the prefix, from any S3-compatible store) or
    /// `hf://ORG/NAME[@REVISION]` (a Hugging Face model repository, from its cache layout
    /// first, then the hub).
    #[schemars(
        length(min = 1, max = 1024),
        regex(
            pattern = r"^((file|pvc)://.+|oci://[^\s/][^\s]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*|@sha256:[a-f0-9]{64})|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?|hf://[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*(@[A-Za-z0-9_./-]+)?)$"
        )
    )]
    pub uri: String,
    /// Where and with what a fetched model (`s3://`, `hf://`) is read: the credentials
    /// Secret, the endpoint, the region, the cache volume's size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ModelSource>,
    /// Weight format. Auto detects it from the files found at uri.
    #[serde(default)]
    pub format: ModelFormat,
    /// Maximum context length (prompt + output tokens) the engine accepts. Defaults to the
    /// model's own limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 128, max = 1048576))]
    pub max_context_tokens: Option<i32>,
}

/// Where a fetched model (`s3://`, `hf://`) is read from, and with which credentials.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSource {
    /// A Secret in the pool's namespace holding the credentials, under the names the
    /// stores' own tools use: for `s3://`, `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`
    /// (and optionally `AWS_SESSION_TOKEN`); for `hf://`, `HF_TOKEN`. Without it, S3 uses the
    /// pod's ambient identity (web identity, instance metadata) and the hub is asked
    /// anonymously.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub credentials_secret: Option<String>,
    /// For `s3://`: the S3-compatible store's URL (`https://s3.example.com`; path-style
    /// requests), absent for AWS S3 itself. For `hf://`: a hub mirror, absent for the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024), regex(pattern = r"^https?://[^\s]+$"))]
    pub endpoint: Option<String>,
    /// For `s3://`: the bucket's region (default `us-east-1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[a-z0-9-]+$"))]
    pub region: Option<String>,
    /// Size limit of the pod's model cache volume (an emptyDir), e.g. `20Gi`; absent: no
    /// limit. The model is fetched once per pod and kept across container restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_size: Option<Quantity>,
}

/// Weight file format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ModelFormat {
    /// Detect from the files present.
    #[default]
    Auto,
    /// Hugging Face layout: config.json, *.safetensors, tokenizer.json.
    Safetensors,
    /// A single GGUF file carrying weights and tokenizer.
    #[serde(rename = "GGUF")]
    Gguf,
}

/// The engine pods.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineSpec {
    /// Container image of the tidegate engine.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Resources of one engine pod.
    #[serde(default)]
    pub resources: EngineResources,
    /// Paged KV cache sizing and offload tiers.
    #[serde(default)]
    pub kv_cache: KvCacheSpec,
    /// Most sequences decoded together in one step.
    #[serde(default = "default_max_batch")]
    #[schemars(range(min = 1, max = 4096))]
    pub max_batch_size: i32,
    /// Token budget of one step (decode tokens plus prefill chunks).
    #[serde(default = "default_max_batch_tokens")]
    #[schemars(range(min = 16, max = 1048576))]
    pub max_batch_tokens: i32,
    /// Requests an engine holds waiting before it refuses with 429 and Retry-After.
    #[serde(default = "default_max_queue")]
    #[schemars(range(min = 0, max = 100000))]
    pub max_queued_requests: i32,
    /// How long a pod being removed may take to finish its in-flight requests.
    #[serde(default = "default_drain_grace")]
    pub drain_grace_period: Duration,
    /// How long a new pod may take to become ready. Its startup probe allows this long from
    /// the container's start (weight load); at the ceiling, admission waits this long from
    /// the replicas' request (scheduling and image pull included) before it counts the ready
    /// ones as all the capacity the pool has.
    #[serde(default = "default_startup_grace")]
    #[schemars(schema_with = "crate::duration::positive_schema")]
    pub startup_grace_period: Duration,
    /// Extra command-line arguments passed to the engine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub extra_args: Vec<String>,
}

fn default_max_batch() -> i32 {
    64
}
fn default_max_batch_tokens() -> i32 {
    8192
}
fn default_max_queue() -> i32 {
    256
}
fn default_drain_grace() -> Duration {
    Duration::from_secs(60)
}
fn default_startup_grace() -> Duration {
    Duration::from_secs(15 * 60)
}

/// Compute resources of one engine pod.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineResources {
    /// GPUs per pod (nvidia.com/gpu). 0 runs the engine on CPU.
    #[serde(default = "default_gpus")]
    #[schemars(range(min = 0, max = 16))]
    pub gpus: i32,
    /// CPU request and limit, e.g. `8` or `7500m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory request and limit, e.g. `64Gi`. Host-RAM KV offload lives inside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
}

fn default_gpus() -> i32 {
    1
}

impl Default for EngineResources {
    fn default() -> Self {
        EngineResources {
            gpus: default_gpus(),
            cpu: None,
            memory: None,
        }
    }
}

/// Paged KV cache: blocks on the accelerator, with optional host-RAM and disk tiers that
/// idle sessions are offloaded to, per their tier's retention policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvCacheSpec {
    /// Tokens per KV block.
    #[serde(default = "default_block_tokens")]
    #[schemars(range(min = 1, max = 256))]
    pub block_tokens: i32,
    /// Fraction of accelerator memory (after weights) given to KV blocks.
    #[serde(default = "default_memory_fraction")]
    #[schemars(range(min = 0.05, max = 0.98))]
    pub memory_fraction: f64,
    /// Host-RAM offload tier size, e.g. `32Gi`. Absent: no host tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_offload: Option<Quantity>,
    /// Disk offload tier size, e.g. `200Gi`, on an emptyDir volume. Absent: no disk tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_offload: Option<Quantity>,
}

fn default_block_tokens() -> i32 {
    16
}
fn default_memory_fraction() -> f64 {
    0.9
}

impl Default for KvCacheSpec {
    fn default() -> Self {
        KvCacheSpec {
            block_tokens: default_block_tokens(),
            memory_fraction: default_memory_fraction(),
            host_offload: None,
            disk_offload: None,
        }
    }
}

/// Replica bounds, and the replica count used in Manual mode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": "self.min <= self.max", "message": "replicas.min must be less than or equal to replicas.max" },
    { "rule": "!has(self.manual) || (self.manual >= self.min && self.manual <= self.max)", "message": "replicas.manual must lie between replicas.min and replicas.max" }
]))]
pub struct ReplicaBounds {
    /// Fewest engine pods, even with no load. 0 lets an idle pool scale to zero.
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 0, max = 10000))]
    pub min: i32,
    /// Most engine pods. At max (or at gpuBudget) the pool is at its ceiling.
    #[schemars(range(min = 1, max = 10000))]
    pub max: i32,
    /// Replica count in Manual mode; `kubectl scale` writes it (scale subresource). Ignored
    /// in Auto and Advisory mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10000))]
    pub manual: Option<i32>,
}

fn default_min_replicas() -> i32 {
    1
}

/// The service level the pool is scaled to keep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Slo {
    /// Decode tokens per second one session needs to feel smooth (r). A pod producing T
    /// tokens/s at saturation serves about T / r sessions at once.
    #[serde(default = "default_tps_per_session")]
    #[schemars(range(min = 0.1, max = 10000.0))]
    pub tokens_per_second_per_session: f64,
    /// Target for the p99 time a request waits in an engine queue before its first step.
    #[serde(default = "default_queue_wait")]
    #[schemars(schema_with = "crate::duration::positive_schema")]
    pub queue_wait_p99: Duration,
    /// Fraction of measured capacity the pool is sized to run at; the rest is headroom.
    #[serde(default = "default_target_utilization")]
    #[schemars(range(min = 0.1, max = 1.0))]
    pub target_utilization: f64,
}

fn default_tps_per_session() -> f64 {
    20.0
}
fn default_queue_wait() -> Duration {
    Duration::from_secs(1)
}
fn default_target_utilization() -> f64 {
    0.7
}

impl Default for Slo {
    fn default() -> Self {
        Slo {
            tokens_per_second_per_session: default_tps_per_session(),
            queue_wait_p99: default_queue_wait(),
            target_utilization: default_target_utilization(),
        }
    }
}

/// Scaling behaviour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": "duration(self.scaleDownStabilization) >= duration(self.scaleUpStabilization)", "message": "scaleDownStabilization must be at least scaleUpStabilization (fast up, slow down)" }
]))]
pub struct Scaling {
    /// Auto acts on its decisions; Advisory only reports them in status and events; Manual
    /// holds replicas.manual (set by `kubectl scale`).
    #[serde(default)]
    pub mode: ScalingMode,
    /// How often the operator measures and decides.
    #[serde(default = "default_interval")]
    #[schemars(schema_with = "crate::duration::positive_schema")]
    pub interval: Duration,
    /// A scale-up must be wanted for this long before it happens (0s: at once).
    #[serde(default = "default_up_window")]
    pub scale_up_stabilization: Duration,
    /// A scale-down happens only to the highest replica count wanted during this window.
    #[serde(default = "default_down_window")]
    pub scale_down_stabilization: Duration,
    /// Most replicas added in one decision.
    #[serde(default = "default_max_up_step")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_scale_up_step: i32,
    /// Most replicas removed in one decision.
    #[serde(default = "default_max_down_step")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_scale_down_step: i32,
    /// Seed for the per-pod decode capacity (tokens/s at saturation) before it is measured.
    /// The operator learns the real value from what pods deliver when saturated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1.0, max = 1000000.0))]
    pub capacity_hint_tokens_per_second: Option<f64>,
    /// Where measurements come from.
    #[serde(default)]
    pub metrics: MetricsSource,
    /// Auto: learn a daily demand profile from this pool's own history and scale up one
    /// measured start-up time ahead of the forecast, while its recent error is small; Off
    /// (default): react to the demand now only. The profile is learned in both.
    #[serde(default)]
    pub forecast: ForecastMode,
}

fn default_interval() -> Duration {
    Duration::from_secs(15)
}
fn default_up_window() -> Duration {
    Duration::ZERO
}
fn default_down_window() -> Duration {
    Duration::from_secs(300)
}
fn default_max_up_step() -> i32 {
    4
}
fn default_max_down_step() -> i32 {
    1
}

impl Default for Scaling {
    fn default() -> Self {
        Scaling {
            mode: ScalingMode::default(),
            interval: default_interval(),
            scale_up_stabilization: default_up_window(),
            scale_down_stabilization: default_down_window(),
            max_scale_up_step: default_max_up_step(),
            max_scale_down_step: default_max_down_step(),
            capacity_hint_tokens_per_second: None,
            metrics: MetricsSource::default(),
            forecast: ForecastMode::default(),
        }
    }
}

/// Whether the operator acts on its scaling decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ScalingMode {
    /// Scale and pause admission as decided.
    #[default]
    Auto,
    /// Decide and report (status, events, metrics), never change replicas or admission.
    Advisory,
    /// Hold replicas.manual; measure and report only.
    Manual,
}

/// Whether the planner scales ahead of a demand forecast.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ForecastMode {
    /// Use the forecast while it predicts well; the reactive rule otherwise.
    Auto,
    /// The reactive rule only (the default: on the simulator's days the forecast costs a few
    /// percent of GPU-hours for little attainment; see the docs).
    #[default]
    Off,
}

/// Where measurements come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsSource {
    /// Prometheus queries the pool's engines (in a cluster); Direct scrapes each engine's
    /// /metrics (local mode).
    #[serde(default)]
    pub source: MetricsSourceKind,
    /// Prometheus base URL for this pool; defaults to the operator's --prometheus-url.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024), regex(pattern = r"^https?://.+$"))]
    pub prometheus_url: Option<String>,
    /// Window of the counter rates, the p99 queue wait and the running/waiting averages (in
    /// the Prometheus queries, or over the direct scrapes).
    #[serde(default = "default_rate_window")]
    #[schemars(schema_with = "crate::duration::positive_schema")]
    pub rate_window: Duration,
    /// Samples older than this are stale: the operator holds its last decision.
    #[serde(default = "default_stale_after")]
    #[schemars(schema_with = "crate::duration::positive_schema")]
    pub stale_after: Duration,
}

fn default_rate_window() -> Duration {
    Duration::from_secs(60)
}
fn default_stale_after() -> Duration {
    Duration::from_secs(120)
}

impl Default for MetricsSource {
    fn default() -> Self {
        MetricsSource {
            source: MetricsSourceKind::default(),
            prometheus_url: None,
            rate_window: default_rate_window(),
            stale_after: default_stale_after(),
        }
    }
}

/// Kind of metrics source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MetricsSourceKind {
    /// PromQL against Prometheus.
    #[default]
    Prometheus,
    /// Scrape each engine's /metrics directly.
    Direct,
}

/// Admission of new tenants at the ceiling, with hysteresis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": "self.resumeThreshold < self.pauseThreshold", "message": "admission.resumeThreshold must be below admission.pauseThreshold" }
]))]
pub struct Admission {
    /// Whether the pool may pause new tenants at all.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Utilization (demand ÷ capacity) at the ceiling above which new tenants are paused,
    /// also when queue wait p99 exceeds slo.queueWaitP99.
    #[serde(default = "default_pause_threshold")]
    #[schemars(range(min = 0.1, max = 2.0))]
    pub pause_threshold: f64,
    /// Utilization below which admission may reopen.
    #[serde(default = "default_resume_threshold")]
    #[schemars(range(min = 0.0, max = 2.0))]
    pub resume_threshold: f64,
    /// Also pause new tenants while replicas the pool ordered are still starting and it is
    /// over the pause threshold (or queue wait p99 over slo.queueWaitP99): at once, not after
    /// pauseAfter, and until holdTime under the resume threshold, as at the ceiling. New
    /// tenants then get 503 + Retry-After for the minutes a replica takes to start instead of
    /// waiting in a queue that existing tenants need. False pauses only at the ceiling.
    #[serde(default = "default_true")]
    pub pause_while_scaling: bool,
    /// How long the pool must stay over the pause threshold at the ceiling before pausing.
    #[serde(default = "default_pause_after")]
    pub pause_after: Duration,
    /// How long the pool must stay under the resume threshold before reopening.
    #[serde(default = "default_hold_time")]
    #[schemars(schema_with = "crate::duration::positive_schema")]
    pub hold_time: Duration,
    /// A tenant served within this window is an existing tenant and is never paused.
    #[serde(default = "default_tenant_memory")]
    #[schemars(schema_with = "crate::duration::positive_schema")]
    pub tenant_memory: Duration,
    /// Retry-After sent to paused new tenants.
    #[serde(default = "default_retry_after")]
    #[schemars(schema_with = "crate::duration::positive_schema")]
    pub retry_after: Duration,
}

fn default_true() -> bool {
    true
}
fn default_pause_threshold() -> f64 {
    0.95
}
fn default_resume_threshold() -> f64 {
    0.8
}
fn default_pause_after() -> Duration {
    Duration::from_secs(60)
}
fn default_hold_time() -> Duration {
    Duration::from_secs(300)
}
fn default_tenant_memory() -> Duration {
    Duration::from_secs(24 * 3600)
}
fn default_retry_after() -> Duration {
    Duration::from_secs(30)
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            enabled: true,
            pause_threshold: default_pause_threshold(),
            resume_threshold: default_resume_threshold(),
            pause_while_scaling: true,
            pause_after: default_pause_after(),
            hold_time: default_hold_time(),
            tenant_memory: default_tenant_memory(),
            retry_after: default_retry_after(),
        }
    }
}
