//! Metrics straight from engines' /metrics (local mode's default metrics source).
//!
//! Each read scrapes every endpoint and parses the Prometheus text format (the shared
//! exposition parser, reading the metrics contract's series names); `window` turns
//! each engine's samples within the pool's `rateWindow` into what the Prometheus queries give
//! in a cluster (rates, gauge averages, the pool's p99 queue wait).
//! Invariants: a counter reset (engine restart) yields no rate for that engine rather than a
//! negative one; an engine that does not answer is left out, and when none answers the result
//! is `Unreachable` (fail static upstream); histories are per pool.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::join_all;

use tidegate_api::InferencePoolSpec;
use tidegate_api::engine_metrics as contract;
use tidegate_api::exposition::{Sample, cumulative_buckets, samples};

use super::window::{EngineHistory, EngineSample, pool_metrics};
use crate::plan::{MetricsProblem, PoolMetrics};
use crate::ports::{Endpoint, MetricsSource, PoolRef};

/// Parses the Prometheus text exposition of an engine.
pub fn parse_engine_metrics(text: &str, at_ms: u64) -> EngineSample {
    let all: Vec<Sample> = samples(text).collect();
    let sum = |series: &str, keep: &dyn Fn(&Sample) -> bool| -> f64 {
        all.iter()
            .filter(|s| s.name == series && keep(s))
            .map(|s| s.value)
            .sum()
    };
    let any = |_: &Sample| true;
    let overload = |s: &Sample| {
        s.label("reason")
            .is_some_and(|r| contract::OVERLOAD_REASONS.contains(&r))
    };
    let finished = |s: &Sample| {
        s.label("outcome")
            .is_some_and(|o| contract::FINISHED_OUTCOMES.contains(&o))
    };
    let itl = &contract::INTER_TOKEN_LATENCY_SECONDS;
    EngineSample {
        at_ms,
        decode_tokens: sum(contract::DECODE_TOKENS.series, &any),
        running: sum(contract::REQUESTS_RUNNING.series, &any),
        waiting: sum(contract::REQUESTS_WAITING.series, &any),
        kv_used: sum(contract::KV_BLOCKS_USED.series, &any),
        kv_total: sum(contract::KV_BLOCKS_TOTAL.series, &any),
        evictions: sum(contract::EVICTIONS.series, &any),
        // A client's retries of one refused request are one request's demand.
        overload_refusals: (sum(contract::REJECTIONS.series, &overload)
            - sum(contract::RETRIED_REJECTIONS.series, &overload))
        .max(0.0),
        finished: sum(contract::REQUESTS.series, &finished),
        itl_sum: sum(&itl.sum_series(), &any),
        itl_count: sum(&itl.count_series(), &any),
        // All tiers summed, as the pool's p99 query sums by le.
        queue_wait_buckets: cumulative_buckets(&all, contract::QUEUE_WAIT_SECONDS.series, any),
    }
}

/// How long a pool's scrapes are kept after its last read.
const FORGET_MS: u64 = 3_600_000;

/// Scrapes engines directly, and keeps each engine's samples for its pool's rate window.
pub struct DirectMetrics {
    http: reqwest::Client,
    /// Keyed by pool, then by engine: reading one pool never touches another's history.
    histories: Mutex<HashMap<PoolRef, HashMap<String, EngineHistory>>>,
}

impl Default for DirectMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl DirectMetrics {
    pub fn new() -> Self {
        DirectMetrics {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .build()
                .unwrap_or_else(|_| reqwest::Client::new()),
            histories: Mutex::new(HashMap::new()),
        }
    }

    async fn scrape(&self, ep: &Endpoint, now_ms: u64) -> Option<EngineSample> {
        let resp = self
            .http
            .get(format!("{}/metrics", ep.api_url))
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let text = resp.text().await.ok()?;
        Some(parse_engine_metrics(&text, now_ms))
    }
}

