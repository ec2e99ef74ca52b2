//! Continuous-batching scheduler without tensors: each request has tokens computed and tokens
//! known; every step fits decode tokens and prefill chunks into a token budget and a batch
//! size, by tier priority with aging, preempting the lowest-priority sequence when KV blocks
//! run out (its tier decides offload or drop + recompute).
//!
//! One step, as the engine loop drives it:
//! ```text
//! let out = scheduler.schedule(now_ms, &mut kv_store);   // KV transfers done via BlockIo
//! let sampled = runner.run(&out.scheduled);                // one batched forward pass
//! let finished = scheduler.update(&out, &sampled, now_ms); // append tokens, end requests
//! ```
//!
//! Invariant: the scheduler is the single owner of request state and of the KV cache manager;
//! nothing else mutates either (no locks).

pub mod config;
pub mod core;
pub mod metrics;
pub mod output;
pub mod request;
pub mod step;

pub use config::SchedulerConfig;
pub use core::{AddError, Scheduler};
pub use metrics::Snapshot;
pub use output::{Finished, SchedStats, ScheduledSeq, SchedulerOutput};
pub use request::{FinishReason, NewRequest};

#[cfg(test)]
mod tests;
