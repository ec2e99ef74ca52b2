//! Picks a pool's metrics source from its spec (`spec.scaling.metrics.source`): Prometheus
//! (PromQL) or Direct (each engine's /metrics scraped by the operator).

use tidegate_api::{InferencePoolSpec, MetricsSourceKind};

use crate::plan::{MetricsProblem, PoolMetrics};
use crate::ports::{Endpoint, MetricsSource, PoolRef};

/// Dispatches to `prometheus` or `direct` per pool.
pub struct SourceSwitch<P, D> {
    pub prometheus: P,
    pub direct: D,
}

impl<P: MetricsSource, D: MetricsSource> MetricsSource for SourceSwitch<P, D> {
    async fn read(
        &self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        endpoints: &[Endpoint],
        now_ms: u64,
    ) -> Result<PoolMetrics, MetricsProblem> {
        match spec.scaling.metrics.source {
            MetricsSourceKind::Prometheus => {
                self.prometheus.read(pool, spec, endpoints, now_ms).await
            }
            MetricsSourceKind::Direct => self.direct.read(pool, spec, endpoints, now_ms).await,
        }
    }
}
