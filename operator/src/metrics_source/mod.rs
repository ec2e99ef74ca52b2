//! Adapters of the MetricsSource port ([`crate::ports::MetricsSource`]): a pool's metrics.
//!
//! - [`prometheus`]: PromQL against a Prometheus server (the cluster's default);
//! - [`direct`]: the engines' own /metrics scraped, with [`window`] computing over the
//!   pool's rate window what the PromQL queries compute in a cluster (local mode's default);
//! - [`switch`]: either one per pool, as `spec.scaling.metrics.source` says.
//!
//! Invariant: missing or stale metrics are reported as a `MetricsProblem`, never as zeros.

pub mod direct;
pub mod prometheus;
pub mod switch;
pub mod window;
