//! tidegate engine library: the model and its batched runner (model, runner, kernels,
//! sampling), the paged KV cache bookkeeping and scheduler, the HTTP server and its backends.
pub mod backend;
pub mod bench;
pub mod bench_model;
pub mod block_io;
pub mod error;
pub mod fake_engine;
pub mod generate;
pub mod kernels;
pub mod kv_cache;
pub mod metrics;
pub mod model;
pub mod runner;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod tenancy;

pub use error::{Error, Result};
