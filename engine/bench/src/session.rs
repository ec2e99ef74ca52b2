//! The returning-session case of `tidegate-engine bench`, end to end through the engine loop:
//! the same 1,000-token history (a) recomputed by a request without a session, (b) reused
//! while its session is still resident, and (c) restored from host RAM after the tier policy
//! offloaded the idle session. Each figure is the TTFT a client sees.
//!
//! Invariant: case (c) is only reported as a host restore when the engine's own counters show
//! that the session was offloaded and then restored from host; otherwise the run fails with
//! what the counters say, so a figure can never describe a path that did not run.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::client::{one, prompt, request};
use tidegate_server::backend::Engine;
use tidegate_server::metrics::{EvictionLabels, Metrics, RestoreLabel};

/// The tier the returning-session requests run in: idle KV is offloaded after one second.
pub(super) const SESSION_TIER: &str = "bench-offload";

/// A policy whose only tier offloads idle sessions after `idle_ttl_s` seconds.
pub(super) fn offload_policy(idle_ttl_s: u64) -> anyhow::Result<tidegate_api::TierPolicySpec> {
    Ok(serde_json::from_value(json!({
        "tiers": [{
            "name": SESSION_TIER,
            "priority": 0,
            "queueWaitTarget": "1h",
            "kvRetention": {"idleTTL": format!("{idle_ttl_s}s"), "onPressure": "Offload"}
        }],
        "defaultTier": SESSION_TIER
    }))?)
}

/// Returning sessions restored from `source` (host, disk or recompute) so far.
pub(super) fn restores(m: &Metrics, source: &'static str) -> u64 {
    m.restores.get_or_create(&RestoreLabel { source }).get()
}

fn offloads(m: &Metrics) -> u64 {
    m.evictions
        .get_or_create(&EvictionLabels {
            tier: SESSION_TIER.to_string(),
            action: "offload",
        })
        .get()
}

/// Runs the three cases; `engine` must already carry [`offload_policy`].
pub(super) async fn returning_session(
    engine: &Arc<dyn Engine>,
    metrics: &Metrics,
    history: usize,
    vocab: usize,
) -> anyhow::Result<Value> {
    let hist = prompt(history, 7, vocab);
    let session = || Some("bench-session".to_string());
    let req = |id: &str, s| request(id.into(), hist.clone(), 1, s, SESSION_TIER);
    let recompute = one(Arc::clone(engine), req("fresh", None)).await?;
    one(Arc::clone(engine), req("s1", session())).await?;
    let resident = one(Arc::clone(engine), req("s2", session())).await?;

    // Let the idle session pass its TTL; the loop's idle tick offloads it to host RAM.
    let before = offloads(metrics);
    anyhow::ensure!(
        poll_until(|| offloads(metrics) > before, Duration::from_secs(10)).await,
        "the idle session was not offloaded within 10 s (offload counter stayed at {before})"
    );
    let restores_before = restores(metrics, "host");
    let restored = one(Arc::clone(engine), req("s3", session())).await?;
    // Counters are published at the end of the step that finished the request, which may be
    // just after its last event reached us.
    poll_until(
        || restores(metrics, "host") > restores_before,
        Duration::from_secs(1),
    )
    .await;
    let gained = restores(metrics, "host") - restores_before;
    anyhow::ensure!(
        gained == 1,
        "the returning session was not restored from host (host restores +{gained})"
    );
    Ok(json!({
        "history_tokens": history,
        "recompute_ttft_s": recompute.ttft,
        "resident_ttft_s": resident.ttft,
        "restore_from_host_ttft_s": restored.ttft,
        "recompute_over_restore": recompute.ttft / restored.ttft,
    }))
}

/// Polls `done` every 20 ms until it holds (true) or `limit` has passed (false).
async fn poll_until(mut done: impl FnMut() -> bool, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}
