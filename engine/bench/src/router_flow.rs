//! `bench-router`'s flow-control figures: fairness between the tenants of a tier, the low
//! tier's worst wait under a saturating top tier, and several routers in front of one
//! engine. Every client is a closed loop (it sends its next request when the last one
//! ended), streaming, so time to first token includes the wait at the router.
//!
//! - `fairness`: `--light-tenants` tenants with one stream each, alone for `--duration`,
//!   then beside one tenant running `--heavy-streams` streams, all in the same tier; the
//!   light tenants' TTFT p50/p90 in both phases, and their refusals.
//! - `starvation`: `--heavy-streams` streams of the top tier (several tenants) saturate the
//!   pool while one stream of the lowest tier sends; its worst TTFT against `--bound`.
//! - `replicas`: `--heavy-streams` streams spread over `--router` and every `--other-router`
//!   in front of one engine; answers by status and the engine's own `queue_full` refusals
//!   over the run (read from its `/metrics`).
//!
//! Invariant: prints what it measured; asserts nothing (a benchmark, not a test).

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde_json::json;

use super::router::{BenchRouterArgs, quantile};

/// Header names of the policy the script gives the router (gateway headers).
const TENANT: &str = "x-tidegate-tenant";
const TIER: &str = "x-tidegate-tier";

/// One request's end: HTTP status (0: no answer) and, when served, its TTFT in seconds.
#[derive(Clone, Copy, Debug)]
struct Outcome {
    status: u16,
    ttft: Option<f64>,
}

/// Streams one completion for `tenant` of `tier`; its status and time to first token.
async fn one(http: &reqwest::Client, base: &str, tenant: &str, tier: &str, n: u32) -> Outcome {
    let t0 = Instant::now();
    let sent = http
        .post(format!("{base}/v1/completions"))
        .header(TENANT, tenant)
        .header(TIER, tier)
        .json(&json!({
            "model": "fake", "prompt": format!("{tenant} asks"), "max_tokens": n,
            "stream": true, "temperature": 0.0, "ignore_eos": true,
        }))
        .send()
        .await;
    let Ok(resp) = sent else {
        return Outcome {
            status: 0,
            ttft: None,
        };
    };
    let status = resp.status().as_u16();
    let mut body = resp.bytes_stream();
    let mut ttft = None;
    while let Some(Ok(chunk)) = body.next().await {
        if ttft.is_none() && chunk.windows(6).any(|w| w == b"\"text\"") {
            ttft = Some(t0.elapsed().as_secs_f64());
        }
    }
    Outcome {
        status,
        ttft: ttft.filter(|_| status == 200),
    }
}

