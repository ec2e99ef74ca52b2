//! The engine-pod watch: a pool's routers hear at once when one of its engines leaves.
//!
//! The pool's tick pushes its engine set to the routers once per `spec.scaling.interval`.
//! An engine pod that is deleted (even force-deleted, with no drain asked), or that stops
//! being Ready, must leave the routers' set sooner than that: the routers probe engines
//! every half second, but a pod in its preStop sleep still answers its probes. So every
//! engine pod change wakes its pool, and a change that takes an engine out (the pod deleting,
//! gone, or not Ready) also marks the pool dirty, which lets the tick through the debounce.
//! The changes come from the pod cache's own feed (`cache`), so the tick they wake reads a
//! pod list that already has the engine out.
//!
//! Invariant: changes that keep an engine Ready (its own status churn, the operator's
//! pod-deletion-cost patch) never force a tick, so they cannot re-trigger reconciles in a loop.

use std::collections::HashSet;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tidegate_api::InferencePool;

use super::lenient::Lenient;
use super::{ENGINE_APP, POOL_LABEL};
use crate::ports::PoolRef;

/// The label that tells an engine pod from a router pod.
const APP_NAME_LABEL: &str = "app.kubernetes.io/name";

/// The pool of an engine pod, marked dirty when the change takes the engine out. Router
/// pods (the pod watch carries both) map to nothing: the routers' own set is not urgent.
pub fn pool_of_engine_pod(
    dirty: &Mutex<HashSet<PoolRef>>,
    pod: &Pod,
) -> Option<ObjectRef<Lenient<InferencePool>>> {
    let namespace = pod.namespace()?;
    if pod.labels().get(APP_NAME_LABEL).map(String::as_str) != Some(ENGINE_APP) {
        return None;
    }
    let name = pod.labels().get(POOL_LABEL)?.clone();
    if takes_engine_out(pod)
        && let Ok(mut d) = dirty.lock()
    {
        d.insert(PoolRef {
            namespace: namespace.clone(),
            name: name.clone(),
        });
    }
    Some(ObjectRef::new(&name).within(&namespace))
}

/// The pod is leaving (deletion started; a force-deleted pod's last state has it too) or
/// is not Ready.
fn takes_engine_out(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some() || !is_ready(pod)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod(ready: bool, deleting: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("tide-abc".into()),
                namespace: Some("ns".into()),
                labels: Some(
                    [
                        (POOL_LABEL.to_string(), "tide".to_string()),
                        (APP_NAME_LABEL.to_string(), ENGINE_APP.to_string()),
                    ]
                    .into(),
                ),
                deletion_timestamp: deleting
                    .then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                ..Default::default()
            },
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn dirty_after(p: &Pod) -> (bool, Option<String>) {
        let dirty = Mutex::new(HashSet::new());
        let r = pool_of_engine_pod(&dirty, p);
        let marked = !dirty.lock().unwrap().is_empty();
        (
            marked,
            r.map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name)),
        )
    }

    #[test]
    fn a_ready_pod_wakes_its_pool_without_forcing_a_tick() {
        assert_eq!(
            dirty_after(&pod(true, false)),
            (false, Some("ns/tide".into()))
        );
    }

    #[test]
    fn a_leaving_or_unready_pod_forces_its_pool_tick() {
        assert_eq!(
            dirty_after(&pod(true, true)),
            (true, Some("ns/tide".into()))
        );
        assert_eq!(
            dirty_after(&pod(false, false)),
            (true, Some("ns/tide".into()))
        );
    }

    #[test]
    fn a_router_pod_maps_to_nothing() {
        let mut p = pod(false, true);
        if let Some(l) = p.metadata.labels.as_mut() {
            l.insert(APP_NAME_LABEL.to_string(), "tidegate-router".to_string());
        }
        assert_eq!(dirty_after(&p), (false, None));
    }

    #[test]
    fn a_pod_without_the_pool_label_maps_to_nothing() {
        let mut p = pod(false, true);
        p.metadata.labels = None;
        assert_eq!(dirty_after(&p), (false, None));
    }
}
