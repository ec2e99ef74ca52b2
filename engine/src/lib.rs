//! tidegate engine library.
pub mod bench;
pub mod fake_engine;
pub mod generate;
pub mod metrics;
pub mod server;
pub mod tenancy;
