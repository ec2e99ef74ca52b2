//! The Kubernetes side of the operator: object builders (pure), the adapters behind the ports
//! (`K8sRuntime`, `ConfigMapRegistry`, `PrometheusMetrics`), the InferencePool controller and
//! the `run` command.
//!
//! Names and labels of what the operator creates for a pool `P` (the chart's PodMonitor,
//! NetworkPolicy and dashboards rely on them):
//! - Deployment `P`, Service `P` (port 8000 `http`, 8001 `admin`), PodDisruptionBudget `P`
//! - Secret `P-admin` (key `token`): the engine admin token, created once, never rewritten
//! - ConfigMap `P-tenants` (binaryData `registry.bin`), shards `P-tenants-1..N` when large
//! - every pod: `app.kubernetes.io/name=tidegate-engine`, `tidegate.dev/pool=P`

pub mod api_keys;
pub mod controller;
pub mod deployment;
pub mod events;
pub mod leader;
pub mod lenient;
pub mod manager;
pub mod metrics;
pub mod objects;
pub mod owners;
pub mod prometheus;
pub mod registry_store;
pub mod render;
pub mod run;
pub mod runtime;
pub mod shutdown;
pub mod source_switch;
pub mod unreadable;

use std::collections::BTreeMap;

/// The one field manager every server-side apply of the operator uses.
pub const FIELD_MANAGER: &str = "tidegate-operator";
/// `app.kubernetes.io/name` of every engine pod.
pub const ENGINE_APP: &str = "tidegate-engine";
/// Pod label holding the pool's name (the PodMonitor copies it into the `pool` metric label).
pub const POOL_LABEL: &str = "tidegate.dev/pool";
/// Engine API port (OpenAI API, /metrics, /healthz, /readyz), from the launch contract.
pub const HTTP_PORT: i32 = tidegate_api::engine_launch::HTTP_PORT as i32;
/// Engine admin API port, from the launch contract.
pub const ADMIN_PORT: i32 = tidegate_api::engine_launch::ADMIN_PORT as i32;
/// Key of the admin token in the pool's admin Secret.
pub const ADMIN_TOKEN_KEY: &str = "token";

/// Name of the pool's admin-token Secret.
pub fn admin_secret_name(pool: &str) -> String {
    format!("{pool}-admin")
}

/// Labels that select a pool's engine pods (the Deployment selector; immutable).
pub fn selector_labels(pool: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), ENGINE_APP.to_string()),
        (POOL_LABEL.to_string(), pool.to_string()),
    ])
}

/// The selector as a label-selector string, e.g. for list calls and status.selector.
pub fn selector_string(pool: &str) -> String {
    selector_labels(pool)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Labels on every object the operator creates for a pool.
pub fn common_labels(pool: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(pool);
    labels.insert("app.kubernetes.io/instance".to_string(), pool.to_string());
    labels.insert(
        "app.kubernetes.io/component".to_string(),
        "engine".to_string(),
    );
    labels.insert(
        "app.kubernetes.io/managed-by".to_string(),
        FIELD_MANAGER.to_string(),
    );
    labels
}
