//! `POST /v1/completions` and `POST /v1/chat/completions`: identify, gate, limit, submit,
//! then stream (SSE) or collect the answer.
//!
//! Invariants: the checks run in the design's order — draining/loading, body, identity,
//! new-tenant gate (not for a request the pool's router proves it forwarded: the router
//! gated it), rate limits, then the engine's own admission (queue bound, KV, queue
//! wait); every refusal is counted once with its reason; a streamed response ends with
//! `data: [DONE]` (unless cut by the end of a drain); dropping the response (client gone)
//! drops the engine's token stream, which cancels the request and frees its KV, while a
//! matched stop string *finishes* it (its session keeps its KV, as at EOS); the in-flight
//! guard lives exactly as long as the response body.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Request, State};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tidegate_api::Tier;

use super::AppState;
use super::drain::InFlight;
use super::openai::{Endpoint, Prepared, prepare};
use super::stop::StopMatcher;
use crate::backend::{FinishReason, GenerateRequest, TokenEvent, TokenStream, Usage};
use crate::metrics::Metrics;
use tidegate_http::error::ApiError;
use tidegate_http::tenancy::new_tenant_gate;
use tidegate_http::tenancy::{Identity, from_router, registry::now_ms};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn request_id(endpoint: Endpoint) -> String {
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let t = now_ms();
    match endpoint {
        Endpoint::Completions => format!("cmpl-{t:x}{n:08x}"),
        Endpoint::Chat => format!("chatcmpl-{t:x}{n:08x}"),
    }
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub async fn completions(State(app): State<Arc<AppState>>, request: Request) -> Response {
    handle(app, Endpoint::Completions, request).await
}

pub async fn chat_completions(State(app): State<Arc<AppState>>, request: Request) -> Response {
    handle(app, Endpoint::Chat, request).await
}

async fn handle(app: Arc<AppState>, endpoint: Endpoint, request: Request) -> Response {
    let arrived = Instant::now();
    let policy = app.policy.get();
    let mut tier_name = policy.spec.default_tier.clone();
    let retry = is_retry(request.headers());
    match admit(&app, endpoint, request, arrived, &mut tier_name).await {
        Ok(response) => response,
        Err(e) => {
            app.metrics.reject(e.metric_label(), retry);
            app.metrics.outcome(&tier_name, "rejected");
            if e.status().is_server_error() {
                tracing::warn!(status = e.status().as_u16(), reason = e.metric_label(), error = %e, "request failed");
            } else {
                tracing::info!(status = e.status().as_u16(), reason = e.metric_label(), tier = %tier_name, error = %e, "request refused");
            }
            e.into_response()
        }
    }
}

/// Whether the client sent this request as a retry of one refused before (the OpenAI SDKs'
/// attempt header above 0). An unreadable value counts as a first attempt: counted as
/// demand, as every refusal was before the header was read.
fn is_retry(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(tidegate_api::router::header::RETRY_COUNT)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u32>().ok())
        .is_some_and(|n| n > 0)
}

async fn admit(
    app: &Arc<AppState>,
    endpoint: Endpoint,
    request: Request,
    arrived: Instant,
    tier_name: &mut String,
) -> Result<Response, ApiError> {
    let guard = app.drain.enter().ok_or(ApiError::Draining)?;
    if !app.engine.is_ready() {
        return Err(ApiError::NotReady);
    }
    let headers = request.headers().clone();
    let headers = &headers;
    let body = app.read_body(request).await?;
    let policy = app.policy.get();
    let identity = policy.identify_routed(headers, app.config.router_token.as_deref())?;
    tier_name.clone_from(&identity.tier.name);
    let session_header = match headers.get("x-session-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::invalid("x-session-id is not valid text", None))?,
        ),
    };
    let prepared = prepare(endpoint, &body, app.engine.as_ref(), session_header)?;
    // A routed request passed the pool's gate at the router, perhaps before a pause that
    // reached this engine first: gating it again would refuse a tenant the pool accepted.
    if !from_router(headers, app.config.router_token.as_deref()) {
        new_tenant_gate(&policy, &identity)?;
    }
    let max_tokens = output_limit(
        &prepared,
        &identity.tier,
        app.engine.model_info().context_length,
    );
    let prompt_len = prepared.prompt.len() as u32;
    let charged = u64::from(prompt_len) + u64::from(max_tokens);
    let limits = identity.tier.rate_limits.clone();
    app.limiter
        .check(&identity.tenant, limits.as_ref(), charged, Instant::now())?;
    let id = request_id(endpoint);
    let request = GenerateRequest {
        id: id.clone(),
        prompt: prepared.prompt.clone(),
        max_tokens,
        sampling: prepared.sampling.clone(),
        ignore_eos: prepared.ignore_eos,
        // By name only: the engine holds the tier's parameters (one tier table).
        tier: identity.tier.name.clone(),
        // Namespaced by tenant: one tenant's session id never reaches another's KV.
        session_id: prepared
            .session_id
            .as_ref()
            .map(|s| format!("{}:{}:{s}", identity.tenant.len(), identity.tenant)),
        arrived,
    };
    let admitted = match app.engine.submit(request).await {
        Ok(a) => a,
        Err(e) => {
            app.limiter
                .refund(&identity.tenant, limits.as_ref(), charged, true);
            return Err(e.into());
        }
    };
    app.admissions
        .record_now(&identity.tenant, &identity.tier.name);
    Metrics::observe(
        &app.metrics.queue_wait_seconds,
        &identity.tier.name,
        admitted.queue_wait.as_secs_f64(),
    );
    tracing::debug!(%id, tenant = %identity.tenant, tier = %identity.tier.name, prompt_tokens = prompt_len, max_tokens, queue_wait_ms = admitted.queue_wait.as_millis() as u64, "admitted");
    let generation = Generation {
        app: Arc::clone(app),
        id,
        created: unix_secs(),
        model: app.engine.model_info().id,
        endpoint,
        identity,
        max_tokens,
        arrived,
        last_token: None,
        prompt_tokens: prompt_len,
        completion_tokens: 0,
        stop: StopMatcher::new(prepared.stop.clone()),
        tokens: Some(admitted.tokens),
        queue: VecDeque::new(),
        guard,
        outcome: None,
    };
    Ok(if prepared.stream {
        stream_response(generation, prepared.include_usage)
    } else {
        collect_response(generation).await
    })
}

