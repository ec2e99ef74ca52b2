//! The engine metrics contract: every `tidegate_engine_*` metric's name, kind, labels and
//! (for histograms) bucket bounds, defined once. The engine registers exactly these; the
//! operator's PromQL queries, its direct scraper and the simulator read them by these
//! constants, never by a name or a bound of their own.
//!
//! Invariants:
//! - A family name never changes once released: dashboards, alerts and the operator's
//!   queries scale on it. Counters are named without `_total` (the exposition adds it);
//!   [`Metric::series`] is the name of the sample line the operator reads.
//! - Labels are bounded: tier names come from the pushed TierPolicy, every other label takes
//!   one of the values listed here; never a tenant, session or request id.
//! - Bucket bounds are ascending and finite; `+Inf` is implied. The simulator observes its
//!   queue waits into [`QUEUE_WAIT_BUCKETS`], so the p99 it plans on is the one a real pool's
//!   histogram gives.

/// How a metric is exposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Exposed as `<name>_total`.
    Counter,
    /// Exposed as `<name>`.
    Gauge,
    /// Exposed as `<name>_bucket{le=…}`, `<name>_sum` and `<name>_count`.
    Histogram,
}

/// One label of a metric.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Label {
    pub name: &'static str,
    /// The values it takes; empty for `tier`, whose values are the pushed TierPolicy's names.
    pub values: &'static [&'static str],
}

/// One metric family of the engine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Metric {
    /// The family name (as registered and in `# TYPE` lines).
    pub name: &'static str,
    /// The sample series the operator reads: `_total` for a counter, `_bucket` for a
    /// histogram, the name itself for a gauge. Written out so queries can use it as a
    /// constant; `contract_tests` check it against `name` and `kind`.
    pub series: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub labels: &'static [Label],
    /// Upper bounds in seconds of a histogram's buckets; empty for other kinds.
    pub buckets: &'static [f64],
}

const TIER: Label = Label {
    name: "tier",
    values: &[],
};

/// Restore sources of `restores_total` (the KV cache's `KvSource`, less `fresh`).
pub const RESTORE_SOURCES: &[&str] = &["resident", "host", "disk", "recompute"];
/// Offload tiers a restore can fail from.
pub const RESTORE_FAILURE_SOURCES: &[&str] = &["host", "disk"];
/// Eviction actions.
pub const EVICTION_ACTIONS: &[&str] = &["drop", "offload"];
/// Request outcomes.
pub const OUTCOMES: &[&str] = &["completed", "cancelled", "rejected", "failed"];
/// Outcomes of requests that were admitted and have left the engine (every outcome but
/// `rejected`): their rate, with the running gauge, gives how long a request holds a slot.
pub const FINISHED_OUTCOMES: &[&str] = &["completed", "cancelled", "failed"];
/// Rejection reasons that mean the pool is overloaded (what the operator counts as overload
/// refusals); every other reason is about the request or the tenant.
pub const OVERLOAD_REASONS: &[&str] = &["queue_full", "queue_timeout"];

/// Queue-wait histogram bounds, seconds: fine from 0.25 s to 8 s, where the queue-wait
/// targets lie (enterprise 0.5 s, default 1 s, free 5 s), so the interpolated p99 near a
/// target is within a fraction of it.
pub const QUEUE_WAIT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 15.0, 30.0,
    60.0,
];
/// Time-to-first-token histogram bounds, seconds.
pub const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];
/// Inter-token latency histogram bounds, seconds.
pub const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
];

impl Metric {
    /// The sample series its kind gives the family name (what `series` must spell out).
    pub fn series_of_kind(&self) -> String {
        match self.kind {
            Kind::Counter => format!("{}_total", self.name),
            Kind::Gauge => self.name.to_string(),
            Kind::Histogram => format!("{}_bucket", self.name),
        }
    }

    /// A histogram's `_sum` series (seconds observed in all).
    pub fn sum_series(&self) -> String {
        format!("{}_sum", self.name)
    }

    /// A histogram's `_count` series (observations).
    pub fn count_series(&self) -> String {
        format!("{}_count", self.name)
    }
}

