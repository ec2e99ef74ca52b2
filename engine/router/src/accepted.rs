//! Tenants this router accepted: a tenant is *existing* from the moment the pool first
//! accepts one of its requests (past the new-tenant gate and its rate limits, handed to the
//! dispatcher: placed on an engine, queued or held), not from its first answer.
//!
//! The router records the tenant at once; the operator collects the records with
//! `GET /admin/v1/tenants?since=MS` on its next tick, merges them into the pool's registry
//! and pushes the registry to every router and engine (one push). Until then, and for
//! [`ACCEPTED_MEMORY_MS`] after, this router's own gate counts its own records as existing,
//! so the pause that arrives between the operator's collection and its push never refuses a
//! tenant this router accepted before it.
//!
//! Invariants: a record is made before the request waits anywhere; a request refused at
//! once at the queue's bound never entered a queue and takes its record back (if it made
//! it); the gate consults the records only to admit, never to refuse.

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::{Json, response::IntoResponse, response::Response};
use std::sync::Arc;
use tidegate_api::engine_admin::AdmittedTenants;
use tidegate_api::router::ACCEPTED_MEMORY_MS;
use tidegate_http::error::{ApiError, SubmitError};
use tidegate_http::tenancy::registry::{FirstAdmissions, now_ms};
use tidegate_http::tenancy::{CompiledPolicy, Identity, new_tenant_gate};

use crate::RouterState;

/// The tenants this router accepted (bounded: the engines' buffer).
#[derive(Debug, Default)]
pub struct Accepted {
    first: FirstAdmissions,
}

/// One request's record: retracted if the request is refused before it entered a queue.
#[derive(Debug)]
#[must_use]
pub struct Record {
    tenant: String,
    /// When this request made the tenant's first record; None when it was not the first.
    at_ms: Option<u64>,
}

impl Accepted {
    /// The new-tenant gate at this router: the pushed registry, or this router's own
    /// acceptances within [`ACCEPTED_MEMORY_MS`].
    pub fn gate(&self, policy: &CompiledPolicy, id: &Identity) -> Result<(), ApiError> {
        match new_tenant_gate(policy, id) {
            Err(_) if self.recently(&id.tenant) => Ok(()),
            other => other,
        }
    }

    fn recently(&self, tenant: &str) -> bool {
        let since = now_ms().saturating_sub(ACCEPTED_MEMORY_MS);
        self.first.contains_since(tenant, since)
    }

    /// Records that the pool accepted a request of `id`'s tenant (call once the request is
    /// past the gate and the rate limits, before it waits for an engine).
    pub fn record(&self, id: &Identity) -> Record {
        Record {
            at_ms: self.first.record_now(&id.tenant, &id.tier.name),
            tenant: id.tenant.clone(),
        }
    }

    /// The request of `record` was refused with `error` while asking for an engine: a refusal
    /// at the queue's bound means it never waited in the pool, so a first record goes.
    pub fn refused(&self, record: &Record, error: &ApiError) {
        let at_bound = matches!(
            error,
            ApiError::Submit(SubmitError::QueueFull { .. }) | ApiError::TenantQueueFull { .. }
        );
        if let (true, Some(at)) = (at_bound, record.at_ms) {
            self.first.retract(&record.tenant, at);
        }
    }

    /// Tenants first accepted at or after `since_ms`, oldest first.
    pub fn since(&self, since_ms: u64) -> AdmittedTenants {
        self.first.since(since_ms)
    }
}

/// `since` of a `?since=MS` query (0 when absent), or the refusal of a malformed one.
fn since_of(query: Option<&str>) -> Result<u64, ApiError> {
    let pairs = query.unwrap_or("").split('&').filter(|p| !p.is_empty());
    for (k, v) in pairs.map(|p| p.split_once('=').unwrap_or((p, ""))) {
        if k == "since" {
            return v
                .parse()
                .map_err(|_| ApiError::invalid("since: expected Unix milliseconds", None));
        }
    }
    Ok(0)
}

/// `GET /admin/v1/tenants?since=MS`: what the operator merges into the registry.
pub async fn get_tenants(
    State(app): State<Arc<RouterState>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let answer = crate::authorize(&app, &headers).and_then(|()| since_of(query.as_deref()));
    match answer {
        Ok(since) => Json(app.accepted.since(since)).into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tidegate_api::engine_admin::{AdmissionPush, AdmissionState, EnginePolicy};

    fn paused() -> CompiledPolicy {
        let tiers = r#"{"tiers": [{"name": "free", "priority": 1}], "defaultTier": "free"}"#;
        CompiledPolicy::compile(&EnginePolicy {
            tier_policy: Some(serde_json::from_str(tiers).unwrap()),
            admission: AdmissionPush {
                state: AdmissionState::PausedNewTenants,
                paused_tiers: vec!["free".into()],
                retry_after_seconds: 5,
                reason: String::new(),
            },
            ..EnginePolicy::default()
        })
        .unwrap()
    }

    fn id(p: &CompiledPolicy, tenant: &str) -> Identity {
        Identity {
            tenant: tenant.into(),
            tier: p.spec.tier(&p.spec.default_tier).unwrap().clone(),
        }
    }

    #[test]
    fn a_tenant_accepted_here_passes_a_pause_the_registry_does_not_know_of_it_yet() {
        let p = paused();
        let a = Accepted::default();
        assert!(
            a.gate(&p, &id(&p, "t")).is_err(),
            "new and unknown: refused"
        );
        let _record = a.record(&id(&p, "t"));
        assert!(a.gate(&p, &id(&p, "t")).is_ok());
        assert!(
            a.gate(&p, &id(&p, "u")).is_err(),
            "another tenant still refused"
        );
        let listed = a.since(0);
        assert_eq!(listed.tenants.len(), 1);
        assert_eq!(listed.tenants[0].tenant, "t");
        assert!(a.since(listed.now_ms + 1).tenants.is_empty());
    }

    #[test]
    fn since_is_read_from_the_query() {
        assert_eq!(since_of(None).unwrap(), 0);
        assert_eq!(since_of(Some("x=1&since=42")).unwrap(), 42);
        assert!(since_of(Some("since=soon")).is_err());
    }

    #[test]
    fn a_refusal_at_the_queue_bound_takes_a_first_record_back() {
        let p = paused();
        let a = Accepted::default();
        let full = ApiError::Submit(SubmitError::QueueFull {
            retry_after: Duration::from_secs(1),
        });
        let first = a.record(&id(&p, "t"));
        a.refused(&first, &full);
        assert!(a.since(0).tenants.is_empty(), "it never waited in the pool");
        let first = a.record(&id(&p, "t"));
        let second = a.record(&id(&p, "t"));
        a.refused(&second, &full);
        assert_eq!(
            a.since(0).tenants.len(),
            1,
            "the first request stays accepted"
        );
        let timeout = ApiError::Submit(SubmitError::QueueTimeout {
            target: Duration::from_secs(1),
            retry_after: Duration::from_secs(1),
        });
        a.refused(&first, &timeout);
        assert_eq!(
            a.since(0).tenants.len(),
            1,
            "a queue timeout had waited: kept"
        );
    }
}
