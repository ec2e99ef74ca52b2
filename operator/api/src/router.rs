//! The pool router contract: how the operator (and local mode) launches `tidegate-engine
//! route`, the headers that cross router ↔ engine, the router's admin API, and its metric
//! families. One definition; the router's clap parser, the engine's trust check, the
//! operator's pushes and its metric reads all use these constants.
//!
//! Router admin routes (all require `Authorization: Bearer <admin token>`; without it: 401):
//! - `PUT /admin/v1/policy`     body [`EnginePolicy`](crate::engine_admin::EnginePolicy) → 204
//!   (the same push engines take: tier policy, admission, registry)
//! - `PUT /admin/v1/endpoints`  body [`RouterEndpoints`] → 200 [`EndpointsView`] (the pool's
//!   engines, whole, and the count of ready routers each enforces 1/R of the limits for; the
//!   answer carries the held count the operator scales from zero on)
//! - `GET /admin/v1/endpoints`  → [`EndpointsView`] (with the share in force and whether the
//!   router holds a policy yet: it is not ready before)
//! - `GET /admin/v1/tenants?since=MS` → [`AdmittedTenants`](crate::engine_admin::AdmittedTenants):
//!   the tenants this router first accepted (past its new-tenant gate and rate limits, into
//!   its queue or an engine) at or after MS, the engines' route and body, so the operator
//!   merges a tenant into the registry from the moment the pool accepted it, not from its
//!   first answer
//!
//! Invariants: identity is resolved once, at the router; engines believe the identity
//! headers only with the router token ([`header::ROUTER_TOKEN`]), which never reaches a
//! client and is never logged; endpoint lists are pushed whole.

use serde::{Deserialize, Serialize};

use crate::engine_metrics::{Kind, Label, Metric};
use crate::inference_pool::InferencePoolSpec;
use crate::launch_args::{Args, EnvValue, token_env, whole_seconds};

/// The router's subcommand of the engine binary.
pub const ROUTE: &str = "route";
/// Router API port in a pod (OpenAI API, /metrics, /healthz, /readyz).
pub const HTTP_PORT: u16 = 8000;
/// Router admin API port in a pod.
pub const ADMIN_PORT: u16 = 8001;
pub const ENDPOINTS_PATH: &str = "/admin/v1/endpoints";

/// The router's command-line flags (without `--`).
pub mod flag {
    pub const LISTEN: &str = "listen";
    pub const ADMIN_LISTEN: &str = "admin-listen";
    /// A static engine (repeatable): `http://host:port`, for local use and tests.
    pub const ENDPOINT: &str = "endpoint";
    /// Requests one engine may hold at once (running + its own queue).
    pub const ENGINE_SLOTS: &str = "engine-slots";
    pub const MAX_QUEUED_REQUESTS: &str = "max-queued-requests";
    pub const LOAD_FACTOR: &str = "load-factor";
    pub const HOLD_TIMEOUT: &str = "hold-timeout";
    pub const MAX_HELD_REQUESTS: &str = "max-held-requests";
    /// Router replicas sharing the pool's rate limits (each enforces 1/N) until the
    /// operator's first push of the ready count (`RouterEndpoints::ready_routers`).
    pub const LIMIT_SHARE: &str = "limit-share";
    /// Requests one tenant may have waiting in the router's queue (default: half of
    /// `max-queued-requests`); more get 429 `tenant_queue_full`, that tenant only.
    pub const MAX_QUEUED_PER_TENANT: &str = "max-queued-per-tenant";
    pub const LOG_FORMAT: &str = "log-format";
}

/// Environment variables of the router and of the engines behind it.
pub mod env {
    /// The shared secret engines require before believing the router's identity headers.
    pub use crate::launch_args::env::ROUTER_TOKEN;
}

/// Headers between router and engine (and the one a client sees).
pub mod header {
    /// Set by the router on every response: the engine that served it.
    pub const ENGINE: &str = "x-tidegate-engine";
    /// Router → engine: the tenant the router resolved.
    pub const TENANT: &str = "x-tidegate-router-tenant";
    /// Router → engine: the tenant's tier.
    pub const TIER: &str = "x-tidegate-router-tier";
    /// Router → engine: proves the two headers above come from the pool's router.
    pub const ROUTER_TOKEN: &str = "x-tidegate-router-token";
    /// Client → router/engine: the session whose KV a request continues.
    pub const SESSION: &str = "x-session-id";
    /// Client → router → engine: which retry of a request this is (0 or absent: the first
    /// attempt). The OpenAI SDKs send it on every request; the engine counts a refused retry
    /// apart, so the operator does not count a client's retries of one refused request as
    /// more demand.
    pub const RETRY_COUNT: &str = "x-stainless-retry-count";
    /// Engine → router, on every answer and on `/readyz`: the engine's own load, as
    /// [`EngineLoad`](super::EngineLoad) writes it.
    pub const ENGINE_LOAD: &str = "x-tidegate-engine-load";
}

