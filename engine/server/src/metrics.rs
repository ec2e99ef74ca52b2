//! The engine's Prometheus metrics (`tidegate_engine_*`), one registry per process.
//!
//! Invariants: names, help texts, labels and histogram buckets come from the metrics contract
//! (`tidegate_api::engine_metrics`), which the operator and its simulator read too; this
//! registry registers every metric of the contract exactly once and nothing else (the test
//! below checks the rendered text against it). Labels are bounded (tier names from the
//! pushed policy, fixed enums for reason / action / source / outcome), never a tenant id,
//! session id or request id. The server records
//! latencies, rejections and outcomes; the engine loop records token counters, queue and
//! KV gauges, evictions and restores.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tidegate_api::engine_metrics::{self as contract, Metric as Def};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    pub tier: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    pub tier: String,
    /// `drop` or `offload`.
    pub action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestoreLabel {
    /// Restores: `resident`, `host`, `disk` or `recompute`; restore failures: `host` or
    /// `disk` (the contract's lists).
    pub source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub tier: String,
    /// `completed`, `cancelled`, `rejected` or `failed`.
    pub outcome: &'static str,
}

type HistogramFamily = Family<TierLabel, Histogram, fn() -> Histogram>;

fn queue_wait_histogram() -> Histogram {
    Histogram::new(contract::QUEUE_WAIT_SECONDS.buckets.iter().copied())
}

fn ttft_histogram() -> Histogram {
    Histogram::new(
        contract::TIME_TO_FIRST_TOKEN_SECONDS
            .buckets
            .iter()
            .copied(),
    )
}

fn itl_histogram() -> Histogram {
    Histogram::new(
        contract::INTER_TOKEN_LATENCY_SECONDS
            .buckets
            .iter()
            .copied(),
    )
}

/// Registers `metric` under the contract's name and help.
fn register(registry: &mut Registry, def: &Def, metric: impl prometheus_client::registry::Metric) {
    registry.register(def.name, def.help, metric);
}

