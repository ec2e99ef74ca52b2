//! The operator's own metrics (`tidegate_operator_*`, prometheus-client) and the HTTP server
//! for `/metrics` and `/healthz`.
//!
//! Label values are bounded: namespace and pool names of existing pools, a fixed set of
//! directions and error reasons. A deleted pool's series are removed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tidegate_api::AdmissionState;

use crate::driver::TickOutcome;
use crate::plan::{ForecastPlan, Standing};
use crate::ports::PoolRef;
use crate::status_write::StatusWrite;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub namespace: String,
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub namespace: String,
    pub pool: String,
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Every `tidegate_operator_*` metric.
pub struct OperatorMetrics {
    registry: Registry,
    pub reconciles: Counter,
    pub reconcile_errors: Family<ReasonLabel, Counter>,
    pub desired_replicas: Family<PoolLabels, Gauge>,
    pub ready_replicas: Family<PoolLabels, Gauge>,
    pub capacity: Family<PoolLabels, FloatGauge>,
    pub itl_base: Family<PoolLabels, FloatGauge>,
    pub itl_per_sequence: Family<PoolLabels, FloatGauge>,
    pub sessions_at_slo: Family<PoolLabels, FloatGauge>,
    pub utilization: Family<PoolLabels, FloatGauge>,
    pub queue_wait_p99: Family<PoolLabels, FloatGauge>,
    pub admission_paused: Family<PoolLabels, Gauge>,
    pub metrics_available: Family<PoolLabels, Gauge>,
    pub forecast_in_use: Family<PoolLabels, Gauge>,
    pub forecast_peak_replicas: Family<PoolLabels, Gauge>,
    pub forecast_lead_time: Family<PoolLabels, FloatGauge>,
    pub forecast_error: Family<PoolLabels, FloatGauge>,
    pub forecast_trend_replicas: Family<PoolLabels, Gauge>,
    pub scaling_decisions: Family<DecisionLabels, Counter>,
    pub status_writes: Family<ReasonLabel, Counter>,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OperatorMetrics {
    pub fn new() -> Self {
        let mut m = OperatorMetrics {
            registry: Registry::with_prefix("tidegate_operator"),
            reconciles: Counter::default(),
            reconcile_errors: Family::default(),
            desired_replicas: Family::default(),
            ready_replicas: Family::default(),
            capacity: Family::default(),
            itl_base: Family::default(),
            itl_per_sequence: Family::default(),
            sessions_at_slo: Family::default(),
            utilization: Family::default(),
            queue_wait_p99: Family::default(),
            admission_paused: Family::default(),
            metrics_available: Family::default(),
            forecast_in_use: Family::default(),
            forecast_peak_replicas: Family::default(),
            forecast_lead_time: Family::default(),
            forecast_error: Family::default(),
            forecast_trend_replicas: Family::default(),
            scaling_decisions: Family::default(),
            status_writes: Family::default(),
        };
        let r = &mut m.registry;
        r.register("reconciles", "Reconciles run", m.reconciles.clone());
        r.register(
            "status_writes",
            "Ticks by what they did with the pool's status: changed, figures, heartbeat (written) or skip",
            m.status_writes.clone(),
        );
        r.register(
            "reconcile_errors",
            "Reconciles that failed, by reason",
            m.reconcile_errors.clone(),
        );
        r.register(
            "desired_replicas",
            "Replicas decided",
            m.desired_replicas.clone(),
        );
        r.register(
            "ready_replicas",
            "Engine pods ready",
            m.ready_replicas.clone(),
        );
        r.register(
            "capacity_tokens_per_second",
            "Demand one replica serves at the SLO: sessions at the SLO × r",
            m.capacity.clone(),
        );
        r.register(
            "pod_itl_base_seconds",
            "Learned pod model: step time of an empty batch (A in ITL = A + B·k)",
            m.itl_base.clone(),
        );
        r.register(
            "pod_itl_per_sequence_seconds",
            "Learned pod model: step time each running sequence adds (B in ITL = A + B·k)",
            m.itl_per_sequence.clone(),
        );
        r.register(
            "pod_sessions_at_slo",
            "Sessions a replica holds while each still gets the SLO's tokens/s (k*)",
            m.sessions_at_slo.clone(),
        );
        r.register(
            "utilization",
            "Demand over capacity of the ready replicas",
            m.utilization.clone(),
        );
        r.register(
            "queue_wait_p99_seconds",
            "p99 queue wait the decision used",
            m.queue_wait_p99.clone(),
        );
        r.register(
            "admission_paused",
            "1 while the pool pauses new tenants",
            m.admission_paused.clone(),
        );
        r.register(
            "metrics_available",
            "1 when the last decision had fresh metrics",
            m.metrics_available.clone(),
        );
        r.register(
            "forecast_in_use",
            "1 while the planner scales ahead of the demand forecast",
            m.forecast_in_use.clone(),
        );
        r.register(
            "forecast_next_hour_peak_replicas",
            "Replicas the forecast's peak over the next hour needs at the target occupancy",
            m.forecast_peak_replicas.clone(),
        );
        r.register(
            "forecast_lead_time_seconds",
            "How far ahead the forecast orders: the measured start-up time of the pool's replicas",
            m.forecast_lead_time.clone(),
        );
        r.register(
            "forecast_recent_error",
            "Recent relative error of the forecast one lead time ahead (0.1 = 10%)",
            m.forecast_error.clone(),
        );
        r.register(
            "forecast_trend_replicas",
            "Replicas the demand's rising trend needs one lead time ahead (0 while it is not rising)",
            m.forecast_trend_replicas.clone(),
        );
        r.register(
            "scaling_decisions",
            "Scaling decisions made, by direction",
            m.scaling_decisions.clone(),
        );
        m
    }

    fn labels(pool: &PoolRef) -> PoolLabels {
        PoolLabels {
            namespace: pool.namespace.clone(),
            pool: pool.name.clone(),
        }
    }

    /// Records one successful tick.
    pub fn record(&self, pool: &PoolRef, outcome: &TickOutcome) {
        let l = Self::labels(pool);
        let plan = &outcome.plan;
        self.desired_replicas
            .get_or_create(&l)
            .set(plan.desired_replicas.into());
        self.ready_replicas
            .get_or_create(&l)
            .set(outcome.workload.ready_replicas.into());
        if let Some(m) = &plan.measured {
            self.capacity
                .get_or_create(&l)
                .set(m.pod.capacity_tokens_per_second);
            self.itl_base.get_or_create(&l).set(m.pod.line.base_seconds);
            self.itl_per_sequence
                .get_or_create(&l)
                .set(m.pod.line.per_sequence_seconds);
            self.sessions_at_slo.get_or_create(&l).set(m.pod.sessions);
            self.utilization.get_or_create(&l).set(m.utilization);
            self.queue_wait_p99
                .get_or_create(&l)
                .set(m.queue_wait_p99.as_secs_f64());
        }
        if let Some(f) = &plan.forecast {
            self.record_forecast(&l, f);
        }
        let paused = plan.admission.state == AdmissionState::PausedNewTenants;
        self.admission_paused
            .get_or_create(&l)
            .set(i64::from(paused));
        self.metrics_available
            .get_or_create(&l)
            .set(i64::from(plan.measured.is_some()));
        if let Some(d) = &plan.decision
            && d.to != d.from
        {
            let direction = if d.to > d.from { "up" } else { "down" };
            self.scaling_decisions
                .get_or_create(&DecisionLabels {
                    namespace: pool.namespace.clone(),
                    pool: pool.name.clone(),
                    direction: direction.to_string(),
                })
                .inc();
        }
    }

    fn record_forecast(&self, l: &PoolLabels, f: &ForecastPlan) {
        self.forecast_in_use
            .get_or_create(l)
            .set(i64::from(f.standing == Standing::InUse));
        match f.next_hour_peak_replicas {
            Some(n) => {
                self.forecast_peak_replicas.get_or_create(l).set(n.into());
            }
            None => {
                self.forecast_peak_replicas.remove(l);
            }
        }
        self.forecast_lead_time
            .get_or_create(l)
            .set(f.lead_time_ms as f64 / 1e3);
        match f.recent_error {
            Some(e) => {
                self.forecast_error.get_or_create(l).set(e);
            }
            None => {
                self.forecast_error.remove(l);
            }
        }
        self.forecast_trend_replicas
            .get_or_create(l)
            .set(f.trend_replicas.unwrap_or(0).into());
    }

    /// Drops a deleted pool's series.
    pub fn forget(&self, pool: &PoolRef) {
        let l = Self::labels(pool);
        self.desired_replicas.remove(&l);
        self.ready_replicas.remove(&l);
        self.capacity.remove(&l);
        self.itl_base.remove(&l);
        self.itl_per_sequence.remove(&l);
        self.sessions_at_slo.remove(&l);
        self.utilization.remove(&l);
        self.queue_wait_p99.remove(&l);
        self.admission_paused.remove(&l);
        self.metrics_available.remove(&l);
        self.forecast_in_use.remove(&l);
        self.forecast_peak_replicas.remove(&l);
        self.forecast_lead_time.remove(&l);
        self.forecast_error.remove(&l);
        self.forecast_trend_replicas.remove(&l);
        for direction in ["up", "down"] {
            self.scaling_decisions.remove(&DecisionLabels {
                namespace: pool.namespace.clone(),
                pool: pool.name.clone(),
                direction: direction.to_string(),
            });
        }
    }

    /// Counts a tick's status decision.
    pub fn status_write(&self, write: StatusWrite) {
        let reason = match write {
            StatusWrite::Changed => "changed",
            StatusWrite::Figures => "figures",
            StatusWrite::Heartbeat => "heartbeat",
            StatusWrite::Skip => "skip",
        };
        self.status_writes
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts a failed reconcile.
    pub fn error(&self, reason: &str) {
        self.reconcile_errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

async fn metrics_handler(State(m): State<Arc<OperatorMetrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

async fn healthz() -> impl IntoResponse {
    (StatusCode::OK, "ok\n")
}

/// The `/metrics` + `/healthz` router.
pub fn router(metrics: Arc<OperatorMetrics>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .with_state(metrics)
}

/// Serves the router until the task is dropped.
pub async fn serve(addr: SocketAddr, metrics: Arc<OperatorMetrics>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding --metrics-listen {addr}: {e}"))?;
    axum::serve(listener, router(metrics)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed() {
        let m = OperatorMetrics::new();
        m.reconciles.inc();
        m.error("runtime");
        let text = m.encode();
        assert!(
            text.contains("tidegate_operator_reconciles_total 1"),
            "{text}"
        );
        assert!(
            text.contains("tidegate_operator_reconcile_errors_total{reason=\"runtime\"} 1"),
            "{text}"
        );
    }
}