/// The output limit: requested (or the endpoint's default), clamped by the tier and by what
/// is left of the context.
fn output_limit(p: &Prepared, tier: &Tier, context: u32) -> u32 {
    let room = context.saturating_sub(p.prompt.len() as u32).max(1);
    let default = match p.endpoint {
        Endpoint::Completions => 16,
        Endpoint::Chat => room,
    };
    let tier_max = u32::try_from(tier.max_output_tokens.max(1)).unwrap_or(u32::MAX);
    p.max_tokens
        .unwrap_or(default)
        .min(tier_max)
        .min(room)
        .max(1)
}

/// One piece of output, after stop strings.
enum Piece {
    Text(String),
    Done {
        reason: FinishReason,
        usage: Usage,
    },
    Failed(String),
    /// The drain grace ran out.
    Cut,
}

/// An admitted request being answered. Dropping it cancels the engine request.
struct Generation {
    app: Arc<AppState>,
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
    identity: Identity,
    max_tokens: u32,
    arrived: Instant,
    last_token: Option<Instant>,
    prompt_tokens: u32,
    completion_tokens: u32,
    stop: StopMatcher,
    /// None once finished: the engine request is released.
    tokens: Option<TokenStream>,
    queue: VecDeque<Piece>,
    guard: InFlight,
    outcome: Option<&'static str>,
}

impl Generation {
    async fn next(&mut self) -> Option<Piece> {
        loop {
            if let Some(piece) = self.queue.pop_front() {
                return Some(piece);
            }
            let tokens = self.tokens.as_mut()?;
            let event = tokio::select! {
                e = tokens.next() => e,
                () = self.guard.cut() => {
                    self.tokens = None;
                    self.end("cancelled");
                    return Some(Piece::Cut);
                }
            };
            match event {
                Some(TokenEvent::Token { text, .. }) => {
                    self.observe_token();
                    self.completion_tokens += 1;
                    let released = self.stop.push(&text);
                    if !released.text.is_empty() {
                        self.queue.push_back(Piece::Text(released.text));
                    }
                    if released.stopped {
                        // A finish, not a cancel: the session keeps its KV for its next turn.
                        if let Some(tokens) = self.tokens.take() {
                            tokens.finish();
                        }
                        self.end("completed");
                        self.queue.push_back(Piece::Done {
                            reason: FinishReason::Stop,
                            usage: Usage {
                                prompt_tokens: self.prompt_tokens,
                                completion_tokens: self.completion_tokens,
                                cached_prompt_tokens: 0,
                            },
                        });
                    }
                }
                Some(TokenEvent::Finished { reason, usage }) => {
                    self.tokens = None;
                    let rest = self.stop.flush();
                    if !rest.is_empty() {
                        self.queue.push_back(Piece::Text(rest));
                    }
                    self.completion_tokens = usage.completion_tokens;
                    self.end("completed");
                    self.queue.push_back(Piece::Done { reason, usage });
                }
                Some(TokenEvent::Failed { message }) => {
                    self.tokens = None;
                    self.end("failed");
                    self.queue.push_back(Piece::Failed(message));
                }
                None => {
                    self.tokens = None;
                    self.end("failed");
                    self.queue
                        .push_back(Piece::Failed("the engine dropped the request".into()));
                }
            }
        }
    }

