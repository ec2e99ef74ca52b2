//! Whether this cluster can mount a pool's model as an image volume (`spec.model.uri:
//! oci://…`), found out before any engine pod is made, so that a cluster without them gets a
//! condition that names the fix instead of pods that cannot find their model.
//!
//! Two facts decide, each checked once per operator process and remembered:
//! - the API server's version: image volumes are 1.31+ alpha, 1.33+ beta (off by default),
//!   on by default from 1.35, GA in 1.36; before 1.33 there is nothing to turn on;
//! - whether the API server keeps the field: a server-side dry-run apply of the pool's engine
//!   Deployment, read back; a server with the ImageVolume feature gate off drops
//!   `volumes[].image` without an error.
//!
//! The pure parts (`by_version`, `volume_kept`) are unit-tested; `ImageVolumes::check` is the
//! thin layer that asks the API server.

use std::sync::Mutex;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use tracing::{info, warn};

use super::FIELD_MANAGER;

/// Whether image volumes work here; `No` carries the reason, for the pool's condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    Yes,
    No(String),
}

/// The fix, the same in every message.
const FIX: &str = "image volumes need Kubernetes 1.33+ with the ImageVolume feature gate (on by \
                   default from 1.35, GA in 1.36) on the API server and the kubelets; or ship the \
                   model on a PersistentVolume (spec.model.uri: pvc://CLAIM/PATH)";

/// What the API server's version alone says: `No` before 1.33, `Yes` from 1.35, None (ask
/// the server) between, where the gate may be on or off.
pub fn by_version(major: u32, minor: u32) -> Option<Support> {
    match (major, minor) {
        (1, m) if m < 33 => Some(Support::No(format!(
            "this cluster runs Kubernetes 1.{m}: {FIX}"
        ))),
        (1, 33 | 34) => None,
        _ => Some(Support::Yes),
    }
}

/// Whether a Deployment read back from the API server still has its `model` image volume.
pub fn volume_kept(deployment: &Deployment) -> bool {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.name == "model" && v.image.is_some()))
}

/// Parses the leading number of a version field (`"36"`, `"36+"`).
fn number(s: &str) -> Option<u32> {
    s.trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()
}

/// The answer for this cluster, found out on first use.
#[derive(Debug, Default)]
pub struct ImageVolumes {
    known: Mutex<Option<Support>>,
}

impl ImageVolumes {
    /// Whether `deployment` (a pool's engine Deployment with its model as an image volume)
    /// would keep that volume on this cluster. Errors reaching the API server are not an
    /// answer: they are returned, and asked again next time.
    pub async fn check(
        &self,
        client: &Client,
        namespace: &str,
        deployment: &Deployment,
    ) -> Result<Support, kube::Error> {
        if let Some(known) = self.known.lock().ok().and_then(|k| k.clone()) {
            return Ok(known);
        }
        let info = client.apiserver_version().await?;
        let version = match (number(&info.major), number(&info.minor)) {
            (Some(major), Some(minor)) => by_version(major, minor),
            _ => None,
        };
        let support = match version {
            Some(s) => s,
            None => {
                self.dry_run(client, namespace, deployment, &info.git_version)
                    .await?
            }
        };
        match &support {
            Support::Yes => {
                info!(version = %info.git_version, "image volumes work on this cluster: oci:// models are mounted as image volumes")
            }
            Support::No(why) => {
                warn!(version = %info.git_version, %why, "image volumes do not work on this cluster: pools with oci:// models are not applied")
            }
        }
        if let Ok(mut known) = self.known.lock() {
            *known = Some(support.clone());
        }
        Ok(support)
    }

    async fn dry_run(
        &self,
        client: &Client,
        namespace: &str,
        deployment: &Deployment,
        version: &str,
    ) -> Result<Support, kube::Error> {
        let name = deployment.metadata.name.clone().unwrap_or_default();
        let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
        let back = api.patch(&name, &params, &Patch::Apply(deployment)).await?;
        Ok(if volume_kept(&back) {
            Support::Yes
        } else {
            Support::No(format!(
                "the API server ({version}) dropped the Deployment's image volume (the \
                 ImageVolume feature gate is off): {FIX}"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::deployment::model_image_volume;
    use k8s_openapi::api::apps::v1::DeploymentSpec;
    use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec, Volume};

    fn with_volumes(volumes: Vec<Volume>) -> Deployment {
        Deployment {
            spec: Some(DeploymentSpec {
                template: PodTemplateSpec {
                    spec: Some(PodSpec {
                        volumes: Some(volumes),
                        ..PodSpec::default()
                    }),
                    ..PodTemplateSpec::default()
                },
                ..DeploymentSpec::default()
            }),
            ..Deployment::default()
        }
    }

    #[test]
    fn the_version_decides_before_1_33_and_from_1_35() {
        let Some(Support::No(why)) = by_version(1, 30) else {
            panic!("1.30 has no image volumes to turn on");
        };
        assert!(
            why.contains("Kubernetes 1.30") && why.contains("pvc://"),
            "{why}"
        );
        assert_eq!(
            by_version(1, 33),
            None,
            "beta, off by default: ask the server"
        );
        assert_eq!(by_version(1, 34), None);
        assert_eq!(by_version(1, 35), Some(Support::Yes));
        assert_eq!(by_version(1, 36), Some(Support::Yes));
        assert_eq!(number("33+"), Some(33));
    }

    #[test]
    fn a_deployment_read_back_without_its_image_volume_lost_it() {
        assert!(volume_kept(&with_volumes(vec![model_image_volume(
            "r/m:1"
        )])));
        let dropped = Volume {
            name: "model".to_string(),
            ..Volume::default()
        };
        assert!(!volume_kept(&with_volumes(vec![dropped])));
        assert!(!volume_kept(&Deployment::default()));
    }
}
