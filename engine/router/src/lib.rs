//! The pool router (`tidegate-engine route`): one front door for a pool's engines.
//!
//! Per request, in the design's order: body within bounds, identity (API key or trusted
//! gateway headers, resolved once, here), the new-tenant gate (the pushed registry, or a
//! tenant this router accepted itself: [`accepted`]), the tenant's rate limits (this
//! router's share of them, 1/R of the R live routers: [`share`]), the tenant recorded as
//! accepted, then a lease on an engine from the [`dispatch`] layer: KV-affine (session, else
//! prompt prefix) with bounded load, waiting in the fair queue (tier, then tenant, then
//! FIFO: [`queue`]) while no engine has room, or held while the pool has no ready engine at
//! all. The request then goes to that engine with the router's identity headers, and its
//! answer streams back with `x-tidegate-engine` naming the engine.
//!
//! Invariants: the admin API never listens without a token; a connect failure is retried
//! once on another engine and a request already sent is never replayed, except one the
//! engine refused for room (`queue_full`: it never started), which goes back into the
//! router's queue with its place and deadline (at most [`MAX_PUT_BACK`] times); every request is
//! counted once in `tidegate_router_requests_total` with its outcome; engine health comes
//! from probing each engine's readiness path every [`PROBE_INTERVAL`], and a failed connect
//! marks an engine down at once; the router is ready (`/readyz`) only once it holds the
//! pool's policy ([`ready`]).

pub mod accepted;
pub mod cli;
pub mod dispatch;
pub mod engine_slot;
pub mod forward;
pub mod metrics;
pub mod queue;
pub mod ready;
pub mod request;
pub mod ring;
pub mod service;
pub mod share;
pub mod usage;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use tidegate_api::engine_admin::{EnginePolicy, POLICY_PATH, TENANTS_PATH};
use tidegate_api::engine_launch as launch;
use tidegate_api::router::{
    ENDPOINTS_PATH, EndpointView, EndpointsView, EngineLoad, RouterEndpoint, RouterEndpoints,
    header,
};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use dispatch::{Ask, DispatchConfig, Dispatcher, Health, Lease, Refusal};
use forward::{ForwardError, Outbound, forward};
use metrics::{MetricsObserver, RouterMetrics};
use request::RouteInfo;
use tidegate_http::auth::AdminAuth;
use tidegate_http::body::read_limited;
use tidegate_http::error::ApiError;
use tidegate_http::error::SubmitError;
use tidegate_http::tenancy::rate_limit::RateLimiter;
use tidegate_http::tenancy::{CompiledPolicy, Identity, PolicyStore};

/// How often every engine's readiness is probed (a drain is seen within this).
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// A probe that takes longer counts as down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Connecting to an engine takes at most this; past it the engine is down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Engine load figures older than this count as full: four probe intervals, so a probe
/// or two lost (or slow) does not take an engine out, but one that stopped answering does.
pub const LOAD_STALE_AFTER: Duration = Duration::from_secs(2);
/// Times one request goes back into the queue after an engine refused it for room, at most
/// (each time the refusing engine counts as full until it reports again).
pub const MAX_PUT_BACK: u32 = 8;

/// Router settings (the CLI builds these from flags and env).
#[derive(Clone, Debug)]
pub struct RouterConfig {
    pub dispatch: DispatchConfig,
    pub max_body_bytes: usize,
    pub body_read_timeout: Duration,
    pub admin: AdminAuth,
    /// Sent to engines with the identity headers; None sends none (engines then identify
    /// requests themselves, from the client's headers, which are not passed on).
    pub router_token: Option<String>,
    /// Router replicas sharing the tenants' rate limits until the operator pushes the count
    /// of ready ones: each enforces 1/share.
    pub limit_share: u32,
    /// An engine silent this long while it has a request has hung (its answer ends).
    pub stream_idle_timeout: Duration,
    pub initial_policy: EnginePolicy,
    pub endpoints: Vec<RouterEndpoint>,
}

