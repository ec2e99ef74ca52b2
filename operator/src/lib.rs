//! tidegate operator: CRD generation, pure planning, controllers and adapters.

pub mod crdgen;
pub mod driver;
pub mod k8s;
pub mod plan;
pub mod ports;
pub mod registry;
pub mod status_build;
