//! tidegate engine library: model loading and the runner, the paged KV cache bookkeeping,
//! the scheduler, the engine loop that drives them, and the HTTP server.

pub mod backend;
pub mod bench;
pub mod bench_model;
pub mod block_io;
pub mod engine_loop;
pub mod error;
pub mod generate;
pub mod kernels;
pub mod kv_cache;
pub mod kv_sizing;
pub mod metrics;
pub mod model;
pub mod router;
pub mod runner;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod tenancy;

pub use error::{Error, Result};
