//! tidegate engine library.
pub mod backend;
pub mod bench;
pub mod fake_engine;
pub mod metrics;
pub mod server;
pub mod tenancy;
