//! The engine Deployment of a pool (pure builder, no I/O).
//!
//! Invariants:
//! - The selector is `selector_labels(pool)` and never changes (a Deployment's selector is
//!   immutable).
//! - The pod runs restricted: non-root, read-only root filesystem, no privilege escalation,
//!   seccomp RuntimeDefault, all capabilities dropped, no service-account token.
//! - terminationGracePeriodSeconds = preStop sleep + spec.engine.drainGracePeriod + margin, so
//!   a pod removed on scale-down finishes its in-flight requests (the engine drains on SIGTERM).
//! - The rollout never runs more pods than replicas (maxSurge 0): a GPU budget is never exceeded.
//!
//! - The engine's command line and environment come from the launch contract
//!   (`tidegate_api::engine_launch`), the same function the local runtime calls; this file
//!   only adds what is Kubernetes' own: the Secret reference, volumes, probes, security.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, ImageVolumeSource, Lifecycle, LifecycleHandler,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, SleepAction, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tidegate_api::InferencePoolSpec;
use tidegate_api::engine_launch::{
    self as launch, EnvValue, LaunchError, LaunchSite, engine_launch,
};
use tidegate_api::fetch_launch;
use tidegate_api::model_uri::ModelUri;

use super::{
    ADMIN_PORT, ADMIN_TOKEN_KEY, HTTP_PORT, admin_secret_name, common_labels, model_fetch,
    selector_labels,
};

/// Seconds the preStop hook waits so that endpoints drop the pod before SIGTERM.
pub const PRESTOP_SLEEP_SECONDS: i64 = 5;
/// Extra seconds beyond the drain grace before the kubelet kills the engine.
pub const TERMINATION_MARGIN_SECONDS: i64 = 10;
/// Where a `pvc://` model volume is mounted.
pub const MODEL_MOUNT: &str = "/model";
/// Where the model cache volume (an emptyDir the fetch step fills) is mounted: read-write in
/// the `fetch-model` init container, read-only in the engine.
pub const MODEL_CACHE_MOUNT: &str = "/var/cache/tidegate/models";
/// The init container that fetches an `s3://` or `hf://` model.
pub const FETCH_CONTAINER: &str = "fetch-model";
/// Where a container's termination message is read from (the Kubernetes default).
pub const TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// Where the disk KV-offload emptyDir is mounted.
pub const KV_OFFLOAD_MOUNT: &str = "/var/cache/tidegate/kv";
/// Non-root uid/gid the engine runs as.
pub const ENGINE_UID: i64 = 65532;

/// Why a pool's spec cannot be turned into a Deployment.
#[derive(Debug, thiserror::Error)]
pub enum BadPoolSpec {
    #[error(
        "spec.model.uri {0:?}: expected file:///PATH, pvc://CLAIM/PATH, oci://IMAGE:TAG (or @sha256:DIGEST), s3://BUCKET/PREFIX or hf://ORG/NAME[@REVISION] in a cluster (a relative file:// path is for local mode)"
    )]
    ModelUri(String),
    #[error(transparent)]
    Launch(#[from] LaunchError),
}

/// Where the weights come from, inside the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelLocation {
    /// Path passed to `--model`.
    pub path: String,
    /// A PVC to mount read-only at MODEL_MOUNT.
    pub claim: Option<String>,
    /// An OCI image whose files are mounted read-only at MODEL_MOUNT (an image volume).
    pub image: Option<String>,
    /// Fetched into the model cache volume by the `fetch-model` init container.
    pub fetched: bool,
}

/// Parses spec.model.uri: `file:///models/x` → path `/models/x`; `pvc://claim/sub/dir` →
/// claim `claim` mounted read-only at MODEL_MOUNT, path `/model/sub/dir`;
/// `oci://registry/name:tag` → that image's files mounted read-only at MODEL_MOUNT (a
/// Kubernetes image volume), path `/model`. An image reference needs a tag or a digest: an
/// untagged one means `:latest`, which the kubelet pulls every time.
pub fn model_location(uri: &str) -> Result<ModelLocation, BadPoolSpec> {
    let bad = || BadPoolSpec::ModelUri(uri.to_string());
    if let Ok(kind) = ModelUri::parse(uri)
        && kind.is_fetched()
    {
        return Ok(ModelLocation {
            path: fetch_launch::model_dest(MODEL_CACHE_MOUNT, uri),
            claim: None,
            image: None,
            fetched: true,
        });
    }
    if uri.starts_with("s3://") || uri.starts_with("hf://") {
        return Err(bad());
    }
    if let Some(path) = uri.strip_prefix("file://") {
        if !path.starts_with('/') || path.len() < 2 {
            return Err(bad());
        }
        return Ok(ModelLocation {
            path: path.to_string(),
            claim: None,
            image: None,
            fetched: false,
        });
    }
    if let Some(reference) = uri.strip_prefix("oci://") {
        let last = reference.rsplit('/').next().unwrap_or_default();
        let pinned = reference.contains("@sha256:") || last.contains(':');
        if !pinned || reference.contains(char::is_whitespace) || reference.starts_with('/') {
            return Err(bad());
        }
        return Ok(ModelLocation {
            path: MODEL_MOUNT.to_string(),
            claim: None,
            image: Some(reference.to_string()),
            fetched: false,
        });
    }
    if let Some(rest) = uri.strip_prefix("pvc://") {
        let (claim, sub) = rest.split_once('/').unwrap_or((rest, ""));
        if claim.is_empty() || sub.split('/').any(|s| s == "..") {
            return Err(bad());
        }
        let sub = sub.trim_matches('/');
        let path = if sub.is_empty() {
            MODEL_MOUNT.to_string()
        } else {
            format!("{MODEL_MOUNT}/{sub}")
        };
        return Ok(ModelLocation {
            path,
            claim: Some(claim.to_string()),
            image: None,
            fetched: false,
        });
    }
    Err(bad())
}

