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

use super::bench_client::{one, prompt, request};
use crate::backend::Engine;
use crate::metrics::{EvictionLabels, Metrics, RestoreLabel};

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

fn host_restores(m: &Metrics) -> u64 {
    m.restores
        .get_or_create(&RestoreLabel { source: "host" })
        .get()
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
    let mut waited = Duration::ZERO;
    while offloads(metrics) == before {
        anyhow::ensure!(
            waited < Duration::from_secs(10),
            "the idle session was not offloaded within 10 s (offload counter stayed at {before})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
    }
    let restores_before = host_restores(metrics);
    let restored = one(Arc::clone(engine), req("s3", session())).await?;
    // Counters are published at the end of the step that finished the request, which may be
    // just after its last event reached us.
    let mut restores = 0;
    for _ in 0..50 {
        restores = host_restores(metrics) - restores_before;
        if restores > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::ensure!(
        restores == 1,
        "the returning session was not restored from host (host restores +{restores})"
    );
    Ok(json!({
        "history_tokens": history,
        "recompute_ttft_s": recompute.ttft,
        "resident_ttft_s": resident.ttft,
        "restore_from_host_ttft_s": restored.ttft,
        "recompute_over_restore": recompute.ttft / restored.ttft,
    }))
}
