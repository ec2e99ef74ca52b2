//! Continuous-batching scheduler without tensors: each request has tokens computed and tokens
//! known; every step fits decode tokens and prefill chunks into a token budget and a batch
//! size, by tier priority with aging, preempting the lowest-priority sequence when KV blocks
//! run out (its tier decides offload or drop + recompute).
//!
//! One step, as the engine loop drives it (here with an in-memory block store and a runner
//! that always samples token 2; the real loop executes the moves on the runner's paged KV
//! store, its `BlockIo`, and builds one `SeqChunk` per `ScheduledSeq`):
//! ```
//! use tidegate_kv::kv_cache::{KvCacheManager, KvConfig, MemBlockIo, Tiers};
//! use tidegate_kv::scheduler::{NewRequest, Scheduler, SchedulerConfig};
//!
//! let kv = KvCacheManager::new(KvConfig::new(64, 16, 1024), Tiers::default());
//! let mut store = MemBlockIo::new(64, 1024); // the runner's KV store in the engine
//! let mut sched = Scheduler::new(SchedulerConfig::default(), kv);
//! let tier = sched.kv().tiers().default_id();
//! let req = NewRequest {
//!     id: 1,
//!     tier,
//!     session: Some("chat-42".into()),
//!     prompt: vec![5, 6, 7],
//!     max_new_tokens: 4,
//!     stop_tokens: vec![0],
//! };
//! sched.add_request(req, 0).expect("queued");
//! let mut now_ms = 0;
//! while sched.num_running() + sched.num_waiting() > 0 {
//!     let mut out = sched.schedule(now_ms); // decides; KV block moves come back as data
//!     let answers = std::mem::take(&mut out.transfers).execute(&mut store); // batched
//!     sched.apply_transfers(answers, &mut out, now_ms); // a failed move → recompute
//!     // runner.step(&[SeqChunk { tokens: &c.tokens, start_pos: c.start_pos,
//!     //     block_table: &c.block_table, want_logits: c.want_logits }, ...]), then sample:
//!     let sampled: Vec<(u64, u32)> = out
//!         .scheduled
//!         .iter()
//!         .filter(|c| c.want_logits)
//!         .map(|c| (c.seq_id, 2))
//!         .collect();
//!     for f in sched.update(&out, &sampled, now_ms) {
//!         assert_eq!((f.seq_id, f.output_tokens), (1, 4));
//!     }
//!     now_ms += 10;
//! }
//! // The session's KV stays resident for its next turn.
//! assert_eq!(sched.kv().idle_sessions(), 1);
//! ```
//!
//! If the forward pass fails, skip `update`: nothing counts as computed, and the next
//! `schedule` hands out the same chunks again (block tables are kept).
//!
//! Invariants: the scheduler is the single owner of request state and of the KV cache
//! manager; nothing else mutates either (no locks). It owns the one tier table (in the KV
//! cache manager: priority, queue-wait target, retention), so every decision about a request
//! — order, preemption, queue-wait expiry, what happens to its KV — reads the same tier as
//! it is now, on the clock the caller passes in (`now`, monotonic milliseconds).

pub mod config;
pub mod core;
pub mod metrics;
pub mod output;
pub mod request;
pub mod step;
pub mod transfers;

pub use config::SchedulerConfig;
pub use core::{AddError, Scheduler};
pub use metrics::Snapshot;
pub use output::{Expired, Finished, SchedStats, ScheduledSeq, SchedulerOutput};
pub use request::{FinishReason, NewRequest};

#[cfg(test)]
mod tests;
