//! tidegate.dev/v1alpha1 API types: `InferencePool`, `TierPolicy`, their status, condition
//! constants, the engine admin and launch contracts, and the engine metrics contract (names, labels,
//! histogram buckets) with the exposition parser and quantile arithmetic that read it.
//!
//! Without the `kube` feature this crate is plain serde + schemars data (what the engine
//! needs); with it, the custom resources, status types and CRD generation are available.

pub mod conditions;
pub mod duration;
pub mod engine_admin;
pub mod engine_launch;
pub mod engine_metrics;
pub mod exposition;
pub mod fetch_launch;
pub mod inference_pool;
mod launch_args;
pub mod model_uri;
pub mod quantity;
pub mod router;
#[cfg(feature = "kube")]
pub mod status;
pub mod tier_policy;

pub use duration::Duration;
pub use engine_admin::AdmissionState;
pub use inference_pool::*;
pub use quantity::Quantity;
pub use tier_policy::*;

/// API group of tidegate's resources.
pub const GROUP: &str = "tidegate.dev";
/// API version of tidegate's resources.
pub const VERSION: &str = "v1alpha1";

/// The CustomResourceDefinitions, in the order they are written to crds/.
#[cfg(feature = "kube")]
pub fn crds() -> Vec<(
    &'static str,
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
)> {
    use kube::CustomResourceExt;
    vec![
        ("tidegate.dev_inferencepools.yaml", InferencePool::crd()),
        ("tidegate.dev_tierpolicies.yaml", TierPolicy::crd()),
    ]
}
