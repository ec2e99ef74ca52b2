//! tidegate's KV core: what a request's KV blocks are, where they live (device, host, disk or
//! nowhere), which are evicted, and which sequences run in the next step.
//!
//! Boundary: this crate is pure bookkeeping. It never depends on a tensor library, an async
//! runtime or an HTTP stack (the build enforces it: none is in its `Cargo.toml`); bytes move
//! only through the [`block_io::BlockIo`] trait that a runner implements.

pub mod block_io;
pub mod kv_cache;
pub mod kv_sizing;
pub mod scheduler;
