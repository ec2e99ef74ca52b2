//! The cache manager's side of block moves: handing the step's [`TransferPlan`] out, and
//! applying the [`TransferAnswer`]s that come back.
//!
//! Invariants:
//! - an offloaded image reaches the store only if its session still waits for it; a session
//!   whose image never arrived (failed read, no room in the store) is dropped and recounted
//!   as a drop, so a later return recomputes;
//! - a failed restore or copy-on-write is a [`Rollback`]: the sequence's KV is good only up to
//!   `keep_tokens`, the caller (the scheduler) recomputes from there, and the failure is
//!   counted and logged; nothing a failed move wrote is ever shared;
//! - restored blocks are hashed for sharing only after their move succeeded;
//! - a session whose spill file could not be written is dropped when the writer's answer is
//!   applied (every step polls), before anything could try to restore it.

use super::manager::{IdleKv, IdleSession, KvCacheManager, SeqId};
use super::offload_store::Place;
use super::stats::KvSource;
use super::transfer::{TransferAnswer, TransferPlan};
use crate::block_io::BlockIo;

/// A sequence whose reused KV turned out shorter than its step assumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rollback {
    /// The sequence.
    pub seq: SeqId,
    /// Its leading tokens whose KV is good; it recomputes from here.
    pub keep_tokens: usize,
}

impl KvCacheManager {
    /// The block moves decided since the last call, in decision order (the engine loop runs
    /// them before the forward pass).
    pub fn take_transfers(&mut self) -> TransferPlan {
        std::mem::take(&mut self.transfers)
    }

    /// Whether moves are waiting to be taken.
    pub fn has_transfers(&self) -> bool {
        !self.transfers.is_empty()
    }

    /// Applies the spill writer's answers that arrived: a session whose file could not be
    /// written is dropped (its return recomputes).
    pub fn poll_spills(&mut self) {
        self.store.poll_writes();
        self.forget_failed_spills();
    }

    /// Waits for every spill file in flight, then applies the answers (tests, benchmarks).
    pub fn wait_for_spills(&mut self) {
        self.store.wait_for_writes();
        self.forget_failed_spills();
    }

    pub(super) fn forget_failed_spills(&mut self) {
        for owner in self.store.take_failed() {
            let gone = matches!(
                self.sessions.get(&owner),
                Some(IdleSession { kv: IdleKv::Stored(id), .. }) if self.store.peek(*id).is_none()
            );
            if gone {
                self.sessions.remove(&owner);
                self.drops.insert(owner);
            }
        }
    }

    /// Applies the answers of an executed plan; returns the sequences to roll back.
    pub fn apply_transfers(&mut self, answers: Vec<TransferAnswer>, now: u64) -> Vec<Rollback> {
        self.poll_spills();
        let mut rollbacks = Vec::new();
        for answer in answers {
            match answer {
                TransferAnswer::Offloaded { ticket, image } => {
                    self.land_offload(ticket, image, now)
                }
                TransferAnswer::OffloadFailed { ticket, error } => {
                    tracing::warn!(error = %error, "KV offload failed; dropping the session's KV instead");
                    self.lose_offload(ticket);
                }
                TransferAnswer::Restored { seq, cache_tokens } => {
                    self.cache_full_blocks(seq, &cache_tokens);
                }
                TransferAnswer::RestoreFailed {
                    seq,
                    from,
                    keep_tokens,
                    error,
                } => {
                    tracing::warn!(seq, from = ?from, error = %error, "KV restore failed; recomputing");
                    self.stats.restore_failed(from);
                    self.stats.unrestored(match from {
                        Place::Host => KvSource::Host,
                        Place::Disk => KvSource::Disk,
                    });
                    rollbacks.push(Rollback { seq, keep_tokens });
                }
                TransferAnswer::Copied { .. } => {}
                TransferAnswer::CopyFailed {
                    seq,
                    keep_tokens,
                    error,
                } => {
                    tracing::warn!(seq, error = %error, "KV copy-on-write failed; recomputing the block");
                    self.stats.cow_copies = self.stats.cow_copies.saturating_sub(1);
                    rollbacks.push(Rollback { seq, keep_tokens });
                }
            }
        }
        rollbacks
    }

    /// Executes the pending moves through `io` and applies their answers: what the engine
    /// loop does around a step, in one call (tests and tensor-free simulations).
    pub fn flush_transfers(&mut self, io: &mut dyn BlockIo, now: u64) -> Vec<Rollback> {
        let answers = self.take_transfers().execute(io);
        self.apply_transfers(answers, now)
    }

    /// An offload's bytes arrived: into the store, if their session still waits for them.
    fn land_offload(&mut self, ticket: u64, image: Vec<u8>, now: u64) {
        let Some(flight) = self.offloading.remove(&ticket) else {
            return;
        };
        let waiting = matches!(
            self.sessions.get(&flight.key),
            Some(IdleSession { kv: IdleKv::Offloading(t), .. }) if *t == ticket
        );
        if !waiting {
            return;
        }
        let put = self.store.put(flight.key.clone(), image, now);
        for owner in put.dropped {
            let gone = matches!(
                self.sessions.get(&owner),
                Some(IdleSession { kv: IdleKv::Stored(id), .. }) if self.store.peek(*id).is_none()
            );
            if gone {
                self.sessions.remove(&owner);
                self.drops.insert(owner);
            }
        }
        match put.stored {
            Some((id, _)) => {
                if let Some(s) = self.sessions.get_mut(&flight.key) {
                    s.kv = IdleKv::Stored(id);
                }
            }
            None => {
                self.sessions.remove(&flight.key);
                self.drops.insert(flight.key.clone());
                self.stats.recount_as_drop(&flight.tier);
            }
        }
    }

    /// An offload's bytes never arrived: its session, if still waiting, is dropped.
    fn lose_offload(&mut self, ticket: u64) {
        let Some(flight) = self.offloading.remove(&ticket) else {
            return;
        };
        let waiting = matches!(
            self.sessions.get(&flight.key),
            Some(IdleSession { kv: IdleKv::Offloading(t), .. }) if *t == ticket
        );
        if waiting {
            self.sessions.remove(&flight.key);
            self.drops.insert(flight.key.clone());
        }
        self.stats.recount_as_drop(&flight.tier);
    }
}
