//! The model fetch step in a pod: the `fetch-model` init container of a pool whose model is
//! fetched (`s3://`, `hf://`), and reading back why it failed.
//!
//! Invariants:
//! - The init container's command line and environment come from the fetch launch contract
//!   (`tidegate_api::fetch_launch`), the same function local mode calls; credentials are
//!   references to the pool's Secret, never values.
//! - It runs as the engine does (the engine image, restricted), writing only the model cache
//!   volume and its termination message.
//! - A failure reaches the pool's status from the pod: the init container's termination
//!   message (the fetch writes the URI and the cause there), or the kubelet's waiting
//!   message when it cannot even start (a Secret or key that does not exist).

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, EnvVar, EnvVarSource, Pod, SecretKeySelector, Volume,
};
use tidegate_api::InferencePoolSpec;
use tidegate_api::fetch_launch::{FetchEnvValue, FetchLaunch, FetchSite, fetch_launch};

use super::deployment::{
    BadPoolSpec, FETCH_CONTAINER, MODEL_CACHE_MOUNT, TERMINATION_MESSAGE_PATH,
    container_security_context, empty_dir, mount,
};

/// The volume name of the model cache.
pub const MODEL_CACHE_VOLUME: &str = "model-cache";

/// Where the fetch step runs in a pod.
pub fn pod_fetch_site() -> FetchSite {
    FetchSite {
        cache_dir: MODEL_CACHE_MOUNT.to_string(),
        hf_home: Some(format!("{MODEL_CACHE_MOUNT}/hf")),
        message_file: Some(TERMINATION_MESSAGE_PATH.to_string()),
        log_format: "json",
    }
}

/// The fetch step of a pool in a pod; None when its model is read in place.
pub fn pod_fetch(spec: &InferencePoolSpec) -> Result<Option<FetchLaunch>, BadPoolSpec> {
    fetch_launch(spec, &pod_fetch_site()).map_err(|_| BadPoolSpec::ModelUri(spec.model.uri.clone()))
}

