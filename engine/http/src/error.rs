//! Every refusal the HTTP API gives, in OpenAI's error shape:
//! `{"error":{"message":..., "type":..., "param":..., "code":...}}`.
//!
//! Invariants: client mistakes are 4xx, capacity refusals are 429 (queue full, rate limited)
//! or 503 (paused, queue timeout, draining, loading) and always carry Retry-After; a 5xx
//! means a bug or an engine failure, never bad input. `metric_label` is the bounded `reason`
//! label of `tidegate_engine_rejections_total`.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::tenancy::IdentityError;
use crate::tenancy::rate_limit::RateLimited;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<&'static str>,
    },
    #[error("{0}")]
    ContextLength(String),
    #[error("The model `{0}` does not exist")]
    UnknownModel(String),
    #[error("Request body is larger than the limit of {0} bytes")]
    TooLarge(usize),
    #[error("The request body did not arrive within {0:?}")]
    BodyTimeout(Duration),
    #[error("{0}")]
    Unauthorized(#[from] IdentityError),
    #[error("{0}")]
    RateLimited(#[from] RateLimited),
    #[error("New-tenant admission is paused for tier `{tier}`: {reason}")]
    NewTenantPaused {
        tier: String,
        reason: String,
        retry_after: Duration,
    },
    #[error("{0}")]
    Submit(#[from] SubmitError),
    /// Router: this tenant already has its bound of requests waiting in the router's queue
    /// (other tenants of its tier still get in).
    #[error("Too many of this tenant's requests are waiting; retry after {retry_after:?}")]
    TenantQueueFull { retry_after: Duration },
    #[error("The engine is draining and takes no new requests")]
    Draining,
    #[error("The engine is loading its model")]
    NotReady,
    #[error("The pool has no ready engine yet (it is starting, or scaling up from zero)")]
    NoReadyEngine { retry_after: Duration },
    #[error("No route for {0}")]
    NotFound(String),
    #[error("Method not allowed")]
    MethodNotAllowed,
    #[error("Unauthorized: a valid admin bearer token is required")]
    AdminUnauthorized,
    #[error("internal error: {0}")]
    Internal(String),
    /// Router: the engine failed while it had the request (never replayed).
    #[error("the engine failed while serving the request: {0}")]
    EngineFailed(String),
}

impl ApiError {
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError::InvalidRequest {
            message: message.into(),
            param,
        }
    }

    /// Bounded `reason` label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest { .. } => "bad_request",
            ApiError::ContextLength(_) => "context_length",
            ApiError::UnknownModel(_) => "unknown_model",
            ApiError::TooLarge(_) => "body_too_large",
            ApiError::BodyTimeout(_) => "body_timeout",
            ApiError::Unauthorized(e) => e.metric_label(),
            ApiError::RateLimited(e) => e.metric_label(),
            ApiError::NewTenantPaused { .. } => "new_tenant_paused",
            ApiError::Submit(e) => e.metric_label(),
            ApiError::TenantQueueFull { .. } => "tenant_queue_full",
            ApiError::Draining => "draining",
            ApiError::NotReady => "not_ready",
            ApiError::NoReadyEngine { .. } => "no_ready_engine",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::AdminUnauthorized => "unauthorized",
            ApiError::Internal(_) => "internal",
            ApiError::EngineFailed(_) => "engine_failed",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. } | ApiError::ContextLength(_) => StatusCode::BAD_REQUEST,
            ApiError::UnknownModel(_) | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Unauthorized(_) | ApiError::AdminUnauthorized => StatusCode::UNAUTHORIZED,
            ApiError::RateLimited(_) | ApiError::TenantQueueFull { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::NewTenantPaused { .. }
            | ApiError::Draining
            | ApiError::NotReady
            | ApiError::NoReadyEngine { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Submit(e) => match e {
                SubmitError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
                SubmitError::QueueTimeout { .. } | SubmitError::ShuttingDown => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                SubmitError::KvExhausted { .. } => StatusCode::BAD_REQUEST,
                SubmitError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            },
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::EngineFailed(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// OpenAI `type` and `code`.
    /// The OpenAI error `code` this error is answered with.
    pub fn code(&self) -> &'static str {
        self.kind().1
    }

    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::InvalidRequest { .. } => ("invalid_request_error", "invalid_request"),
            ApiError::ContextLength(_) => ("invalid_request_error", "context_length_exceeded"),
            ApiError::UnknownModel(_) => ("invalid_request_error", "model_not_found"),
            ApiError::TooLarge(_) => ("invalid_request_error", "request_too_large"),
            ApiError::BodyTimeout(_) => ("invalid_request_error", "request_timeout"),
            ApiError::Unauthorized(_) | ApiError::AdminUnauthorized => {
                ("authentication_error", "invalid_api_key")
            }
            ApiError::RateLimited(_) => ("rate_limit_error", "rate_limit_exceeded"),
            ApiError::TenantQueueFull { .. } => ("server_overloaded", "tenant_queue_full"),
            ApiError::NewTenantPaused { .. } => {
                ("new_tenant_admission_paused", "new_tenant_admission_paused")
            }
            ApiError::Submit(e) => match e {
                SubmitError::QueueFull { .. } => ("server_overloaded", "queue_full"),
                SubmitError::QueueTimeout { .. } => ("server_overloaded", "queue_timeout"),
                SubmitError::KvExhausted { .. } => {
                    ("invalid_request_error", "context_length_exceeded")
                }
                SubmitError::ShuttingDown => ("service_unavailable", "draining"),
                SubmitError::Internal(_) => ("server_error", "internal_error"),
            },
            ApiError::Draining => ("service_unavailable", "draining"),
            ApiError::NotReady => ("service_unavailable", "not_ready"),
            ApiError::NoReadyEngine { .. } => ("service_unavailable", "no_ready_engine"),
            ApiError::NotFound(_) => ("invalid_request_error", "not_found"),
            ApiError::MethodNotAllowed => ("invalid_request_error", "method_not_allowed"),
            ApiError::Internal(_) => ("server_error", "internal_error"),
            ApiError::EngineFailed(_) => ("server_error", "engine_failed"),
        }
    }

    fn param(&self) -> Option<&'static str> {
        match self {
            ApiError::InvalidRequest { param, .. } => *param,
            ApiError::UnknownModel(_) => Some("model"),
            ApiError::ContextLength(_) => Some("messages"),
            _ => None,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::RateLimited(e) => Some(e.retry_after),
            ApiError::NewTenantPaused { retry_after, .. }
            | ApiError::TenantQueueFull { retry_after }
            | ApiError::NoReadyEngine { retry_after } => Some(*retry_after),
            ApiError::Submit(SubmitError::QueueFull { retry_after })
            | ApiError::Submit(SubmitError::QueueTimeout { retry_after, .. }) => Some(*retry_after),
            ApiError::Submit(SubmitError::ShuttingDown)
            | ApiError::Draining
            | ApiError::NotReady => Some(Duration::from_secs(5)),
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (kind, code) = self.kind();
        let body = json!({
            "error": {
                "message": self.to_string(),
                "type": kind,
                "param": self.param(),
                "code": code,
            }
        });
        let mut response = (self.status(), Json(body)).into_response();
        if let Some(after) = self.retry_after() {
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        if matches!(self, ApiError::TooLarge(_)) {
            // The rest of the body may still be on its way: this connection cannot carry
            // another request, and the client should know before it tries.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if matches!(self, ApiError::AdminUnauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Why `submit` refused a request.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum SubmitError {
    #[error("the engine's queue is full; retry after {retry_after:?}")]
    QueueFull { retry_after: Duration },
    #[error("the request would wait longer than its tier's queue-wait target ({target:?})")]
    QueueTimeout {
        target: Duration,
        retry_after: Duration,
    },
    #[error("the prompt needs {needed} KV blocks but the cache holds {total}")]
    KvExhausted { needed: u64, total: u64 },
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("engine error: {0}")]
    Internal(String),
}

impl SubmitError {
    /// The `reason` label of `tidegate_engine_rejections_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            SubmitError::QueueFull { .. } => "queue_full",
            SubmitError::QueueTimeout { .. } => "queue_timeout",
            SubmitError::KvExhausted { .. } => "kv_exhausted",
            SubmitError::ShuttingDown => "draining",
            SubmitError::Internal(_) => "internal",
        }
    }
}
