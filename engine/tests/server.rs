//! The HTTP server over real sockets, in front of the real engine loop on the echo runner
//! (what `serve --fake-model` runs): OpenAI shapes, SSE, tenants and admission, rate limits,
//! admin auth, drain, cancellation, and a corpus of bad requests that must never produce a
//! 5xx.

// Test helpers outside #[test] functions: unwrap is the point here.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use std::sync::Arc;
use tidegate_api::engine_admin::{AdmissionPush, AdmissionState, ApiKeyEntry, EnginePolicy};

use tidegate_http::auth::AdminAuth;
use tidegate_http::tenancy::sha256_hex;
use tidegate_runner::echo::EchoConfig;
use tidegate_server::api::{self as server, RunningServer, ServerConfig};
use tidegate_server::backend::Engine;
use tidegate_server::engine_loop::{LoopConfig, LoopEngine};
use tidegate_server::metrics::Metrics;
use tokio::net::TcpListener;

mod bad_requests;
mod common;

const TOKEN: &str = "admin-secret";

struct Harness {
    base: String,
    admin: String,
    client: reqwest::Client,
    server: Option<RunningServer>,
}

/// The knobs these tests turn: the loop's batch and queue bounds, the echo runner's timing.
struct Fake {
    max_running: usize,
    max_waiting: usize,
    token_delay: Duration,
    context_length: usize,
    load_delay: Duration,
}

impl Default for Fake {
    fn default() -> Self {
        Fake {
            max_running: 16,
            max_waiting: 64,
            token_delay: Duration::from_millis(5),
            context_length: 4096,
            load_delay: Duration::ZERO,
        }
    }
}

impl Fake {
    /// The echo-runner engine; waits until it is ready unless loading is being tested.
    async fn engine(self, metrics: Arc<Metrics>) -> Arc<dyn Engine> {
        let echo = EchoConfig {
            step_time: self.token_delay,
            context_length: self.context_length,
            load_delay: self.load_delay,
        };
        let config = LoopConfig {
            model_id: "fake".into(),
            kv_blocks: 4096,
            max_batch_seqs: self.max_running,
            max_waiting: self.max_waiting,
            ..LoopConfig::default()
        };
        let wait = self.load_delay.is_zero();
        let engine = LoopEngine::start_echo(echo, config, metrics).unwrap();
        while wait && !engine.is_ready() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        engine
    }
}

async fn start(fake: Fake, config: ServerConfig) -> Harness {
    let metrics = Metrics::new();
    let engine = fake.engine(metrics.clone()).await;
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = ServerConfig {
        admin: AdminAuth::Token(TOKEN.into()),
        ..config
    };
    let server = server::start(config, api, Some(admin), engine, metrics).unwrap();
    Harness {
        base: format!("http://{}", server.api_addr),
        admin: format!("http://{}", server.admin_addr.unwrap()),
        client: reqwest::Client::new(),
        server: Some(server),
    }
}

async fn default_harness() -> Harness {
    start(Fake::default(), ServerConfig::default()).await
}

impl Harness {
    async fn post(&self, path: &str, body: Value, key: Option<&str>) -> reqwest::Response {
        let mut req = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        req.send().await.unwrap()
    }

