//! The Services, engine PodDisruptionBudget, admin-token Secret and registry ConfigMaps of a
//! pool (pure builders, no I/O).
//!
//! Two Services: `P`, the front door clients use, selects the router pods (its name is the
//! one clients used before the router existed, so their URLs did not change); `P-engines`,
//! headless, selects the engine pods, for per-pod DNS (scrapes, debugging). It is headless
//! on purpose: a load-balancing address over the engines would invite traffic around the
//! router, losing its KV affinity and pool-wide admission.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub use crate::admin_token::{hex, random_token};

use super::{
    ADMIN_PORT, ADMIN_TOKEN_KEY, HTTP_PORT, ROUTER_HTTP_PORT, admin_secret_name, common_labels,
    engines_service_name, router_labels, router_selector_labels, selector_labels,
};

fn meta(name: String, pool: &str, namespace: &str, owners: Vec<OwnerReference>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace.to_string()),
        labels: Some(common_labels(pool)),
        owner_references: Some(owners).filter(|o| !o.is_empty()),
        ..ObjectMeta::default()
    }
}

fn port(name: &str, number: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_string()),
        port: number,
        target_port: Some(IntOrString::String(name.to_string())),
        protocol: Some("TCP".to_string()),
        ..ServicePort::default()
    }
}

/// The pool's front door `P`: `http` (8000) on the router pods. The routers' admin API is
/// not on it: the operator pushes to every router pod by its address, one by one.
pub fn service(pool: &str, namespace: &str, owners: Vec<OwnerReference>) -> Service {
    let mut metadata = meta(pool.to_string(), pool, namespace, owners);
    metadata.labels = Some(router_labels(pool));
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(router_selector_labels(pool)),
            ports: Some(vec![port("http", ROUTER_HTTP_PORT)]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The engines' internal Service `P-engines` (headless): `http` (8000) and `admin` (8001) on
/// the engine pods.
pub fn engines_service(pool: &str, namespace: &str, owners: Vec<OwnerReference>) -> Service {
    Service {
        metadata: meta(engines_service_name(pool), pool, namespace, owners),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            cluster_ip: Some("None".to_string()),
            selector: Some(selector_labels(pool)),
            ports: Some(vec![port("http", HTTP_PORT), port("admin", ADMIN_PORT)]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The engines' PodDisruptionBudget `P`: voluntary evictions take at most one engine at a time.
pub fn pod_disruption_budget(
    pool: &str,
    namespace: &str,
    owners: Vec<OwnerReference>,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(pool.to_string(), pool, namespace, owners),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(pool)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

/// The pool's admin-token Secret (created once; never rewritten).
pub fn admin_secret(
    pool: &str,
    namespace: &str,
    token: &str,
    owners: Vec<OwnerReference>,
) -> Secret {
    Secret {
        metadata: meta(admin_secret_name(pool), pool, namespace, owners),
        type_: Some("Opaque".to_string()),
        string_data: Some(BTreeMap::from([(
            ADMIN_TOKEN_KEY.to_string(),
            token.to_string(),
        )])),
        ..Secret::default()
    }
}

/// One ConfigMap holding `bytes` as binaryData `key`.
pub fn binary_config_map(
    name: String,
    pool: &str,
    namespace: &str,
    key: &str,
    bytes: Vec<u8>,
    annotations: BTreeMap<String, String>,
    owners: Vec<OwnerReference>,
) -> ConfigMap {
    let mut metadata = meta(name, pool, namespace, owners);
    metadata.annotations = Some(annotations).filter(|a| !a.is_empty());
    ConfigMap {
        metadata,
        binary_data: Some(BTreeMap::from([(key.to_string(), ByteString(bytes))])),
        ..ConfigMap::default()
    }
}
