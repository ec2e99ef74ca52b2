//! `PrometheusMetrics` against a real Prometheus server scraping three fake engines in two
//! pools (their /metrics as the engine writes it, with the `namespace`, `pool` and `pod`
//! target labels the chart's PodMonitor produces): the PromQL parses and evaluates, and the
//! answers map onto PoolMetrics (per-pod decode rate, the pod model's points from the
//! inter-token latency histogram, finished requests, p99 from the histogram, KV use,
//! overload refusals less a client's retries, staleness).
//!
//! Runs only when TIDEGATE_TEST_PROMETHEUS names a Prometheus binary (scripts/test.sh sets
//! it to the one test-deps installs); otherwise it passes without doing anything.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use tidegate_api::InferencePoolSpec;
use tidegate_operator::metrics_source::prometheus::PrometheusMetrics;
use tidegate_operator::plan::{MetricsProblem, PoolMetrics};
use tidegate_operator::ports::{MetricsSource, PoolRef};

/// Refusals an engine counts, per second: `overload` for a full queue, `retried` of them on a
/// client's retry (None: an engine that does not count retries apart), and always five for
/// the admission pause, which is not overload.
#[derive(Clone, Copy)]
struct Refusals {
    overload: f64,
    retried: Option<f64>,
}

/// Serves engine metrics: `tps` decode tokens/s, each `itl` seconds after the one before it,
/// `waiting` queued requests, 10 queue-wait observations per second of 0.3s each, two
/// completed requests per second, and `refused`.
async fn fake_engine(tps: f64, waiting: f64, itl: f64, refused: Refusals) -> SocketAddr {
    let start = Instant::now();
    let app = Router::new().route(
        "/metrics",
        get(move || async move {
            let t = start.elapsed().as_secs_f64();
            let n = (t * 10.0).floor();
            let tokens = (t * tps).floor();
            format!(
                "# TYPE tidegate_engine_decode_tokens_total counter\n\
                 tidegate_engine_decode_tokens_total {tokens}\n\
                 # TYPE tidegate_engine_requests_running gauge\n\
                 tidegate_engine_requests_running 4\n\
                 # TYPE tidegate_engine_requests_waiting gauge\n\
                 tidegate_engine_requests_waiting {waiting}\n\
                 # TYPE tidegate_engine_kv_blocks_used gauge\n\
                 tidegate_engine_kv_blocks_used 50\n\
                 # TYPE tidegate_engine_kv_blocks_total gauge\n\
                 tidegate_engine_kv_blocks_total 100\n\
                 # TYPE tidegate_engine_evictions_total counter\n\
                 tidegate_engine_evictions_total{{tier=\"free\",action=\"drop\"}} 0\n\
                 # TYPE tidegate_engine_queue_wait_seconds histogram\n\
                 tidegate_engine_queue_wait_seconds_bucket{{tier=\"free\",le=\"0.1\"}} 0\n\
                 tidegate_engine_queue_wait_seconds_bucket{{tier=\"free\",le=\"0.5\"}} {n}\n\
                 tidegate_engine_queue_wait_seconds_bucket{{tier=\"free\",le=\"+Inf\"}} {n}\n\
                 tidegate_engine_queue_wait_seconds_sum{{tier=\"free\"}} {}\n\
                 tidegate_engine_queue_wait_seconds_count{{tier=\"free\"}} {n}\n\
                 # TYPE tidegate_engine_inter_token_latency_seconds histogram\n\
                 tidegate_engine_inter_token_latency_seconds_bucket{{tier=\"free\",le=\"+Inf\"}} {tokens}\n\
                 tidegate_engine_inter_token_latency_seconds_sum{{tier=\"free\"}} {}\n\
                 tidegate_engine_inter_token_latency_seconds_count{{tier=\"free\"}} {tokens}\n\
                 # TYPE tidegate_engine_requests_total counter\n\
                 tidegate_engine_requests_total{{tier=\"free\",outcome=\"completed\"}} {}\n\
                 # TYPE tidegate_engine_rejections_total counter\n\
                 tidegate_engine_rejections_total{{reason=\"queue_full\"}} {}\n\
                 tidegate_engine_rejections_total{{reason=\"new_tenant_admission_paused\"}} {}\n{}",
                n * 0.3,
                tokens * itl,
                (t * 2.0).floor(),
                (t * refused.overload).floor(),
                (t * 5.0).floor(),
                refused.retried.map_or(String::new(), |r| format!(
                    "# TYPE tidegate_engine_retried_rejections_total counter\n\
                     tidegate_engine_retried_rejections_total{{reason=\"queue_full\"}} {}\n",
                    (t * r).floor()
                )),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Reads `pool` every half second until its metrics satisfy `usable`, failing the test with
/// the last answer after `timeout`.
async fn read_until(
    source: &PrometheusMetrics,
    pool: &PoolRef,
    spec: &InferencePoolSpec,
    timeout: Duration,
    usable: impl Fn(&PoolMetrics) -> bool,
) -> PoolMetrics {
    let deadline = Instant::now() + timeout;
    loop {
        match source.read(pool, spec, &[], now_ms()).await {
            Ok(m) if usable(&m) => return m,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "no usable metrics for {}: {other:?}",
                    pool.name
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

fn spec() -> InferencePoolSpec {
    serde_json::from_value(serde_json::json!({
        "model": {"name": "m", "uri": "file:///m"},
        "engine": {"image": "e"},
        "replicas": {"max": 2},
        "scaling": {"metrics": {"rateWindow": "5s"}}
    }))
    .expect("spec")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promql_against_a_real_prometheus() {
    let Ok(bin) = std::env::var("TIDEGATE_TEST_PROMETHEUS") else {
        eprintln!("TIDEGATE_TEST_PROMETHEUS not set; skipping");
        return;
    };
    // Pool chat: engine a refuses 3/s for overload, 1/s of them retries; b (no retry
    // counter) 1/s: 3 requests/s of unmet demand. Pool old: one engine without the retry
    // counter, 1/s, so the whole query has no retried series to subtract.
    let (retries_counted, not_counted) = (
        Refusals {
            overload: 3.0,
            retried: Some(1.0),
        },
        Refusals {
            overload: 1.0,
            retried: None,
        },
    );
    let a = fake_engine(100.0, 2.0, 0.04, retries_counted).await;
    let b = fake_engine(50.0, 0.0, 0.025, not_counted).await;
    let c = fake_engine(10.0, 0.0, 0.025, not_counted).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "global:\n  scrape_interval: 1s\n\
         scrape_configs:\n  - job_name: tidegate-engine\n    static_configs:\n\
         \x20     - targets: ['{a}']\n        labels: {{namespace: prod, pool: chat, pod: chat-a}}\n\
         \x20     - targets: ['{b}']\n        labels: {{namespace: prod, pool: chat, pod: chat-b}}\n\
         \x20     - targets: ['{c}']\n        labels: {{namespace: prod, pool: old, pod: old-a}}\n"
    );
    let config_path = dir.path().join("prometheus.yml");
    std::fs::write(&config_path, config).expect("config");
    let port = free_port();
    let _prom = Prometheus(
        Command::new(bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    let source = PrometheusMetrics::new(Some(format!("http://127.0.0.1:{port}")));
    let pool = PoolRef {
        namespace: "prod".into(),
        name: "chat".into(),
    };
    let spec = spec();

    // Wait until both pods have enough samples for rate() and the histogram quantile.
    let m = read_until(&source, &pool, &spec, Duration::from_secs(40), |m| {
        m.pods_reporting == 2
            && m.step_samples.len() == 2
            && m.queue_wait_p99_seconds.is_some()
            && m.requests_finished_per_second > 0.0
            && m.overload_refusals_per_second > 0.0
            && (120.0..=180.0).contains(&m.decode_tokens_per_second)
    })
    .await;
    assert!(
        (120.0..=180.0).contains(&m.decode_tokens_per_second),
        "{m:?}"
    );
    // Each engine is one point: its running gauge and rate(_sum) ÷ rate(_count).
    let mut itls: Vec<f64> = m.step_samples.iter().map(|p| p.itl_seconds).collect();
    itls.sort_by(f64::total_cmp);
    assert!(
        (itls[0] - 0.025).abs() < 1e-6 && (itls[1] - 0.04).abs() < 1e-6,
        "mean ITL per engine: {m:?}"
    );
    assert!(m.step_samples.iter().all(|p| p.batch == 4.0), "{m:?}");
    // Two per second per engine, give or take a scrape's rounding.
    assert!(
        (3.0..=5.0).contains(&m.requests_finished_per_second),
        "{m:?}"
    );
    // Overload refusals less the retried ones (4 − 1); the pause's refusals are not counted.
    assert!(
        (2.0..=4.0).contains(&m.overload_refusals_per_second),
        "{m:?}"
    );
    assert_eq!(m.running, 8.0);
    assert_eq!(m.waiting, 2.0);
    assert!((m.kv_utilization - 0.5).abs() < 1e-9, "{m:?}");
    let p99 = m.queue_wait_p99_seconds.unwrap_or_default();
    assert!(
        (0.1..=0.5).contains(&p99),
        "p99 within the 0.1–0.5 bucket: {p99}"
    );
    assert!(
        now_ms().saturating_sub(m.sampled_at) < 5_000,
        "sampled_at is the last scrape: {m:?}"
    );

    // Without any retry counter in the pool, nothing is subtracted (`or vector(0)`).
    let old = PoolRef {
        namespace: "prod".into(),
        name: "old".into(),
    };
    let m = read_until(&source, &old, &spec, Duration::from_secs(20), |m| {
        m.overload_refusals_per_second > 0.0
    })
    .await;
    assert!(
        (0.5..=1.5).contains(&m.overload_refusals_per_second),
        "pool old: {m:?}"
    );

    // A pool nobody scrapes has no data; a dead Prometheus is unreachable.
    let other = PoolRef {
        namespace: "prod".into(),
        name: "nobody".into(),
    };
    assert!(matches!(
        source.read(&other, &spec, &[], now_ms()).await,
        Err(MetricsProblem::NoData(_))
    ));
    drop(_prom);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(matches!(
        source.read(&pool, &spec, &[], now_ms()).await,
        Err(MetricsProblem::Unreachable(_))
    ));
}