    /// Asks the engine to drain, giving in-flight requests `grace_seconds`.
    async fn drain(&self, grace_seconds: u64) -> reqwest::Response {
        self.client
            .post(format!("{}/admin/v1/drain", self.admin))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(format!(r#"{{"graceSeconds": {grace_seconds}}}"#))
            .send()
            .await
            .unwrap()
    }

    /// Waits until the server has stopped after its drain.
    async fn stopped(&mut self) {
        let server = self.server.take().unwrap();
        tokio::time::timeout(Duration::from_secs(10), server.wait())
            .await
            .expect("server stops after draining")
            .expect("clean stop");
    }

    async fn push_policy(&self, policy: &EnginePolicy) {
        let resp = self
            .client
            .put(format!("{}/admin/v1/policy", self.admin))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(serde_json::to_string(policy).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 204, "{}", resp.text().await.unwrap());
    }

    async fn metrics(&self) -> String {
        common::metrics_text(&self.client, &self.base).await
    }
}

fn chat(content: &str) -> Value {
    json!({"model": "fake", "messages": [{"role": "user", "content": content}]})
}

/// Reads a whole SSE body; returns the `data:` payloads.
async fn sse_data(resp: reqwest::Response) -> Vec<String> {
    let text = resp.text().await.unwrap();
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {e:?}"))
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn chat_and_completions_non_streaming() {
    let h = default_harness().await;
    let resp = h
        .post("/v1/chat/completions", chat("hello tide"), None)
        .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "hello tide");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // The echo's ten tokens and the end-of-turn token it stopped at.
    assert_eq!(v["usage"]["completion_tokens"], 11);

    let body = json!({"prompt": "abc", "max_tokens": 5, "ignore_eos": true});
    let v: Value = h
        .post("/v1/completions", body, None)
        .await
        .json()
        .await
        .unwrap();
    // ignore_eos: the echo's end-of-turn token is generated (no text) and it starts over.
    assert_eq!(v["choices"][0]["text"], "abca");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["total_tokens"], 8);

    let body = json!({"prompt": "one two. three", "max_tokens": 50, "stop": ["."]});
    let v: Value = h
        .post("/v1/completions", body, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["text"], "one two");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let v: Value = h
        .client
        .get(format!("{}/v1/models", h.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["data"][0]["id"], "fake");
    assert_eq!(
        v["data"][0]["kernels"], "none",
        "the echo runner multiplies nothing"
    );
    for path in ["/healthz", "/readyz"] {
        let r = h
            .client
            .get(format!("{}{path}", h.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
}

#[tokio::test]
async fn sse_stream_format_ends_with_done() {
    let h = default_harness().await;
    let mut body = chat("stream me");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = h.post("/v1/chat/completions", body, None).await;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let data = sse_data(resp).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "stream me");
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 10);

    // Completions stream without usage.
    let body = json!({"prompt": "xy", "stream": true, "max_tokens": 3, "ignore_eos": true});
    let data = sse_data(h.post("/v1/completions", body, None).await).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let text: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(String::from))
        .collect();
    // "xy" repeated once is two periods: the third token is the end-of-turn token.
    assert_eq!(text, "xy");

    let metrics = h.metrics().await;
    for name in [
        "tidegate_engine_decode_tokens_total",
        "tidegate_engine_time_to_first_token_seconds_count{tier=\"default\"}",
        "tidegate_engine_requests_total{tier=\"default\",outcome=\"completed\"} 2",
    ] {
        assert!(metrics.contains(name), "missing {name}:\n{metrics}");
    }
}

fn tiered_policy(paused: bool) -> EnginePolicy {
    let spec = json!({
        "tiers": [
            {"name": "enterprise", "priority": 100, "admission": {"pausable": false}},
            {"name": "free", "priority": 1,
             "rateLimits": {"requestsPerMinute": 2}}
        ],
        "defaultTier": "free"
    });
    let key = |k: &str, tenant: &str, tier: &str| ApiKeyEntry {
        key_sha256: sha256_hex(k.as_bytes()),
        tenant: tenant.into(),
        tier: tier.into(),
    };
    EnginePolicy {
        tier_policy: Some(serde_json::from_value(spec).unwrap()),
        api_keys: vec![
            key("sk-new-free", "newco", "free"),
            key("sk-old-free", "oldco", "free"),
            key("sk-new-ent", "bigco", "enterprise"),
        ],
        admission: AdmissionPush {
            state: if paused {
                AdmissionState::PausedNewTenants
            } else {
                AdmissionState::Open
            },
            paused_tiers: vec!["free".into(), "enterprise".into()],
            retry_after_seconds: 42,
            reason: "pool at its replica ceiling".into(),
        },
        admitted_tenants: vec!["oldco".into()],
    }
}

#[tokio::test]
async fn paused_admission_refuses_only_new_tenants_of_pausable_tiers() {
    let h = default_harness().await;
    h.push_policy(&tiered_policy(true)).await;

    let resp = h
        .post("/v1/chat/completions", chat("hi"), Some("sk-new-free"))
        .await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "42");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "new_tenant_admission_paused");
    assert_eq!(v["error"]["code"], "new_tenant_admission_paused");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("replica ceiling")
    );

    let resp = h
        .post("/v1/chat/completions", chat("hi"), Some("sk-old-free"))
        .await;
    assert_eq!(resp.status(), 200, "existing tenant is served");
    let resp = h
        .post("/v1/chat/completions", chat("hi"), Some("sk-new-ent"))
        .await;
    assert_eq!(resp.status(), 200, "non-pausable tier is served");
    let resp = h
        .post("/v1/chat/completions", chat("hi"), Some("sk-unknown"))
        .await;
    assert_eq!(resp.status(), 401, "unknown key");

    let metrics = h.metrics().await;
    assert!(
        metrics.contains("tidegate_engine_admission_paused{tier=\"free\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tidegate_engine_admission_paused{tier=\"enterprise\"} 0"));
    assert!(metrics.contains("tidegate_engine_rejections_total{reason=\"new_tenant_paused\"} 1"));
    assert!(
        !metrics.contains("tidegate_engine_retried_rejections_total{reason=\"new_tenant_paused\"}"),
        "a first attempt is not a retry"
    );
    // The OpenAI SDKs' retry of the refused request: refused again, and counted apart too, so
    // the operator sees one request's demand.
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.base))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-new-free")
        .header(tidegate_api::router::header::RETRY_COUNT, "1")
        .body(chat("hi").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let metrics = h.metrics().await;
    assert!(metrics.contains("tidegate_engine_rejections_total{reason=\"new_tenant_paused\"} 2"));
    assert!(
        metrics
            .contains("tidegate_engine_retried_rejections_total{reason=\"new_tenant_paused\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("newco") && !metrics.contains("oldco"),
        "no tenant labels"
    );

    let v: Value = h
        .client
        .get(format!("{}/admin/v1/tenants?since=0", h.admin))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tenants: Vec<&str> = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants.len(), 2);
    assert!(tenants.contains(&"oldco") && tenants.contains(&"bigco"));
    let now = v["nowMs"].as_u64().unwrap();
    let v: Value = h
        .client
        .get(format!("{}/admin/v1/tenants?since={}", h.admin, now + 1))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["tenants"].as_array().unwrap().len(), 0);

    // Resume: the new tenant is served.
    h.push_policy(&tiered_policy(false)).await;
    let resp = h
        .post("/v1/chat/completions", chat("hi"), Some("sk-new-free"))
        .await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn rate_limit_gives_429_with_retry_after() {
    let h = default_harness().await;
    h.push_policy(&tiered_policy(false)).await;
    for _ in 0..2 {
        let resp = h
            .post("/v1/chat/completions", chat("hi"), Some("sk-new-free"))
            .await;
        assert_eq!(resp.status(), 200);
    }
    let resp = h
        .post("/v1/chat/completions", chat("hi"), Some("sk-new-free"))
        .await;
    assert_eq!(resp.status(), 429);
    let after: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&after), "{after}");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    // Another tenant of the same tier has its own bucket.
    let resp = h
        .post("/v1/chat/completions", chat("hi"), Some("sk-old-free"))
        .await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn queue_full_gives_429_with_retry_after() {
    let fake = Fake {
        max_running: 1,
        max_waiting: 1,
        token_delay: Duration::from_millis(10),
        ..Fake::default()
    };
    let h = start(fake, ServerConfig::default()).await;
    let long = json!({"prompt": "a", "max_tokens": 300, "ignore_eos": true});
    let mut inflight = Vec::new();
    for _ in 0..2 {
        let c = h.client.clone();
        let url = format!("{}/v1/completions", h.base);
        let body = long.to_string();
        inflight.push(tokio::spawn(async move {
            c.post(url).body(body).send().await.unwrap().status()
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One runs, one waits: only then is the queue full (on a busy machine the requests may
    // take longer than the sleeps to reach the engine).
    for _ in 0..250 {
        let m = h.metrics().await;
        if m.contains("tidegate_engine_requests_waiting 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resp = h.post("/v1/completions", long.clone(), None).await;
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_full");
    for t in inflight {
        let status = t.await.unwrap();
        // The queued one may time out against the default 2 s target: 503, never 5xx-other.
        assert!(status == 200 || status == 503, "{status}");
    }
}

#[tokio::test]
async fn admin_requires_the_token() {
    let h = default_harness().await;
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("admin-secret"),
        Some("Basic x"),
    ] {
        let mut req = h.client.get(format!("{}/admin/v1/drain", h.admin));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401, "{auth:?}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["type"], "authentication_error");
    }
    let resp = h
        .client
        .put(format!("{}/admin/v1/policy", h.admin))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = h
        .client
        .get(format!("{}/admin/v1/drain", h.admin))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["state"], "Serving");

    // A bad policy is refused whole.
    let resp = h
        .client
        .put(format!("{}/admin/v1/policy", h.admin))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(r#"{"tierPolicy": {"tiers": [{"name": "a"}], "defaultTier": "b"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);

    // No token, admin enabled: refused at start.
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = Metrics::new();
    let engine = Fake::default().engine(metrics.clone()).await;
    let config = ServerConfig {
        admin: AdminAuth::Token("  ".into()),
        ..ServerConfig::default()
    };
    let err = server::start(config, api, Some(admin), engine, metrics)
        .err()
        .expect("must refuse");
    assert!(err.to_string().contains("admin API needs a token"), "{err}");
}

#[tokio::test]
async fn drain_finishes_in_flight_refuses_new_and_stops() {
    let fake = Fake {
        token_delay: Duration::from_millis(10),
        ..Fake::default()
    };
    let mut h = start(fake, ServerConfig::default()).await;
    let body = json!({"prompt": "drain", "max_tokens": 100, "ignore_eos": true, "stream": true,
                      "stream_options": {"include_usage": true}});
    let mut stream = h.post("/v1/completions", body, None).await;
    assert_eq!(stream.status(), 200);
    let first = stream.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));

    let resp = h.drain(30).await;
    assert_eq!(resp.status(), 202);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["state"], "Draining");
    assert_eq!(v["inFlight"], 1);

    let resp = h.post("/v1/chat/completions", chat("late"), None).await;
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "draining");
    let ready = h
        .client
        .get(format!("{}/readyz", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);

    let mut rest = String::from_utf8(first.to_vec()).unwrap();
    while let Some(chunk) = stream.chunk().await.unwrap() {
        rest.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");
    let generated = rest
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|c| c["usage"]["completion_tokens"].as_u64());
    assert_eq!(generated, Some(100), "the in-flight stream completed");

    h.stopped().await;
}

#[tokio::test]
async fn a_connection_accepted_before_the_drain_completes_still_gets_an_answer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut h = default_harness().await;
    let addr = h.base.trim_start_matches("http://").to_string();
    // A client has connected; its request is still on its way.
    let mut early = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Nothing in flight: the drain completes at once.
    let resp = h.drain(30).await;
    assert_eq!(resp.status(), 202);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The port is closed: a client that still lists this engine is refused and goes elsewhere.
    assert!(tokio::net::TcpStream::connect(&addr).await.is_err());
    // The early connection's request is answered (503 draining), not dropped unanswered.
    let body = r#"{"prompt": "late", "max_tokens": 4}"#;
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    early.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    early.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    assert!(answer.contains("draining"), "{answer}");

    h.stopped().await;
}

#[tokio::test]
async fn vanished_client_frees_engine_resources() {
    let fake = Fake {
        token_delay: Duration::from_millis(5),
        ..Fake::default()
    };
    let h = start(fake, ServerConfig::default()).await;
    let body = json!({"prompt": "gone", "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut stream = h.post("/v1/completions", body, None).await;
    stream.chunk().await.unwrap().unwrap();
    let m = h.metrics().await;
    assert!(m.contains("tidegate_engine_requests_running 1"), "{m}");
    drop(stream);
    let mut freed = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let m = h.metrics().await;
        if m.contains("tidegate_engine_requests_running 0")
            && m.contains("tidegate_engine_kv_blocks_used 0")
        {
            freed = true;
            assert!(m.contains("outcome=\"cancelled\"} 1"), "{m}");
            break;
        }
    }
    assert!(freed, "the engine freed the request");
}

#[tokio::test]
async fn bad_request_corpus_never_5xx() {
    let config = ServerConfig {
        max_body_bytes: 64 * 1024,
        ..ServerConfig::default()
    };
    let fake = Fake {
        context_length: 256,
        ..Fake::default()
    };
    let h = start(fake, config).await;
    let chat_path = bad_requests::CHAT;
    let cmpl_path = bad_requests::COMPLETIONS;
    bad_requests::check_corpus(&h.client, &h.base).await;
    // Wrong method, wrong header.
    let resp = h
        .client
        .get(format!("{}{cmpl_path}", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    let resp = h
        .client
        .post(format!("{}{cmpl_path}", h.base))
        .header("authorization", "Token abc")
        .body(r#"{"prompt": "a"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // The server still serves.
    let resp = h.post(chat_path, chat("still here"), None).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn queue_wait_over_tier_target_gives_503() {
    let fake = Fake {
        max_running: 1,
        max_waiting: 8,
        token_delay: Duration::from_millis(10),
        ..Fake::default()
    };
    let h = start(fake, ServerConfig::default()).await;
    let policy = EnginePolicy {
        tier_policy: Some(
            serde_json::from_value(json!({
                "tiers": [{"name": "batch", "queueWaitTarget": "200ms"}],
                "defaultTier": "batch"
            }))
            .unwrap(),
        ),
        ..EnginePolicy::default()
    };
    h.push_policy(&policy).await;
    let long = json!({"prompt": "a", "max_tokens": 200, "ignore_eos": true, "stream": true});
    let running = h.post("/v1/completions", long, None).await;
    assert_eq!(running.status(), 200);
    let started = std::time::Instant::now();
    let resp = h.post("/v1/chat/completions", chat("wait"), None).await;
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused near the target"
    );
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_timeout");
    drop(running);
    let m = h.metrics().await;
    assert!(
        m.contains("tidegate_engine_rejections_total{reason=\"queue_timeout\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn session_header_reuses_retained_kv() {
    let h = default_harness().await;
    let mut usage = Vec::new();
    for _ in 0..2 {
        let resp = h
            .client
            .post(format!("{}/v1/chat/completions", h.base))
            .header("x-session-id", "conv-1")
            .body(chat("remember me").to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let v: Value = resp.json().await.unwrap();
        usage.push(
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(usage[0], 0);
    assert!(usage[1] > 0, "{usage:?}");
    // The same through the request field.
    let mut body = json!({"prompt": "field session", "max_tokens": 4, "session_id": "conv-2"});
    h.post("/v1/completions", body.clone(), None).await;
    body["max_tokens"] = json!(5);
    let v: Value = h
        .post("/v1/completions", body, None)
        .await
        .json()
        .await
        .unwrap();
    assert!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
}

#[tokio::test]
async fn not_ready_while_loading() {
    let fake = Fake {
        load_delay: Duration::from_millis(500),
        ..Fake::default()
    };
    let h = start(fake, ServerConfig::default()).await;
    let ready = h
        .client
        .get(format!("{}/readyz", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let health = h
        .client
        .get(format!("{}/healthz", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let resp = h.post("/v1/chat/completions", chat("early"), None).await;
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    tokio::time::sleep(Duration::from_millis(600)).await;
    let ready = h
        .client
        .get(format!("{}/readyz", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
}

#[tokio::test]
async fn stalled_upload_gets_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = ServerConfig {
        body_read_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let h = start(Fake::default(), config).await;
    let addr = h.base.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"prompt\":",
    )
    .await
    .unwrap();
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = conn.read(&mut buf).await.unwrap();
            response.extend_from_slice(&buf[..n]);
            if n == 0 || response.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "answered");
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_written_whole_gets_413_json() {
    // Twice a 4 MiB limit (big enough that the unread part cannot all sit in socket
    // buffers), and the promised 64 MiB against the default 1 MiB limit.
    for (limit, body_bytes) in [(4 << 20, 8 << 20), (1 << 20, 64 << 20)] {
        let config = ServerConfig {
            max_body_bytes: limit,
            ..ServerConfig::default()
        };
        let h = start(Fake::default(), config).await;
        let addr = h.base.trim_start_matches("http://").to_string();
        let answer = tokio::task::spawn_blocking(move || common::send_whole(addr, body_bytes))
            .await
            .unwrap();
        let (head, body) = answer.expect("the whole request is sent and the answer read");
        assert!(head.starts_with("HTTP/1.1 413"), "{body_bytes}: {head}");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert!(v["error"]["message"].is_string(), "{v}");
        // The server still serves.
        let resp = h.post("/v1/chat/completions", chat("after"), None).await;
        assert_eq!(resp.status(), 200);
    }
}