const fn counter(
    name: &'static str,
    series: &'static str,
    help: &'static str,
    labels: &'static [Label],
) -> Metric {
    Metric {
        name,
        series,
        kind: Kind::Counter,
        help,
        labels,
        buckets: &[],
    }
}

const fn gauge(name: &'static str, help: &'static str, labels: &'static [Label]) -> Metric {
    Metric {
        name,
        series: name,
        kind: Kind::Gauge,
        help,
        labels,
        buckets: &[],
    }
}

const fn histogram(
    name: &'static str,
    series: &'static str,
    help: &'static str,
    buckets: &'static [f64],
) -> Metric {
    Metric {
        name,
        series,
        kind: Kind::Histogram,
        help,
        labels: &[TIER],
        buckets,
    }
}

pub const DECODE_TOKENS: Metric = counter(
    "tidegate_engine_decode_tokens",
    "tidegate_engine_decode_tokens_total",
    "Tokens generated by decode steps",
    &[],
);
pub const PREFILL_TOKENS: Metric = counter(
    "tidegate_engine_prefill_tokens",
    "tidegate_engine_prefill_tokens_total",
    "Prompt tokens computed by prefill",
    &[],
);
pub const QUEUE_WAIT_SECONDS: Metric = histogram(
    "tidegate_engine_queue_wait_seconds",
    "tidegate_engine_queue_wait_seconds_bucket",
    "Time admitted requests waited in the queue, by tier",
    QUEUE_WAIT_BUCKETS,
);
pub const TIME_TO_FIRST_TOKEN_SECONDS: Metric = histogram(
    "tidegate_engine_time_to_first_token_seconds",
    "tidegate_engine_time_to_first_token_seconds_bucket",
    "Time from arrival to the first output token, by tier",
    TTFT_BUCKETS,
);
pub const INTER_TOKEN_LATENCY_SECONDS: Metric = histogram(
    "tidegate_engine_inter_token_latency_seconds",
    "tidegate_engine_inter_token_latency_seconds_bucket",
    "Time between consecutive output tokens of a request, by tier",
    ITL_BUCKETS,
);
pub const REQUESTS_RUNNING: Metric = gauge(
    "tidegate_engine_requests_running",
    "Requests admitted and generating",
    &[],
);
pub const REQUESTS_WAITING: Metric = gauge(
    "tidegate_engine_requests_waiting",
    "Requests queued for admission",
    &[],
);
pub const KV_BLOCKS_USED: Metric = gauge(
    "tidegate_engine_kv_blocks_used",
    "KV cache blocks in use (running and retained sessions)",
    &[],
);
pub const KV_BLOCKS_TOTAL: Metric = gauge(
    "tidegate_engine_kv_blocks_total",
    "KV cache blocks in the pool",
    &[],
);
pub const EVICTIONS: Metric = counter(
    "tidegate_engine_evictions",
    "tidegate_engine_evictions_total",
    "Idle sessions evicted from the KV cache, by tier and action (drop|offload)",
    &[
        TIER,
        Label {
            name: "action",
            values: EVICTION_ACTIONS,
        },
    ],
);
pub const RESTORES: Metric = counter(
    "tidegate_engine_restores",
    "tidegate_engine_restores_total",
    "Returning sessions whose KV was reused, by source (resident|host|disk|recompute)",
    &[Label {
        name: "source",
        values: RESTORE_SOURCES,
    }],
);
pub const KV_RESTORE_FAILURES: Metric = counter(
    "tidegate_engine_kv_restore_failures",
    "tidegate_engine_kv_restore_failures_total",
    "Offloaded KV that could not be restored (the session recomputes), by source (host|disk)",
    &[Label {
        name: "source",
        values: RESTORE_FAILURE_SOURCES,
    }],
);
pub const REJECTIONS: Metric = counter(
    "tidegate_engine_rejections",
    "tidegate_engine_rejections_total",
    "Requests refused, by reason",
    // The reasons are the server's error kinds (bounded, but owned by the server); the ones
    // the operator reads are OVERLOAD_REASONS.
    &[Label {
        name: "reason",
        values: &[],
    }],
);
pub const RETRIED_REJECTIONS: Metric = counter(
    "tidegate_engine_retried_rejections",
    "tidegate_engine_retried_rejections_total",
    "Refused requests the client marked as a retry (x-stainless-retry-count > 0), by reason: a subset of rejections_total",
    &[Label {
        name: "reason",
        values: &[],
    }],
);
pub const ADMISSION_PAUSED: Metric = gauge(
    "tidegate_engine_admission_paused",
    "1 while new tenants of the tier are refused, else 0",
    &[TIER],
);
pub const REQUESTS: Metric = counter(
    "tidegate_engine_requests",
    "tidegate_engine_requests_total",
    "Requests by tier and outcome (completed|cancelled|rejected|failed)",
    &[
        TIER,
        Label {
            name: "outcome",
            values: OUTCOMES,
        },
    ],
);
pub const PROCESS_RESIDENT_MEMORY_BYTES: Metric = gauge(
    "tidegate_engine_process_resident_memory_bytes",
    "Resident set size of the engine process",
    &[],
);

