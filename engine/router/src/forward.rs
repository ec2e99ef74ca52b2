//! Sending one request to an engine and streaming its answer back.
//!
//! Invariants: the lease lives exactly as long as the response body (the engine's slot is
//! counted until the client has the last byte or went away; dropping the body drops the
//! engine connection, which cancels the engine request); the body is passed through as the
//! engine sends it (backpressure: nothing is read from the engine faster than the client
//! reads); an engine that breaks mid-stream ends that one stream, with an SSE error event
//! when the answer is a stream; the router token and identity headers go only to engines.
//! Every answer's load header is recorded for its engine; a refusal for room
//! (`queue_full`) marks the engine full until it reports again and refunds the tenant's
//! charge; a finished answer's `usage` settles the charge.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use futures::Stream;
use serde_json::Value;
use tidegate_api::router::{EngineLoad, header};

use super::dispatch::Lease;
use super::usage::UsageScan;
use tidegate_http::tenancy::Identity;

/// Why a forward produced no response.
#[derive(Debug)]
pub enum ForwardError {
    /// Nothing was sent (connection refused or timed out): safe to try another engine.
    Connect(String),
    /// Sent, then failed before any answer: never replayed.
    Sent(String),
}

/// What the router tells an engine beside the client's body.
#[derive(Debug)]
pub struct Outbound<'a> {
    pub method: reqwest::Method,
    /// An engine silent this long (before its answer starts, or between two chunks of it)
    /// has hung: its stream is ended with an error.
    pub idle_timeout: Duration,
    pub path: &'a str,
    pub client_headers: &'a HeaderMap,
    pub identity: &'a Identity,
    pub router_token: Option<&'a str>,
    pub body: Bytes,
}

/// Client headers passed on to engines (everything else is the router's business).
const PASSED: &[&str] = &[
    "content-type",
    "accept",
    header::SESSION,
    header::RETRY_COUNT,
    "x-request-id",
];

fn outbound_headers(o: &Outbound<'_>) -> HeaderMap {
    let mut h = HeaderMap::new();
    for name in PASSED {
        if let Some(v) = o.client_headers.get(*name) {
            h.insert(HeaderName::from_static(name), v.clone());
        }
    }
    if let Some(token) = o.router_token
        && let (Ok(tenant), Ok(tier), Ok(token)) = (
            HeaderValue::from_str(&o.identity.tenant),
            HeaderValue::from_str(&o.identity.tier.name),
            HeaderValue::from_str(token),
        )
    {
        h.insert(header::TENANT, tenant);
        h.insert(header::TIER, tier);
        h.insert(header::ROUTER_TOKEN, token);
    }
    h
}

/// Engine response headers passed on to the client.
const RETURNED: &[&str] = &[
    "content-type",
    "retry-after",
    "cache-control",
    "x-request-id",
];

