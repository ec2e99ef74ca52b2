//! The router's part in pool-wide admission across replicas, over real sockets in front of a
//! real engine server (fake backend): a tenant is existing from the moment the router accepts
//! it (it lists it for the operator and admits it through a pause the registry does not
//! reflect yet, and the engine serves what the router forwarded though its own policy is
//! paused), the pushed count of ready routers sets the rate-limit share, and a router that
//! has no policy yet is not ready.

// Test helpers outside #[test] functions: unwrap is the point here.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tidegate_api::engine_admin::{
    AdmissionPush, AdmissionState, EnginePolicy, POLICY_PATH, TENANTS_PATH,
};
use tidegate_api::router::{ENDPOINTS_PATH, RouterEndpoint, RouterEndpoints};
use tidegate_http::auth::AdminAuth;
use tidegate_router::dispatch::DispatchConfig;
use tidegate_router::{self as router, RouterConfig, RunningRouter};
use tidegate_runner::echo::EchoConfig;
use tidegate_server::api::{self as server, RunningServer, ServerConfig};
use tidegate_server::backend::Engine;
use tidegate_server::engine_loop::{LoopConfig, LoopEngine};
use tidegate_server::metrics::Metrics;
use tokio::net::TcpListener;

const TOKEN: &str = "pool-secret";

/// Gateway headers on; `free` pausable and limited to 4 requests a minute.
fn policy() -> EnginePolicy {
    let spec = serde_json::from_value(json!({
        "tiers": [
            {"name": "enterprise", "priority": 100, "admission": {"pausable": false}},
            {"name": "free", "priority": 1, "rateLimits": {"requestsPerMinute": 4}}
        ],
        "defaultTier": "free",
        "tenancy": {"gatewayHeaders": {}}
    }))
    .unwrap();
    EnginePolicy {
        tier_policy: Some(spec),
        ..EnginePolicy::default()
    }
}

/// `policy()` with the free tier paused and `known` as the registry.
fn paused(known: &[&str]) -> EnginePolicy {
    EnginePolicy {
        admission: AdmissionPush {
            state: AdmissionState::PausedNewTenants,
            paused_tiers: vec!["free".into()],
            retry_after_seconds: 3,
            reason: "pool at its ceiling".into(),
        },
        admitted_tenants: known.iter().map(|s| s.to_string()).collect(),
        ..policy()
    }
}

struct EngineServer {
    url: String,
    _server: RunningServer,
}

async fn engine(initial_policy: EnginePolicy) -> EngineServer {
    let metrics = Metrics::new();
    let config = LoopConfig {
        model_id: "fake".into(),
        kv_blocks: 4096,
        ..LoopConfig::default()
    };
    let echo = EchoConfig {
        step_time: Duration::from_millis(1),
        ..EchoConfig::default()
    };
    let backend = LoopEngine::start_echo(echo, config, metrics.clone()).unwrap();
    while !backend.is_ready() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = ServerConfig {
        admin: AdminAuth::Token(TOKEN.into()),
        router_token: Some(TOKEN.into()),
        initial_policy,
        ..ServerConfig::default()
    };
    let server = server::start(config, api, Some(admin), backend, metrics).unwrap();
    EngineServer {
        url: format!("http://{}", server.api_addr),
        _server: server,
    }
}

struct Router {
    base: String,
    admin: String,
    _running: RunningRouter,
    http: reqwest::Client,
}

async fn start_router(engines: &[&EngineServer], initial_policy: EnginePolicy) -> Router {
    let config = RouterConfig {
        dispatch: DispatchConfig {
            engine_slots: 64,
            max_queued: 64,
            max_held: 8,
            hold_timeout: Duration::from_secs(20),
            load_factor: 1.25,
            aging_per_second: 20.0,
            slot_share: 1,
            load_stale_after: tidegate_router::LOAD_STALE_AFTER,
            max_queued_per_tenant: 32,
        },
        max_body_bytes: 1 << 20,
        body_read_timeout: Duration::from_secs(5),
        admin: AdminAuth::Token(TOKEN.into()),
        router_token: Some(TOKEN.into()),
        limit_share: 1,
        stream_idle_timeout: Duration::from_secs(30),
        initial_policy,
        endpoints: engines
            .iter()
            .map(|e| RouterEndpoint {
                name: e.url.trim_start_matches("http://").to_string(),
                url: e.url.clone(),
                accepting: true,
            })
            .collect(),
    };
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = router::start(config, api, Some(admin)).unwrap();
    let r = Router {
        base: format!("http://{}", running.api_addr),
        admin: format!("http://{}", running.admin_addr.unwrap()),
        _running: running,
        http: reqwest::Client::new(),
    };
    r.wait_for_engines(engines.len()).await;
    r
}

