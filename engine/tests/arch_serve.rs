//! Each architecture's fixture model served over HTTP by the real engine loop answers a chat
//! completion on both CPU runners, and its prompt is the one transformers renders: the
//! prompt tokens the server counts are transformers' `apply_chat_template` ids for the same
//! conversation (recorded in the fixture by `scripts/gen-arch-fixtures.py`).
#![allow(clippy::unwrap_used)] // test code

mod common;

use std::path::PathBuf;

use serde_json::{Value, json};
use tidegate_runner::model::ModelFiles;
use tidegate_runner::{DeviceChoice, Placement, RunnerChoice};
use tidegate_server::api::{self as server, ServerConfig};
use tidegate_server::engine_loop::LoopConfig;
use tidegate_server::metrics::Metrics;
use tokio::net::TcpListener;

const MODELS: [&str; 6] = [
    "llama3",
    "qwen2",
    "qwen3",
    "mistral",
    "gemma3",
    "gemma3_gguf",
];

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/arch")
        .join(name)
}

async fn chat_once(model: PathBuf, placement: Placement, fixture: &Value) {
    let metrics = Metrics::new();
    let config = LoopConfig {
        model_id: "fixture".into(),
        kv_blocks: 64,
        placement,
        ..LoopConfig::default()
    };
    let files = ModelFiles::load(&model).unwrap();
    let engine = common::ready_loop_engine(files, config, metrics.clone()).await;
    let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    api.set_nonblocking(true).unwrap();
    let api = TcpListener::from_std(api).unwrap();
    let running = server::start(ServerConfig::default(), api, None, engine, metrics).unwrap();
    let chat = &fixture["chat"][0];
    let body = json!({"messages": chat["messages"], "max_tokens": 8, "temperature": 0});
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", running.api_addr))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let v: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{}: {v}", model.display());
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let want = chat["ids"].as_array().unwrap().len() as u64;
    assert_eq!(prompt_tokens, want, "{}: prompt tokens", model.display());
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap() >= 1,
        "{v}"
    );
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_model_answers_a_chat_completion_on_both_runners() {
    let candle = Placement {
        device: DeviceChoice::Cpu,
        runner: RunnerChoice::Candle,
    };
    for name in MODELS {
        let text = std::fs::read_to_string(dir(name).join("expected.json")).unwrap();
        let fixture: Value = serde_json::from_str(&text).unwrap();
        for placement in [Placement::cpu_packed(), candle] {
            chat_once(dir(name), placement, &fixture).await;
        }
        if fixture["gguf"] == json!(true) {
            chat_once(
                dir(name).join("model.gguf"),
                Placement::cpu_packed(),
                &fixture,
            )
            .await;
        }
    }
}
