//! The router Deployment and its PodDisruptionBudget of a pool (pure builders, no I/O).
//!
//! The router is the engine image in its second role (`tidegate-engine route`): its command
//! line comes from the router contract (`tidegate_api::router::router_args`), bound on all
//! of the pod's addresses and with no static engines (the operator pushes the pool's
//! engines to each router's admin API); its environment is the contract's (the admin token
//! and the router token, both from the pool's admin Secret).
//!
//! Invariants:
//! - The selector is `router_selector_labels(pool)` and never changes; it never matches an
//!   engine pod, and the engine selector never matches a router pod.
//! - CPU only: the pod asks for no GPU whatever the engines ask for, so a router never
//!   takes a GPU budget's slot.
//! - The pod runs restricted, as the engine's does (same uid, read-only root, all
//!   capabilities dropped, seccomp RuntimeDefault, no service-account token).
//! - Each router enforces 1/replicas of every tenant limit (`--limit-share replicas`) until
//!   the operator's first endpoint push, which carries the count of ready routers (each
//!   then enforces 1/ready), so the pool-wide limit is the tier's over the live routers
//!   while every replica takes its share of the traffic.
//! - The PodDisruptionBudget allows one router down at a time (maxUnavailable 1): a node
//!   drain never blocks on a one-router pool, and at two or more one stays up.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, PodSpec, PodTemplateSpec, ResourceRequirements,
    TopologySpreadConstraint,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tidegate_api::InferencePoolSpec;
use tidegate_api::engine_launch as launch;
use tidegate_api::router::{RouterSite, router_args, router_env};

use super::deployment::{
    PRESTOP_SLEEP_SECONDS, container_security_context, contract_env, empty_dir, http_probe, mount,
    pod_security_context, prestop_sleep, scrape_annotations,
};
use super::{
    ROUTER_ADMIN_PORT, ROUTER_HTTP_PORT, router_labels, router_name, router_selector_labels,
};

/// CPU the router asks for (it forwards bytes; the engines do the work).
pub const ROUTER_CPU_REQUEST: &str = "250m";
/// CPU a router may burst to.
pub const ROUTER_CPU_LIMIT: &str = "2";
/// Memory the router asks for.
pub const ROUTER_MEMORY_REQUEST: &str = "128Mi";
/// Memory limit: room for the held and queued requests' bodies on top of the process.
pub const ROUTER_MEMORY_LIMIT: &str = "512Mi";
/// Seconds past the preStop sleep before the kubelet kills a router.
pub const ROUTER_TERMINATION_MARGIN_SECONDS: i64 = 10;

/// Where the router runs inside its pod: all of the pod's addresses, the contract's ports,
/// no static engines, and the pool's router replicas sharing each tenant's limits.
pub fn pod_router_site(spec: &InferencePoolSpec) -> RouterSite {
    RouterSite {
        bind_host: "0.0.0.0".to_string(),
        api_port: tidegate_api::router::HTTP_PORT,
        admin_port: tidegate_api::router::ADMIN_PORT,
        endpoints: Vec::new(),
        limit_share: router_replicas(spec),
        log_format: "json",
    }
}

/// Router replicas: the spec's (at least one).
pub fn router_replicas(spec: &InferencePoolSpec) -> i32 {
    spec.router.replicas.max(1)
}

/// Small requests and limits, CPU and memory only: never a GPU.
pub fn router_resources() -> ResourceRequirements {
    let amounts = |cpu: &str, mem: &str| {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.to_string())),
            ("memory".to_string(), Quantity(mem.to_string())),
        ])
    };
    ResourceRequirements {
        requests: Some(amounts(ROUTER_CPU_REQUEST, ROUTER_MEMORY_REQUEST)),
        limits: Some(amounts(ROUTER_CPU_LIMIT, ROUTER_MEMORY_LIMIT)),
        ..ResourceRequirements::default()
    }
}

