//! The new-tenant gate: the admission rule that pauses new tenants of a tier at the pool's
//! ceiling, applied the same way at the router and at an engine.

use crate::error::ApiError;
use crate::tenancy::{CompiledPolicy, Identity};

/// A new tenant of a paused, pausable tier is refused with the pushed reason (or a default)
/// and Retry-After; everyone else passes.
pub fn new_tenant_gate(policy: &CompiledPolicy, id: &Identity) -> Result<(), ApiError> {
    if !policy.refuses_new_tenant(id) {
        return Ok(());
    }
    Err(ApiError::NewTenantPaused {
        tier: id.tier.name.clone(),
        reason: if policy.pause_reason.is_empty() {
            "the pool is at capacity; existing tenants keep being served".to_string()
        } else {
            policy.pause_reason.clone()
        },
        retry_after: policy.retry_after,
    })
}
