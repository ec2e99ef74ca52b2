//! `PrometheusMetrics`: the MetricsSource port through PromQL.
//!
//! Scrape labels assumed (what the chart's PodMonitor produces): every engine series carries
//! `namespace`, `pod` and `instance` (Prometheus' Kubernetes discovery) and `pool`
//! (relabelled from the pod label `tidegate.dev/pool`). Queries select
//! `{namespace="NS", pool="POOL"}`; per-engine figures are grouped by `(pod, instance)`, so
//! targets without a `pod` label (local mode's file_sd) are still told apart by `instance`.
//! Metric names and the overload reasons come from the metrics contract
//! (`tidegate_api::engine_metrics`), never spelled here.
//!
//! Fail static: an unreachable Prometheus (or one that refuses a query, or is too slow) is
//! `MetricsProblem::Unreachable`; no engine series for the pool is `NoData`. `sampled_at` is
//! the newest scrape timestamp of the pool's series (`timestamp()`), not the query time, so
//! the planner sees stale data as stale.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_http_query::Client;
use prometheus_http_query::response::Data;
use tidegate_api::InferencePoolSpec;
use tidegate_api::engine_metrics as contract;

use crate::plan::{MetricsProblem, PoolMetrics, StepSample};
use crate::ports::{Endpoint, MetricsSource, PoolRef};

/// How long one PromQL query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The PromQL queries for one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Queries {
    /// Decode tokens/s per engine: `sum by (pod, instance) (rate(decode_tokens_total[W]))`.
    pub tokens_per_pod: String,
    /// Mean inter-token latency per engine over the window (the pod model's points, with
    /// `running_per_pod`): `rate(…_sum) / rate(…_count)`.
    pub itl_per_pod: String,
    /// Requests running per pod, averaged over the window (also: which pods report).
    pub running_per_pod: String,
    /// Requests waiting per pod, averaged over the window.
    pub waiting: String,
    /// p99 queue wait over the window, seconds.
    pub queue_wait_p99: String,
    /// KV blocks used ÷ total, pool-wide.
    pub kv_utilization: String,
    /// KV evictions per second, pool-wide.
    pub evictions: String,
    /// Overload refusals (queue full, queue timeout) per second.
    pub refusals: String,
    /// Requests finished (completed, cancelled, failed) per second, pool-wide.
    pub finished: String,
    /// How fast the queues grow, requests/s, pool-wide: `deriv` of the waiting gauge.
    pub waiting_growth: String,
    /// Newest scrape timestamp of the pool's series, seconds.
    pub newest_sample: String,
}

impl Queries {
    pub fn new(namespace: &str, pool: &str, window: Duration) -> Self {
        let sel = format!(
            "namespace=\"{}\", pool=\"{}\"",
            escape(namespace),
            escape(pool)
        );
        let w = format!("{}s", window.as_secs().max(1));
        let tokens = contract::DECODE_TOKENS.series;
        let running = contract::REQUESTS_RUNNING.series;
        let waiting = contract::REQUESTS_WAITING.series;
        let wait_buckets = contract::QUEUE_WAIT_SECONDS.series;
        let (kv_used, kv_total) = (
            contract::KV_BLOCKS_USED.series,
            contract::KV_BLOCKS_TOTAL.series,
        );
        let evictions = contract::EVICTIONS.series;
        let rejections = contract::REJECTIONS.series;
        let retried = contract::RETRIED_REJECTIONS.series;
        let overload = contract::OVERLOAD_REASONS.join("|");
        let requests = contract::REQUESTS.series;
        let finished = contract::FINISHED_OUTCOMES.join("|");
        let itl = &contract::INTER_TOKEN_LATENCY_SECONDS;
        let (itl_sum, itl_count) = (itl.sum_series(), itl.count_series());
        Queries {
            tokens_per_pod: format!("sum by (pod, instance) (rate({tokens}{{{sel}}}[{w}]))"),
            itl_per_pod: format!(
                "sum by (pod, instance) (rate({itl_sum}{{{sel}}}[{w}])) / \
                 sum by (pod, instance) (rate({itl_count}{{{sel}}}[{w}]))"
            ),
            // Gauges are averaged over the same window as the rates: demand then moves with
            // the decode rate it is compared to, and one scrape's noise does not scale a pool
            // (the simulator's pipeline reads them the same way).
            running_per_pod: format!(
                "sum by (pod, instance) (avg_over_time({running}{{{sel}}}[{w}]))"
            ),
            waiting: format!("sum by (pod, instance) (avg_over_time({waiting}{{{sel}}}[{w}]))"),
            queue_wait_p99: format!(
                "histogram_quantile(0.99, sum by (le) (rate({wait_buckets}{{{sel}}}[{w}])))"
            ),
            kv_utilization: format!("sum({kv_used}{{{sel}}}) / sum({kv_total}{{{sel}}})"),
            evictions: format!("sum(rate({evictions}{{{sel}}}[{w}]))"),
            // A client's retries of one refused request are one request's demand, not three:
            // the refusals of retries are taken out (engines that do not count them apart
            // give none to take).
            refusals: format!(
                "clamp_min(sum(rate({rejections}{{{sel}, reason=~\"{overload}\"}}[{w}])) - \
                 (sum(rate({retried}{{{sel}, reason=~\"{overload}\"}}[{w}])) or vector(0)), 0)"
            ),
            finished: format!("sum(rate({requests}{{{sel}, outcome=~\"{finished}\"}}[{w}]))"),
            waiting_growth: format!("sum(deriv({waiting}{{{sel}}}[{w}]))"),
            newest_sample: format!("max(timestamp({running}{{{sel}}}))"),
        }
    }
}

