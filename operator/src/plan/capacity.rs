//! Per-replica decode capacity (tokens/s at saturation), learned from measurements.
//!
//! Invariants: capacity is always positive; it starts from the spec's hint (or from
//! maxBatchSize × r when there is none) and moves only on evidence: towards what saturated
//! pods deliver (exponentially smoothed), and up at once when an unsaturated pod already
//! delivers more than we believed possible.

use tidegate_api::InferencePoolSpec;

use super::PoolMetrics;

/// Weight of a new saturated measurement in the smoothed capacity.
const ALPHA: f64 = 0.3;

/// Learned capacity of one replica.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CapacityModel {
    /// Tokens/s one replica produces at saturation; None until seeded.
    tokens_per_second: Option<f64>,
    /// Saturated measurements seen so far.
    pub samples: u64,
}

impl CapacityModel {
    /// A model that starts from a known capacity (e.g. restored from status).
    pub fn restored(tokens_per_second: f64) -> Self {
        CapacityModel {
            tokens_per_second: (tokens_per_second > 0.0).then_some(tokens_per_second),
            samples: 0,
        }
    }

    /// The seed when nothing has been measured yet.
    pub fn seed(spec: &InferencePoolSpec) -> f64 {
        spec.scaling
            .capacity_hint_tokens_per_second
            .unwrap_or_else(|| {
                f64::from(spec.engine.max_batch_size) * spec.slo.tokens_per_second_per_session
            })
    }

    /// Learns from one measurement of the pool.
    pub fn observe(&mut self, spec: &InferencePoolSpec, m: &PoolMetrics, replicas: i32) {
        let mut cap = self.tokens_per_second.unwrap_or_else(|| Self::seed(spec));
        if !m.saturated_pod_tokens_per_second.is_empty() {
            let n = m.saturated_pod_tokens_per_second.len() as f64;
            let mean = m.saturated_pod_tokens_per_second.iter().sum::<f64>() / n;
            if mean > 0.0 {
                cap = if self.samples == 0 && spec.scaling.capacity_hint_tokens_per_second.is_none()
                {
                    mean
                } else {
                    ALPHA * mean + (1.0 - ALPHA) * cap
                };
                self.samples += 1;
            }
        } else if replicas > 0 {
            // Not saturated: a replica can do at least what it is doing now.
            let per_replica = m.decode_tokens_per_second / f64::from(replicas);
            cap = cap.max(per_replica);
        }
        self.tokens_per_second = Some(cap.max(1e-3));
    }

    /// Current belief; 0 before the first observation.
    pub fn per_replica(&self) -> f64 {
        self.tokens_per_second.unwrap_or(0.0)
    }
}