/// terminationGracePeriodSeconds for a pool.
pub fn termination_grace_seconds(spec: &InferencePoolSpec) -> i64 {
    let drain = spec.engine.drain_grace_period.as_std().as_secs_f64().ceil() as i64;
    PRESTOP_SLEEP_SECONDS + drain + TERMINATION_MARGIN_SECONDS
}

/// Where the engine runs inside the pod (ports, model path, the KV offload mount).
pub fn pod_launch_site(spec: &InferencePoolSpec, model_path: &str) -> LaunchSite {
    LaunchSite {
        model_path: model_path.to_string(),
        bind_host: "0.0.0.0".to_string(),
        api_port: launch::HTTP_PORT,
        admin_port: launch::ADMIN_PORT,
        kv_disk_dir: spec
            .engine
            .kv_cache
            .disk_offload
            .as_ref()
            .map(|_| KV_OFFLOAD_MOUNT.to_string()),
        log_format: "json",
    }
}

/// A contract's environment (the engine's or the router's): literals as they are, the admin
/// token as a reference to the pool's Secret (never its value).
pub fn contract_env(pool: &str, vars: &[(&'static str, EnvValue)]) -> Vec<EnvVar> {
    vars.iter()
        .map(|(name, value)| match value {
            EnvValue::Literal(v) => EnvVar {
                name: name.to_string(),
                value: Some(v.clone()),
                ..EnvVar::default()
            },
            EnvValue::AdminToken => EnvVar {
                name: name.to_string(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: admin_secret_name(pool),
                        key: ADMIN_TOKEN_KEY.to_string(),
                        optional: Some(false),
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            },
        })
        .collect()
}

/// The preStop hook of engine and router containers: a sleep, so the Service drops the pod
/// before its process gets SIGTERM.
pub fn prestop_sleep() -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            sleep: Some(SleepAction {
                seconds: PRESTOP_SLEEP_SECONDS,
            }),
            ..LifecycleHandler::default()
        }),
        ..Lifecycle::default()
    }
}

/// Requests = limits: CPU and memory when given, and nvidia.com/gpu when gpus > 0.
pub fn engine_resources(spec: &InferencePoolSpec) -> ResourceRequirements {
    let r = &spec.engine.resources;
    let mut amounts = BTreeMap::new();
    if r.gpus > 0 {
        amounts.insert("nvidia.com/gpu".to_string(), Quantity(r.gpus.to_string()));
    }
    if let Some(cpu) = &r.cpu {
        amounts.insert("cpu".to_string(), Quantity(cpu.0.clone()));
    }
    if let Some(mem) = &r.memory {
        amounts.insert("memory".to_string(), Quantity(mem.0.clone()));
    }
    ResourceRequirements {
        limits: Some(amounts.clone()).filter(|a| !a.is_empty()),
        requests: Some(amounts).filter(|a| !a.is_empty()),
        ..ResourceRequirements::default()
    }
}

/// The restricted container securityContext.
pub fn container_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(ENGINE_UID),
        run_as_group: Some(ENGINE_UID),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            add: None,
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }
}

/// The restricted pod securityContext (the engine's uid/gid).
pub fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(ENGINE_UID),
        run_as_group: Some(ENGINE_UID),
        fs_group: Some(ENGINE_UID),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            localhost_profile: None,
        }),
        ..PodSecurityContext::default()
    }
}

const STARTUP_PROBE_PERIOD_SECONDS: i32 = 10;

/// Startup probe failures that span `engine.startupGracePeriod` (at least one).
fn startup_probe_failures(spec: &InferencePoolSpec) -> i32 {
    let grace = spec.engine.startup_grace_period.as_std().as_secs();
    let period = STARTUP_PROBE_PERIOD_SECONDS as u64;
    i32::try_from(grace.div_ceil(period))
        .unwrap_or(i32::MAX)
        .max(1)
}

