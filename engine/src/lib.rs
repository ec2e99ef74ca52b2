//! tidegate engine library: model loading and the tensor side of the runner (this part), the
//! paged KV cache bookkeeping, the scheduler and the HTTP server (other modules).

pub mod block_io;
pub mod error;
pub mod kernels;
pub mod model;
pub mod runner;
pub mod sampling;

pub use error::{Error, Result};
pub mod bench_model;
pub mod generate;
