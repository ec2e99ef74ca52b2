//! tidegate engine library.
pub mod block_io;
pub mod kv_cache;
pub mod scheduler;