/// One query's answer: value per engine, keyed `pod/instance` ("" for a pool-wide value).
pub type Series = BTreeMap<String, f64>;

/// The answers, in the order of [`Queries`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answers {
    pub tokens_per_pod: Series,
    pub itl_per_pod: Series,
    pub running_per_pod: Series,
    pub waiting: Series,
    pub queue_wait_p99: Series,
    pub kv_utilization: Series,
    pub evictions: Series,
    pub refusals: Series,
    pub finished: Series,
    pub waiting_growth: Series,
    pub newest_sample: Series,
}

fn finite(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite())
}

fn scalar(s: &Series) -> Option<f64> {
    finite(s.values().next().copied())
}

/// Keeps only the series of engines the workload runtime still runs: Prometheus keeps
/// answering with a gone pod's last gauge values for its lookback window (5 minutes), which
/// would hold demand up after a pod crashed or was removed. Keys are `pod/instance`; pool-wide
/// values ("") and an empty `live` list (runtime knows nothing) keep everything.
pub fn only_live(mut a: Answers, live: &[String]) -> Answers {
    if live.is_empty() {
        return a;
    }
    let keep = |s: &mut Series| {
        s.retain(|key, _| {
            let pod = key.split('/').next().unwrap_or_default();
            key.is_empty() || pod.is_empty() || live.iter().any(|l| l == pod)
        })
    };
    keep(&mut a.tokens_per_pod);
    keep(&mut a.itl_per_pod);
    keep(&mut a.running_per_pod);
    keep(&mut a.waiting);
    a
}

/// Turns the answers into pool metrics (pure).
pub fn assemble(a: &Answers) -> Result<PoolMetrics, MetricsProblem> {
    if a.running_per_pod.is_empty() {
        return Err(MetricsProblem::NoData(
            "Prometheus has no tidegate_engine series for this pool (are the engines scraped?)"
                .to_string(),
        ));
    }
    let tokens: f64 = a.tokens_per_pod.values().filter(|v| v.is_finite()).sum();
    // One point per engine that produced tokens (an idle one has no latency: 0/0 is NaN).
    let step_samples = a
        .itl_per_pod
        .iter()
        .filter_map(|(pod, itl)| {
            let batch = a.running_per_pod.get(pod)?;
            (itl.is_finite() && batch.is_finite()).then_some(StepSample {
                batch: *batch,
                itl_seconds: *itl,
            })
        })
        .collect();
    let sampled_at = scalar(&a.newest_sample)
        .map(|s| (s * 1000.0).max(0.0) as u64)
        .unwrap_or(0);
    Ok(PoolMetrics {
        decode_tokens_per_second: tokens,
        step_samples,
        running: a.running_per_pod.values().filter(|v| v.is_finite()).sum(),
        waiting: a.waiting.values().filter(|v| v.is_finite()).sum(),
        queue_wait_p99_seconds: scalar(&a.queue_wait_p99),
        kv_utilization: scalar(&a.kv_utilization).unwrap_or(0.0),
        evictions_per_second: scalar(&a.evictions).unwrap_or(0.0),
        overload_refusals_per_second: scalar(&a.refusals).unwrap_or(0.0),
        requests_finished_per_second: scalar(&a.finished).unwrap_or(0.0),
        waiting_growth_per_second: scalar(&a.waiting_growth).unwrap_or(0.0),
        pods_reporting: a.running_per_pod.len() as i32,
        sampled_at,
    })
}