/// An HTTP probe on the container's `http` port.
pub fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String("http".to_string()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

/// An emptyDir volume, with an optional size limit.
pub fn empty_dir(name: &str, size: Option<&str>) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: size.map(|s| Quantity(s.to_string())),
            medium: None,
        }),
        ..Volume::default()
    }
}

/// The model as an image volume: the image's files, read-only, pulled only when missing (a
/// model image is immutable by tag or digest; IfNotPresent also lets a locally loaded image
/// serve on a node that reaches no registry).
pub fn model_image_volume(reference: &str) -> Volume {
    Volume {
        name: "model".to_string(),
        image: Some(ImageVolumeSource {
            reference: Some(reference.to_string()),
            pull_policy: Some("IfNotPresent".to_string()),
        }),
        ..Volume::default()
    }
}

/// A volume mount.
pub fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    }
}

/// Prometheus scrape annotations of the engine pods (for annotation-based scrape configs;
/// the chart's PodMonitor selects the pods by label instead).
pub fn scrape_annotations() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("prometheus.io/scrape".to_string(), "true".to_string()),
        ("prometheus.io/port".to_string(), HTTP_PORT.to_string()),
        (
            "prometheus.io/path".to_string(),
            launch::METRICS_PATH.to_string(),
        ),
    ])
}

/// The engine pod template.
pub fn pod_template(pool: &str, spec: &InferencePoolSpec) -> Result<PodTemplateSpec, BadPoolSpec> {
    let model = model_location(&spec.model.uri)?;
    let launch = engine_launch(spec, &pod_launch_site(spec, &model.path))?;
    let mut volumes = vec![empty_dir("tmp", Some("1Gi"))];
    let mut mounts = vec![mount("tmp", "/tmp", false)];
    if let Some(claim) = &model.claim {
        volumes.push(Volume {
            name: "model".to_string(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: Some(true),
            }),
            ..Volume::default()
        });
        mounts.push(mount("model", MODEL_MOUNT, true));
    }
    if let Some(reference) = &model.image {
        volumes.push(model_image_volume(reference));
        mounts.push(mount("model", MODEL_MOUNT, true));
    }
    if let Some(disk) = &spec.engine.kv_cache.disk_offload {
        volumes.push(empty_dir("kv-offload", Some(&disk.0)));
        mounts.push(mount("kv-offload", KV_OFFLOAD_MOUNT, false));
    }
    let fetch = model_fetch::pod_fetch(spec)?;
    if fetch.is_some() {
        volumes.push(model_fetch::cache_volume(spec));
        mounts.push(mount(
            model_fetch::MODEL_CACHE_VOLUME,
            MODEL_CACHE_MOUNT,
            true,
        ));
    }
    let init_containers = fetch
        .as_ref()
        .map(|f| vec![model_fetch::fetch_container(spec, f)]);
    let container = Container {
        name: "engine".to_string(),
        image: Some(spec.engine.image.clone()),
        args: Some(launch.args),
        env: Some(contract_env(pool, &launch.env)),
        ports: Some(vec![
            ContainerPort {
                name: Some("http".to_string()),
                container_port: HTTP_PORT,
                protocol: Some("TCP".to_string()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("admin".to_string()),
                container_port: ADMIN_PORT,
                protocol: Some("TCP".to_string()),
                ..ContainerPort::default()
            },
        ]),
        resources: Some(engine_resources(spec)),
        // Loading weights may take minutes: the startup probe allows startupGracePeriod (the
        // same time admission waits at the ceiling for pods still starting), then liveness.
        startup_probe: Some(http_probe(
            launch::HEALTHZ_PATH,
            STARTUP_PROBE_PERIOD_SECONDS,
            startup_probe_failures(spec),
        )),
        liveness_probe: Some(http_probe(launch::HEALTHZ_PATH, 10, 3)),
        readiness_probe: Some(http_probe(launch::READYZ_PATH, 5, 2)),
        lifecycle: Some(prestop_sleep()),
        security_context: Some(container_security_context()),
        volume_mounts: Some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        ..Container::default()
    };
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(common_labels(pool)),
            annotations: Some(scrape_annotations()),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            init_containers,
            containers: vec![container],
            volumes: Some(volumes),
            security_context: Some(pod_security_context()),
            termination_grace_period_seconds: Some(termination_grace_seconds(spec)),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            ..PodSpec::default()
        }),
    })
}

/// The engine Deployment with `replicas` pods.
pub fn deployment(
    pool: &str,
    namespace: &str,
    spec: &InferencePoolSpec,
    replicas: i32,
    owners: Vec<OwnerReference>,
) -> Result<Deployment, BadPoolSpec> {
    Ok(Deployment {
        metadata: ObjectMeta {
            name: Some(pool.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(common_labels(pool)),
            owner_references: Some(owners).filter(|o| !o.is_empty()),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector_labels(pool)),
                match_expressions: None,
            },
            template: pod_template(pool, spec)?,
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_string()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(0)),
                    max_unavailable: Some(IntOrString::Int(1)),
                }),
            }),
            revision_history_limit: Some(5),
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}
