//! tidegate engine library.
pub mod backend;
pub mod bench;
pub mod block_io;
pub mod fake_engine;
pub mod kv_cache;
pub mod metrics;
pub mod scheduler;
pub mod server;
pub mod tenancy;