fn container_port(name: &str, number: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_string()),
        container_port: number,
        protocol: Some("TCP".to_string()),
        ..ContainerPort::default()
    }
}

/// The router pod template.
pub fn router_pod_template(pool: &str, spec: &InferencePoolSpec) -> PodTemplateSpec {
    let container = Container {
        name: "router".to_string(),
        image: Some(spec.engine.image.clone()),
        args: Some(router_args(spec, &pod_router_site(spec))),
        env: Some(contract_env(pool, &router_env())),
        ports: Some(vec![
            container_port("http", ROUTER_HTTP_PORT),
            container_port("admin", ROUTER_ADMIN_PORT),
        ]),
        resources: Some(router_resources()),
        // The router starts in milliseconds and is ready once the operator pushed it the
        // pool's policy (with no engine it holds requests): no startup probe.
        liveness_probe: Some(http_probe(launch::HEALTHZ_PATH, 10, 3)),
        readiness_probe: Some(http_probe(launch::READYZ_PATH, 5, 2)),
        // The Service drops the pod before SIGTERM, so no new request reaches a router
        // that is stopping.
        lifecycle: Some(prestop_sleep()),
        security_context: Some(container_security_context()),
        volume_mounts: Some(vec![mount("tmp", "/tmp", false)]),
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        ..Container::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(router_labels(pool)),
            annotations: Some(router_scrape_annotations()),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            volumes: Some(vec![empty_dir("tmp", Some("64Mi"))]),
            security_context: Some(pod_security_context()),
            termination_grace_period_seconds: Some(
                PRESTOP_SLEEP_SECONDS + ROUTER_TERMINATION_MARGIN_SECONDS,
            ),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            // Spread over nodes when the cluster can: one node going away keeps a router.
            topology_spread_constraints: Some(vec![TopologySpreadConstraint {
                max_skew: 1,
                topology_key: "kubernetes.io/hostname".to_string(),
                when_unsatisfiable: "ScheduleAnyway".to_string(),
                label_selector: Some(LabelSelector {
                    match_labels: Some(router_selector_labels(pool)),
                    match_expressions: None,
                }),
                ..TopologySpreadConstraint::default()
            }]),
            ..PodSpec::default()
        }),
    }
}

/// The engine pods' scrape annotations, with the router's port.
fn router_scrape_annotations() -> BTreeMap<String, String> {
    let mut a = scrape_annotations();
    a.insert(
        "prometheus.io/port".to_string(),
        ROUTER_HTTP_PORT.to_string(),
    );
    a
}

fn meta(pool: &str, namespace: &str, owners: Vec<OwnerReference>) -> ObjectMeta {
    ObjectMeta {
        name: Some(router_name(pool)),
        namespace: Some(namespace.to_string()),
        labels: Some(router_labels(pool)),
        owner_references: Some(owners).filter(|o| !o.is_empty()),
        ..ObjectMeta::default()
    }
}

/// The router Deployment `<pool>-router` with `spec.router.replicas` pods.
pub fn router_deployment(
    pool: &str,
    namespace: &str,
    spec: &InferencePoolSpec,
    owners: Vec<OwnerReference>,
) -> Deployment {
    Deployment {
        metadata: meta(pool, namespace, owners),
        spec: Some(DeploymentSpec {
            replicas: Some(router_replicas(spec)),
            selector: LabelSelector {
                match_labels: Some(router_selector_labels(pool)),
                match_expressions: None,
            },
            template: router_pod_template(pool, spec),
            // No GPU to budget: a new router comes up before an old one goes, so the front
            // door never has fewer replicas than asked during a rollout.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_string()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            revision_history_limit: Some(5),
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// The router PodDisruptionBudget `<pool>-router`: at most one router evicted at a time.
pub fn router_pod_disruption_budget(
    pool: &str,
    namespace: &str,
    owners: Vec<OwnerReference>,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(pool, namespace, owners),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(router_selector_labels(pool)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}
