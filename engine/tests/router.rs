//! The router over real sockets, in front of real engine servers (fake backend): session
//! affinity, streaming passthrough, identity forwarded with the router token, the pause at
//! the router, a held request served once an engine appears (scale from zero), a stopped
//! engine taken out within a second, and the bad-request corpus (no 5xx, OpenAI shapes).

// Test helpers outside #[test] functions: unwrap is the point here.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tidegate_api::engine_admin::{AdmissionPush, AdmissionState, EnginePolicy};
use tidegate_api::router::{ENDPOINTS_PATH, RouterEndpoint, RouterEndpoints, header};
use tidegate_http::auth::AdminAuth;
use tidegate_router::dispatch::DispatchConfig;
use tidegate_router::{self as router, RouterConfig, RunningRouter};
use tidegate_runner::echo::EchoConfig;
use tidegate_server::api::{self as server, RunningServer, ServerConfig};
use tidegate_server::backend::Engine;
use tidegate_server::engine_loop::{LoopConfig, LoopEngine};
use tidegate_server::metrics::Metrics;
use tokio::net::TcpListener;

mod bad_requests;
mod common;

const TOKEN: &str = "pool-secret";

struct EngineServer {
    url: String,
    admin: String,
    server: RunningServer,
}

async fn engine(step_ms: u64) -> EngineServer {
    engine_with(EchoConfig {
        step_time: Duration::from_millis(step_ms),
        ..EchoConfig::default()
    })
    .await
}

/// A real engine (the engine loop on the echo runner) behind its HTTP server.
async fn engine_with(echo: EchoConfig) -> EngineServer {
    engine_on(
        echo,
        LoopConfig {
            model_id: "fake".into(),
            kv_blocks: 4096,
            ..LoopConfig::default()
        },
    )
    .await
}

/// An engine that holds `batch` running and `queue` waiting requests at most.
async fn small_engine(step_ms: u64, batch: usize, queue: usize) -> EngineServer {
    let echo = EchoConfig {
        step_time: Duration::from_millis(step_ms),
        ..EchoConfig::default()
    };
    let config = LoopConfig {
        model_id: "fake".into(),
        kv_blocks: 4096,
        max_batch_seqs: batch,
        max_waiting: queue,
        ..LoopConfig::default()
    };
    engine_on(echo, config).await
}

async fn engine_on(echo: EchoConfig, config: LoopConfig) -> EngineServer {
    let metrics = Metrics::new();
    let backend = LoopEngine::start_echo(echo, config, metrics.clone()).unwrap();
    while !backend.is_ready() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = ServerConfig {
        admin: AdminAuth::Token(TOKEN.into()),
        router_token: Some(TOKEN.into()),
        initial_policy: gateway_policy(),
        ..ServerConfig::default()
    };
    let server = server::start(config, api, Some(admin), backend, metrics).unwrap();
    EngineServer {
        url: format!("http://{}", server.api_addr),
        admin: format!("http://{}", server.admin_addr.unwrap()),
        server,
    }
}

fn endpoint(e: &EngineServer) -> RouterEndpoint {
    endpoint_at(&e.url)
}

/// An accepting engine at `url`, named by its address.
fn endpoint_at(url: &str) -> RouterEndpoint {
    RouterEndpoint {
        name: url.trim_start_matches("http://").to_string(),
        url: url.to_string(),
        accepting: true,
    }
}

fn dispatch_config() -> DispatchConfig {
    DispatchConfig {
        engine_slots: 64,
        slot_share: 1,
        load_stale_after: tidegate_router::LOAD_STALE_AFTER,
        max_queued: 64,
        max_queued_per_tenant: 32,
        max_held: 8,
        hold_timeout: Duration::from_secs(20),
        load_factor: 1.25,
        aging_per_second: 20.0,
    }
}

struct Router {
    base: String,
    admin: String,
    _running: RunningRouter,
    http: reqwest::Client,
}

async fn start_router(engines: &[&EngineServer], policy: EnginePolicy) -> Router {
    start_router_with(engines, policy, 1 << 20).await
}

async fn start_router_with(
    engines: &[&EngineServer],
    policy: EnginePolicy,
    max_body: usize,
) -> Router {
    let endpoints: Vec<_> = engines.iter().map(|e| endpoint(e)).collect();
    start_router_on(endpoints, policy, max_body).await
}

async fn start_router_on(
    endpoints: Vec<RouterEndpoint>,
    policy: EnginePolicy,
    max_body: usize,
) -> Router {
    let n = endpoints.len();
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = RouterConfig {
        dispatch: dispatch_config(),
        max_body_bytes: max_body,
        body_read_timeout: Duration::from_secs(5),
        admin: AdminAuth::Token(TOKEN.into()),
        router_token: Some(TOKEN.into()),
        limit_share: 1,
        stream_idle_timeout: Duration::from_secs(30),
        initial_policy: policy,
        endpoints,
    };
    let running = router::start(config, api, Some(admin)).unwrap();
    let r = Router {
        base: format!("http://{}", running.api_addr),
        admin: format!("http://{}", running.admin_addr.unwrap()),
        _running: running,
        http: reqwest::Client::new(),
    };
    r.wait_ready(n).await;
    r
}