/// The fetch contract's environment: literals as they are, credentials as references to the
/// pool's Secret (an optional key may be absent from it).
pub fn fetch_env(vars: &[(&'static str, FetchEnvValue)]) -> Vec<EnvVar> {
    vars.iter()
        .map(|(name, value)| match value {
            FetchEnvValue::Literal(v) => EnvVar {
                name: name.to_string(),
                value: Some(v.clone()),
                ..EnvVar::default()
            },
            FetchEnvValue::SecretKey {
                secret,
                key,
                optional,
            } => EnvVar {
                name: name.to_string(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: secret.clone(),
                        key: key.to_string(),
                        optional: Some(*optional),
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            },
        })
        .collect()
}

/// The cache volume (an emptyDir: fetched once per pod, kept across container restarts).
pub fn cache_volume(spec: &InferencePoolSpec) -> Volume {
    let size = spec
        .model
        .source
        .as_ref()
        .and_then(|s| s.cache_size.as_ref())
        .map(|q| q.0.clone());
    empty_dir(MODEL_CACHE_VOLUME, size.as_deref())
}

/// The `fetch-model` init container.
pub fn fetch_container(spec: &InferencePoolSpec, launch: &FetchLaunch) -> Container {
    Container {
        name: FETCH_CONTAINER.to_string(),
        image: Some(spec.engine.image.clone()),
        args: Some(launch.args.clone()),
        env: Some(fetch_env(&launch.env)).filter(|e| !e.is_empty()),
        security_context: Some(container_security_context()),
        volume_mounts: Some(vec![
            mount(MODEL_CACHE_VOLUME, MODEL_CACHE_MOUNT, false),
            mount("tmp", "/tmp", false),
        ]),
        termination_message_path: Some(TERMINATION_MESSAGE_PATH.to_string()),
        // The fetch writes its cause; a crash before it does leaves the log's tail.
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        ..Container::default()
    }
}

/// Why the model fetch of one of these engine pods is failing, naming the pod; None while
/// every fetch runs or succeeded.
pub fn fetch_failure<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Option<String> {
    pods.into_iter().find_map(|pod| {
        let status = pod.status.as_ref()?;
        let fetch = status
            .init_container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == FETCH_CONTAINER)?;
        let why = container_failure(fetch)?;
        let name = pod.metadata.name.as_deref().unwrap_or("?");
        Some(format!("pod {name}: {why}"))
    })
}

/// A failed or unstartable container: its termination message (now, or the last one while
/// it waits to restart), or the kubelet's reason for not starting it.
fn container_failure(c: &ContainerStatus) -> Option<String> {
    let terminated = |t: &k8s_openapi::api::core::v1::ContainerStateTerminated| {
        (t.exit_code != 0).then(|| {
            let msg = t
                .message
                .as_deref()
                .map(str::trim)
                .filter(|m| !m.is_empty());
            let last = msg.and_then(|m| m.lines().last()).map(str::to_string);
            last.unwrap_or_else(|| {
                format!(
                    "exited {} ({})",
                    t.exit_code,
                    t.reason.clone().unwrap_or_default()
                )
            })
        })
    };
    let state = c.state.as_ref()?;
    if let Some(t) = &state.terminated {
        return terminated(t);
    }
    if let Some(w) = &state.waiting {
        if let Some(t) = c.last_state.as_ref().and_then(|l| l.terminated.as_ref())
            && let Some(why) = terminated(t)
        {
            return Some(why);
        }
        let reason = w.reason.as_deref().unwrap_or_default();
        if reason != "PodInitializing" && reason != "ContainerCreating" {
            let msg = w.message.clone().unwrap_or_default();
            return Some(format!("{FETCH_CONTAINER} cannot start: {reason}: {msg}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(fetch: ContainerStatus) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p-1".into()),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                init_container_statuses: Some(vec![fetch]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn status(state: ContainerState, last: Option<ContainerState>) -> ContainerStatus {
        ContainerStatus {
            name: FETCH_CONTAINER.into(),
            state: Some(state),
            last_state: last,
            ..ContainerStatus::default()
        }
    }

    fn exited(code: i32, message: &str) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                message: Some(message.into()),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }
    }

    fn waiting(reason: &str, message: &str) -> ContainerState {
        ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some(message.into()),
            }),
            ..ContainerState::default()
        }
    }

    const MSG: &str =
        "model fetch failed: s3://m/tiny: credentials refused: 403 InvalidAccessKeyId";

    #[test]
    fn a_failed_fetch_names_the_pod_and_the_cause() {
        let p = pod(status(exited(1, MSG), None));
        assert_eq!(fetch_failure(&[p]), Some(format!("pod p-1: {MSG}")));
    }

    #[test]
    fn a_fetch_waiting_to_restart_reports_its_last_failure() {
        let p = pod(status(
            waiting("CrashLoopBackOff", "back-off 10s"),
            Some(exited(1, MSG)),
        ));
        assert_eq!(fetch_failure(&[p]), Some(format!("pod p-1: {MSG}")));
    }

    #[test]
    fn a_missing_secret_is_the_kubelets_message() {
        let p = pod(status(
            waiting(
                "CreateContainerConfigError",
                "secret \"s3-creds\" not found",
            ),
            None,
        ));
        let why = fetch_failure(&[p]).expect("failure");
        assert!(why.contains("secret \"s3-creds\" not found"), "{why}");
    }

    #[test]
    fn a_running_or_finished_fetch_is_no_failure() {
        assert_eq!(fetch_failure(&[pod(status(exited(0, ""), None))]), None);
        assert_eq!(
            fetch_failure(&[pod(status(waiting("PodInitializing", ""), None))]),
            None
        );
        assert_eq!(fetch_failure(&[Pod::default()]), None);
    }
}