/// A closed-loop client until `until`.
fn client(
    http: &reqwest::Client,
    base: &str,
    tenant: String,
    tier: &str,
    n: u32,
    until: Instant,
) -> tokio::task::JoinHandle<Vec<Outcome>> {
    let (http, base, tier) = (http.clone(), base.to_string(), tier.to_string());
    tokio::spawn(async move {
        let mut out = Vec::new();
        while Instant::now() < until {
            let o = one(&http, &base, &tenant, &tier, n).await;
            if o.status != 200 {
                // A refusal: try again soon (a saturating client), without spinning.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            out.push(o);
        }
        out
    })
}

async fn gather(tasks: Vec<tokio::task::JoinHandle<Vec<Outcome>>>) -> Vec<Outcome> {
    let mut all = Vec::new();
    for t in tasks {
        if let Ok(v) = t.await {
            all.extend(v);
        }
    }
    all
}

/// `p50`, `p90`, `max` TTFT in ms of the served ones, served count, refused count.
fn summary(v: &[Outcome]) -> (f64, f64, f64, usize, usize) {
    let mut t: Vec<f64> = v.iter().filter_map(|o| o.ttft).collect();
    let served = t.len();
    let (p50, p90, max) = (
        quantile(&mut t, 0.5) * 1e3,
        quantile(&mut t, 0.9) * 1e3,
        quantile(&mut t, 1.0) * 1e3,
    );
    (p50, p90, max, served, v.len() - served)
}

fn lights(
    args: &BenchRouterArgs,
    http: &reqwest::Client,
    until: Instant,
) -> Vec<tokio::task::JoinHandle<Vec<Outcome>>> {
    (0..args.light_tenants)
        .map(|i| {
            client(
                http,
                &args.router,
                format!("light-{i}"),
                &args.tier,
                args.max_tokens,
                until,
            )
        })
        .collect()
}

/// Light tenants alone, then beside a heavy tenant of the same tier.
pub async fn fairness(args: &BenchRouterArgs, http: &reqwest::Client) -> anyhow::Result<()> {
    let d = args.duration;
    let alone = gather(lights(args, http, Instant::now() + d)).await;
    // The heavy tenant first, so the light ones arrive into its backlog.
    let until = Instant::now() + d + Duration::from_secs(1);
    let heavy: Vec<_> = (0..args.heavy_streams)
        .map(|_| {
            client(
                http,
                &args.router,
                "heavy".into(),
                &args.tier,
                args.max_tokens,
                until,
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let beside = gather(lights(args, http, until)).await;
    let heavy = gather(heavy).await;
    let (a50, a90, _, an, ar) = summary(&alone);
    let (b50, b90, _, bn, br) = summary(&beside);
    let (h50, h90, _, hn, hr) = summary(&heavy);
    println!(
        "fairness: {} light tenants × 1 stream, then beside 1 tenant × {} streams, one tier, {:?} each, {} tokens per answer",
        args.light_tenants, args.heavy_streams, d, args.max_tokens
    );
    println!("  light alone:   TTFT p50 {a50:.1} ms, p90 {a90:.1} ms ({an} served, {ar} refused)");
    println!("  light beside:  TTFT p50 {b50:.1} ms, p90 {b90:.1} ms ({bn} served, {br} refused)");
    println!("  heavy:         TTFT p50 {h50:.1} ms, p90 {h90:.1} ms ({hn} served, {hr} refused)");
    let goal = 3.0 * a90 + 250.0;
    let met = b90 <= goal && br == 0;
    println!(
        "  goal: beside p90 ≤ 3 × alone p90 + 250 ms = {goal:.1} ms, no light refusal: {}",
        if met { "met" } else { "NOT met" }
    );
    Ok(())
}

/// The lowest tier's worst wait under a saturating top tier.
pub async fn starvation(args: &BenchRouterArgs, http: &reqwest::Client) -> anyhow::Result<()> {
    let until = Instant::now() + args.duration + Duration::from_secs(1);
    let top: Vec<_> = (0..args.heavy_streams)
        .map(|i| {
            client(
                http,
                &args.router,
                format!("top-{}", i % 8),
                &args.top_tier,
                args.max_tokens,
                until,
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let low = gather(vec![client(
        http,
        &args.router,
        "low".into(),
        &args.tier,
        args.max_tokens,
        until,
    )])
    .await;
    let top = gather(top).await;
    let (l50, _, lmax, ln, lr) = summary(&low);
    let (t50, _, _, tn, tr) = summary(&top);
    println!(
        "starvation: {} streams of tier {} saturating, 1 stream of tier {}, {:?}",
        args.heavy_streams, args.top_tier, args.tier, args.duration
    );
    println!("  top tier:  TTFT p50 {t50:.1} ms ({tn} served, {tr} refused)");
    println!("  low tier:  TTFT p50 {l50:.1} ms, worst {lmax:.1} ms ({ln} served, {lr} refused)");
    let bound = args.bound.as_secs_f64() * 1e3;
    println!(
        "  stated bound (priority gap ÷ aging + top tier's queue-wait target, plus a slot's time): {bound:.0} ms: {}",
        if lmax <= bound && ln > 0 {
            "within"
        } else {
            "NOT within"
        }
    );
    Ok(())
}

/// The engine's `queue_full` refusals so far, from its `/metrics`.
async fn engine_queue_full(http: &reqwest::Client, engine: &str) -> anyhow::Result<f64> {
    let text = http
        .get(format!("{engine}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    Ok(text
        .lines()
        .find(|l| l.starts_with("tidegate_engine_rejections_total{reason=\"queue_full\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0))
}

/// Several routers in front of one engine at a multiple of its slots.
pub async fn replicas(args: &BenchRouterArgs, http: &reqwest::Client) -> anyhow::Result<()> {
    let engine = args.engines.first().context("--engine is needed")?;
    let mut routers = vec![args.router.clone()];
    routers.extend(args.other_routers.iter().cloned());
    let before = engine_queue_full(http, engine).await?;
    let until = Instant::now() + args.duration;
    let tasks: Vec<_> = (0..args.heavy_streams)
        .map(|i| {
            let base = &routers[i % routers.len()];
            client(
                http,
                base,
                format!("t{}", i % 8),
                &args.tier,
                args.max_tokens,
                until,
            )
        })
        .collect();
    let all = gather(tasks).await;
    let after = engine_queue_full(http, engine).await?;
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for o in &all {
        *by_status.entry(o.status).or_default() += 1;
    }
    let (p50, p90, _, _, _) = summary(&all);
    println!(
        "replicas: {} streams over {} routers in front of one engine, {:?}",
        args.heavy_streams,
        routers.len(),
        args.duration
    );
    println!("  answers by status: {by_status:?} (0 = no answer)");
    println!("  TTFT p50 {p50:.1} ms, p90 {p90:.1} ms");
    println!(
        "  the engine's queue_full refusals over the run: {}",
        after - before
    );
    Ok(())
}