impl Router {
    async fn endpoints(&self) -> Value {
        self.admin_json(&format!("{}{ENDPOINTS_PATH}", self.admin))
            .await
    }

    /// An admin GET (the router's or an engine's) with the pool token, as JSON.
    async fn admin_json(&self, url: &str) -> Value {
        self.http
            .get(url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn wait_ready(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.endpoints().await;
            let ready = v["endpoints"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["state"] == "ready")
                .count();
            if ready == n {
                return;
            }
            assert!(Instant::now() < deadline, "engines not ready: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn complete(
        &self,
        tenant: &str,
        session: Option<&str>,
        prompt: &str,
    ) -> reqwest::Response {
        let mut req = self
            .http
            .post(format!("{}/v1/completions", self.base))
            .header("x-tidegate-tenant", tenant)
            .json(&json!({"model": "fake", "prompt": prompt, "max_tokens": 4}));
        if let Some(s) = session {
            req = req.header(header::SESSION, s);
        }
        req.send().await.unwrap()
    }

    async fn metrics(&self) -> String {
        common::metrics_text(&self.http, &self.base).await
    }
}

fn engine_of(r: &reqwest::Response) -> String {
    r.headers()[header::ENGINE].to_str().unwrap().to_string()
}

/// Gateway headers on, so tests name tenants without API keys.
fn gateway_policy() -> EnginePolicy {
    let spec = serde_json::from_value(json!({
        "tiers": [
            {"name": "enterprise", "priority": 100, "admission": {"pausable": false}},
            {"name": "free", "priority": 1}
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stick_to_one_engine_and_spread_across_engines() {
    let (a, b, c) = (engine(1).await, engine(1).await, engine(1).await);
    let r = start_router(&[&a, &b, &c], gateway_policy()).await;
    let mut owner: HashMap<String, String> = HashMap::new();
    for round in 0..3 {
        for s in 0..30 {
            let session = format!("s{s}");
            let resp = r.complete("acme", Some(&session), "hello").await;
            assert_eq!(resp.status(), 200);
            let e = engine_of(&resp);
            let first = owner.entry(session.clone()).or_insert_with(|| e.clone());
            assert_eq!(*first, e, "round {round}: session {session} moved");
        }
    }
    let used: HashSet<&String> = owner.values().collect();
    assert_eq!(used.len(), 3, "30 sessions over 3 engines use all of them");
    let m = r.metrics().await;
    assert!(
        m.contains(r#"tidegate_router_affinity_total{key="session",result="hit"} 90"#),
        "{m}"
    );
    assert!(m.contains(r#"tidegate_router_requests_total{tier="free",outcome="served"} 90"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_pass_through_with_usage_and_identity_reaches_the_engine() {
    let a = engine(1).await;
    let r = start_router(&[&a], gateway_policy()).await;
    let resp = r
        .http
        .post(format!("{}/v1/chat/completions", r.base))
        .header("x-tidegate-tenant", "acme")
        .header("x-tidegate-tier", "enterprise")
        .json(&json!({
            "model": "fake",
            "messages": [{"role": "user", "content": "hi there"}],
            "stream": true,
            "stream_options": {"include_usage": true},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = resp.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(text.contains("\"usage\""), "{text}");
    // The engine saw the router's tenant: its registry has it.
    let tenants = r
        .admin_json(&format!("{}/admin/v1/tenants?since=0", a.admin))
        .await;
    let t = &tenants["tenants"][0];
    assert_eq!(
        (t["tenant"].as_str(), t["tier"].as_str()),
        (Some("acme"), Some("enterprise"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_tier_refuses_new_tenants_at_the_router() {
    let a = engine(1).await;
    let mut policy = gateway_policy();
    policy.admission = AdmissionPush {
        state: AdmissionState::PausedNewTenants,
        paused_tiers: vec!["free".into()],
        retry_after_seconds: 17,
        reason: "pool at its ceiling".into(),
    };
    policy.admitted_tenants = vec!["old".into()];
    let r = start_router(&[&a], policy).await;
    let resp = r.complete("newcomer", None, "hello").await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "17");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "new_tenant_admission_paused");
    assert!(v["error"]["message"].as_str().unwrap().contains("ceiling"));
    assert_eq!(r.complete("old", None, "hello").await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_held_until_the_first_engine_is_ready() {
    let r = start_router(&[], gateway_policy()).await;
    let base = r.base.clone();
    let held = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": "fake", "prompt": "wake up", "max_tokens": 3}))
            .send()
            .await
            .unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !r.metrics().await.contains("tidegate_router_held 1") {
        assert!(Instant::now() < deadline, "the request was not held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The admin view the operator plans on: held (scale from zero), not queued for room.
    let view = r.endpoints().await;
    assert_eq!(
        (view["held"].as_u64(), view["queued"].as_u64()),
        (Some(1), Some(0))
    );
    // The operator scales 0 → 1 and pushes the new engine.
    let a = engine(1).await;
    let push = RouterEndpoints {
        endpoints: vec![endpoint(&a)],
        ready_routers: None,
    };
    let status = r
        .http
        .put(format!("{}{ENDPOINTS_PATH}", r.admin))
        .bearer_auth(TOKEN)
        .json(&push)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    let resp = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(r.metrics().await.contains("tidegate_router_held 0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_past_its_bound_is_a_503_with_retry_after() {
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut dispatch = dispatch_config();
    dispatch.hold_timeout = Duration::from_millis(300);
    let config = RouterConfig {
        dispatch,
        max_body_bytes: 1 << 20,
        body_read_timeout: Duration::from_secs(5),
        admin: AdminAuth::Disabled,
        router_token: None,
        limit_share: 1,
        stream_idle_timeout: Duration::from_secs(30),
        initial_policy: gateway_policy(),
        endpoints: vec![],
    };
    let running = router::start(config, api, None).unwrap();
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", running.api_addr))
        .json(&json!({"model": "fake", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_ready_engine");
    running.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_engine_gets_no_new_request_within_a_second() {
    let (a, b) = (engine(1).await, engine(1).await);
    let r = start_router(&[&a, &b], gateway_policy()).await;
    let gone = a.url.trim_start_matches("http://").to_string();
    a.server.drain(Some(Duration::ZERO));
    let stopped = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for s in 0..20 {
        let resp = r.complete("acme", Some(&format!("s{s}")), "hello").await;
        assert_eq!(
            resp.status(),
            200,
            "every request is served by the other engine"
        );
        assert_ne!(
            engine_of(&resp),
            gone,
            "{:?} after the stop",
            stopped.elapsed()
        );
    }
    let v = r.endpoints().await;
    let states: Vec<&str> = v["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["state"].as_str().unwrap())
        .collect();
    assert!(states.contains(&"ready"), "{v}");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_bad_request_corpus_gets_the_same_answers_through_the_router() {
    let a = engine_with(EchoConfig {
        context_length: bad_requests::CONTEXT_TOKENS as usize,
        ..EchoConfig::default()
    })
    .await;
    let r = start_router_with(&[&a], gateway_policy(), bad_requests::MAX_BODY_BYTES).await;
    bad_requests::check_corpus(&r.http, &r.base).await;
    let unauthorized = r
        .http
        .get(format!("{}{ENDPOINTS_PATH}", r.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);
    let m = r.metrics().await;
    assert!(!m.contains("engine_error"), "{m}");
}

/// How the misbehaving engine below ends its answer.
#[derive(Clone, Copy)]
enum Misbehaviour {
    /// One good event, then silence with the connection open.
    Hang,
    /// One good event, then bytes that are not HTTP chunked framing, then a close.
    Garbage,
}

/// A TCP server that passes readiness probes and answers completions with a stream that
/// breaks: what a wedged or crashing engine looks like to the router.
async fn bad_engine(how: Misbehaviour) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    let Ok(n) = sock.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    if head.starts_with("GET") {
                        buf.drain(..end + 4);
                        let ok = "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nready";
                        if sock.write_all(ok.as_bytes()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let event =
                        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
                    let start = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
                        event.len()
                    );
                    let _ = sock.write_all(start.as_bytes()).await;
                    match how {
                        Misbehaviour::Hang => tokio::time::sleep(Duration::from_secs(600)).await,
                        Misbehaviour::Garbage => {
                            let _ = sock.write_all(b"this is not chunked framing\r\n").await;
                        }
                    }
                    return;
                }
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_hangs_or_sends_garbage_ends_only_its_own_stream() {
    for how in [Misbehaviour::Hang, Misbehaviour::Garbage] {
        let bad = bad_engine(how).await;
        let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = RouterConfig {
            dispatch: dispatch_config(),
            max_body_bytes: 1 << 20,
            body_read_timeout: Duration::from_secs(5),
            admin: AdminAuth::Disabled,
            router_token: None,
            limit_share: 1,
            stream_idle_timeout: Duration::from_millis(400),
            initial_policy: gateway_policy(),
            endpoints: vec![RouterEndpoint {
                name: "bad".into(),
                url: bad,
                accepting: true,
            }],
        };
        let running = router::start(config, api, None).unwrap();
        let base = format!("http://{}", running.api_addr);
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !common::metrics_text(&http, &base)
            .await
            .contains(r#"tidegate_router_endpoints{state="ready"} 1"#)
        {
            assert!(
                Instant::now() < deadline,
                "the bad engine never probed ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let body = json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": true});
        let t0 = Instant::now();
        let resp = http
            .post(format!("{base}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let text = tokio::time::timeout(Duration::from_secs(10), resp.text())
            .await
            .expect("the stream ended")
            .unwrap_or_default();
        assert!(
            text.contains("\"hi\""),
            "the good event came through: {text}"
        );
        assert!(
            text.contains("engine_stream_broken"),
            "ended with an error event: {text}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
        // The router itself is fine: it still answers.
        let health = http.get(format!("{base}/healthz")).send().await.unwrap();
        assert_eq!(health.status(), 200);
        running.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_body_written_whole_gets_the_413_json_through_the_router() {
    let a = engine(1).await;
    let r = start_router(&[&a], gateway_policy()).await;
    let addr = r.base.trim_start_matches("http://").to_string();
    let answer = tokio::task::spawn_blocking(move || common::send_whole(addr, 64 << 20))
        .await
        .unwrap();
    let (head, body) = answer.expect("the whole request is sent and the answer read");
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "request_too_large", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_reports_its_slots_is_not_overfilled_by_a_wrong_flag() {
    // The engine holds 2 (batch 1, queue 1); the router was told 64 (a wrong flag): the
    // engine's `slots=2` in its load header bounds what the router sends, and whatever
    // refusal for room a race still produces is put back, never passed to a client.
    let a = small_engine(5, 1, 1).await;
    let r = start_router(&[&a], gateway_policy()).await;
    let ask = |i: usize| {
        let (http, base) = (r.http.clone(), r.base.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/v1/completions"))
                .header("x-tidegate-tenant", format!("t{i}"))
                .json(&json!({"model": "fake", "prompt": format!("p{i}"), "max_tokens": 4}))
                .send()
                .await
                .map(|resp| resp.status().as_u16())
        })
    };
    let tasks: Vec<_> = (0..8).map(ask).collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), 200);
    }
    let m = r.metrics().await;
    assert!(!m.contains("outcome=\"queue_full\"} "), "{m}");
    let em = common::metrics_text(&r.http, &a.url).await;
    let refused = em
        .lines()
        .find(|l| l.contains("reason=\"queue_full\""))
        .unwrap_or("none");
    println!("the engine's own refusals for room: {refused}");
}

/// An engine that sends no load figures (an older one) and refuses its first `refusals`
/// completions for room (429 `queue_full`), then answers each with a one-word completion.
async fn refusing_engine(refusals: usize) -> (String, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let posts = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&posts);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if buf.len() < end + 4 + len {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    }
                    buf.drain(..end + 4 + len);
                    let (status, body) = if head.starts_with("get") {
                        ("200 OK", "ready".to_string())
                    } else if seen.fetch_add(1, Ordering::SeqCst) < refusals {
                        let e = json!({"error": {"message": "queue full", "type": "rate_limit_error", "code": "queue_full"}});
                        ("429 Too Many Requests", e.to_string())
                    } else {
                        let c = json!({"object": "text_completion", "choices": [{"index": 0, "text": "hi", "finish_reason": "length"}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}});
                        ("200 OK", c.to_string())
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if sock.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, posts)
}

/// One tier whose requests may wait 30 s here: an engine that sends no figures is retried
/// after its next probe (every 500 ms), so put-backs take a while.
fn patient_policy() -> EnginePolicy {
    let spec = serde_json::from_value(json!({
        "tiers": [{"name": "free", "priority": 1, "queueWaitTarget": "30s"}],
        "defaultTier": "free",
        "tenancy": {"gatewayHeaders": {}}
    }))
    .unwrap();
    EnginePolicy {
        tier_policy: Some(spec),
        ..EnginePolicy::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_refusal_for_room_goes_back_into_the_router_queue() {
    // Three refusals for room, then answers: the client sees one 200, the router counts no
    // queue_full, and the engine saw the request four times (it was never started).
    let (url, posts) = refusing_engine(3).await;
    let r = start_router_on(vec![endpoint_at(&url)], patient_policy(), 1 << 20).await;
    let resp = r.complete("t1", None, "p").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        posts.load(Ordering::SeqCst),
        4,
        "three refusals, then served"
    );
    let m = r.metrics().await;
    assert!(!m.contains("outcome=\"queue_full\"} "), "{m}");

    // Past the bound of put-backs the refusal reaches the client, as a 429 with its reason.
    let (url, _) = refusing_engine(usize::MAX).await;
    let r = start_router_on(vec![endpoint_at(&url)], patient_policy(), 1 << 20).await;
    let resp = r.complete("t1", None, "p").await;
    assert_eq!(resp.status(), 429);
}
