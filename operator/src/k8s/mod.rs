//! The Kubernetes side of the operator: object builders (pure), watch caches, owner
//! references, leader election and the InferencePool controller (generic over the ports).
//! The adapters that talk to a cluster live in the folders of their ports
//! (`workload_runtime::kubernetes`, `registry_store::config_map`, `metrics_source::prometheus`,
//! `status_sink::kubernetes`) and `crate::run` wires them; nothing here depends on them but
//! the status sink the controller reports to.
//!
//! Names and labels of what the operator creates for a pool `P` (the chart's PodMonitor,
//! NetworkPolicy and dashboards rely on them):
//! - Deployment `P` (engines), headless Service `P-engines` (port 8000 `http`, 8001 `admin`),
//!   PodDisruptionBudget `P`
//! - Deployment `P-router` (the pool router), PodDisruptionBudget `P-router`
//! - Service `P` (port 8000 `http`): the pool's front door, selecting the router pods, so a
//!   client's URL is the same as before the router existed
//! - Secret `P-admin` (key `token`): the engine admin token, created once, never rewritten
//! - ConfigMap `P-tenants` (binaryData `registry.bin`), shards `P-tenants-1..N` when large
//! - every engine pod: `app.kubernetes.io/name=tidegate-engine`, `tidegate.dev/pool=P`
//! - every router pod: `app.kubernetes.io/name=tidegate-router`, `tidegate.dev/pool=P`
//!
//! Invariant: the two selectors never match each other's pods (they differ in
//! `app.kubernetes.io/name`), so engine listings, the engine PDB and the engines' Service
//! never see a router pod, and the front-door Service never sends a client to an engine.

pub mod api_keys;
pub mod cache;
pub mod controller;
pub mod deployment;
pub mod engine_pods;
pub mod image_volumes;
pub mod leader;
pub mod lenient;
pub mod manager;
pub mod metrics;
pub mod model_fetch;
pub mod objects;
pub mod owners;
pub mod render;
pub mod router;
pub mod secret_texts;
pub mod shutdown;
pub mod unreadable;

use std::collections::BTreeMap;

/// The one field manager every server-side apply of the operator uses.
pub const FIELD_MANAGER: &str = crate::OPERATOR_NAME;
/// `app.kubernetes.io/name` of every engine pod.
pub const ENGINE_APP: &str = "tidegate-engine";
/// `app.kubernetes.io/name` of every router pod (not the engines': the engine Deployment's
/// selector is immutable and must not match router pods).
pub const ROUTER_APP: &str = "tidegate-router";
/// Pod label holding the pool's name (the PodMonitor copies it into the `pool` metric label).
pub const POOL_LABEL: &str = "tidegate.dev/pool";
/// Engine API port (OpenAI API, /metrics, /healthz, /readyz), from the launch contract.
pub const HTTP_PORT: i32 = tidegate_api::engine_launch::HTTP_PORT as i32;
/// Engine admin API port, from the launch contract.
pub const ADMIN_PORT: i32 = tidegate_api::engine_launch::ADMIN_PORT as i32;
/// Router API port (OpenAI API, /metrics, /healthz, /readyz), from the router contract.
pub const ROUTER_HTTP_PORT: i32 = tidegate_api::router::HTTP_PORT as i32;
/// Router admin API port, from the router contract.
pub const ROUTER_ADMIN_PORT: i32 = tidegate_api::router::ADMIN_PORT as i32;
/// Key of the admin token in the pool's admin Secret.
pub const ADMIN_TOKEN_KEY: &str = "token";

/// Server-side apply parameters: one field manager, conflicts forced.
pub fn apply_params() -> kube::api::PatchParams {
    kube::api::PatchParams::apply(FIELD_MANAGER).force()
}

/// Name of the pool's admin-token Secret.
pub fn admin_secret_name(pool: &str) -> String {
    format!("{pool}-admin")
}

/// Name of the pool's router Deployment and its PodDisruptionBudget.
pub fn router_name(pool: &str) -> String {
    format!("{pool}-router")
}

/// Name of the pool's internal (headless) Service over its engine pods.
pub fn engines_service_name(pool: &str) -> String {
    format!("{pool}-engines")
}

