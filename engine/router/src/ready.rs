//! The router's readiness: ready once it holds the pool's policy. A router the operator
//! runs starts with no policy (no API keys, no tiers, no pause): were it ready at once, the
//! Service would send it clients it maps to `anonymous` of a default tier that no pause
//! applies to, until the operator's push arrives. So `/readyz` answers 503 until the first
//! policy push, and the answer to every endpoint push says whether one came
//! (`EndpointsView::policy_pushed`), so the operator pushes the policy to it that tick.
//!
//! Invariants: a router with its admin API disabled (static engines, benchmarks), or started
//! with a policy of its own (`--policy-file`), is ready from its start; once ready, a router
//! stays ready (a later push replaces the policy whole, it never removes it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use tidegate_http::error::ApiError;

use crate::RouterState;

/// Whether the router holds a policy to admit requests by.
#[derive(Debug)]
pub struct PolicyReadiness(AtomicBool);

impl PolicyReadiness {
    /// `has_policy`: the router has a policy of its own already, or nobody will push one.
    pub fn new(has_policy: bool) -> Self {
        PolicyReadiness(AtomicBool::new(has_policy))
    }

    /// A policy was pushed.
    pub fn pushed(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn has_policy(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// `GET /readyz`: 200 once the router holds a policy, 503 `not_ready` before.
pub async fn readyz(State(app): State<Arc<RouterState>>) -> Response {
    if app.ready.has_policy() {
        "ready".into_response()
    } else {
        ApiError::NotReady.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_from_the_first_push_on() {
        let r = PolicyReadiness::new(false);
        assert!(!r.has_policy());
        r.pushed();
        r.pushed();
        assert!(r.has_policy());
        assert!(PolicyReadiness::new(true).has_policy());
    }
}
