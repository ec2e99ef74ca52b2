//! The real engine loop on the echo runner (what `serve --fake-model` runs), through the
//! `Engine` trait: the echo's answers, the queue bound and the tier's wait target enforced by
//! the real scheduler, and a session's KV reused, offloaded under pressure and restored from
//! host RAM by the real KV manager.

// Test helpers outside #[test] functions: unwrap is the point here.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tidegate_api::TierPolicySpec;
use tidegate_runner::echo::EchoConfig;
use tidegate_server::backend::{
    Admitted, ChatMessage, Engine, FinishReason, GenerateRequest, SubmitError, TokenEvent, Usage,
};
use tidegate_server::engine_loop::{LoopConfig, LoopEngine};
use tidegate_server::metrics::Metrics;

async fn echo_engine(config: LoopConfig, step: Duration, metrics: Arc<Metrics>) -> Arc<LoopEngine> {
    let echo = EchoConfig {
        step_time: step,
        ..EchoConfig::default()
    };
    let engine = LoopEngine::start_echo(echo, config, metrics).unwrap();
    while !engine.is_ready() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    engine
}

fn request(engine: &LoopEngine, text: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        id: "t".into(),
        prompt: engine.tokenize(text).unwrap(),
        max_tokens,
        sampling: Default::default(),
        ignore_eos: false,
        tier: "default".into(),
        session_id: None,
        arrived: Instant::now(),
    }
}

async fn collect(mut admitted: Admitted) -> (String, FinishReason, Usage) {
    let mut text = String::new();
    loop {
        match admitted.tokens.next().await.unwrap() {
            TokenEvent::Token { text: t, .. } => text.push_str(&t),
            TokenEvent::Finished { reason, usage } => return (text, reason, usage),
            TokenEvent::Failed { message } => panic!("{message}"),
        }
    }
}

#[tokio::test]
async fn a_chat_is_echoed_then_ends_and_ignore_eos_runs_to_max_tokens() {
    let engine = echo_engine(LoopConfig::default(), Duration::ZERO, Metrics::new()).await;
    let chat = engine
        .apply_chat_template(&[ChatMessage {
            role: "user".into(),
            content: "hi there".into(),
        }])
        .unwrap();
    let a = engine.submit(request(&engine, &chat, 100)).await.unwrap();
    let (text, reason, usage) = collect(a).await;
    assert_eq!(text, "hi there");
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(
        usage.completion_tokens, 9,
        "eight characters and the end of turn"
    );

    let mut req = request(&engine, "tides", 23);
    req.ignore_eos = true;
    let (text, reason, usage) = collect(engine.submit(req).await.unwrap()).await;
    assert_eq!(usage.completion_tokens, 23);
    assert!(text.starts_with("tidestides"), "{text}");
    assert_eq!(reason, FinishReason::Length);
}

#[tokio::test]
async fn the_queue_bound_and_the_tiers_wait_target_refuse() {
    let config = LoopConfig {
        max_batch_seqs: 1,
        max_waiting: 1,
        ..LoopConfig::default()
    };
    let engine = echo_engine(config, Duration::from_millis(20), Metrics::new()).await;
    let mut long = request(&engine, "x", 1000);
    long.ignore_eos = true;
    let _running = engine.submit(long).await.unwrap();
    let policy: TierPolicySpec = serde_json::from_value(serde_json::json!({
        "tiers": [{"name": "default"}, {"name": "quick", "queueWaitTarget": "100ms"}],
        "defaultTier": "default"
    }))
    .unwrap();
    engine.set_tier_policy(&policy);
    // The push's wake-up shares the (one-slot) inbox until the owner's next turn takes it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut waiter = request(&engine, "y", 5);
    waiter.tier = "quick".into();
    let waiting = tokio::spawn(engine.submit(waiter));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let full = engine.submit(request(&engine, "z", 5)).await;
    assert!(
        matches!(full, Err(SubmitError::QueueFull { .. })),
        "{full:?}"
    );
    let timed_out = waiting.await.unwrap();
    assert!(
        matches!(timed_out, Err(SubmitError::QueueTimeout { .. })),
        "{timed_out:?}"
    );
}

#[tokio::test]
async fn a_session_is_reused_then_offloaded_under_pressure_and_restored() {
    let metrics = Metrics::new();
    let config = LoopConfig {
        kv_blocks: 4,
        kv_block_tokens: 16,
        ..LoopConfig::default()
    };
    let engine = echo_engine(config, Duration::ZERO, Arc::clone(&metrics)).await;
    let mut first = request(&engine, "twenty characters!!!", 10);
    first.session_id = Some("s1".into());
    let (text, _, usage) = collect(engine.submit(first.clone()).await.unwrap()).await;
    assert_eq!(usage.cached_prompt_tokens, 0);
    first.arrived = Instant::now();
    let (again, _, usage) = collect(engine.submit(first.clone()).await.unwrap()).await;
    assert_eq!(again, text, "same history, same answer");
    assert!(
        usage.cached_prompt_tokens >= 16,
        "the idle session's KV was reused: {usage:?}"
    );
    // Another session needs the whole pool: s1's KV is offloaded to host RAM (the default
    // tier's retention), and s1 coming back restores it.
    let mut other = request(&engine, "x", 60);
    other.session_id = Some("s2".into());
    other.ignore_eos = true;
    collect(engine.submit(other).await.unwrap()).await;
    first.arrived = Instant::now();
    let (restored, _, usage) = collect(engine.submit(first).await.unwrap()).await;
    assert_eq!(restored, text, "a restored history gives the same answer");
    assert!(usage.cached_prompt_tokens >= 16, "{usage:?}");
    let text = metrics.encode().unwrap();
    assert!(
        text.contains("tidegate_engine_evictions_total{tier=\"default\",action=\"offload\"}"),
        "{text}"
    );
    assert!(
        text.contains("tidegate_engine_restores_total{source=\"host\"} 1"),
        "{text}"
    );
}
