//! The Service, PodDisruptionBudget, admin-token Secret and registry ConfigMaps of a pool
//! (pure builders, no I/O).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    ADMIN_PORT, ADMIN_TOKEN_KEY, HTTP_PORT, admin_secret_name, common_labels, selector_labels,
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

/// The pool's Service: `http` (8000) for clients, `admin` (8001) for the operator.
pub fn service(pool: &str, namespace: &str, owners: Vec<OwnerReference>) -> Service {
    Service {
        metadata: meta(pool.to_string(), pool, namespace, owners),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(selector_labels(pool)),
            ports: Some(vec![port("http", HTTP_PORT), port("admin", ADMIN_PORT)]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The pool's PodDisruptionBudget: voluntary evictions take at most one engine at a time.
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

/// A fresh random admin token: 32 bytes from the OS, hex.
pub fn random_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex(&bytes))
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
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
