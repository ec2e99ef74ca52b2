//! The `/metrics` answer of the engine and the router.

use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// A `/metrics` answer: the exposition text as OpenMetrics, or a 500 when it failed.
pub fn openmetrics_response(encoded: Result<String, std::fmt::Error>) -> Response {
    match encoded {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => ApiError::Internal(e.to_string()).into_response(),
    }
}
