//! The admin API (its own listener): policy push, admitted tenants, drain.
//!
//! Invariants: every route checks the bearer token first (401 otherwise, compared in
//! constant time); a pushed policy is validated whole and replaces the old one whole, or is
//! refused with 400 and changes nothing; the admission_paused gauge mirrors the last
//! accepted push.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use tidegate_api::engine_admin::{
    DRAIN_PATH, DrainRequest, EnginePolicy, POLICY_PATH, TENANTS_PATH,
};
use tidegate_http::auth::check_bearer;

use super::AppState;
use crate::metrics::TierLabel;
use tidegate_http::error::ApiError;
use tidegate_http::tenancy::CompiledPolicy;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(POLICY_PATH, put(put_policy))
        .route(TENANTS_PATH, get(get_tenants))
        .route(DRAIN_PATH, get(get_drain).post(post_drain))
        .fallback(|| async { ApiError::NotFound("admin route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}

fn authorize(app: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    check_bearer(headers, app.admin_token.as_deref())
}

/// Applies a policy: store it and mirror its admission state in the gauge.
pub fn apply_policy(app: &AppState, compiled: CompiledPolicy) {
    app.metrics.admission_paused.clear();
    for tier in &compiled.spec.tiers {
        app.metrics
            .admission_paused
            .get_or_create(&TierLabel {
                tier: tier.name.clone(),
            })
            .set(i64::from(compiled.tier_paused(tier)));
    }
    app.engine.set_tier_policy(&compiled.spec);
    app.policy.set(compiled);
}

async fn put_policy(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    request: Request,
) -> Result<StatusCode, ApiError> {
    authorize(&app, &headers)?;
    let body = app.read_body(request).await?;
    let policy: EnginePolicy = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("Invalid policy: {e}"), None))?;
    let compiled = CompiledPolicy::compile(&policy)
        .map_err(|e| ApiError::invalid(format!("Invalid policy: {e}"), None))?;
    tracing::info!(
        tiers = compiled.spec.tiers.len(),
        api_keys = policy.api_keys.len(),
        admitted_tenants = policy.admitted_tenants.len(),
        admission = policy.admission.state.as_str(),
        paused_tiers = ?policy.admission.paused_tiers,
        "policy pushed"
    );
    apply_policy(&app, compiled);
    Ok(StatusCode::NO_CONTENT)
}

async fn get_tenants(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    authorize(&app, &headers)?;
    let mut since = 0u64;
    for pair in query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == "since" {
            since = v.parse().map_err(|_| {
                ApiError::invalid(
                    format!("since must be Unix milliseconds, got {v:?}"),
                    Some("since"),
                )
            })?;
        }
    }
    Ok(Json(app.admissions.since(since)).into_response())
}

async fn post_drain(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    authorize(&app, &headers)?;
    let body = app.read_body(request).await?;
    let request: DrainRequest = if body.iter().all(u8::is_ascii_whitespace) {
        DrainRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid(format!("Invalid drain request: {e}"), None))?
    };
    let status = app
        .drain
        .start(request.grace_seconds.map(Duration::from_secs));
    Ok((StatusCode::ACCEPTED, Json(status)).into_response())
}

async fn get_drain(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&app, &headers)?;
    Ok(Json(app.drain.status()).into_response())
}