/// An engine's load as it reports it ([`header::ENGINE_LOAD`]): requests running (in the
/// batch) and waiting (in its own queue), KV blocks free of the pool's total, and the most
/// requests it holds (batch plus queue; optional: older engines do not send it). Written as
/// `running=3;waiting=1;kv_free=120;kv_total=512;slots=80`; unknown keys are ignored when
/// read, so either side may add one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineLoad {
    pub running: u64,
    pub waiting: u64,
    pub kv_free: u64,
    pub kv_total: u64,
    pub slots: Option<u64>,
}

impl EngineLoad {
    /// Requests the engine holds (running plus waiting).
    pub fn held(&self) -> u64 {
        self.running.saturating_add(self.waiting)
    }

    /// The header value.
    pub fn to_header(&self) -> String {
        let mut h = format!(
            "running={};waiting={};kv_free={};kv_total={}",
            self.running, self.waiting, self.kv_free, self.kv_total
        );
        if let Some(s) = self.slots {
            h.push_str(&format!(";slots={s}"));
        }
        h
    }

    /// Reads a header value; None unless `running` and `waiting` are there and every known
    /// key's value is a number.
    pub fn parse(value: &str) -> Option<Self> {
        let (mut running, mut waiting) = (None, None);
        let mut load = EngineLoad::default();
        for part in value.split(';') {
            let Some((k, v)) = part.split_once('=') else {
                continue;
            };
            let slot = match k.trim() {
                "running" => &mut running,
                "waiting" => &mut waiting,
                "kv_free" => {
                    load.kv_free = v.trim().parse().ok()?;
                    continue;
                }
                "kv_total" => {
                    load.kv_total = v.trim().parse().ok()?;
                    continue;
                }
                "slots" => {
                    load.slots = Some(v.trim().parse().ok()?);
                    continue;
                }
                _ => continue,
            };
            *slot = Some(v.trim().parse().ok()?);
        }
        load.running = running?;
        load.waiting = waiting?;
        Some(load)
    }
}

/// One engine of the pool, as the operator pushes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouterEndpoint {
    /// Stable name (the pod's); the affinity ring hashes it.
    pub name: String,
    /// Base URL of the engine's OpenAI API, e.g. `http://10.0.0.7:8000`.
    pub url: String,
    /// False once the operator started draining it: no new request goes there.
    #[serde(default = "yes")]
    pub accepting: bool,
}

fn yes() -> bool {
    true
}

/// `PUT /admin/v1/endpoints`: the whole set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouterEndpoints {
    pub endpoints: Vec<RouterEndpoint>,
    /// The pool's ready routers as the operator saw them this tick: each enforces
    /// 1/readyRouters of every tenant's limits, so the pool enforces the tier's limit over
    /// the routers that live now, not over the spec's count. Absent (no router was ready, or
    /// an older operator): the router keeps the share it has (at start, `--limit-share`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_routers: Option<u32>,
}

/// One engine as the router sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointView {
    pub name: String,
    pub url: String,
    /// One of [`ENDPOINT_STATES`].
    pub state: String,
    pub in_flight: u64,
}

/// `GET /admin/v1/endpoints`. Its default is what an older router's view reads as (one
/// router, a policy held), as the serde defaults of its newer fields are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointsView {
    pub endpoints: Vec<EndpointView>,
    /// Requests held because no engine is ready.
    pub held: u64,
    /// Requests waiting at the router for an engine with room (held ones not included):
    /// demand the engines' own queue gauges do not show once every engine is full.
    #[serde(default)]
    pub queued: u64,
    /// The routers this one shares each tenant's limits with (it enforces 1/limitShare):
    /// the last pushed `readyRouters`, else its `--limit-share`.
    #[serde(default = "one")]
    pub limit_share: u32,
    /// The router holds the pool's policy (a push came, or it was started with one). Until
    /// then its `/readyz` answers 503 and the operator pushes it the policy at once, whether
    /// or not the policy changed. Absent (an older router): true.
    #[serde(default = "yes")]
    pub policy_pushed: bool,
}

