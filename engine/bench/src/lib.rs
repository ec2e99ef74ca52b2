//! tidegate's benchmark harnesses: commands that print figures, kept out of the libraries they
//! measure.
//!
//! - [`engine_loop`]: `tidegate-engine bench`: tok/s, TTFT and ITL by concurrency, roofline,
//!   the returning session's restore ([`session`]) and an optional soak ([`soak`]).
//! - [`model_runner`]: `bench-model`: copy bandwidth, batch-1 roofline, decode tok/s;
//!   [`roofline`]: the roofline fraction measured in pairs of read passes and decode steps.
//! - [`overload`]: `overload-bench`: a multiple of a running engine's capacity.
//! - [`router`]: `bench-router`: a running router's added latency and overload memory;
//!   [`router_flow`]: its fairness, starvation bound and replicas figures.
//! - [`startup`]: `bench-startup`: an engine's time to ready, cold and warm page cache.

pub mod client;
pub mod engine_loop;
pub mod model_runner;
pub mod overload;
pub mod roofline;
pub mod router;
pub mod router_flow;
pub mod session;
pub mod soak;
pub mod startup;