impl Router {
    async fn admin_get(&self, path: &str) -> Value {
        let url = format!("{}{path}", self.admin);
        let resp = self.http.get(url).bearer_auth(TOKEN).send().await.unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        resp.json().await.unwrap()
    }

    async fn wait_for_engines(&self, n: usize) {
        for _ in 0..200 {
            let v = self.admin_get(ENDPOINTS_PATH).await;
            let endpoints = v["endpoints"].as_array().unwrap();
            if endpoints.iter().filter(|e| e["state"] == "ready").count() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("engines not ready");
    }

    async fn push_policy(&self, policy: &EnginePolicy) {
        let url = format!("{}{POLICY_PATH}", self.admin);
        let req = self.http.put(url).bearer_auth(TOKEN).json(policy);
        assert_eq!(req.send().await.unwrap().status(), 204);
    }

    async fn push_endpoints(&self, set: &RouterEndpoints) -> Value {
        let url = format!("{}{ENDPOINTS_PATH}", self.admin);
        let resp = self.http.put(url).bearer_auth(TOKEN).json(set);
        resp.send().await.unwrap().json().await.unwrap()
    }

    /// A request of `tenant` in the free tier: its status and error code.
    async fn complete(&self, tenant: &str) -> (u16, String) {
        let resp = self
            .http
            .post(format!("{}/v1/completions", self.base))
            .header("x-tidegate-tenant", tenant)
            .json(&json!({"model": "fake", "prompt": "hello", "max_tokens": 2}))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap_or_default();
        (
            status,
            v["error"]["code"].as_str().unwrap_or("").to_string(),
        )
    }

    async fn readyz(&self) -> u16 {
        let url = format!("{}/readyz", self.base);
        self.http.get(url).send().await.unwrap().status().as_u16()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_the_router_accepted_before_a_pause_is_existing_at_once() {
    // The engine has the pause already, without the tenant: the router's push is later.
    let e = engine(paused(&[])).await;
    let r = start_router(&[&e], policy()).await;
    assert_eq!(
        r.complete("early").await.0,
        200,
        "the engine serves a routed request"
    );
    let listed = r.admin_get(&format!("{TENANTS_PATH}?since=0")).await;
    assert_eq!(listed["tenants"][0]["tenant"], "early");
    assert_eq!(listed["tenants"][0]["tier"], "free");
    let cursor = listed["nowMs"].as_u64().unwrap();
    // The pause reaches the router before the operator merged "early" into the registry.
    r.push_policy(&paused(&[])).await;
    assert_eq!(
        r.complete("early").await.0,
        200,
        "accepted before the pause"
    );
    let (status, code) = r.complete("late").await;
    assert_eq!(
        (status, code.as_str()),
        (503, "new_tenant_admission_paused")
    );
    let since = r.admin_get(&format!("{TENANTS_PATH}?since={cursor}")).await;
    let listed: Vec<&Value> = since["tenants"].as_array().unwrap().iter().collect();
    assert!(
        listed.iter().all(|t| t["tenant"] != "late"),
        "a refused tenant is not accepted: {since}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pushed_count_of_ready_routers_sets_this_routers_share_of_the_limits() {
    let e = engine(policy()).await;
    let r = start_router(&[&e], policy()).await;
    let engines = r.admin_get(ENDPOINTS_PATH).await;
    assert_eq!(
        engines["limitShare"], 1,
        "--limit-share until the first push"
    );
    let set = |ready_routers| RouterEndpoints {
        endpoints: vec![RouterEndpoint {
            name: e.url.trim_start_matches("http://").to_string(),
            url: e.url.clone(),
            accepting: true,
        }],
        ready_routers,
    };
    // Two routers are ready: this one passes 2 of the tier's 4 requests a minute.
    assert_eq!(r.push_endpoints(&set(Some(2))).await["limitShare"], 2);
    assert_eq!(r.complete("acme").await.0, 200);
    assert_eq!(r.complete("acme").await.0, 200);
    let (status, code) = r.complete("acme").await;
    assert_eq!((status, code.as_str()), (429, "rate_limit_exceeded"));
    assert_eq!(r.push_endpoints(&set(None)).await["limitShare"], 2, "kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_is_ready_only_once_the_operator_pushed_it_a_policy() {
    let e = engine(policy()).await;
    let r = start_router(&[&e], EnginePolicy::default()).await;
    assert_eq!(r.readyz().await, 503);
    assert_eq!(r.admin_get(ENDPOINTS_PATH).await["policyPushed"], false);
    r.push_policy(&policy()).await;
    assert_eq!(r.readyz().await, 200);
    assert_eq!(r.admin_get(ENDPOINTS_PATH).await["policyPushed"], true);
    // One started with a policy of its own is ready from the start.
    let own = start_router(&[&e], policy()).await;
    assert_eq!(own.readyz().await, 200);
}
