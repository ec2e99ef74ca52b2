//! The engine's HTTP side: the OpenAI-compatible API, health, metrics, and the admin API
//! on its own listener, all in front of an [`Engine`](crate::backend::Engine).
//!
//! Invariants: the admin API never listens without a token ([`AdminAuth::Token`]) — the
//! only way to run without one is [`AdminAuth::Disabled`], which binds no admin listener;
//! shared state is read-mostly (the policy, replaced whole) or owned by small types with
//! one job (rate limiter, first admissions, drain); the serve future returns `Ok` once a
//! drain completes; every answer of the API port (readiness included) carries the engine's
//! load ([`header::ENGINE_LOAD`]: running, waiting, KV blocks free), which the pool router
//! places on.

pub mod admin;
mod closing_listener;
pub mod completions;
pub mod drain;
pub mod openai;
pub mod stop;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tidegate_api::engine_admin::{DrainStatus, EnginePolicy};
use tidegate_api::engine_launch as launch;
use tidegate_api::router::{EngineLoad, header};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::backend::Engine;
use crate::metrics::Metrics;
use axum::body::Bytes;
use axum::extract::Request;
use drain::{Drain, Phase};
use tidegate_http::auth::{ADMIN_TOKEN_MISSING, AdminAuth};
use tidegate_http::body::read_limited;
use tidegate_http::error::ApiError;
use tidegate_http::metrics_answer::openmetrics_response;
use tidegate_http::tenancy::rate_limit::RateLimiter;
use tidegate_http::tenancy::registry::FirstAdmissions;
use tidegate_http::tenancy::{CompiledPolicy, PolicyError, PolicyStore};

/// Server settings (the CLI builds these from flags and env).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Requests with a larger body get 413.
    pub max_body_bytes: usize,
    /// A request body that takes longer to arrive gets 408.
    pub body_read_timeout: Duration,
    /// Grace for in-flight requests when a drain gives none.
    pub drain_grace: Duration,
    pub admin: AdminAuth,
    /// Policy in force until the operator pushes one.
    pub initial_policy: EnginePolicy,
    /// The pool router's shared secret; without it, router identity headers are ignored.
    pub router_token: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_body_bytes: 1 << 20,
            body_read_timeout: Duration::from_secs(30),
            drain_grace: Duration::from_secs(30),
            admin: AdminAuth::Disabled,
            initial_policy: EnginePolicy::default(),
            router_token: None,
        }
    }
}

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{}", ADMIN_TOKEN_MISSING)]
    AdminTokenMissing,
    #[error("an admin token is configured but no admin listener was given")]
    AdminListenerMissing,
    #[error("an admin listener was given but the admin API is disabled")]
    AdminListenerUnexpected,
    #[error("initial policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

impl StartError {
    pub fn metric_label(&self) -> &'static str {
        "start_error"
    }
}

/// Everything the handlers share.
pub struct AppState {
    pub engine: Arc<dyn Engine>,
    pub metrics: Arc<Metrics>,
    pub policy: PolicyStore,
    pub limiter: RateLimiter,
    pub admissions: FirstAdmissions,
    pub drain: Arc<Drain>,
    pub config: ServerConfig,
    admin_token: Option<String>,
    /// The engine's batch plus queue, sent with its load (None when it has no bound).
    slots: Option<u64>,
}

