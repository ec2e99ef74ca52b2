//! `tidegate-engine overload-bench`: measure an engine's capacity, offer a multiple of it,
//! and print what happened — refusals by status (with or without Retry-After), admitted
//! requests' p99 queue wait against the tier's target (from the engine's own histogram),
//! and the engine's RSS over the run (from its /metrics).
//!
//! Invariants: the offered load is open-loop (arrivals do not wait for completions), so an
//! overloaded engine cannot slow the offer down; the bench bounds its own outstanding
//! requests; the verdict fails (non-zero exit) when a refusal is not 429/503 with
//! Retry-After, when the p99 queue wait exceeds the target, or when RSS keeps growing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::json;
use tidegate_api::engine_metrics::{PROCESS_RESIDENT_MEMORY_BYTES, QUEUE_WAIT_SECONDS};
use tidegate_api::exposition::{
    Sample, bucket_deltas, cumulative_buckets, histogram_quantile, samples,
};
use tokio::sync::{Semaphore, mpsc};

fn parse_duration(s: &str) -> Result<Duration, String> {
    s.parse::<tidegate_api::Duration>()
        .map(|d| d.as_std())
        .map_err(|e| e.to_string())
}

/// Offer a multiple of an engine's measured capacity and report how it copes.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Base URL of the engine's API (e.g. http://127.0.0.1:8000).
    #[arg(long, env = "TIDEGATE_BENCH_TARGET")]
    pub target: String,
    /// Offered request rate as a multiple of the measured capacity.
    #[arg(long, default_value_t = 4.0)]
    pub rate_multiple: f64,
    /// How long to offer the overload (e.g. 60s).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// How long to measure capacity first, with closed-loop clients.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub calibrate: Duration,
    /// Closed-loop clients during calibration.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Output tokens per request (sent with ignore_eos).
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// Prompt length in characters.
    #[arg(long, default_value_t = 64)]
    pub prompt_chars: usize,
    /// Model name to send (default: the first of /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer API key to send.
    #[arg(long, env = "TIDEGATE_BENCH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Tier whose queue wait is checked (default: all tiers together).
    #[arg(long)]
    pub tier: Option<String>,
    /// Queue-wait target the p99 is compared with.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub queue_wait_target: Duration,
    /// Most requests the bench keeps outstanding at once.
    #[arg(long, default_value_t = 4096)]
    pub max_outstanding: usize,
}

/// One finished request.
#[derive(Debug)]
struct Outcome {
    status: u16,
    retry_after: bool,
    latency: Duration,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(bench(args))
}

struct Target {
    client: reqwest::Client,
    base: String,
    body: Arc<String>,
    api_key: Option<String>,
}

