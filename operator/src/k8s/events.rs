//! Kubernetes Events (events.k8s.io) for the planner's scale and admission changes.
//!
//! Events are a courtesy: a cluster that refuses them (RBAC, quota, an API server without
//! the events API) is logged at warn and reconciliation continues.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::warn;

use crate::plan::{EventKind, EventPlan};

/// Publishes plan events; `disabled()` publishes nothing.
#[derive(Clone)]
pub struct EventSink {
    recorder: Option<Recorder>,
}

impl EventSink {
    /// Publishes as controller `tidegate-operator`, instance = this pod's name if known.
    pub fn new(client: Client) -> Self {
        let reporter = Reporter {
            controller: super::FIELD_MANAGER.to_string(),
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