/// Everything the handlers share.
pub struct RouterState {
    pub dispatch: Arc<Dispatcher>,
    pub metrics: Arc<RouterMetrics>,
    pub policy: PolicyStore,
    /// Tenants this router accepted (it reports them to the operator and admits them).
    pub accepted: accepted::Accepted,
    /// This router's share of the rate limits (the pushed count of ready routers).
    pub share: share::LimitShare,
    /// Ready once it holds the pool's policy.
    pub ready: ready::PolicyReadiness,
    limiter: RateLimiter,
    http: reqwest::Client,
    config: RouterConfig,
    admin_token: Option<String>,
}

/// A started router.
pub struct RunningRouter {
    pub api_addr: SocketAddr,
    pub admin_addr: Option<SocketAddr>,
    pub state: Arc<RouterState>,
    stop: Arc<tokio::sync::Notify>,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningRouter {
    /// Resolves when the router stops (it runs until its process ends).
    pub async fn wait(self) -> std::io::Result<()> {
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }

    pub fn abort(&self) {
        self.task.abort();
    }

    /// Stops taking connections; the answers in flight finish (streams included), then
    /// [`RunningRouter::wait`] resolves.
    pub fn stop(&self) {
        self.stop.notify_waiters();
        self.stop.notify_one();
    }
}

/// Why the router did not start.
#[derive(Debug, thiserror::Error)]
pub enum RouterStartError {
    #[error("{}", tidegate_http::auth::ADMIN_TOKEN_MISSING)]
    AdminTokenMissing,
    #[error("the admin API and its listener must be given together")]
    AdminListener,
    #[error("initial policy: {0}")]
    Policy(#[from] tidegate_http::tenancy::PolicyError),
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    #[error("HTTP client: {0}")]
    Client(String),
}

/// Binds the routes on the given listeners, starts the health prober and serves.
pub fn start(
    config: RouterConfig,
    api: TcpListener,
    admin: Option<TcpListener>,
) -> Result<RunningRouter, RouterStartError> {
    let admin_token = match (&config.admin, &admin) {
        (AdminAuth::Token(t), Some(_)) if !t.trim().is_empty() => Some(t.trim().to_string()),
        (AdminAuth::Token(t), _) if t.trim().is_empty() => {
            return Err(RouterStartError::AdminTokenMissing);
        }
        (AdminAuth::Disabled, None) => None,
        _ => return Err(RouterStartError::AdminListener),
    };
    let compiled = CompiledPolicy::compile(&config.initial_policy)?;
    let metrics = RouterMetrics::new();
    let dispatch = Dispatcher::new(
        config.dispatch.clone(),
        Box::new(MetricsObserver(Arc::clone(&metrics))),
    );
    dispatch.set_endpoints(&config.endpoints);
    let http = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .pool_idle_timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        .build()
        .map_err(|e| RouterStartError::Client(e.to_string()))?;
    let api_addr = api.local_addr()?;
    let admin_addr = admin.as_ref().map(TcpListener::local_addr).transpose()?;
    let state = Arc::new(RouterState {
        dispatch,
        metrics,
        policy: PolicyStore::new(compiled),
        accepted: accepted::Accepted::default(),
        share: share::LimitShare::new(config.limit_share),
        // Nobody pushes to a router without an admin API; one given a policy file has one.
        ready: ready::PolicyReadiness::new(
            admin_token.is_none() || config.initial_policy != EnginePolicy::default(),
        ),
        limiter: RateLimiter::default(),
        http,
        config,
        admin_token,
    });
    let prober = tokio::spawn(probe_loop(Arc::clone(&state)));
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = |stop: Arc<tokio::sync::Notify>| async move { stop.notified().await };
    let api_server = axum::serve(api, api_routes(Arc::clone(&state)))
        .with_graceful_shutdown(stopped(Arc::clone(&stop)));
    let admin_server = admin.map(|l| {
        axum::serve(l, admin_routes(Arc::clone(&state)))
            .with_graceful_shutdown(stopped(Arc::clone(&stop)))
    });
    tracing::info!(%api_addr, ?admin_addr, "routing");
    let task = tokio::spawn(async move {
        let admin = async move {
            match admin_server {
                Some(s) => s.await,
                None => Ok(()),
            }
        };
        let (a, b) = tokio::join!(api_server.into_future(), admin);
        prober.abort();
        a.and(b)
    });
    Ok(RunningRouter {
        api_addr,
        admin_addr,
        state,
        stop,
        task,
    })
}

fn api_routes(state: Arc<RouterState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route(launch::HEALTHZ_PATH, get(|| async { "ok" }))
        .route(launch::READYZ_PATH, get(ready::readyz))
        .route(launch::METRICS_PATH, get(metrics_text))
        .fallback(
            |uri: Uri| async move { ApiError::NotFound(uri.path().chars().take(200).collect()) },
        )
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}

fn admin_routes(state: Arc<RouterState>) -> Router {
    Router::new()
        .route(POLICY_PATH, put(put_policy))
        .route(ENDPOINTS_PATH, put(put_endpoints).get(get_endpoints))
        .route(TENANTS_PATH, get(accepted::get_tenants))
        .fallback(|| async { ApiError::NotFound("admin route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}

async fn completions(State(app): State<Arc<RouterState>>, request: Request) -> Response {
    route(app, "/v1/completions", request).await
}

async fn chat_completions(State(app): State<Arc<RouterState>>, request: Request) -> Response {
    route(app, "/v1/chat/completions", request).await
}

/// One OpenAI request, start to answer.
async fn route(app: Arc<RouterState>, path: &'static str, request: Request) -> Response {
    let mut tier = app.policy.get().spec.default_tier.clone();
    let (response, outcome) = match admit_and_forward(&app, path, request, &mut tier).await {
        Ok(done) => done,
        Err(e) => {
            let outcome = forward::refusal_outcome(e.status(), e.code());
            tracing::info!(status = e.status().as_u16(), reason = outcome, %tier, error = %e, "request refused at the router");
            (e.into_response(), outcome)
        }
    };
    app.metrics.outcome(&tier, outcome);
    response
}

async fn admit_and_forward(
    app: &Arc<RouterState>,
    path: &'static str,
    request: Request,
    tier_name: &mut String,
) -> Result<(Response, &'static str), ApiError> {
    let arrived = Instant::now();
    let headers = request.headers().clone();
    let body = read_limited(
        request,
        app.config.max_body_bytes,
        app.config.body_read_timeout,
    )
    .await?;
    let policy = app.policy.get();
    let identity = policy.identify(&headers)?;
    tier_name.clone_from(&identity.tier.name);
    let max_output = u64::try_from(identity.tier.max_output_tokens.max(1)).unwrap_or(1);
    let info = RouteInfo::parse(&body, &headers, &identity.tenant, max_output)?;
    app.accepted.gate(&policy, &identity)?;
    let limits = app.share.limits(identity.tier.rate_limits.as_ref());
    app.limiter.check(
        &identity.tenant,
        limits.as_ref(),
        info.estimated_tokens,
        Instant::now(),
    )?;
    let ask = Ask {
        key: info.key,
        priority: i64::from(identity.tier.priority),
        tier: identity.tier.name.clone(),
        tenant: identity.tenant.clone(),
        cost: info.estimated_tokens,
        wait: identity.tier.queue_wait_target.as_std(),
        since: Instant::now(),
        exclude: None,
    };
    // Existing from here: recorded before the request waits, so a pause that arrives while it
    // waits never refuses this tenant's next request.
    let record = app.accepted.record(&identity);
    let lease = lease_for(app, ask.clone())
        .await
        .inspect_err(|e| app.accepted.refused(&record, e))?;
    app.metrics
        .queue_waited(&identity.tier.name, arrived.elapsed().as_secs_f64());
    let request = Forwarding {
        path,
        headers: &headers,
        identity: &identity,
        body,
    };
    send(app, &request, ask, lease).await
}

/// A lease for the request, or the refusal the client gets.
async fn lease_for(app: &Arc<RouterState>, ask: Ask) -> Result<Lease, ApiError> {
    let wait = ask.wait;
    let retry_after = Duration::from_secs(1).max(wait);
    app.dispatch.acquire(ask).await.map_err(|r| match r {
        Refusal::QueueFull => ApiError::Submit(SubmitError::QueueFull { retry_after }),
        Refusal::TenantQueueFull => ApiError::TenantQueueFull { retry_after },
        Refusal::QueueTimeout => ApiError::Submit(SubmitError::QueueTimeout {
            target: wait,
            retry_after,
        }),
        Refusal::NoEngine => ApiError::NoReadyEngine {
            retry_after: Duration::from_secs(5),
        },
    })
}

/// A client request on its way to an engine.
struct Forwarding<'a> {
    path: &'static str,
    headers: &'a HeaderMap,
    identity: &'a Identity,
    body: Bytes,
}

/// Forwards to the lease's engine. On a connect failure, once more to another engine; on
/// a refusal for room (the engine's `queue_full`: the request never started), back into the
/// queue with its place and deadline, then to whichever engine has room.
async fn send(
    app: &Arc<RouterState>,
    request: &Forwarding<'_>,
    mut ask: Ask,
    mut lease: Lease,
) -> Result<(Response, &'static str), ApiError> {
    let outbound = || Outbound {
        method: reqwest::Method::POST,
        idle_timeout: app.config.stream_idle_timeout,
        path: request.path,
        client_headers: request.headers,
        identity: request.identity,
        router_token: app.config.router_token.as_deref(),
        body: request.body.clone(),
    };
    let (mut put_back, mut reconnected) = (0, false);
    loop {
        let engine = lease.engine_id();
        match forward(&app.http, lease, outbound()).await {
            Ok((_, "queue_full")) if put_back < MAX_PUT_BACK => {
                put_back += 1;
                tracing::debug!(
                    engine,
                    put_back,
                    "engine full: the request waits here again"
                );
            }
            Ok(done) => return Ok(done),
            Err((ForwardError::Connect(why), lease)) if !reconnected => {
                reconnected = true;
                tracing::warn!(engine = %lease.name, error = %why, "engine unreachable; trying another");
                drop(lease);
                app.dispatch.set_health(engine, Health::Down);
                ask.exclude = Some(engine);
            }
            Err((ForwardError::Connect(why), lease)) => {
                drop(lease);
                app.dispatch.set_health(engine, Health::Down);
                return Err(ApiError::EngineFailed(format!("no engine answered: {why}")));
            }
            Err((ForwardError::Sent(why), lease)) => {
                tracing::warn!(engine = %lease.name, error = %why, "engine failed after the request was sent");
                return Err(ApiError::EngineFailed(format!(
                    "the engine failed before answering: {why}"
                )));
            }
        }
        lease = lease_for(app, ask.clone()).await?;
    }
}

async fn models(State(app): State<Arc<RouterState>>) -> Response {
    let tier = app.policy.get().spec.default_tier.clone();
    let tier = match app.policy.get().spec.tier(&tier) {
        Some(t) => t.clone(),
        None => return ApiError::Internal("no default tier".into()).into_response(),
    };
    let ask = Ask {
        key: None,
        priority: i64::from(tier.priority),
        tier: tier.name.clone(),
        tenant: tidegate_http::tenancy::ANONYMOUS.to_string(),
        cost: 0,
        wait: tier.queue_wait_target.as_std(),
        since: Instant::now(),
        exclude: None,
    };
    let lease = match lease_for(&app, ask).await {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    let headers = HeaderMap::new();
    let identity = Identity {
        tenant: tidegate_http::tenancy::ANONYMOUS.to_string(),
        tier,
    };
    let o = Outbound {
        method: reqwest::Method::GET,
        idle_timeout: app.config.stream_idle_timeout,
        path: "/v1/models",
        client_headers: &headers,
        identity: &identity,
        router_token: None,
        body: Bytes::new(),
    };
    match forward(&app.http, lease, o).await {
        Ok((r, _)) => r,
        Err((e, _)) => ApiError::EngineFailed(format!("{e:?}")).into_response(),
    }
}

async fn metrics_text(State(app): State<Arc<RouterState>>) -> Response {
    tidegate_http::metrics_answer::openmetrics_response(app.metrics.encode())
}

/// Probes every engine's readiness path, forever.
async fn probe_loop(app: Arc<RouterState>) {
    let mut tick = tokio::time::interval(PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let probes = app.dispatch.probe_targets().into_iter().map(|(id, url)| {
            let app = Arc::clone(&app);
            async move {
                let url = format!("{}{}", url.trim_end_matches('/'), launch::READYZ_PATH);
                let (health, load) = match app.http.get(url).timeout(PROBE_TIMEOUT).send().await {
                    Ok(r) => {
                        let load = r
                            .headers()
                            .get(header::ENGINE_LOAD)
                            .and_then(|v| v.to_str().ok())
                            .and_then(EngineLoad::parse);
                        let health = if r.status().is_success() {
                            Health::Ready
                        } else {
                            Health::NotReady
                        };
                        (health, load)
                    }
                    Err(_) => (Health::Down, None),
                };
                app.dispatch.set_probe(id, health, load, Instant::now());
            }
        });
        futures::future::join_all(probes).await;
    }
}

pub(crate) fn authorize(app: &RouterState, headers: &HeaderMap) -> Result<(), ApiError> {
    tidegate_http::auth::check_bearer(headers, app.admin_token.as_deref())
}

async fn admin_body(app: &RouterState, request: Request) -> Result<Bytes, ApiError> {
    read_limited(
        request,
        app.config.max_body_bytes,
        app.config.body_read_timeout,
    )
    .await
}

async fn put_policy(
    State(app): State<Arc<RouterState>>,
    headers: HeaderMap,
    request: Request,
) -> Result<StatusCode, ApiError> {
    authorize(&app, &headers)?;
    let body = admin_body(&app, request).await?;
    let policy: EnginePolicy = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("invalid policy: {e}"), None))?;
    let compiled = CompiledPolicy::compile(&policy)
        .map_err(|e| ApiError::invalid(format!("invalid policy: {e}"), None))?;
    tracing::info!(admission = policy.admission.state.as_str(), paused_tiers = ?policy.admission.paused_tiers, tenants = policy.admitted_tenants.len(), "policy pushed");
    app.policy.set(compiled);
    app.ready.pushed();
    Ok(StatusCode::NO_CONTENT)
}

async fn put_endpoints(
    State(app): State<Arc<RouterState>>,
    headers: HeaderMap,
    request: Request,
) -> Result<Json<EndpointsView>, ApiError> {
    authorize(&app, &headers)?;
    let body = admin_body(&app, request).await?;
    let set: RouterEndpoints = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("invalid endpoints: {e}"), None))?;
    tracing::debug!(
        engines = set.endpoints.len(),
        accepting = set.endpoints.iter().filter(|e| e.accepting).count(),
        "endpoints pushed"
    );
    app.dispatch.set_endpoints(&set.endpoints);
    if let Some(before) = app.share.set(set.ready_routers) {
        // The same R divides each engine's slots between the routers.
        app.dispatch.set_slot_share(app.share.get());
        tracing::info!(
            from = before,
            to = app.share.get(),
            "routers sharing the rate limits and the engines' slots changed"
        );
    }
    Ok(endpoints_view(&app))
}

async fn get_endpoints(
    State(app): State<Arc<RouterState>>,
    headers: HeaderMap,
) -> Result<Json<EndpointsView>, ApiError> {
    authorize(&app, &headers)?;
    Ok(endpoints_view(&app))
}

fn endpoints_view(app: &RouterState) -> Json<EndpointsView> {
    let (engines, held, queued) = app.dispatch.view();
    Json(EndpointsView {
        endpoints: engines
            .into_iter()
            .map(|e| EndpointView {
                name: e.name,
                url: e.url,
                state: e.state.to_string(),
                in_flight: e.in_flight,
            })
            .collect(),
        held: held as u64,
        queued: queued as u64,
        limit_share: app.share.get(),
        policy_pushed: app.ready.has_policy(),
    })
}