/// Labels that select a pool's engine pods (the Deployment selector; immutable).
pub fn selector_labels(pool: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), ENGINE_APP.to_string()),
        (POOL_LABEL.to_string(), pool.to_string()),
    ])
}

/// Labels that select a pool's router pods (the router Deployment's selector; immutable).
pub fn router_selector_labels(pool: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), ROUTER_APP.to_string()),
        (POOL_LABEL.to_string(), pool.to_string()),
    ])
}

fn label_string(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The engine selector as a label-selector string, e.g. for list calls and status.selector.
pub fn selector_string(pool: &str) -> String {
    label_string(&selector_labels(pool))
}

/// The router selector as a label-selector string (list calls).
pub fn router_selector_string(pool: &str) -> String {
    label_string(&router_selector_labels(pool))
}

/// Label selector of every object the operator manages (the label `with_common` sets).
pub fn managed_selector() -> String {
    format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}")
}

const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// Labels on every object the operator creates for a pool's engines (and the pool's
/// Secret, ConfigMaps and front-door Service, which are the pool's own).
pub fn common_labels(pool: &str) -> BTreeMap<String, String> {
    with_common(selector_labels(pool), pool, "engine")
}

/// Labels on the router Deployment, its pods and its PodDisruptionBudget.
pub fn router_labels(pool: &str) -> BTreeMap<String, String> {
    with_common(router_selector_labels(pool), pool, "router")
}

fn with_common(
    mut labels: BTreeMap<String, String>,
    pool: &str,
    component: &str,
) -> BTreeMap<String, String> {
    labels.insert("app.kubernetes.io/instance".to_string(), pool.to_string());
    labels.insert(
        "app.kubernetes.io/component".to_string(),
        component.to_string(),
    );
    labels.insert(MANAGED_BY_LABEL.to_string(), FIELD_MANAGER.to_string());
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block of top-level key `key` in a YAML file: its line and the indented ones after.
    fn block<'a>(yaml: &'a str, key: &str) -> Vec<&'a str> {
        let head = format!("{key}:");
        yaml.lines()
            .skip_while(|l| *l != head)
            .skip(1)
            .take_while(|l| l.is_empty() || l.starts_with(' '))
            .collect()
    }

    #[test]
    fn the_managed_selector_selects_what_the_operator_labels() {
        let selector = managed_selector();
        let (key, value) = selector.split_once('=').expect("key=value");
        for labels in [common_labels("p"), router_labels("p")] {
            assert_eq!(
                labels.get(key).map(String::as_str),
                Some(value),
                "{labels:?}"
            );
        }
    }

    #[test]
    fn the_charts_admission_policy_admits_the_label_the_operator_puts_on_its_objects() {
        let policy = include_str!("../../../charts/tidegate/templates/admission-policy.yaml");
        let labels = common_labels("p");
        let (key, value) = labels
            .iter()
            .find(|(k, _)| k.as_str() == "app.kubernetes.io/managed-by")
            .expect("the operator labels what it manages");
        assert!(
            policy.contains(&format!("expression: \"'{key}'\"")),
            "the policy's label key must be {key}"
        );
        assert!(
            policy.contains(&format!("== '{value}'")),
            "the policy must admit {key}={value}"
        );
        for kind in [
            "deployments",
            "services",
            "secrets",
            "configmaps",
            "pods",
            "poddisruptionbudgets",
        ] {
            assert!(policy.contains(kind), "the policy must cover {kind}");
        }
    }

    #[test]
    fn the_charts_pod_monitors_select_the_labels_the_operator_puts_on_pods() {
        let values = include_str!("../../../charts/tidegate/values.yaml");
        for (monitor, app) in [("engineMonitor", ENGINE_APP), ("routerMonitor", ROUTER_APP)] {
            let lines = block(values, monitor);
            assert!(!lines.is_empty(), "values.yaml has no {monitor}");
            let has = |want: &str| lines.iter().any(|l| l.trim() == want);
            assert!(
                has(&format!("app.kubernetes.io/name: {app}")),
                "{monitor}.podSelector must select app.kubernetes.io/name={app}"
            );
            assert!(
                has(&format!("poolLabel: {POOL_LABEL}")),
                "{monitor}.poolLabel must be {POOL_LABEL}"
            );
        }
    }
}
