//! StatusSink in a cluster: the InferencePool's status subresource, merge-patched when
//! [`status_write::decide`] says the new status is worth a request, and Kubernetes Events
//! (events.k8s.io) for the planner's scale and admission changes.
//!
//! Invariants: a status is written whenever something a reader acts on changed, and its
//! figures at least every `status_write::HEARTBEAT_MS`; events are a courtesy: a cluster
//! that refuses them (RBAC, quota, an API server without the events API) is logged at warn
//! and reconciliation continues.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};
use tidegate_api::InferencePool;
use tracing::warn;

use crate::plan::{EventKind, EventPlan, Millis};
use crate::ports::{PoolRef, PoolReport, StatusError, StatusSink};
use crate::status_write::{self, StatusWrite};

/// Writes pools' status and publishes their events.
pub struct KubeStatusSink {
    client: Client,
    events: EventSink,
    /// When this operator last wrote each pool's status.
    written_at: Mutex<HashMap<PoolRef, Millis>>,
}

impl KubeStatusSink {
    pub fn new(client: Client, events: EventSink) -> Self {
        KubeStatusSink {
            client,
            events,
            written_at: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets a deleted pool.
    pub fn forget(&self, pool: &PoolRef) {
        self.written_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(pool);
    }

    fn written_at(&self, pool: &PoolRef) -> Option<Millis> {
        let book = self.written_at.lock().unwrap_or_else(|p| p.into_inner());
        book.get(pool).copied()
    }
}

/// The reference an Event names its pool by.
fn regarding(pool: &PoolRef, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some(InferencePool::api_version(&()).into_owned()),
        kind: Some(InferencePool::kind(&()).into_owned()),
        name: Some(pool.name.clone()),
        namespace: Some(pool.namespace.clone()),
        uid: uid.map(str::to_string),
        ..ObjectReference::default()
    }
}

impl StatusSink for KubeStatusSink {
    async fn report(&self, r: &PoolReport<'_>) -> Result<StatusWrite, StatusError> {
        let pool = r.pool;
        let write = status_write::decide(r.previous, r.status, self.written_at(pool), r.now);
        if write.due() {
            let api: Api<InferencePool> = Api::namespaced(self.client.clone(), &pool.namespace);
            let patch = serde_json::json!({ "status": r.status });
            api.patch_status(&pool.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| StatusError(e.to_string()))?;
            self.written_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(pool.clone(), r.now);
        }
        self.events
            .publish(&regarding(pool, r.uid), &r.plan.events)
            .await;
        Ok(write)
    }
}

/// Publishes plan events; `disabled()` publishes nothing.
#[derive(Clone)]
pub struct EventSink {
    recorder: Option<Recorder>,
}

impl EventSink {
    /// Publishes as controller `tidegate-operator`, instance = this pod's name if known.
    pub fn new(client: Client) -> Self {
        let reporter = Reporter {
            controller: crate::OPERATOR_NAME.to_string(),
            instance: std::env::var("POD_NAME").ok(),
        };
        EventSink {
            recorder: Some(Recorder::new(client, reporter)),
        }
    }

    /// A sink that drops every event (API servers without the events API).
    pub fn disabled() -> Self {
        EventSink { recorder: None }
    }

    /// The action name of an event reason (what the operator did).
    fn action(reason: &str) -> &'static str {
        if reason.contains("Scale") || reason.contains("Scaling") {
            "Scale"
        } else if reason.contains("Admission")
            || reason.contains("Paus")
            || reason.contains("Resum")
        {
            "Admission"
        } else {
            "Reconcile"
        }
    }

    /// Publishes each event; failures are logged and swallowed.
    pub async fn publish(&self, regarding: &ObjectReference, events: &[EventPlan]) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        for ev in events {
            let event = Event {
                type_: match ev.kind {
                    EventKind::Normal => EventType::Normal,
                    EventKind::Warning => EventType::Warning,
                },
                reason: ev.reason.to_string(),
                note: Some(ev.note.chars().take(1000).collect()),
                action: Self::action(ev.reason).to_string(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, regarding).await {
                warn!(object = ?regarding.name, reason = ev.reason, error = %e, "could not record event; continuing");
            }
        }
    }
}
