//! The HTTP server in front of the real engine loop (scheduler + paged KV cache + runner) on
//! the seed-42 random model: exact output lengths, streaming, batched = one-by-one greedy
//! text, cancellation freeing blocks, session KV reuse, and (when fetched) SmolLM2 answering
//! a factual question through the chat API.

// Test helpers outside #[test] functions: unwrap is the point here.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tidegate_engine::backend::Engine;
use tidegate_engine::engine_loop::{LoopConfig, LoopEngine};
use tidegate_engine::metrics::Metrics;
use tidegate_engine::model::ModelFiles;
use tidegate_engine::server::{self, RunningServer, ServerConfig};
use tokio::net::TcpListener;

struct Harness {
    base: String,
    client: reqwest::Client,
    _server: RunningServer,
}

async fn start(model: &Path, kv_blocks: usize) -> Harness {
    let metrics = Metrics::new();
    let files = ModelFiles::load(model).unwrap();
    let config = LoopConfig {
        model_id: "test-model".into(),
        kv_blocks,
        kv_block_tokens: 16,
        max_batch_tokens: 256,
        ..LoopConfig::default()
    };
    let engine = LoopEngine::start(files, config, metrics.clone()).unwrap();
    for _ in 0..600 {
        if engine.is_ready() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(engine.is_ready(), "engine loaded");
    let engine: Arc<dyn Engine> = engine;
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = server::start(ServerConfig::default(), api, None, engine, metrics).unwrap();
    Harness {
        base: format!("http://{}", server.api_addr),
        client: reqwest::Client::new(),
        _server: server,
    }
}

async fn random_harness() -> Harness {
    start(&common::random_model_dir(), 256).await
}

impl Harness {
    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
    }

    async fn complete(&self, body: Value) -> Value {
        let resp = self.post("/v1/completions", body).await;
        assert_eq!(resp.status(), 200);
        resp.json().await.unwrap()
    }

    async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// The value of one sample line (`name{labels} value`), 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn greedy(prompt: &str, max_tokens: u32) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true, "temperature": 0})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_returns_exactly_max_tokens_with_ignore_eos() {
    let h = random_harness().await;
    let v = h.complete(greedy("The tide comes in", 17)).await;
    assert_eq!(v["usage"]["completion_tokens"], 17, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let m = h.metrics().await;
    assert!(
        metric(&m, "tidegate_engine_decode_tokens_total") >= 16.0,
        "{m}"
    );
    assert!(
        metric(&m, "tidegate_engine_prefill_tokens_total") >= 1.0,
        "{m}"
    );
    assert!(
        metric(&m, "tidegate_engine_kv_blocks_total") == 256.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_yields_tokens_then_done() {
    let h = random_harness().await;
    let mut body = greedy("stream this", 9);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = h.post("/v1/completions", body).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    let usage = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find(|v| v["usage"].is_object())
        .unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 9, "{text}");
    // Streamed text equals the non-streamed text of the same greedy request.
    let streamed: String = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    let whole = h.complete(greedy("stream this", 9)).await;
    assert_eq!(whole["choices"][0]["text"].as_str().unwrap(), streamed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_greedy_requests_match_one_by_one() {
    let h = Arc::new(random_harness().await);
    let prompts = [
        "one fish",
        "two fish, red fish",
        "blue fish and a much longer prompt that needs a few blocks of cache",
        "x",
        "the quick brown fox jumps",
        "over the lazy dog",
    ];
    let mut alone = Vec::new();
    for p in prompts {
        let v = h.complete(greedy(p, 12)).await;
        alone.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let h = Arc::clone(&h);
            let body = greedy(p, 12);
            tokio::spawn(async move {
                let v = h.complete(body).await;
                v["choices"][0]["text"].as_str().unwrap().to_string()
            })
        })
        .collect();
    let mut together = Vec::new();
    for t in tasks {
        together.push(t.await.unwrap());
    }
    assert_eq!(alone, together);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_stream_frees_its_blocks() {
    let h = random_harness().await;
    let mut body = greedy("a long generation that the client abandons", 900);
    body["stream"] = json!(true);
    let mut stream = h.post("/v1/completions", body).await;
    assert_eq!(stream.status(), 200);
    stream.chunk().await.unwrap().unwrap();
    let m = h.metrics().await;
    assert!(metric(&m, "tidegate_engine_kv_blocks_used") >= 1.0, "{m}");
    drop(stream);
    let mut freed = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let m = h.metrics().await;
        if metric(&m, "tidegate_engine_requests_running") == 0.0
            && metric(&m, "tidegate_engine_kv_blocks_used") == 0.0
        {
            freed = true;
            break;
        }
    }
    assert!(freed, "the engine freed the cancelled request's blocks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returning_session_reuses_its_kv() {
    let h = random_harness().await;
    let prompt = "a conversation that comes back for a second turn, long enough for blocks";
    let mut body = greedy(prompt, 6);
    body["session_id"] = json!("conv-1");
    let first = h.complete(body.clone()).await;
    let prefill_after_first = metric(&h.metrics().await, "tidegate_engine_prefill_tokens_total");
    let second = h.complete(body).await;
    let m = h.metrics().await;
    let prefill_second = metric(&m, "tidegate_engine_prefill_tokens_total") - prefill_after_first;
    let prompt_tokens = second["usage"]["prompt_tokens"].as_f64().unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_f64()
        .unwrap();
    assert!(cached > 0.0, "{second}");
    assert!(
        prefill_second < prompt_tokens,
        "{prefill_second} vs {prompt_tokens}"
    );
    assert!(
        metric(&m, "tidegate_engine_restores_total{source=\"resident\"}") >= 1.0,
        "{m}"
    );
    assert_eq!(first["choices"][0]["text"], second["choices"][0]["text"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_says_paris_over_http() {
    let Some(path) = common::smollm2_path() else {
        return;
    };
    let h = start(&path, 512).await;
    let body = json!({
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24,
        "temperature": 0
    });
    let resp = h.post("/v1/chat/completions", body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    let answer = v["choices"][0]["message"]["content"].as_str().unwrap();
    println!("answer: {answer}");
    assert!(answer.contains("Paris"), "{answer:?}");
}