impl Target {
    async fn send(&self) -> Outcome {
        let start = Instant::now();
        let mut req = self
            .client
            .post(format!("{}/v1/completions", self.base))
            .header("content-type", "application/json")
            .body(self.body.as_ref().clone());
        if let Some(k) = &self.api_key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        match req.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp.headers().contains_key("retry-after");
                let _ = resp.bytes().await;
                Outcome {
                    status,
                    retry_after,
                    latency: start.elapsed(),
                }
            }
            Err(_) => Outcome {
                status: 0,
                retry_after: false,
                latency: start.elapsed(),
            },
        }
    }

    async fn metrics(&self) -> anyhow::Result<String> {
        let resp = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .context("GET /metrics")?;
        resp.text().await.context("reading /metrics")
    }
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .context("HTTP client")?;
    let base = args.target.trim_end_matches('/').to_string();
    let model = match &args.model {
        Some(m) => m.clone(),
        None => {
            let v: serde_json::Value = serde_json::from_slice(
                &client
                    .get(format!("{base}/v1/models"))
                    .send()
                    .await
                    .context("GET /v1/models")?
                    .bytes()
                    .await?,
            )?;
            v["data"][0]["id"]
                .as_str()
                .context("no model in /v1/models")?
                .to_string()
        }
    };
    let prompt: String = "the tide comes in "
        .chars()
        .cycle()
        .take(args.prompt_chars.max(1))
        .collect();
    let body = json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        "ignore_eos": true,
        "temperature": 0,
    })
    .to_string();
    let target = Arc::new(Target {
        client,
        base,
        body: Arc::new(body),
        api_key: args.api_key.clone(),
    });

    // 1. Capacity, closed loop.
    println!(
        "calibrating: {} clients for {:?}",
        args.concurrency, args.calibrate
    );
    let until = Instant::now() + args.calibrate;
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let target = Arc::clone(&target);
        workers.push(tokio::spawn(async move {
            let mut ok = 0u64;
            while Instant::now() < until {
                if target.send().await.status == 200 {
                    ok += 1;
                }
            }
            ok
        }));
    }
    let mut completed = 0u64;
    for w in workers {
        completed += w.await.unwrap_or(0);
    }
    let capacity = completed as f64 / args.calibrate.as_secs_f64();
    if capacity <= 0.0 {
        bail!("no request completed during calibration; is the engine serving?");
    }
    println!(
        "capacity: {capacity:.2} req/s ({:.1} output tokens/s)",
        capacity * f64::from(args.max_tokens)
    );

    // 2. Overload, open loop.
    let rate = capacity * args.rate_multiple;
    println!(
        "offering {rate:.2} req/s ({}x) for {:?}",
        args.rate_multiple, args.duration
    );
    let before = target.metrics().await?;
    let rss_start = gauge(&before, PROCESS_RESIDENT_MEMORY_BYTES.series);
    let (tx, mut rx) = mpsc::unbounded_channel::<Outcome>();
    let outstanding = Arc::new(Semaphore::new(args.max_outstanding.max(1)));
    let start = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut next = start;
    let mut offered = 0u64;
    let mut shed_by_bench = 0u64;
    let mut rss_samples: Vec<f64> = Vec::new();
    let mut last_sample = start;
    while start.elapsed() < args.duration {
        tokio::time::sleep_until(next.into()).await;
        next += interval;
        offered += 1;
        match Arc::clone(&outstanding).try_acquire_owned() {
            Ok(permit) => {
                let target = Arc::clone(&target);
                let tx = tx.clone();
                tokio::spawn(async move {
                    let outcome = target.send().await;
                    drop(permit);
                    let _ = tx.send(outcome);
                });
            }
            Err(_) => shed_by_bench += 1,
        }
        if last_sample.elapsed() >= Duration::from_secs(1) {
            last_sample = Instant::now();
            let target = Arc::clone(&target);
            if let Ok(Ok(text)) =
                tokio::time::timeout(Duration::from_millis(500), target.metrics()).await
                && let Some(rss) = gauge(&text, PROCESS_RESIDENT_MEMORY_BYTES.series)
            {
                rss_samples.push(rss);
            }
        }
    }
    drop(tx);
    let mut outcomes = Vec::new();
    while let Some(o) = rx.recv().await {
        outcomes.push(o);
    }
    let after = target.metrics().await?;
    let rss_end = gauge(&after, PROCESS_RESIDENT_MEMORY_BYTES.series);

    // 3. Figures.
    let mut by_status: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
    for o in &outcomes {
        let e = by_status.entry(o.status).or_default();
        e.0 += 1;
        if o.retry_after {
            e.1 += 1;
        }
    }
    println!("offered {offered} requests, {shed_by_bench} not sent (bench outstanding cap)");
    println!("status  count  with Retry-After");
    let mut refusals_ok = true;
    for (status, (count, with_ra)) in &by_status {
        let label = if *status == 0 {
            "error".to_string()
        } else {
            status.to_string()
        };
        println!("{label:>6} {count:>6} {with_ra:>6}");
        if *status != 200 && (!matches!(status, 429 | 503) || with_ra != count) {
            refusals_ok = false;
        }
    }
    let mut ok_latency: Vec<Duration> = outcomes
        .iter()
        .filter(|o| o.status == 200)
        .map(|o| o.latency)
        .collect();
    ok_latency.sort();
    if let Some(p99) = percentile(&ok_latency, 0.99) {
        println!("admitted end-to-end latency p99: {:.3}s", p99.as_secs_f64());
    }
    let admitted = ok_latency.len() as f64 / args.duration.as_secs_f64();
    println!(
        "admitted throughput: {admitted:.2} req/s ({:.0}% of measured capacity)",
        100.0 * admitted / capacity
    );
    let p99_wait = histogram_p99(
        &before,
        &after,
        QUEUE_WAIT_SECONDS.series,
        args.tier.as_deref(),
    );
    let target_s = args.queue_wait_target.as_secs_f64();
    let wait_ok = match p99_wait {
        Some(p) => {
            println!(
                "admitted queue wait p99 (engine histogram, interpolated): {p:.3}s; target {target_s:.3}s"
            );
            p <= target_s
        }
        None => {
            println!("admitted queue wait p99: no samples");
            false
        }
    };
    let rss_max = rss_samples.iter().copied().fold(0.0f64, f64::max);
    let fmt_mb =
        |b: Option<f64>| b.map_or("n/a".to_string(), |b| format!("{:.1} MiB", b / 1048576.0));
    println!(
        "engine RSS: start {}, max {}, end {}",
        fmt_mb(rss_start),
        fmt_mb((rss_max > 0.0).then_some(rss_max)),
        fmt_mb(rss_end)
    );
    // Bounded: the second half of the run does not keep growing past the first half's peak
    // by more than 10% + 32 MiB.
    let half = rss_samples.len() / 2;
    let first_peak = rss_samples[..half].iter().copied().fold(0.0f64, f64::max);
    let second_peak = rss_samples[half..].iter().copied().fold(0.0f64, f64::max);
    let rss_ok = half == 0 || second_peak <= first_peak * 1.1 + 32.0 * 1048576.0;
    println!(
        "verdict: refusals 429/503 with Retry-After: {}; p99 queue wait within target: {}; RSS bounded: {}",
        yes(refusals_ok),
        yes(wait_ok),
        yes(rss_ok)
    );
    if refusals_ok && wait_ok && rss_ok {
        Ok(())
    } else {
        bail!("overload benchmark failed its checks")
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "NO" }
}

fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i])
}

fn gauge(text: &str, name: &str) -> Option<f64> {
    samples(text)
        .find(|s| s.name == name && s.labels.is_empty())
        .map(|s| s.value)
}

/// The 99th percentile of what was observed between two scrapes of the histogram whose
/// `_bucket` series is `series` (one tier, or all summed), interpolated linearly within its
/// bucket as Prometheus' `histogram_quantile` does.
fn histogram_p99(before: &str, after: &str, series: &str, tier: Option<&str>) -> Option<f64> {
    let keep = |s: &Sample<'_>| tier.is_none_or(|t| s.label("tier") == Some(t));
    let buckets = |text: &str| {
        let all: Vec<Sample> = samples(text).collect();
        cumulative_buckets(&all, series, keep)
    };
    histogram_quantile(0.99, &bucket_deltas(&buckets(before), &buckets(after)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_from_histogram_diff() {
        let before = "x_bucket{tier=\"a\",le=\"0.1\"} 0\nx_bucket{tier=\"a\",le=\"1.0\"} 0\nx_bucket{tier=\"a\",le=\"+Inf\"} 0\n";
        let after = "x_bucket{tier=\"a\",le=\"0.1\"} 98\nx_bucket{tier=\"a\",le=\"1.0\"} 100\nx_bucket{tier=\"a\",le=\"+Inf\"} 100\nrss 5\n";
        let p = histogram_p99(before, after, "x_bucket", Some("a")).unwrap();
        assert!((p - 0.55).abs() < 1e-9, "{p}");
        assert_eq!(histogram_p99(before, after, "x_bucket", Some("b")), None);
        assert_eq!(gauge(after, "rss"), Some(5.0));
    }
}
