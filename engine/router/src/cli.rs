//! `tidegate-engine route`: flags (each with an env var), logging, the router, Ctrl-C and
//! SIGTERM end it.
//!
//! Invariants: the process refuses to start with the admin API enabled and no token; no
//! token is ever logged; flag names are the router contract's (`tidegate_api::router`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tidegate_api::engine_admin::EnginePolicy;
use tidegate_api::router::{RouterEndpoint, flag};
use tokio::net::TcpListener;

use super::RouterConfig;
use super::dispatch::DispatchConfig;
use tidegate_http::auth::AdminAuth;
use tidegate_http::auth::AdminFlags;
use tidegate_http::logging::{LogFormat, init_logging};

fn parse_duration(s: &str) -> Result<Duration, String> {
    s.parse::<tidegate_api::Duration>()
        .map(|d| d.as_std())
        .map_err(|e| e.to_string())
}

fn parse_load_factor(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (1.0..=4.0).contains(&f) => Ok(f),
        _ => Err(format!("{s:?}: expected a factor in [1, 4], e.g. 1.25")),
    }
}

/// Route a pool's OpenAI traffic to its engines (KV-affine, pool-wide admission).
#[derive(Debug, Args)]
pub struct RouteArgs {
    /// Address of the OpenAI-compatible API, /metrics and health endpoints.
    #[arg(long = flag::LISTEN, env = "TIDEGATE_ROUTER_LISTEN", default_value = "0.0.0.0:8000")]
    pub listen: SocketAddr,
    /// Address of the admin API (policy and endpoint pushes).
    #[arg(long = flag::ADMIN_LISTEN, env = "TIDEGATE_ROUTER_ADMIN_LISTEN", default_value = "0.0.0.0:8001")]
    pub admin_listen: SocketAddr,
    /// The admin API's token (or --admin-disabled, with static --endpoint engines) and the
    /// router token the engines require before they believe its identity headers.
    #[command(flatten)]
    pub secrets: AdminFlags,
    /// An engine's base URL (repeatable), e.g. http://127.0.0.1:8100. In a cluster the
    /// operator pushes the pool's engines instead.
    #[arg(long = flag::ENDPOINT, value_name = "URL")]
    pub endpoints: Vec<String>,
    /// Requests one engine holds at most (its batch plus its own queue); more wait here. An
    /// engine that reports its own figure (`slots=` in its load header) is held to the lower.
    #[arg(long = flag::ENGINE_SLOTS, env = "TIDEGATE_ENGINE_SLOTS", default_value_t = 64)]
    pub engine_slots: u64,
    /// Requests waiting here for an engine with room at most; more get 429.
    #[arg(long = flag::MAX_QUEUED_REQUESTS, env = "TIDEGATE_ROUTER_MAX_QUEUED", default_value_t = 256)]
    pub max_queued_requests: usize,
    /// Requests one tenant may have waiting here at most (default: half of
    /// --max-queued-requests); more get 429 tenant_queue_full, that tenant only.
    #[arg(long = flag::MAX_QUEUED_PER_TENANT, env = "TIDEGATE_ROUTER_MAX_QUEUED_PER_TENANT")]
    pub max_queued_per_tenant: Option<usize>,
    /// One engine takes at most this times the mean load before a session spills over.
    #[arg(long = flag::LOAD_FACTOR, env = "TIDEGATE_LOAD_FACTOR", default_value_t = 1.25, value_parser = parse_load_factor)]
    pub load_factor: f64,
    /// How long a request is held while no engine is ready (scale from zero).
    #[arg(long = flag::HOLD_TIMEOUT, env = "TIDEGATE_HOLD_TIMEOUT", default_value = "300s", value_parser = parse_duration)]
    pub hold_timeout: Duration,
    /// Requests held at most while no engine is ready; more get 503 at once.
    #[arg(long = flag::MAX_HELD_REQUESTS, env = "TIDEGATE_MAX_HELD", default_value_t = 256)]
    pub max_held_requests: usize,
    /// Router replicas sharing each tenant's rate limits and every engine's slots (this one
    /// enforces 1/N of the limits and holds at most 1/N of each engine's slots) until the
    /// operator pushes the count of ready routers with the engine set.
    #[arg(long = flag::LIMIT_SHARE, env = "TIDEGATE_LIMIT_SHARE", default_value_t = 1)]
    pub limit_share: u32,
    /// Priority points a waiting request gains per second (so low tiers are not starved).
    #[arg(long, env = "TIDEGATE_QUEUE_AGING", default_value_t = 20.0)]
    pub queue_aging: f64,
    /// JSON file with the policy to use until the operator pushes one (admin API body).
    #[arg(long, env = "TIDEGATE_POLICY_FILE")]
    pub policy_file: Option<PathBuf>,
    /// Largest request body accepted, in bytes.
    #[arg(long, env = "TIDEGATE_MAX_BODY_BYTES", default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// An engine silent this long while it has a request (before its answer or between two
    /// chunks) has hung: that one answer ends with an error.
    #[arg(long, env = "TIDEGATE_STREAM_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub stream_idle_timeout: Duration,
    /// On SIGTERM, how long the answers in flight get to finish.
    #[arg(long, env = "TIDEGATE_ROUTER_DRAIN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub drain_grace: Duration,
    /// Log line format.
    #[arg(long = flag::LOG_FORMAT, env = "TIDEGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Static endpoints named by their URL's authority (`127.0.0.1:8100`).
fn static_endpoints(urls: &[String]) -> anyhow::Result<Vec<RouterEndpoint>> {
    urls.iter()
        .map(|u| {
            let rest = u
                .strip_prefix("http://")
                .with_context(|| format!("--endpoint {u:?}: expected http://host:port"))?;
            let name = rest.trim_end_matches('/').to_string();
            anyhow::ensure!(!name.is_empty(), "--endpoint {u:?}: no host");
            Ok(RouterEndpoint {
                name,
                url: u.trim_end_matches('/').to_string(),
                accepting: true,
            })
        })
        .collect()
}

fn config(args: &RouteArgs) -> anyhow::Result<RouterConfig> {
    let admin = args.secrets.admin_auth()?;
    let initial_policy = match &args.policy_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading policy file {}", path.display()))?;
            serde_json::from_str::<EnginePolicy>(&text)
                .with_context(|| format!("parsing policy file {}", path.display()))?
        }
        None => EnginePolicy::default(),
    };
    Ok(RouterConfig {
        dispatch: DispatchConfig {
            engine_slots: args.engine_slots.max(1),
            slot_share: args.limit_share.max(1),
            load_stale_after: super::LOAD_STALE_AFTER,
            max_queued: args.max_queued_requests,
            max_queued_per_tenant: args
                .max_queued_per_tenant
                .unwrap_or(args.max_queued_requests / 2)
                .max(1),
            max_held: args.max_held_requests,
            hold_timeout: args.hold_timeout,
            load_factor: args.load_factor,
            aging_per_second: args.queue_aging.max(0.0),
        },
        max_body_bytes: args.max_body_bytes,
        body_read_timeout: Duration::from_secs(30),
        admin,
        router_token: args.secrets.router_token(),
        limit_share: args.limit_share.max(1),
        stream_idle_timeout: args.stream_idle_timeout,
        initial_policy,
        endpoints: static_endpoints(&args.endpoints)?,
    })
}

