//! Paged KV cache bookkeeping (no tensors): a fixed pool of blocks, per-sequence block tables,
//! shared-prefix reuse, idle sessions and their eviction to host RAM, disk, or nowhere.
//!
//! Layers, each talking only to the one below:
//! - [`block_pool::BlockPool`]: blocks, reference counts, LRU free list, hash index;
//! - [`offload_store::OffloadStore`]: offloaded bytes under host and disk budgets, disk
//!   entries in checksummed [`spill_file`]s;
//! - [`KvCacheManager`]: block tables, sessions, eviction and restore decisions (using the
//!   [`cost::CostModel`]); it decides block moves as data ([`transfer::TransferPlan`]), which
//!   the engine loop executes in batches through [`crate::block_io::BlockIo`] and answers.
//!
//! Invariants of the whole: the device budget (`num_blocks × block_bytes`), the host budget
//! and the disk budget are never exceeded; no block is leaked or freed twice
//! ([`KvCacheManager::check`] verifies both; the property tests drive it); KV bytes that
//! could not be moved intact (a failed block read or write, a bad spill file) are never used:
//! offloading them drops the session, restoring them recomputes it.

pub mod answers;
pub mod begin;
pub mod block_pool;
pub mod cost;
pub mod eviction;
mod ids;
pub mod immediate;
pub mod manager;
pub mod mem_io;
pub mod offload_store;
pub mod prefix_hash;
pub mod spill_file;
mod spill_writer;
pub mod stats;
pub mod tier;
pub mod tier_policy;
pub mod transfer;

pub use answers::Rollback;
pub use begin::{Begin, SeqStart};
pub use block_pool::{BlockId, BlockPool};
pub use cost::CostModel;
pub use eviction::Preempted;
pub use immediate::MoveNow;
pub use manager::{KvCacheManager, KvConfig, SeqId};
pub use mem_io::MemBlockIo;
pub use offload_store::{Place, SpillReadError, StoreConfig, StoreStats};
pub use stats::{EvictAction, KvSource, KvStats};
pub use tier::{PressureAction, TierConfig, TierId, Tiers};
pub use transfer::{BlockMove, TransferAnswer, TransferPlan};

#[cfg(test)]
mod tests;