    fn observe_token(&mut self) {
        let now = Instant::now();
        let tier = &self.identity.tier.name;
        match self.last_token {
            None => Metrics::observe(
                &self.app.metrics.time_to_first_token_seconds,
                tier,
                now.duration_since(self.arrived).as_secs_f64(),
            ),
            Some(last) => Metrics::observe(
                &self.app.metrics.inter_token_latency_seconds,
                tier,
                now.duration_since(last).as_secs_f64(),
            ),
        }
        self.last_token = Some(now);
    }

    /// Records the outcome once and refunds unused output tokens to the rate limiter.
    fn end(&mut self, outcome: &'static str) {
        if self.outcome.is_some() {
            return;
        }
        self.outcome = Some(outcome);
        let tier = &self.identity.tier;
        self.app.metrics.outcome(&tier.name, outcome);
        self.app.limiter.refund(
            &self.identity.tenant,
            tier.rate_limits.as_ref(),
            u64::from(self.max_tokens.saturating_sub(self.completion_tokens)),
            false,
        );
        tracing::info!(
            id = %self.id,
            tenant = %self.identity.tenant,
            tier = %tier.name,
            outcome,
            prompt_tokens = self.prompt_tokens,
            completion_tokens = self.completion_tokens,
            elapsed_ms = self.arrived.elapsed().as_millis() as u64,
            "request finished"
        );
    }

    fn usage_json(&self, usage: &Usage) -> Value {
        json!({
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
        })
    }

    /// A streaming chunk with one choice.
    fn chunk(
        &self,
        text: Option<&str>,
        finish: Option<FinishReason>,
        include_usage: bool,
    ) -> Value {
        let finish = finish.map(|f| f.as_str());
        let mut v = match self.endpoint {
            Endpoint::Completions => json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish}],
            }),
            Endpoint::Chat => {
                let delta = match text {
                    Some(t) => json!({"content": t}),
                    None => json!({}),
                };
                json!({
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
                })
            }
        };
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn usage_chunk(&self, usage: &Usage) -> Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self.usage_json(usage),
        })
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // Client gone before the end: the token stream drops with us and the engine frees
        // the request's blocks at its next step.
        self.end("cancelled");
    }
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

fn error_value(message: &str) -> Value {
    json!({"error": {"message": message, "type": "server_error", "param": null, "code": "engine_error"}})
}

fn stream_response(generation: Generation, include_usage: bool) -> Response {
    let mut pending: VecDeque<Event> = VecDeque::new();
    if generation.endpoint == Endpoint::Chat {
        let mut first = generation.chunk(None, None, include_usage);
        first["choices"][0]["delta"] = json!({"role": "assistant", "content": ""});
        pending.push_back(data(&first));
    }
    let events = futures::stream::unfold(
        (generation, pending, false),
        move |(mut g, mut pending, mut done)| async move {
            loop {
                if let Some(e) = pending.pop_front() {
                    return Some((Ok::<Event, Infallible>(e), (g, pending, done)));
                }
                if done {
                    return None;
                }
                match g.next().await {
                    Some(Piece::Text(t)) => {
                        pending.push_back(data(&g.chunk(Some(&t), None, include_usage)));
                    }
                    Some(Piece::Done { reason, usage }) => {
                        pending.push_back(data(&g.chunk(None, Some(reason), include_usage)));
                        if include_usage {
                            pending.push_back(data(&g.usage_chunk(&usage)));
                        }
                        pending.push_back(Event::default().data("[DONE]"));
                        done = true;
                    }
                    Some(Piece::Failed(message)) => {
                        pending.push_back(data(&error_value(&message)));
                        pending.push_back(Event::default().data("[DONE]"));
                        done = true;
                    }
                    Some(Piece::Cut) | None => return None,
                }
            }
        },
    );
    Sse::new(events).into_response()
}

async fn collect_response(mut g: Generation) -> Response {
    let mut text = String::new();
    loop {
        match g.next().await {
            Some(Piece::Text(t)) => text.push_str(&t),
            Some(Piece::Done { reason, usage }) => {
                let choice = match g.endpoint {
                    Endpoint::Completions => json!({
                        "index": 0, "text": text, "logprobs": null, "finish_reason": reason.as_str(),
                    }),
                    Endpoint::Chat => json!({
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": null,
                        "finish_reason": reason.as_str(),
                    }),
                };
                let object = match g.endpoint {
                    Endpoint::Completions => "text_completion",
                    Endpoint::Chat => "chat.completion",
                };
                return Json(json!({
                    "id": g.id,
                    "object": object,
                    "created": g.created,
                    "model": g.model,
                    "choices": [choice],
                    "usage": g.usage_json(&usage),
                }))
                .into_response();
            }
            Some(Piece::Failed(message)) => {
                return ApiError::Internal(message).into_response();
            }
            Some(Piece::Cut) | None => return ApiError::Draining.into_response(),
        }
    }
}