/// Sends `o` to the lease's engine. The lease moves into the response body.
pub async fn forward(
    http: &reqwest::Client,
    lease: Lease,
    o: Outbound<'_>,
) -> Result<(Response, &'static str), (ForwardError, Lease)> {
    let url = format!("{}{}", lease.url.trim_end_matches('/'), o.path);
    let send = http
        .request(o.method.clone(), url)
        .headers(outbound_headers(&o))
        .body(o.body.clone())
        .send();
    let resp = match tokio::time::timeout(o.idle_timeout, send).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) if e.is_connect() => {
            return Err((ForwardError::Connect(e.to_string()), lease));
        }
        Ok(Err(e)) => return Err((ForwardError::Sent(e.to_string()), lease)),
        Err(_) => {
            let why = format!("no answer within {:?}", o.idle_timeout);
            return Err((ForwardError::Sent(why), lease));
        }
    };
    let status = resp.status();
    if let Some(load) = resp
        .headers()
        .get(header::ENGINE_LOAD)
        .and_then(|v| v.to_str().ok())
        .and_then(EngineLoad::parse)
    {
        lease.report(load);
    }
    let mut headers = HeaderMap::new();
    for name in RETURNED {
        if let Some(v) = resp.headers().get(*name) {
            headers.insert(HeaderName::from_static(name), v.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(&lease.name) {
        headers.insert(header::ENGINE, v);
    }
    let sse = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    let (body, outcome) = if status.is_success() {
        let body = Body::from_stream(Passthrough {
            inner: Box::pin(resp.bytes_stream()),
            lease: Some(lease),
            usage: UsageScan::default(),
            sse,
            done: false,
            idle_after: o.idle_timeout,
            idle: Box::pin(tokio::time::sleep(o.idle_timeout)),
        });
        (body, "served")
    } else {
        // A refusal or an error: small JSON, read whole so its code names the outcome.
        let bytes = tokio::time::timeout(o.idle_timeout, resp.bytes())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let mut lease = lease;
        let code = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
            .unwrap_or_default();
        // Not served: nothing of the tenant's charge was spent.
        lease.settle(0);
        if status == StatusCode::TOO_MANY_REQUESTS && code == "queue_full" {
            lease.refused_for_room();
        }
        drop(lease);
        (Body::from(bytes), refusal_outcome(status, &code))
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    Ok((response, outcome))
}

/// The router outcome (`tidegate_router_requests_total`) of a refusal, from its status and
/// OpenAI error code: the engine's answer or the router's own.
pub fn refusal_outcome(status: StatusCode, code: &str) -> &'static str {
    match code {
        "queue_full" => "queue_full",
        "tenant_queue_full" => "tenant_queue_full",
        "no_ready_engine" => "hold_timeout",
        "queue_timeout" => "queue_timeout",
        "new_tenant_admission_paused" => "paused",
        "rate_limit_exceeded" => "rate_limited",
        "invalid_api_key" => "unauthorized",
        _ if status.is_client_error() => "bad_request",
        _ => "engine_error",
    }
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// The engine's body, holding the lease until it ends.
struct Passthrough {
    inner: ByteStream,
    lease: Option<Lease>,
    usage: UsageScan,
    sse: bool,
    done: bool,
    idle_after: Duration,
    /// Fires when the engine has been silent for `idle_after`; reset by every chunk.
    idle: Pin<Box<tokio::time::Sleep>>,
}

/// The SSE event that ends a stream the engine broke.
pub fn stream_error_event(message: &str) -> Bytes {
    let body = serde_json::json!({
        "error": {
            "message": format!("the engine stopped answering mid-stream: {message}"),
            "type": "server_error",
            "param": Value::Null,
            "code": "engine_stream_broken",
        }
    });
    Bytes::from(format!("data: {body}\n\n"))
}

impl Stream for Passthrough {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.inner.as_mut().poll_next(cx) {
            Poll::Pending => {
                if self.idle.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let why = format!("no data for {:?}", self.idle_after);
                Poll::Ready(Some(self.end_broken(&why)))
            }
            Poll::Ready(Some(Ok(b))) => {
                self.usage.feed(&b);
                let next = tokio::time::Instant::now() + self.idle_after;
                self.idle.as_mut().reset(next);
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(None) => {
                self.done = true;
                let total = self.usage.total();
                if let (Some(lease), Some(tokens)) = (self.lease.as_mut(), total) {
                    lease.settle(tokens);
                }
                self.lease = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(self.end_broken(&e.to_string()))),
        }
    }
}

impl Passthrough {
    /// Ends a body the engine broke (an error or silence): an SSE error event for a stream,
    /// an aborted body otherwise; the engine's slot is returned at once.
    fn end_broken(&mut self, why: &str) -> Result<Bytes, std::io::Error> {
        self.done = true;
        let engine = self
            .lease
            .take()
            .map(|l| l.name.clone())
            .unwrap_or_default();
        tracing::warn!(%engine, error = %why, "engine broke a response mid-body");
        if self.sse {
            Ok(stream_error_event(why))
        } else {
            Err(std::io::Error::other(why.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_and_the_clients_retry_count_reach_the_engine_and_its_key_does_not() {
        let mut client = HeaderMap::new();
        client.insert(header::SESSION, HeaderValue::from_static("s1"));
        client.insert(header::RETRY_COUNT, HeaderValue::from_static("2"));
        client.insert("authorization", HeaderValue::from_static("Bearer sk-x"));
        let tier = serde_json::from_value(serde_json::json!({"name": "free"})).unwrap();
        let identity = Identity {
            tenant: "acme".into(),
            tier,
        };
        let o = Outbound {
            method: reqwest::Method::POST,
            idle_timeout: Duration::from_secs(1),
            path: "/v1/chat/completions",
            client_headers: &client,
            identity: &identity,
            router_token: Some("t"),
            body: Bytes::new(),
        };
        let h = outbound_headers(&o);
        assert_eq!(h[header::RETRY_COUNT], "2");
        assert_eq!(h[header::SESSION], "s1");
        assert_eq!(h[header::TENANT], "acme");
        assert!(h.get("authorization").is_none());
    }
}
