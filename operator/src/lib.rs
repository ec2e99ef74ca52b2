//! tidegate operator: CRD generation, pure planning, controllers and adapters.

pub mod bench_plan;
pub mod crdgen;
pub mod direct_metrics;
pub mod driver;
pub mod engine_client;
pub mod k8s;
pub mod local;
pub mod metric_window;
pub mod plan;
pub mod ports;
pub mod registry;
pub mod sim;
pub mod status_build;
pub mod status_write;
