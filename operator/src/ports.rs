//! Ports: everything the operator's decisions touch in the world, behind small traits, so
//! the same driver runs in a cluster, on a laptop (local mode) and in tests.
//!
//! | port            | cluster                               | local mode                     |
//! |-----------------|---------------------------------------|--------------------------------|
//! | WorkloadRuntime | Deployments + Services + PDBs (SSA)   | engine + router processes here |
//! | MetricsSource   | Prometheus (PromQL)                   | engines' /metrics scraped      |
//! | EngineControl   | engine and router admin APIs (HTTP)   | same                           |
//! | RegistryStore   | a ConfigMap per pool                  | a file per pool                |
//! | StatusSink      | status subresource + Events           | console table + decision log   |
//!
//! Adapters live in folders named for the port they implement (`workload_runtime/`,
//! `metrics_source/`, `engine_control/`, `registry_store/`, `status_sink/`).
//!
//! Traits use native async fns and are used through generics (no dyn, no boxing).

use std::future::Future;

use tidegate_api::InferencePoolSpec;
use tidegate_api::engine_admin::{AdmittedTenants, DrainStatus, EnginePolicy};
use tidegate_api::router::{EndpointsView, RouterEndpoints};
use tidegate_api::status::InferencePoolStatus;

use crate::plan::{MetricsProblem, Millis, Plan, PoolMetrics};
use crate::registry::Registry;
use crate::status_write::StatusWrite;

/// Identifies a pool.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PoolRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One engine replica as the runtime sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Pod (or local process) name.
    pub name: String,
    /// Base URL of the OpenAI-compatible API and /metrics, e.g. `http://10.0.0.7:8000`.
    pub api_url: String,
    /// Base URL of the admin API.
    pub admin_url: String,
    /// Ready to serve (readiness probe passed, not draining).
    pub ready: bool,
}

/// What the runtime currently runs for a pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadState {
    /// Replicas asked of the runtime (Deployment spec.replicas), or None if nothing exists yet.
    pub replicas: Option<i32>,
    pub ready_replicas: i32,
    pub endpoints: Vec<Endpoint>,
    /// The pool's router replicas (their admin API takes the policy and the engine set).
    pub routers: Vec<Endpoint>,
    /// Label selector of the pool's pods, for status.selector.
    pub selector: String,
    /// Why the model fetch step (`fetch-model`) of the pool's engines is failing, naming the
    /// replica, the URI and the cause; None while no fetch has failed.
    pub model_problem: Option<String>,
}

/// A workload runtime failure.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RuntimeError(pub String);

/// Runs the engine replicas of a pool.
pub trait WorkloadRuntime: Send + Sync {
    /// What runs now.
    fn observe(
        &self,
        pool: &PoolRef,
    ) -> impl Future<Output = Result<WorkloadState, RuntimeError>> + Send;
    /// Makes the pool run `replicas` engines of `spec`. `remove_first` names replicas that
    /// were drained and should be the ones removed on a scale-down.
    fn apply(
        &self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        replicas: i32,
        remove_first: &[String],
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    /// The admin token engines of this pool accept.
    fn admin_token(
        &self,
        pool: &PoolRef,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send;
}

/// Reads a pool's metrics.
pub trait MetricsSource: Send + Sync {
    fn read(
        &self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        endpoints: &[Endpoint],
        now_ms: u64,
    ) -> impl Future<Output = Result<PoolMetrics, MetricsProblem>> + Send;
}

/// An engine admin API failure.
#[derive(Debug, thiserror::Error)]
#[error("engine {endpoint}: {message}")]
pub struct ControlError {
    pub endpoint: String,
    pub message: String,
}

/// Talks to engines' admin API.
pub trait EngineControl: Send + Sync {
    fn push_policy(
        &self,
        ep: &Endpoint,
        token: &str,
        policy: &EnginePolicy,
    ) -> impl Future<Output = Result<(), ControlError>> + Send;
    fn tenants_since(
        &self,
        ep: &Endpoint,
        token: &str,
        since_ms: u64,
    ) -> impl Future<Output = Result<AdmittedTenants, ControlError>> + Send;
    fn drain(
        &self,
        ep: &Endpoint,
        token: &str,
        grace_seconds: u64,
    ) -> impl Future<Output = Result<DrainStatus, ControlError>> + Send;
    fn drain_status(
        &self,
        ep: &Endpoint,
        token: &str,
    ) -> impl Future<Output = Result<DrainStatus, ControlError>> + Send;
    /// Gives a router the pool's engines (whole); answers what the router holds.
    fn push_endpoints(
        &self,
        router: &Endpoint,
        token: &str,
        set: &RouterEndpoints,
    ) -> impl Future<Output = Result<EndpointsView, ControlError>> + Send;
}

/// A registry store failure.
#[derive(Debug, thiserror::Error)]
#[error("tenant registry: {0}")]
pub struct RegistryError(pub String);

/// Persists the admitted-tenant registry of a pool.
pub trait RegistryStore: Send + Sync {
    fn load(&self, pool: &PoolRef) -> impl Future<Output = Result<Registry, RegistryError>> + Send;
    fn save(
        &self,
        pool: &PoolRef,
        registry: &Registry,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send;
}

/// What one tick reports about a pool.
#[derive(Clone, Copy, Debug)]
pub struct PoolReport<'a> {
    pub pool: &'a PoolRef,
    /// The status the sink's store held before this tick (None: none yet).
    pub previous: Option<&'a InferencePoolStatus>,
    /// The status after this tick.
    pub status: &'a InferencePoolStatus,
    /// The plan the status was built from: its events are published with it.
    pub plan: &'a Plan,
    pub workload: &'a WorkloadState,
    /// The pool object's UID where it has one (a Kubernetes Event names its object by it).
    pub uid: Option<&'a str>,
    pub now: Millis,
}

/// A status sink failure (the tick is retried).
#[derive(Debug, thiserror::Error)]
#[error("status: {0}")]
pub struct StatusError(pub String);

/// Reports each tick's status and events where users read them.
pub trait StatusSink: Send + Sync {
    /// Reports one tick; answers whether, and why, the status was written.
    fn report(
        &self,
        report: &PoolReport<'_>,
    ) -> impl Future<Output = Result<StatusWrite, StatusError>> + Send;
}