/// Every metric of the engine. Cheap to share (`Arc`); all fields are atomic.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub decode_tokens: Counter,
    pub prefill_tokens: Counter,
    pub queue_wait_seconds: HistogramFamily,
    pub time_to_first_token_seconds: HistogramFamily,
    pub inter_token_latency_seconds: HistogramFamily,
    pub requests_running: Gauge,
    pub requests_waiting: Gauge,
    pub kv_blocks_used: Gauge,
    pub kv_blocks_total: Gauge,
    pub evictions: Family<EvictionLabels, Counter>,
    pub restores: Family<RestoreLabel, Counter>,
    /// Offloaded KV that failed to restore, by source (`host` or `disk`).
    pub kv_restore_failures: Family<RestoreLabel, Counter>,
    pub rejections: Family<ReasonLabel, Counter>,
    /// The refusals of requests the client marked as a retry (a subset of `rejections`).
    pub retried_rejections: Family<ReasonLabel, Counter>,
    pub admission_paused: Family<TierLabel, Gauge>,
    pub requests: Family<OutcomeLabels, Counter>,
    pub resident_memory_bytes: Gauge,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::default();
        let m = Metrics {
            decode_tokens: Counter::default(),
            prefill_tokens: Counter::default(),
            queue_wait_seconds: Family::new_with_constructor(queue_wait_histogram),
            time_to_first_token_seconds: Family::new_with_constructor(ttft_histogram),
            inter_token_latency_seconds: Family::new_with_constructor(itl_histogram),
            requests_running: Gauge::default(),
            requests_waiting: Gauge::default(),
            kv_blocks_used: Gauge::default(),
            kv_blocks_total: Gauge::default(),
            evictions: Family::default(),
            restores: Family::default(),
            kv_restore_failures: Family::default(),
            rejections: Family::default(),
            retried_rejections: Family::default(),
            admission_paused: Family::default(),
            requests: Family::default(),
            resident_memory_bytes: Gauge::default(),
            registry: Registry::default(),
        };
        // Counters get their `_total` suffix from the encoder.
        let r = &mut registry;
        register(r, &contract::DECODE_TOKENS, m.decode_tokens.clone());
        register(r, &contract::PREFILL_TOKENS, m.prefill_tokens.clone());
        register(
            r,
            &contract::QUEUE_WAIT_SECONDS,
            m.queue_wait_seconds.clone(),
        );
        register(
            r,
            &contract::TIME_TO_FIRST_TOKEN_SECONDS,
            m.time_to_first_token_seconds.clone(),
        );
        register(
            r,
            &contract::INTER_TOKEN_LATENCY_SECONDS,
            m.inter_token_latency_seconds.clone(),
        );
        register(r, &contract::REQUESTS_RUNNING, m.requests_running.clone());
        register(r, &contract::REQUESTS_WAITING, m.requests_waiting.clone());
        register(r, &contract::KV_BLOCKS_USED, m.kv_blocks_used.clone());
        register(r, &contract::KV_BLOCKS_TOTAL, m.kv_blocks_total.clone());
        register(r, &contract::EVICTIONS, m.evictions.clone());
        register(r, &contract::RESTORES, m.restores.clone());
        register(
            r,
            &contract::KV_RESTORE_FAILURES,
            m.kv_restore_failures.clone(),
        );
        register(r, &contract::REJECTIONS, m.rejections.clone());
        register(
            r,
            &contract::RETRIED_REJECTIONS,
            m.retried_rejections.clone(),
        );
        register(r, &contract::ADMISSION_PAUSED, m.admission_paused.clone());
        register(r, &contract::REQUESTS, m.requests.clone());
        register(
            r,
            &contract::PROCESS_RESIDENT_MEMORY_BYTES,
            m.resident_memory_bytes.clone(),
        );
        Arc::new(Metrics { registry, ..m })
    }

    /// Counts a refusal, and apart as well when the client sent it as a retry.
    pub fn reject(&self, reason: &'static str, retry: bool) {
        self.rejections.get_or_create(&ReasonLabel { reason }).inc();
        if retry {
            self.retried_rejections
                .get_or_create(&ReasonLabel { reason })
                .inc();
        }
    }

    /// Counts a request outcome.
    pub fn outcome(&self, tier: &str, outcome: &'static str) {
        self.requests
            .get_or_create(&OutcomeLabels {
                tier: tier.to_string(),
                outcome,
            })
            .inc();
    }

    /// Observes a histogram labelled by tier.
    pub fn observe(family: &HistogramFamily, tier: &str, seconds: f64) {
        family
            .get_or_create(&TierLabel {
                tier: tier.to_string(),
            })
            .observe(seconds);
    }

    /// Raises a counter to a cumulative total taken from a snapshot (the engine loop keeps
    /// its own totals); a total below the counter's value changes nothing.
    pub fn raise_to(counter: &Counter, total: u64) {
        let now = counter.get();
        if total > now {
            counter.inc_by(total - now);
        }
    }

    /// [`Metrics::raise_to`] for `evictions_total{tier, action}`.
    pub fn evictions_total(&self, tier: &str, action: &'static str, total: u64) {
        let counter = self.evictions.get_or_create_owned(&EvictionLabels {
            tier: tier.to_string(),
            action,
        });
        Self::raise_to(&counter, total);
    }

    /// [`Metrics::raise_to`] for `restores_total{source}`.
    pub fn restores_total(&self, source: &'static str, total: u64) {
        let counter = self.restores.get_or_create_owned(&RestoreLabel { source });
        Self::raise_to(&counter, total);
    }

    /// [`Metrics::raise_to`] for `kv_restore_failures_total{source}`.
    pub fn kv_restore_failures_total(&self, source: &'static str, total: u64) {
        let counter = self
            .kv_restore_failures
            .get_or_create_owned(&RestoreLabel { source });
        Self::raise_to(&counter, total);
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        if let Some(rss) = resident_memory_bytes() {
            self.resident_memory_bytes.set(rss);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// This process's RSS, from procfs (None elsewhere).
pub fn resident_memory_bytes() -> Option<i64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use tidegate_api::engine_metrics::{ALL, Kind, lookup};
    use tidegate_api::exposition::samples;

    use super::*;

    /// A registry with one child in every family, so every label set is rendered.
    fn every_family_touched() -> Arc<Metrics> {
        let m = Metrics::new();
        m.decode_tokens.inc();
        m.prefill_tokens.inc();
        for family in [
            &m.queue_wait_seconds,
            &m.time_to_first_token_seconds,
            &m.inter_token_latency_seconds,
        ] {
            Metrics::observe(family, "gold", 0.1);
        }
        m.evictions_total("free", "offload", 1);
        m.restores_total("disk", 1);
        m.kv_restore_failures
            .get_or_create(&RestoreLabel { source: "host" })
            .inc();
        m.reject("queue_full", true);
        m.admission_paused
            .get_or_create(&TierLabel {
                tier: "free".into(),
            })
            .set(1);
        m.outcome("gold", "completed");
        m.resident_memory_bytes.set(1);
        m
    }

    /// `(name, kind)` of every `# TYPE` line.
    fn declared(text: &str) -> Vec<(String, String)> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .map(|(n, k)| (n.to_string(), k.to_string()))
            .collect()
    }

    #[test]
    fn the_rendered_metrics_are_exactly_the_contract() {
        let text = every_family_touched().encode().expect("encode");
        // Every family of the contract, once, of its kind, and nothing else.
        let want: Vec<(String, String)> = ALL
            .iter()
            .map(|d| {
                let kind = match d.kind {
                    Kind::Counter => "counter",
                    Kind::Gauge => "gauge",
                    Kind::Histogram => "histogram",
                };
                (d.name.to_string(), kind.to_string())
            })
            .collect();
        assert_eq!(declared(&text), want, "{text}");
        let mut le_seen: BTreeSet<(&str, u64)> = BTreeSet::new();
        for s in samples(&text) {
            let d = lookup(s.name).unwrap_or_else(|| panic!("{} is not in the contract", s.name));
            let keys: Vec<&str> = s
                .labels
                .iter()
                .map(|(k, _)| *k)
                .filter(|k| *k != "le")
                .collect();
            let want_keys: Vec<&str> = d.labels.iter().map(|l| l.name).collect();
            assert_eq!(keys, want_keys, "labels of {}", s.name);
            for l in d.labels.iter().filter(|l| !l.values.is_empty()) {
                let v = s.label(l.name).unwrap_or_default();
                assert!(
                    l.values.contains(&v),
                    "{}: {}={v} not in {:?}",
                    s.name,
                    l.name,
                    l.values
                );
            }
            if let Some(le) = s.label("le").filter(|le| *le != "+Inf") {
                le_seen.insert((d.name, le.parse::<f64>().expect("le").to_bits()));
            }
        }
        // Exactly the contract's bucket bounds.
        for d in ALL.iter().filter(|d| d.kind == Kind::Histogram) {
            // Bits order like the values for positive bounds; compared as values, so a
            // failure prints seconds.
            let rendered: Vec<f64> = le_seen
                .iter()
                .filter(|(n, _)| *n == d.name)
                .map(|(_, b)| f64::from_bits(*b))
                .collect();
            assert_eq!(rendered, d.buckets, "buckets of {}", d.name);
        }
    }

    #[test]
    fn exposes_contract_names() {
        let m = Metrics::new();
        m.decode_tokens.inc();
        m.prefill_tokens.inc();
        Metrics::observe(&m.queue_wait_seconds, "gold", 0.1);
        Metrics::observe(&m.time_to_first_token_seconds, "gold", 0.1);
        Metrics::observe(&m.inter_token_latency_seconds, "gold", 0.01);
        m.evictions
            .get_or_create(&EvictionLabels {
                tier: "free".into(),
                action: "drop",
            })
            .inc();
        m.restores_total("host", 1);
        m.restores_total("host", 1);
        m.kv_restore_failures_total("disk", 1);
        Metrics::raise_to(&m.decode_tokens, 0);
        m.reject("queue_full", false);
        m.reject("queue_timeout", true);
        m.admission_paused
            .get_or_create(&TierLabel {
                tier: "free".into(),
            })
            .set(1);
        m.outcome("gold", "completed");
        let text = m.encode().unwrap();
        for name in [
            "tidegate_engine_decode_tokens_total 1",
            "tidegate_engine_prefill_tokens_total 1",
            "tidegate_engine_queue_wait_seconds_bucket{le=\"0.1\",tier=\"gold\"} 1",
            "tidegate_engine_time_to_first_token_seconds_count{tier=\"gold\"} 1",
            "tidegate_engine_inter_token_latency_seconds_count{tier=\"gold\"} 1",
            "tidegate_engine_requests_running 0",
            "tidegate_engine_requests_waiting 0",
            "tidegate_engine_kv_blocks_used 0",
            "tidegate_engine_kv_blocks_total 0",
            "tidegate_engine_evictions_total{tier=\"free\",action=\"drop\"} 1",
            "tidegate_engine_restores_total{source=\"host\"} 1",
            "tidegate_engine_kv_restore_failures_total{source=\"disk\"} 1",
            "tidegate_engine_rejections_total{reason=\"queue_full\"} 1",
            "tidegate_engine_rejections_total{reason=\"queue_timeout\"} 1",
            "tidegate_engine_retried_rejections_total{reason=\"queue_timeout\"} 1",
            "tidegate_engine_admission_paused{tier=\"free\"} 1",
            "tidegate_engine_requests_total{tier=\"gold\",outcome=\"completed\"} 1",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