fn one() -> u32 {
    1
}

impl Default for EndpointsView {
    fn default() -> Self {
        EndpointsView {
            endpoints: Vec::new(),
            held: 0,
            queued: 0,
            limit_share: one(),
            policy_pushed: yes(),
        }
    }
}

/// How long a router counts a tenant it accepted itself as existing at its own new-tenant
/// gate, whatever the pushed registry says: long enough for the operator to collect it and
/// push it back (a tick and a push, seconds) many times over, short enough that a tenant the
/// registry forgot (its memory window) is not kept alive at one router only.
pub const ACCEPTED_MEMORY_MS: u64 = 10 * 60 * 1000;

/// States of an engine at the router (`endpoints` gauge label).
pub const ENDPOINT_STATES: &[&str] = &["ready", "not_ready", "draining", "down"];
/// Outcomes of a request at the router.
pub const ROUTER_OUTCOMES: &[&str] = &[
    "served",
    "engine_error",
    "queue_full",
    "tenant_queue_full",
    "queue_timeout",
    "hold_timeout",
    "paused",
    "rate_limited",
    "unauthorized",
    "bad_request",
];
/// How a request with an affinity key was placed.
pub const AFFINITY_RESULTS: &[&str] = &["hit", "spill", "miss"];

const TIER: Label = Label {
    name: "tier",
    values: &[],
};

pub const REQUESTS: Metric = Metric {
    name: "tidegate_router_requests",
    series: "tidegate_router_requests_total",
    kind: Kind::Counter,
    help: "Requests by tier and outcome at the router",
    labels: &[
        TIER,
        Label {
            name: "outcome",
            values: ROUTER_OUTCOMES,
        },
    ],
    buckets: &[],
};
pub const AFFINITY: Metric = Metric {
    name: "tidegate_router_affinity",
    series: "tidegate_router_affinity_total",
    kind: Kind::Counter,
    help: "Placements of requests with a session or prefix key: hit (the key's engine), spill \
           (the next engine on the ring, the key's was over its load bound), miss (the key's \
           engine was not ready)",
    labels: &[
        Label {
            name: "key",
            values: &["session", "prefix"],
        },
        Label {
            name: "result",
            values: AFFINITY_RESULTS,
        },
    ],
    buckets: &[],
};
pub const QUEUE_WAIT: Metric = Metric {
    name: "tidegate_router_queue_wait_seconds",
    series: "tidegate_router_queue_wait_seconds_bucket",
    kind: Kind::Histogram,
    help: "Time a request waited at the router for an engine with room, by tier",
    labels: &[TIER],
    buckets: crate::engine_metrics::QUEUE_WAIT_BUCKETS,
};
pub const QUEUED: Metric = Metric {
    name: "tidegate_router_queued",
    series: "tidegate_router_queued",
    kind: Kind::Gauge,
    help: "Requests waiting at the router for an engine with room",
    labels: &[],
    buckets: &[],
};
pub const HELD: Metric = Metric {
    name: "tidegate_router_held",
    series: "tidegate_router_held",
    kind: Kind::Gauge,
    help: "Requests held because the pool has no ready engine (scale from zero)",
    labels: &[],
    buckets: &[],
};
pub const ENDPOINTS: Metric = Metric {
    name: "tidegate_router_endpoints",
    series: "tidegate_router_endpoints",
    kind: Kind::Gauge,
    help: "Engines known to the router, by state",
    labels: &[Label {
        name: "state",
        values: ENDPOINT_STATES,
    }],
    buckets: &[],
};

/// Every router metric family.
pub const ALL: &[Metric] = &[REQUESTS, AFFINITY, QUEUE_WAIT, QUEUED, HELD, ENDPOINTS];

/// Where one router runs.
#[derive(Clone, Debug)]
pub struct RouterSite {
    pub bind_host: String,
    pub api_port: u16,
    pub admin_port: u16,
    /// Static engines (local mode and tests); empty in a cluster, where the operator pushes.
    pub endpoints: Vec<String>,
    /// Routers sharing the tenants' limits until the operator's first endpoint push says how
    /// many are ready (`RouterEndpoints::ready_routers`): `spec.router.replicas` in a
    /// cluster, 1 where one router runs (local mode).
    pub limit_share: i32,
    pub log_format: &'static str,
}