/// A started server.
pub struct RunningServer {
    pub api_addr: SocketAddr,
    pub admin_addr: Option<SocketAddr>,
    pub(crate) state: Arc<AppState>,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningServer {
    /// Starts a drain, as `POST /admin/v1/drain` or SIGTERM do.
    pub fn drain(&self, grace: Option<Duration>) -> DrainStatus {
        self.state.drain.start(grace)
    }

    /// Resolves when the server stopped (after a drain): `Ok` on a clean stop.
    pub async fn wait(self) -> std::io::Result<()> {
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

/// Binds the routes on the given listeners and starts serving.
pub fn start(
    config: ServerConfig,
    api: TcpListener,
    admin: Option<TcpListener>,
    engine: Arc<dyn Engine>,
    metrics: Arc<Metrics>,
) -> Result<RunningServer, StartError> {
    let admin_token = match (&config.admin, &admin) {
        (AdminAuth::Token(t), _) if t.trim().is_empty() => {
            return Err(StartError::AdminTokenMissing);
        }
        (AdminAuth::Token(t), Some(_)) => Some(t.trim().to_string()),
        (AdminAuth::Token(_), None) => return Err(StartError::AdminListenerMissing),
        (AdminAuth::Disabled, Some(_)) => return Err(StartError::AdminListenerUnexpected),
        (AdminAuth::Disabled, None) => None,
    };
    let compiled = CompiledPolicy::compile(&config.initial_policy)?;
    let api_addr = api.local_addr()?;
    let admin_addr = admin.as_ref().map(TcpListener::local_addr).transpose()?;
    let slots = Some(engine.model_info().slots).filter(|&s| s > 0);
    let state = Arc::new(AppState {
        engine,
        metrics,
        policy: PolicyStore::new(CompiledPolicy::compile(&EnginePolicy::default())?),
        limiter: RateLimiter::default(),
        admissions: FirstAdmissions::default(),
        drain: Drain::new(config.drain_grace),
        config,
        admin_token,
        slots,
    });
    admin::apply_policy(&state, compiled);

    let limit = DefaultBodyLimit::max(state.config.max_body_bytes);
    let api_router = api_router(Arc::clone(&state)).layer(limit);
    let drain = Arc::clone(&state.drain);
    // The port closes when the drain completes; connections accepted before are served
    // a moment longer (see closing_listener).
    let api = closing_listener::ClosingListener::new(api, Arc::clone(&drain))?;
    let api_server = axum::serve(api, api_router).with_graceful_shutdown({
        let drain = Arc::clone(&drain);
        async move {
            drain.drained().await;
            tokio::time::sleep(closing_listener::LINGER).await;
        }
    });
    let admin_server = admin.map(|listener| {
        let router = admin::router(Arc::clone(&state)).layer(limit);
        let drain = Arc::clone(&drain);
        axum::serve(listener, router).with_graceful_shutdown(async move {
            drain.drained().await;
            // Let the operator read "Drained" before the process goes.
            tokio::time::sleep(Duration::from_millis(500)).await;
        })
    });
    tracing::info!(%api_addr, ?admin_addr, "serving");
    let task = tokio::spawn(async move {
        let servers = async move {
            let admin = async move {
                match admin_server {
                    Some(s) => s.await,
                    None => Ok(()),
                }
            };
            let (a, b) = tokio::join!(api_server, admin);
            a.and(b)
        };
        tokio::select! {
            r = servers => r,
            () = async {
                drain.drained().await;
                // Connections still open after the drain are not waited for long.
                tokio::time::sleep(Duration::from_secs(5)).await;
            } => Ok(()),
        }
    });
    Ok(RunningServer {
        api_addr,
        admin_addr,
        state,
        task,
    })
}

fn api_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(completions::chat_completions))
        .route("/v1/models", get(models))
        .route(launch::HEALTHZ_PATH, get(healthz))
        .route(launch::READYZ_PATH, get(readyz))
        .route(launch::METRICS_PATH, get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::map_response_with_state(
            Arc::clone(&state),
            with_load,
        ))
        .with_state(state)
}

/// Adds the engine's load to an answer (the router reads it from every answer and probe).
async fn with_load(State(app): State<Arc<AppState>>, mut response: Response) -> Response {
    if let Ok(v) = axum::http::HeaderValue::from_str(&app.load().to_header()) {
        response.headers_mut().insert(header::ENGINE_LOAD, v);
    }
    response
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(uri.path().chars().take(200).collect())
}

async fn models(State(app): State<Arc<AppState>>) -> Response {
    let info = app.engine.model_info();
    Json(json!({
        "object": "list",
        "data": [{
            "id": info.id,
            "object": "model",
            "created": info.created,
            "owned_by": "tidegate",
            "max_model_len": info.context_length,
            "weights": info.weights,
            "weight_bytes_per_token": info.weight_bytes_per_token,
            "kernels": info.kernels,
        }],
    }))
    .into_response()
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(app): State<Arc<AppState>>) -> Response {
    if !app.engine.is_ready() {
        return (StatusCode::SERVICE_UNAVAILABLE, "loading").into_response();
    }
    match app.drain.phase() {
        Phase::Serving => (StatusCode::OK, "ready").into_response(),
        Phase::Draining | Phase::Drained { .. } => {
            (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response()
        }
    }
}

async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    openmetrics_response(app.metrics.encode())
}

impl AppState {
    /// The engine's load as its last step published it.
    pub fn load(&self) -> EngineLoad {
        let n = |g: i64| u64::try_from(g).unwrap_or(0);
        let m = &self.metrics;
        let total = n(m.kv_blocks_total.get());
        EngineLoad {
            running: n(m.requests_running.get()),
            waiting: n(m.requests_waiting.get()),
            kv_free: total.saturating_sub(n(m.kv_blocks_used.get())),
            kv_total: total,
            slots: self.slots,
        }
    }

    /// The request's body within `--max-body-bytes` and the body read timeout, so a slow or
    /// stalled upload cannot hold a connection and its buffers for ever (both ports).
    pub(crate) async fn read_body(&self, request: Request) -> Result<Bytes, ApiError> {
        read_limited(
            request,
            self.config.max_body_bytes,
            self.config.body_read_timeout,
        )
        .await
    }
}
