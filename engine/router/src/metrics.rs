//! The router's Prometheus metrics (`tidegate_router_*`).
//!
//! Invariants: names, help texts, labels and buckets come from the router contract
//! (`tidegate_api::router`); every family of it is registered exactly once (the test
//! checks the rendered text against it); labels are bounded (tier names from the pushed
//! policy, fixed enums otherwise), never a tenant or session id.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tidegate_api::router as contract;

use super::dispatch::{Affinity, DispatchObserver, Key};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub tier: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AffinityLabels {
    pub key: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    pub tier: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

fn queue_wait_histogram() -> Histogram {
    Histogram::new(contract::QUEUE_WAIT.buckets.iter().copied())
}

/// The router's registry and its families.
#[derive(Debug)]
pub struct RouterMetrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub affinity: Family<AffinityLabels, Counter>,
    pub queue_wait: Family<TierLabel, Histogram, fn() -> Histogram>,
    pub queued: Gauge,
    pub held: Gauge,
    pub endpoints: Family<StateLabel, Gauge>,
}

impl RouterMetrics {
    pub fn new() -> Arc<Self> {
        let mut m = RouterMetrics {
            registry: Registry::default(),
            requests: Family::default(),
            affinity: Family::default(),
            queue_wait: Family::new_with_constructor(queue_wait_histogram),
            queued: Gauge::default(),
            held: Gauge::default(),
            endpoints: Family::default(),
        };
        let r = &mut m.registry;
        r.register(
            contract::REQUESTS.name,
            contract::REQUESTS.help,
            m.requests.clone(),
        );
        r.register(
            contract::AFFINITY.name,
            contract::AFFINITY.help,
            m.affinity.clone(),
        );
        r.register(
            contract::QUEUE_WAIT.name,
            contract::QUEUE_WAIT.help,
            m.queue_wait.clone(),
        );
        r.register(
            contract::QUEUED.name,
            contract::QUEUED.help,
            m.queued.clone(),
        );
        r.register(contract::HELD.name, contract::HELD.help, m.held.clone());
        r.register(
            contract::ENDPOINTS.name,
            contract::ENDPOINTS.help,
            m.endpoints.clone(),
        );
        Arc::new(m)
    }

    pub fn outcome(&self, tier: &str, outcome: &'static str) {
        self.requests
            .get_or_create(&RequestLabels {
                tier: tier.to_string(),
                outcome,
            })
            .inc();
    }

    pub fn queue_waited(&self, tier: &str, seconds: f64) {
        self.queue_wait
            .get_or_create(&TierLabel {
                tier: tier.to_string(),
            })
            .observe(seconds);
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Feeds dispatch events into the metrics.
#[derive(Debug)]
pub struct MetricsObserver(pub Arc<RouterMetrics>);

impl DispatchObserver for MetricsObserver {
    fn placed(&self, key: Option<Key>, affinity: Option<Affinity>) {
        if let (Some(k), Some(a)) = (key, affinity) {
            self.0
                .affinity
                .get_or_create(&AffinityLabels {
                    key: k.kind.as_str(),
                    result: a.as_str(),
                })
                .inc();
        }
    }

    fn gauges(&self, queued: usize, held: usize, states: &[(&'static str, u64)]) {
        self.0.queued.set(queued as i64);
        self.0.held.set(held as i64);
        for (state, n) in states {
            self.0
                .endpoints
                .get_or_create(&StateLabel { state })
                .set(*n as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_every_contract_family() {
        let m = RouterMetrics::new();
        m.outcome("free", "served");
        m.queue_waited("free", 0.1);
        m.affinity
            .get_or_create(&AffinityLabels {
                key: "session",
                result: "hit",
            })
            .inc();
        MetricsObserver(Arc::clone(&m)).gauges(0, 0, &[("ready", 1)]);
        let text = m.encode().unwrap();
        assert!(
            !text.contains(".."),
            "help texts end without a period: {text}"
        );
        for def in contract::ALL {
            assert!(
                text.contains(&format!("# TYPE {} ", def.name)),
                "{} missing:\n{text}",
                def.name
            );
            assert!(text.contains(def.series), "{} series missing", def.series);
        }
    }
}
