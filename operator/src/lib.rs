//! tidegate operator: CRD generation, pure planning, controllers and adapters.

pub mod crdgen;
pub mod plan;
pub mod sim;