impl MetricsSource for DirectMetrics {
    async fn read(
        &self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        endpoints: &[Endpoint],
        now_ms: u64,
    ) -> Result<PoolMetrics, MetricsProblem> {
        // All engines at once: a read takes the slowest scrape, not the sum of them.
        let scraped = join_all(endpoints.iter().map(|ep| self.scrape(ep, now_ms))).await;
        let samples: Vec<(String, EngineSample)> = endpoints
            .iter()
            .zip(scraped)
            .filter_map(|(ep, s)| Some((ep.name.clone(), s?)))
            .collect();
        if samples.is_empty() {
            return Err(if endpoints.is_empty() {
                MetricsProblem::NoData("no engine replicas to scrape".into())
            } else {
                MetricsProblem::Unreachable(format!(
                    "none of {} engine(s) answered /metrics",
                    endpoints.len()
                ))
            });
        }
        let window_ms = spec.scaling.metrics.rate_window.as_std().as_millis() as u64;
        let mut all = self.histories.lock().unwrap_or_else(|p| p.into_inner());
        // Pools not read for an hour (deleted, or moved to Prometheus) are forgotten.
        all.retain(|_, engines| {
            engines.values().any(|h| {
                h.newest_at()
                    .is_some_and(|at| now_ms.saturating_sub(at) < FORGET_MS)
            })
        });
        let histories = all.entry(pool.clone()).or_default();
        // Engines the runtime no longer runs (scaled down, replaced) are forgotten, as the
        // Prometheus path keeps only live pods' series; one that missed a scrape keeps its
        // history and is simply left out of this read.
        histories.retain(|name, _| endpoints.iter().any(|e| &e.name == name));
        // A baseline older than two windows (or two intervals, when those are longer) is
        // too old to take a rate from.
        let interval_ms = spec.scaling.interval.as_std().as_millis() as u64;
        let max_gap_ms = 2 * window_ms.max(interval_ms);
        let answered: Vec<String> = samples.iter().map(|(n, _)| n.clone()).collect();
        for (name, s) in samples {
            histories
                .entry(name)
                .or_default()
                .push(s, window_ms, max_gap_ms);
        }
        let engines = answered.iter().filter_map(|n| histories.get(n));
        Ok(pool_metrics(engines, window_ms, now_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
# HELP tidegate_engine_decode_tokens_total Decode tokens.
# TYPE tidegate_engine_decode_tokens_total counter
tidegate_engine_decode_tokens_total 1200
tidegate_engine_requests_running 8
tidegate_engine_requests_waiting 3
tidegate_engine_kv_blocks_used 50
tidegate_engine_kv_blocks_total 200
tidegate_engine_evictions_total{tier="free",action="drop"} 4
tidegate_engine_rejections_total{reason="queue_full"} 2
tidegate_engine_rejections_total{reason="rate_limited"} 9
tidegate_engine_rejections_total{reason="queue_timeout"} 3
tidegate_engine_retried_rejections_total{reason="queue_timeout"} 2
tidegate_engine_retried_rejections_total{reason="rate_limited"} 4
tidegate_engine_requests_total{tier="free",outcome="completed"} 30
tidegate_engine_requests_total{tier="free",outcome="rejected"} 11
tidegate_engine_requests_total{tier="gold",outcome="cancelled"} 2
tidegate_engine_inter_token_latency_seconds_sum{tier="free"} 12.5
tidegate_engine_inter_token_latency_seconds_count{tier="free"} 500
tidegate_engine_inter_token_latency_seconds_sum{tier="gold"} 2.5
tidegate_engine_inter_token_latency_seconds_count{tier="gold"} 100
tidegate_engine_queue_wait_seconds_bucket{tier="free",le="0.1"} 10
tidegate_engine_queue_wait_seconds_bucket{tier="free",le="1.0"} 18
tidegate_engine_queue_wait_seconds_bucket{tier="free",le="+Inf"} 20
tidegate_engine_queue_wait_seconds_bucket{tier="gold",le="0.1"} 5
tidegate_engine_queue_wait_seconds_bucket{tier="gold",le="1.0"} 5
tidegate_engine_queue_wait_seconds_bucket{tier="gold",le="+Inf"} 5
"#;

    #[test]
    fn parses_the_engine_exposition() {
        let s = parse_engine_metrics(TEXT, 7);
        assert_eq!(s.decode_tokens, 1200.0);
        assert_eq!((s.running, s.waiting), (8.0, 3.0));
        assert_eq!((s.kv_used, s.kv_total), (50.0, 200.0));
        assert_eq!(s.evictions, 4.0);
        // queue_full 2 + queue_timeout 3, less the 2 timeouts of retries.
        assert_eq!(s.overload_refusals, 3.0);
        assert_eq!(s.finished, 32.0);
        assert_eq!((s.itl_sum, s.itl_count), (15.0, 600.0));
        assert_eq!(
            s.queue_wait_buckets,
            vec![(0.1, 15.0), (1.0, 23.0), (f64::INFINITY, 25.0)]
        );
    }

    /// An engine whose decode counter grows by 100 tokens per scrape.
    async fn counting_engine() -> String {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let scrapes = Arc::new(AtomicU64::new(0));
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let n = scrapes.fetch_add(1, Ordering::SeqCst);
                async move {
                    format!(
                        "tidegate_engine_decode_tokens_total {}\ntidegate_engine_requests_running 2\n",
                        n * 100
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    fn endpoint(name: &str, url: &str) -> Endpoint {
        Endpoint {
            name: name.into(),
            api_url: url.into(),
            admin_url: url.into(),
            ready: true,
        }
    }

    #[tokio::test]
    async fn two_pools_read_in_turn_each_keep_their_own_window() {
        let spec: InferencePoolSpec = serde_saphyr::from_str(
            r#"
model: {name: m, uri: "file:///m"}
engine: {image: e}
replicas: {min: 1, max: 2}
scaling: {metrics: {source: Direct, rateWindow: 10s}}
"#,
        )
        .expect("spec");
        let (url_a, url_b) = (counting_engine().await, counting_engine().await);
        let pool = |name: &str| PoolRef {
            namespace: "default".into(),
            name: name.into(),
        };
        let (a, b) = (pool("a"), pool("b"));
        let (ea, eb) = ([endpoint("a-0", &url_a)], [endpoint("b-0", &url_b)]);
        let direct = DirectMetrics::new();
        for now_ms in [0, 2_000] {
            let ma = direct.read(&a, &spec, &ea, now_ms).await.expect("pool a");
            let mb = direct.read(&b, &spec, &eb, now_ms).await.expect("pool b");
            if now_ms > 0 {
                // 100 tokens over 2 s on each engine: reading b did not reset a's window.
                assert_eq!(ma.decode_tokens_per_second, 50.0, "{ma:?}");
                assert_eq!(mb.decode_tokens_per_second, 50.0, "{mb:?}");
                assert_eq!((ma.running, ma.pods_reporting), (2.0, 1));
            }
        }
    }
}