/// Reads pool metrics from Prometheus.
pub struct PrometheusMetrics {
    default_url: Option<String>,
    clients: Mutex<HashMap<String, Client>>,
}

impl PrometheusMetrics {
    /// `default_url` is the operator's --prometheus-url; a pool may name its own.
    pub fn new(default_url: Option<String>) -> Self {
        PrometheusMetrics {
            default_url: default_url.filter(|u| !u.is_empty()),
            clients: Mutex::new(HashMap::new()),
        }
    }

    fn client(&self, url: &str) -> Result<Client, MetricsProblem> {
        let mut clients = self
            .clients
            .lock()
            .map_err(|_| MetricsProblem::Unreachable("client cache poisoned".to_string()))?;
        if let Some(c) = clients.get(url) {
            return Ok(c.clone());
        }
        let c = Client::try_from(url)
            .map_err(|e| MetricsProblem::Unreachable(format!("bad Prometheus URL {url:?}: {e}")))?;
        clients.insert(url.to_string(), c.clone());
        Ok(c)
    }
}

async fn query(client: &Client, promql: &str) -> Result<Series, MetricsProblem> {
    let answer = tokio::time::timeout(QUERY_TIMEOUT, client.query(promql).get())
        .await
        .map_err(|_| {
            MetricsProblem::Unreachable(format!(
                "Prometheus did not answer within {}s",
                QUERY_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| MetricsProblem::Unreachable(format!("Prometheus query failed: {e}")))?;
    let mut out = Series::new();
    match answer.data() {
        Data::Vector(v) => {
            for s in v {
                // One engine = one (pod, instance): `pod` in a cluster, `instance` (the
                // scrape address) everywhere, so targets without a pod label still count.
                let label = |k: &str| s.metric().get(k).map(String::as_str).unwrap_or("");
                let key = match (label("pod"), label("instance")) {
                    ("", "") => String::new(),
                    (pod, instance) => format!("{pod}/{instance}"),
                };
                out.insert(key, s.sample().value());
            }
        }
        Data::Scalar(s) => {
            out.insert(String::new(), s.value());
        }
        Data::Matrix(_) => {}
    }
    Ok(out)
}

impl MetricsSource for PrometheusMetrics {
    async fn read(
        &self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        endpoints: &[Endpoint],
        _now_ms: u64,
    ) -> Result<PoolMetrics, MetricsProblem> {
        let m = &spec.scaling.metrics;
        let url = m
            .prometheus_url
            .clone()
            .or_else(|| self.default_url.clone())
            .ok_or_else(|| {
                MetricsProblem::Unreachable(
                    "no Prometheus URL: set --prometheus-url or spec.scaling.metrics.prometheusUrl"
                        .to_string(),
                )
            })?;
        let client = self.client(&url)?;
        let q = Queries::new(&pool.namespace, &pool.name, m.rate_window.as_std());
        let (tokens, itl, running, waiting, p99, kv, evictions, refusals, finished, growth, newest) = futures::join!(
            query(&client, &q.tokens_per_pod),
            query(&client, &q.itl_per_pod),
            query(&client, &q.running_per_pod),
            query(&client, &q.waiting),
            query(&client, &q.queue_wait_p99),
            query(&client, &q.kv_utilization),
            query(&client, &q.evictions),
            query(&client, &q.refusals),
            query(&client, &q.finished),
            query(&client, &q.waiting_growth),
            query(&client, &q.newest_sample),
        );
        let live: Vec<String> = endpoints.iter().map(|e| e.name.clone()).collect();
        assemble(&only_live(
            Answers {
                tokens_per_pod: tokens?,
                itl_per_pod: itl?,
                running_per_pod: running?,
                waiting: waiting?,
                queue_wait_p99: p99?,
                kv_utilization: kv?,
                evictions: evictions?,
                refusals: refusals?,
                finished: finished?,
                waiting_growth: growth?,
                newest_sample: newest?,
            },
            &live,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(pairs: &[(&str, f64)]) -> Series {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn queries_are_scoped_to_the_pool() {
        let q = Queries::new("prod", "llama", Duration::from_secs(60));
        assert_eq!(
            q.tokens_per_pod,
            "sum by (pod, instance) (rate(tidegate_engine_decode_tokens_total{namespace=\"prod\", pool=\"llama\"}[60s]))"
        );
        assert!(q.queue_wait_p99.starts_with("histogram_quantile(0.99, sum by (le) (rate(tidegate_engine_queue_wait_seconds_bucket{namespace=\"prod\", pool=\"llama\"}[60s])))"));
        assert!(q.refusals.contains("reason=~\"queue_full|queue_timeout\""));
        assert!(
            q.refusals
                .contains(" - (sum(rate(tidegate_engine_retried_rejections_total{")
        );
    }

    /// Every `tidegate_engine_…` name in a query, in order.
    fn engine_names(q: &str) -> Vec<&str> {
        q.match_indices("tidegate_engine_")
            .map(|(i, _)| {
                let rest = &q[i..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            })
            .collect()
    }

    #[test]
    fn queries_use_only_contract_series() {
        let q = Queries::new("prod", "llama", Duration::from_secs(60));
        let all = [
            &q.tokens_per_pod,
            &q.itl_per_pod,
            &q.running_per_pod,
            &q.waiting,
            &q.queue_wait_p99,
            &q.kv_utilization,
            &q.evictions,
            &q.refusals,
            &q.finished,
            &q.waiting_growth,
            &q.newest_sample,
        ];
        for query in all {
            let names = engine_names(query);
            assert!(!names.is_empty(), "{query}");
            for n in names {
                let of_contract = |m: &contract::Metric| {
                    m.series == n
                        || m.kind == contract::Kind::Histogram
                            && (m.sum_series() == n || m.count_series() == n)
                };
                assert!(
                    contract::ALL.iter().any(of_contract),
                    "{n} in {query} is not a series of the metrics contract"
                );
            }
        }
        assert!(
            q.queue_wait_p99
                .contains(contract::QUEUE_WAIT_SECONDS.series)
        );
    }

    #[test]
    fn no_series_is_no_data() {
        assert!(matches!(
            assemble(&Answers::default()),
            Err(MetricsProblem::NoData(_))
        ));
    }

    #[test]
    fn each_engine_with_a_latency_is_a_point_of_the_pod_model() {
        let a = Answers {
            tokens_per_pod: series(&[("a", 100.0), ("b", 40.0), ("c", 0.0)]),
            itl_per_pod: series(&[("a", 0.04), ("b", 0.025), ("c", f64::NAN)]),
            running_per_pod: series(&[("a", 8.0), ("b", 2.0), ("c", 0.0)]),
            waiting: series(&[("", 3.0)]),
            queue_wait_p99: series(&[("", f64::NAN)]),
            kv_utilization: series(&[("", 0.5)]),
            evictions: series(&[("", 0.25)]),
            refusals: series(&[]),
            finished: series(&[("", 0.5)]),
            waiting_growth: series(&[("", -0.1)]),
            newest_sample: series(&[("", 1_700_000_000.5)]),
        };
        let m = assemble(&a).expect("metrics");
        assert_eq!(m.decode_tokens_per_second, 140.0);
        // The idle engine (0/0 latency) gives no point.
        let points: Vec<(f64, f64)> = m
            .step_samples
            .iter()
            .map(|p| (p.batch, p.itl_seconds))
            .collect();
        assert_eq!(points, vec![(8.0, 0.04), (2.0, 0.025)]);
        assert_eq!(
            (m.requests_finished_per_second, m.waiting_growth_per_second),
            (0.5, -0.1)
        );
        assert_eq!(m.running, 10.0);
        assert_eq!(m.waiting, 3.0);
        assert_eq!(m.pods_reporting, 3);
        assert_eq!(
            m.queue_wait_p99_seconds, None,
            "NaN quantile means nothing queued"
        );
        assert_eq!(m.sampled_at, 1_700_000_000_500);
        assert_eq!(m.evictions_per_second, 0.25);
    }

    #[tokio::test]
    async fn unreachable_prometheus_is_reported() {
        let p = PrometheusMetrics::new(Some("http://127.0.0.1:1".to_string()));
        let spec: InferencePoolSpec = serde_json::from_value(serde_json::json!({
            "model": {"name": "m", "uri": "file:///m"},
            "engine": {"image": "e"},
            "replicas": {"max": 2}
        }))
        .expect("spec");
        let pool = PoolRef {
            namespace: "ns".into(),
            name: "p".into(),
        };
        let r = p.read(&pool, &spec, &[], 0).await;
        assert!(matches!(r, Err(MetricsProblem::Unreachable(_))), "{r:?}");
    }
}