/// The router's command line (starting with the subcommand) for `spec` at `site`. Its
/// environment is the admin token and the router token, as the engines'.
pub fn router_args(spec: &InferencePoolSpec, site: &RouterSite) -> Vec<String> {
    let r = &spec.router;
    let e = &spec.engine;
    let mut a = Args(vec![ROUTE.to_string()]);
    a.flag(
        flag::LISTEN,
        format!("{}:{}", site.bind_host, site.api_port),
    );
    a.flag(
        flag::ADMIN_LISTEN,
        format!("{}:{}", site.bind_host, site.admin_port),
    );
    for ep in &site.endpoints {
        a.flag(flag::ENDPOINT, ep);
    }
    a.flag(
        flag::ENGINE_SLOTS,
        e.max_batch_size.saturating_add(e.max_queued_requests),
    );
    a.flag(
        flag::MAX_QUEUED_REQUESTS,
        e.max_queued_requests.saturating_mul(2).max(64),
    );
    a.flag(flag::LOAD_FACTOR, r.load_factor);
    a.flag(flag::HOLD_TIMEOUT, whole_seconds(&r.hold_timeout));
    a.flag(flag::MAX_HELD_REQUESTS, r.max_held_requests);
    a.flag(flag::LIMIT_SHARE, site.limit_share.max(1));
    a.flag(flag::LOG_FORMAT, site.log_format);
    a.0
}

/// The router's environment: the admin token (its admin API) and the router token (what it
/// proves itself to the engines with), both the pool's admin token, as in the engines'.
pub fn router_env() -> Vec<(&'static str, EnvValue)> {
    token_env()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_series_match_their_kind() {
        for m in ALL {
            assert_eq!(m.series, m.series_of_kind(), "{}", m.name);
            assert!(m.name.starts_with("tidegate_router_"));
        }
    }

    #[test]
    fn engine_load_round_trips_and_tolerates_new_keys() {
        let l = EngineLoad {
            running: 3,
            waiting: 1,
            kv_free: 120,
            kv_total: 512,
            slots: None,
        };
        assert_eq!(EngineLoad::parse(&l.to_header()), Some(l));
        assert_eq!(l.held(), 4);
        let with_slots = EngineLoad {
            slots: Some(80),
            ..l
        };
        assert_eq!(
            with_slots.to_header(),
            "running=3;waiting=1;kv_free=120;kv_total=512;slots=80"
        );
        assert_eq!(EngineLoad::parse(&with_slots.to_header()), Some(with_slots));
        let later = EngineLoad::parse("running=2; waiting=0; kv_free=1; kv_total=2; next=8");
        assert_eq!(later.map(|l| l.held()), Some(2));
        for bad in [
            "",
            "running=1",
            "waiting=1",
            "running=x;waiting=1",
            "running=1;waiting=-1",
            "running=1;waiting=1;slots=x",
        ] {
            assert_eq!(EngineLoad::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ready_routers_travel_as_camel_case_and_are_optional() {
        let set = RouterEndpoints {
            endpoints: vec![],
            ready_routers: Some(3),
        };
        let json = serde_json::to_value(&set).unwrap();
        assert_eq!(json["readyRouters"], 3);
        let old: RouterEndpoints = serde_json::from_str(r#"{"endpoints":[]}"#).unwrap();
        assert_eq!(
            old.ready_routers, None,
            "an older operator's push keeps the share"
        );
        let none = serde_json::to_value(RouterEndpoints::default()).unwrap();
        assert!(none.get("readyRouters").is_none());
    }

    #[test]
    fn an_older_routers_view_reads_as_one_router_with_a_policy() {
        let v: EndpointsView = serde_json::from_str(r#"{"endpoints":[],"held":0}"#).unwrap();
        assert_eq!((v.queued, v.limit_share, v.policy_pushed), (0, 1, true));
        assert_eq!(v, EndpointsView::default());
        let v = EndpointsView {
            limit_share: 2,
            ..EndpointsView::default()
        };
        assert_eq!(serde_json::to_value(&v).unwrap()["limitShare"], 2);
    }

    #[test]
    fn endpoints_default_to_accepting() {
        let e: RouterEndpoint =
            serde_json::from_str(r#"{"name":"a","url":"http://127.0.0.1:1"}"#).unwrap();
        assert!(e.accepting);
    }
}
