//! The cache manager with every block move executed as soon as it is decided, and every spill
//! file written before the call returns: for tests and tensor-free simulations that drive
//! the manager call by call (the engine loop batches a whole step's moves and lets the spill
//! writer work in the background instead; the answers and their effects are the same).

use super::answers::Rollback;
use super::begin::{Begin, SeqStart};
use super::eviction::Preempted;
use super::manager::{KvCacheManager, SeqId};
use super::stats::KvSource;
use crate::block_io::BlockIo;

/// Each call decides, executes its moves through `io`, and applies their answers.
pub trait MoveNow {
    /// [`KvCacheManager::begin_seq`]; a failed restore or copy comes back as a recompute.
    fn begin_seq_io(
        &mut self,
        start: SeqStart<'_>,
        now: u64,
        io: &mut dyn BlockIo,
    ) -> Option<Begin>;
    /// [`KvCacheManager::allocate_slots`].
    fn allocate_slots_io(
        &mut self,
        seq: SeqId,
        total: usize,
        now: u64,
        io: &mut dyn BlockIo,
    ) -> Option<()>;
    /// [`KvCacheManager::evict_expired`].
    fn evict_expired_io(&mut self, now: u64, io: &mut dyn BlockIo) -> usize;
    /// [`KvCacheManager::make_room`].
    fn make_room_io(&mut self, need: usize, now: u64, io: &mut dyn BlockIo) -> bool;
    /// [`KvCacheManager::preempt_seq`].
    fn preempt_seq_io(
        &mut self,
        seq: SeqId,
        computed: &[u32],
        now: u64,
        io: &mut dyn BlockIo,
    ) -> Preempted;
}

impl MoveNow for KvCacheManager {
    fn begin_seq_io(
        &mut self,
        start: SeqStart<'_>,
        now: u64,
        io: &mut dyn BlockIo,
    ) -> Option<Begin> {
        let mut begin = self.begin_seq(start, now)?;
        for Rollback { seq, keep_tokens } in self.flush_now(io, now) {
            if seq == start.seq && keep_tokens < begin.computed {
                begin.computed = keep_tokens;
                if matches!(begin.source, KvSource::Host | KvSource::Disk) {
                    begin.source = KvSource::Recompute;
                }
            }
        }
        Some(begin)
    }

    fn allocate_slots_io(
        &mut self,
        seq: SeqId,
        total: usize,
        now: u64,
        io: &mut dyn BlockIo,
    ) -> Option<()> {
        let done = self.allocate_slots(seq, total, now);
        self.flush_now(io, now);
        done
    }

    fn evict_expired_io(&mut self, now: u64, io: &mut dyn BlockIo) -> usize {
        let n = self.evict_expired(now);
        self.flush_now(io, now);
        n
    }

    fn make_room_io(&mut self, need: usize, now: u64, io: &mut dyn BlockIo) -> bool {
        let done = self.make_room(need, now);
        self.flush_now(io, now);
        done
    }

    fn preempt_seq_io(
        &mut self,
        seq: SeqId,
        computed: &[u32],
        now: u64,
        io: &mut dyn BlockIo,
    ) -> Preempted {
        let out = self.preempt_seq(seq, computed, now);
        self.flush_now(io, now);
        out
    }
}

impl KvCacheManager {
    fn flush_now(&mut self, io: &mut dyn BlockIo, now: u64) -> Vec<Rollback> {
        let rollbacks = self.flush_transfers(io, now);
        self.wait_for_spills();
        rollbacks
    }
}