/// Every metric of the engine, in registration order.
pub const ALL: &[Metric] = &[
    DECODE_TOKENS,
    PREFILL_TOKENS,
    QUEUE_WAIT_SECONDS,
    TIME_TO_FIRST_TOKEN_SECONDS,
    INTER_TOKEN_LATENCY_SECONDS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    KV_BLOCKS_USED,
    KV_BLOCKS_TOTAL,
    EVICTIONS,
    RESTORES,
    KV_RESTORE_FAILURES,
    REJECTIONS,
    RETRIED_REJECTIONS,
    ADMISSION_PAUSED,
    REQUESTS,
    PROCESS_RESIDENT_MEMORY_BYTES,
];

/// The contract metric whose family or sample series is `name` (a histogram's `_sum` and
/// `_count` included).
pub fn lookup(name: &str) -> Option<&'static Metric> {
    ALL.iter().find(|m| {
        name == m.name
            || name == m.series
            || (m.kind == Kind::Histogram
                && [Some("_sum"), Some("_count")].contains(&name.strip_prefix(m.name)))
    })
}

#[cfg(test)]
mod contract_tests {
    use super::*;

    #[test]
    fn series_names_follow_the_kind() {
        for m in ALL {
            assert_eq!(m.series, m.series_of_kind(), "{}", m.name);
            assert!(m.name.starts_with("tidegate_engine_"), "{}", m.name);
            assert_eq!(
                m.kind == Kind::Histogram,
                !m.buckets.is_empty(),
                "{}",
                m.name
            );
        }
    }

    #[test]
    fn bounds_are_ascending_and_finite() {
        for m in ALL {
            assert!(
                m.buckets.windows(2).all(|w| w[0] < w[1]),
                "{}: {:?}",
                m.name,
                m.buckets
            );
            assert!(m.buckets.iter().all(|b| b.is_finite() && *b > 0.0));
        }
    }

    #[test]
    fn the_metrics_reference_lists_every_metric() {
        let doc = include_str!("../../../docs/operations.md");
        for m in ALL {
            let shown = match m.kind {
                Kind::Histogram => m.name,
                _ => m.series,
            };
            assert!(
                doc.contains(&format!("| `{shown}` |")),
                "{shown} is missing from the metrics reference in docs/operations.md"
            );
        }
    }

    #[test]
    fn the_dashboard_and_alerts_read_only_contract_series() {
        let sources = [
            include_str!("../../../charts/tidegate/dashboards/tidegate-overview.json"),
            include_str!("../../../charts/tidegate/alerts/tidegate-alerts.yaml"),
        ];
        for text in sources {
            for (i, _) in text.match_indices("tidegate_engine_") {
                let rest = &text[i..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                let name = &rest[..end];
                assert!(
                    lookup(name).is_some(),
                    "{name} is not in the metrics contract"
                );
            }
        }
    }

    #[test]
    fn names_are_unique_and_looked_up() {
        for (i, m) in ALL.iter().enumerate() {
            assert!(ALL[..i].iter().all(|o| o.name != m.name), "{}", m.name);
            assert_eq!(lookup(m.series), Some(m));
        }
        assert_eq!(
            lookup("tidegate_engine_queue_wait_seconds_count"),
            Some(&QUEUE_WAIT_SECONDS)
        );
        assert_eq!(lookup("tidegate_engine_decode_tokens_sum"), None);
    }
}