/// Runs the router until SIGTERM or Ctrl-C.
pub fn run(args: RouteArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let config = config(&args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let api = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let admin = match config.admin {
            AdminAuth::Token(_) => Some(
                TcpListener::bind(args.admin_listen)
                    .await
                    .with_context(|| format!("binding admin {}", args.admin_listen))?,
            ),
            AdminAuth::Disabled => None,
        };
        tracing::info!(
            engines = config.endpoints.len(),
            engine_slots = config.dispatch.engine_slots,
            load_factor = config.dispatch.load_factor,
            limit_share = config.limit_share,
            identity_headers = config.router_token.is_some(),
            "router starting"
        );
        let router = super::start(config, api, admin)?;
        tidegate_http::shutdown::shutdown_signal().await;
        // New connections are refused; answers in flight finish, within the grace.
        tracing::info!(
            grace_s = args.drain_grace.as_secs(),
            "termination signal: finishing the requests in flight"
        );
        router.stop();
        match tokio::time::timeout(args.drain_grace, router.wait()).await {
            Ok(r) => r.context("router stopped")?,
            Err(_) => tracing::warn!("requests still in flight after the grace: stopping anyway"),
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_endpoints_are_named_by_authority() {
        let e = static_endpoints(&["http://127.0.0.1:8100/".into()]).unwrap();
        assert_eq!(e[0].name, "127.0.0.1:8100");
        assert_eq!(e[0].url, "http://127.0.0.1:8100");
        assert!(static_endpoints(&["127.0.0.1:1".into()]).is_err());
    }
}
