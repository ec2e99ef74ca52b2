//! `tidegate-engine bench --soak-seconds N`: random conversations against the engine loop for
//! N seconds, to show that memory stays flat while the KV cache churns (sessions retained,
//! offloaded to host RAM, restored, dropped, preempted). Prints RSS at the start, once a
//! minute, and at the end, with the request and KV counters.
//!
//! Invariants: every conversation's history is capped (it restarts as a new session past
//! `MAX_HISTORY`), the host offload store has a fixed byte budget, and the run stops at the
//! deadline without leaving requests behind, so a growing RSS can only be a leak.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::client::{one, prompt, request};
use crate::session::{SESSION_TIER, restores};
use tidegate_runner::sampling::Rng;
use tidegate_server::backend::Engine;
use tidegate_server::metrics::{Metrics, resident_memory_bytes};

/// Tokens after which a conversation starts over as a new session.
const MAX_HISTORY: usize = 768;
/// Distinct conversations cycled through (more than fit in the device pool at once).
const CONVERSATIONS: usize = 96;

/// A uniform pick in `0..n` (the soak needs variety, not quality).
fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n.max(1) as u64) as usize
}

/// One conversation: its session id (renewed when the history is capped) and its tokens.
struct Conversation {
    session: String,
    history: Vec<u32>,
    restarts: usize,
}

fn mib(b: i64) -> i64 {
    b >> 20
}

/// Runs `workers` concurrent clients for `seconds`; returns the report.
pub(super) async fn soak(
    engine: &Arc<dyn Engine>,
    metrics: &Metrics,
    seconds: u64,
    workers: usize,
    vocab: usize,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let conversations: Arc<Vec<tokio::sync::Mutex<Conversation>>> = Arc::new(
        (0..CONVERSATIONS)
            .map(|i| {
                tokio::sync::Mutex::new(Conversation {
                    session: format!("soak-{i}-0"),
                    history: Vec::new(),
                    restarts: 0,
                })
            })
            .collect(),
    );
    let rss_start = resident_memory_bytes().unwrap_or(0);
    println!(
        "soak: {seconds}s, {workers} clients, RSS at start {} MiB",
        mib(rss_start)
    );
    let tasks: Vec<_> = (0..workers.max(1))
        .map(|w| {
            let engine = Arc::clone(engine);
            let conversations = Arc::clone(&conversations);
            tokio::spawn(async move {
                let mut rng = Rng::new(w as u64 * 7_919 + 1);
                let (mut requests, mut tokens) = (0u64, 0u64);
                while Instant::now() < deadline {
                    let i = below(&mut rng, CONVERSATIONS);
                    let mut c = conversations[i].lock().await;
                    let turn = 8 + below(&mut rng, 120);
                    if c.history.len() + turn > MAX_HISTORY {
                        c.restarts += 1;
                        c.session = format!("soak-{i}-{}", c.restarts);
                        c.history.clear();
                    }
                    let salt = (i * 1_000 + c.restarts) * 1_000 + c.history.len();
                    c.history.extend(prompt(turn, salt, vocab));
                    let out = 1 + below(&mut rng, 48) as u32;
                    let req = request(
                        format!("soak-{w}-{requests}"),
                        c.history.clone(),
                        out,
                        Some(c.session.clone()),
                        SESSION_TIER,
                    );
                    let t = one(Arc::clone(&engine), req).await?;
                    // The reply becomes part of the history (token ids stand in for text).
                    c.history.extend(prompt(t.stamps.len(), salt + 1, vocab));
                    requests += 1;
                    tokens += t.stamps.len() as u64;
                }
                anyhow::Ok((requests, tokens))
            })
        })
        .collect();
    let mut samples = vec![json!({"t_s": 0, "rss_mib": mib(rss_start)})];
    let t0 = Instant::now();
    while Instant::now() + Duration::from_secs(60) < deadline {
        tokio::time::sleep(Duration::from_secs(60)).await;
        let rss = resident_memory_bytes().unwrap_or(0);
        let t = t0.elapsed().as_secs();
        println!("soak: {t:>4}s RSS {} MiB", mib(rss));
        samples.push(json!({"t_s": t, "rss_mib": mib(rss)}));
    }
    let (mut requests, mut tokens) = (0, 0);
    for t in tasks {
        let (r, n) = t.await??;
        requests += r;
        tokens += n;
    }
    let rss_end = resident_memory_bytes().unwrap_or(0);
    println!("soak: end RSS {} MiB", mib(rss_end));
    Ok(json!({
        "seconds": seconds,
        "clients": workers,
        "requests": requests,
        "output_tokens": tokens,
        "restores_host": restores(metrics, "host"),
        "restores_disk": restores(metrics, "disk"),
        "restores_recompute": restores(metrics, "recompute"),
        "rss_start_mib": mib(rss_start),
        "rss_end_mib": mib(rss_end),
        "rss_samples": samples,
    }))
}
