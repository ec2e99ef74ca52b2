//! tidegate's engine role: one engine pod.
//!
//! - [`engine_loop`]: the one owner of the scheduler, the KV cache and the model runner; it
//!   runs the continuous-batching loop on its own thread.
//! - [`backend`]: the boundary between the HTTP API and whatever generates tokens
//!   ([`backend::Engine`]).
//! - [`api`]: the OpenAI-compatible API, the admin API and `/metrics`, with drain.
//! - [`metrics`]: the engine's metric families (names and buckets from `tidegate_api`).
//! - [`cli`]: `tidegate-engine serve`: flags (the operator's launch contract) to a running
//!   engine.
//!
//! Boundary: the KV bookkeeping is `tidegate_kv`, the model code `tidegate_runner`, the shared
//! HTTP pieces `tidegate_http`; nothing here is used by the router.

pub mod api;
pub mod backend;
pub mod cli;
pub mod engine_loop;
pub mod metrics;
