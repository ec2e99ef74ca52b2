//! KV block moves as data: what the cache manager decided to move between the device pool and
//! the host (offload, restore, copy-on-write), executed in batches by whoever holds the pool,
//! and answered back.
//!
//! The manager never touches bytes while it decides. Each decision appends a [`BlockMove`] to
//! the step's [`TransferPlan`]; the engine loop runs [`TransferPlan::execute`] against the
//! runner's store before the forward pass, and hands the [`TransferAnswer`]s back
//! ([`crate::scheduler::Scheduler::apply_transfers`]), which turns a failed move into a
//! recompute, never into wrong output.
//!
//! Invariants:
//! - moves run in the order they were decided; only consecutive moves of one kind are
//!   batched, so a block released by an offload and reused by a restore later in the same
//!   step is read before it is overwritten, exactly as if each move ran alone;
//! - a batch moves every block of every move in it with one call of the store's batched
//!   method (one device↔host copy per layer and direction in the runners); when the batch
//!   fails, its moves are retried one by one so that a failure is pinned to its own move;
//! - every move gets exactly one answer; an offload answers with the whole image or fails;
//! - a block whose restore or copy failed in this plan is poisoned until something is written
//!   to it successfully: an offload that reads it fails (its image would not be the KV).

use std::collections::HashSet;
use std::mem::discriminant;

use super::block_pool::BlockId;
use super::ids::SeqId;
use super::offload_store::Place;
use crate::block_io::{BlockIo, BlockIoCause, BlockIoError, BlockOp, first};

/// Identifies one offload in flight (between its decision and its answer).
pub type Ticket = u64;

/// One block move the cache manager decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockMove {
    /// Read `blocks` (already released in the bookkeeping) as idle KV `ticket`'s image.
    Offload {
        /// The idle KV the image belongs to.
        ticket: Ticket,
        /// Its blocks, in order.
        blocks: Vec<BlockId>,
    },
    /// Write `image` (the blocks' images, concatenated) into `blocks` for sequence `seq`.
    Restore {
        /// The sequence the KV is for.
        seq: SeqId,
        /// Destination blocks, in order.
        blocks: Vec<BlockId>,
        /// Their images.
        image: Vec<u8>,
        /// Where the bytes were kept.
        from: Place,
        /// Tokens of `seq` whose KV is good without this move (what it recomputes from if the
        /// move fails).
        keep_tokens: usize,
        /// Tokens whose full blocks join the shared-prefix cache once the move succeeded.
        cache_tokens: Vec<u32>,
    },
    /// Copy block `src` onto `dst` (copy-on-write of a shared partial block) for `seq`.
    Copy {
        /// The sequence the copy is for.
        seq: SeqId,
        /// Source block.
        src: BlockId,
        /// Destination block.
        dst: BlockId,
        /// Tokens of `seq` whose KV is good without this move.
        keep_tokens: usize,
    },
}

impl BlockMove {
    fn blocks(&self) -> usize {
        match self {
            BlockMove::Offload { blocks, .. } | BlockMove::Restore { blocks, .. } => blocks.len(),
            BlockMove::Copy { .. } => 1,
        }
    }
}

/// The moves one step decided, in decision order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransferPlan {
    moves: Vec<BlockMove>,
}

/// What became of one move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransferAnswer {
    /// The offload's image, whole.
    Offloaded {
        /// The idle KV it belongs to.
        ticket: Ticket,
        /// The blocks' images, concatenated.
        image: Vec<u8>,
    },
    /// The offload could not read its blocks: the idle KV is dropped.
    OffloadFailed {
        /// The idle KV.
        ticket: Ticket,
        /// Why.
        error: BlockIoError,
    },
    /// The restore landed.
    Restored {
        /// The sequence.
        seq: SeqId,
        /// Tokens whose full blocks may now be shared.
        cache_tokens: Vec<u32>,
    },
    /// The restore failed: `seq` recomputes from `keep_tokens`.
    RestoreFailed {
        /// The sequence.
        seq: SeqId,
        /// Where the bytes were.
        from: Place,
        /// Tokens still good.
        keep_tokens: usize,
        /// Why.
        error: BlockIoError,
    },
    /// The copy landed.
    Copied {
        /// The sequence.
        seq: SeqId,
    },
    /// The copy failed: `seq` recomputes from `keep_tokens`.
    CopyFailed {
        /// The sequence.
        seq: SeqId,
        /// Tokens still good.
        keep_tokens: usize,
        /// Why.
        error: BlockIoError,
    },
}

impl TransferPlan {
    /// Appends a move (decision order is execution order).
    pub(super) fn push(&mut self, m: BlockMove) {
        self.moves.push(m);
    }

    /// Whether there is nothing to move.
    pub fn is_empty(&self) -> bool {
        self.moves.is_empty()
    }

    /// The moves, in order.
    pub fn moves(&self) -> &[BlockMove] {
        &self.moves
    }

    /// Blocks the plan moves in all.
    pub fn blocks(&self) -> usize {
        self.moves.iter().map(BlockMove::blocks).sum()
    }

    /// Runs the moves against `io`, consecutive moves of one kind as one batch, and answers
    /// each move once, in order.
    pub fn execute(self, io: &mut dyn BlockIo) -> Vec<TransferAnswer> {
        let mut answers = Vec::with_capacity(self.moves.len());
        let mut poisoned: HashSet<BlockId> = HashSet::new();
        let mut rest = self.moves.as_slice();
        while let Some(head) = rest.first() {
            let run = rest
                .iter()
                .take_while(|m| discriminant(*m) == discriminant(head))
                .count();
            let (batch, tail) = rest.split_at(run);
            match head {
                BlockMove::Offload { .. } => offload_batch(batch, &*io, &poisoned, &mut answers),
                BlockMove::Restore { .. } => restore_batch(batch, io, &mut poisoned, &mut answers),
                BlockMove::Copy { .. } => copy_batch(batch, io, &mut poisoned, &mut answers),
            }
            rest = tail;
        }
        answers
    }
}

fn poisoned_error(block: BlockId) -> BlockIoError {
    let cause = BlockIoCause::Device("its restore or copy failed in this step".into());
    BlockIoError::new(BlockOp::Read, block, cause)
}

/// Reads every offload of `batch` with one `read_blocks`, or move by move when that fails.
fn offload_batch(
    batch: &[BlockMove],
    io: &dyn BlockIo,
    poisoned: &HashSet<BlockId>,
    answers: &mut Vec<TransferAnswer>,
) {
    let bb = io.block_bytes();
    let offloads: Vec<(Ticket, &[BlockId])> = batch
        .iter()
        .filter_map(|m| match m {
            BlockMove::Offload { ticket, blocks } => Some((*ticket, blocks.as_slice())),
            _ => None,
        })
        .collect();
    let all: Vec<BlockId> = offloads
        .iter()
        .flat_map(|(_, b)| b.iter().copied())
        .collect();
    let mut image = Vec::with_capacity(all.len() * bb);
    let clean = !all.iter().any(|b| poisoned.contains(b));
    if clean && read_exact(io, &all, &mut image, bb).is_ok() {
        if let [(ticket, _)] = offloads[..] {
            // One offload: its image is the whole read, no copy.
            answers.push(TransferAnswer::Offloaded { ticket, image });
            return;
        }
        let mut at = 0;
        for (ticket, blocks) in offloads {
            let len = blocks.len() * bb;
            let image = image[at..at + len].to_vec();
            at += len;
            answers.push(TransferAnswer::Offloaded { ticket, image });
        }
        return;
    }
    for (ticket, blocks) in offloads {
        let mut image = Vec::with_capacity(blocks.len() * bb);
        let read = match blocks.iter().find(|b| poisoned.contains(b)) {
            Some(&b) => Err(poisoned_error(b)),
            None => read_exact(io, blocks, &mut image, bb),
        };
        answers.push(match read {
            Ok(()) => TransferAnswer::Offloaded { ticket, image },
            Err(error) => TransferAnswer::OffloadFailed { ticket, error },
        });
    }
}

/// `read_blocks`, refusing an image of the wrong size even when the store said `Ok`.
fn read_exact(
    io: &dyn BlockIo,
    blocks: &[BlockId],
    out: &mut Vec<u8>,
    bb: usize,
) -> Result<(), BlockIoError> {
    io.read_blocks(blocks, out)?;
    if out.len() != blocks.len() * bb {
        let cause = BlockIoCause::WrongSize {
            got: out.len(),
            want: blocks.len() * bb,
        };
        return Err(BlockIoError::new(BlockOp::Read, first(blocks), cause));
    }
    Ok(())
}

/// Writes every restore of `batch` with one `write_blocks`, or move by move when that fails.
fn restore_batch(
    batch: &[BlockMove],
    io: &mut dyn BlockIo,
    poisoned: &mut HashSet<BlockId>,
    answers: &mut Vec<TransferAnswer>,
) {
    let bb = io.block_bytes();
    let sized = |blocks: &[BlockId], image: &[u8]| image.len() == blocks.len() * bb;
    let batched = match batch {
        // One restore: its own image is the batch, no copy.
        [BlockMove::Restore { blocks, image, .. }] => {
            sized(blocks, image) && io.write_blocks(blocks, image).is_ok()
        }
        _ => {
            let mut all = Vec::new();
            let mut data = Vec::new();
            let mut whole = true;
            for m in batch {
                if let BlockMove::Restore { blocks, image, .. } = m {
                    whole &= sized(blocks, image);
                    all.extend_from_slice(blocks);
                    data.extend_from_slice(image);
                }
            }
            whole && io.write_blocks(&all, &data).is_ok()
        }
    };
    for m in batch {
        let BlockMove::Restore {
            seq,
            blocks,
            image,
            from,
            keep_tokens,
            cache_tokens,
        } = m
        else {
            continue;
        };
        let result = if batched {
            Ok(())
        } else if !sized(blocks, image) {
            let cause = BlockIoCause::WrongSize {
                got: image.len(),
                want: blocks.len() * bb,
            };
            Err(BlockIoError::new(BlockOp::Write, first(blocks), cause))
        } else {
            io.write_blocks(blocks, image)
        };
        answers.push(match result {
            Ok(()) => {
                blocks.iter().for_each(|b| {
                    poisoned.remove(b);
                });
                TransferAnswer::Restored {
                    seq: *seq,
                    cache_tokens: cache_tokens.clone(),
                }
            }
            Err(error) => {
                poisoned.extend(blocks.iter().copied());
                TransferAnswer::RestoreFailed {
                    seq: *seq,
                    from: *from,
                    keep_tokens: *keep_tokens,
                    error,
                }
            }
        });
    }
}

/// Copies every pair of `batch` with one `copy_blocks`, or pair by pair when that fails.
fn copy_batch(
    batch: &[BlockMove],
    io: &mut dyn BlockIo,
    poisoned: &mut HashSet<BlockId>,
    answers: &mut Vec<TransferAnswer>,
) {
    let pairs: Vec<(BlockId, BlockId)> = batch
        .iter()
        .filter_map(|m| match m {
            BlockMove::Copy { src, dst, .. } => Some((*src, *dst)),
            _ => None,
        })
        .collect();
    let clean = !pairs.iter().any(|(s, _)| poisoned.contains(s));
    let batched = clean && io.copy_blocks(&pairs).is_ok();
    for m in batch {
        let BlockMove::Copy {
            seq,
            src,
            dst,
            keep_tokens,
        } = m
        else {
            continue;
        };
        let result = if batched {
            Ok(())
        } else if poisoned.contains(src) {
            Err(poisoned_error(*src))
        } else {
            io.copy_blocks(&[(*src, *dst)])
        };
        answers.push(match result {
            Ok(()) => {
                poisoned.remove(dst);
                TransferAnswer::Copied { seq: *seq }
            }
            Err(error) => {
                poisoned.insert(*dst);
                TransferAnswer::CopyFailed {
                    seq: *seq,
                    keep_tokens: *keep_tokens,
                    error,
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::MemBlockIo;

    /// Counts batched calls and fails reads of one block.
    struct Counting {
        inner: MemBlockIo,
        bad_read: Option<BlockId>,
        batched_reads: std::cell::Cell<usize>,
        batched_writes: usize,
    }

    impl BlockIo for Counting {
        fn block_bytes(&self) -> usize {
            self.inner.block_bytes()
        }
        fn read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<(), BlockIoError> {
            if Some(block) == self.bad_read {
                return Err(BlockIoError::new(
                    BlockOp::Read,
                    block,
                    BlockIoCause::Device("bad".into()),
                ));
            }
            self.inner.read_block(block, out)
        }
        fn write_block(&mut self, block: u32, data: &[u8]) -> Result<(), BlockIoError> {
            self.inner.write_block(block, data)
        }
        fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), BlockIoError> {
            self.inner.copy_block(src, dst)
        }
        fn read_blocks(&self, blocks: &[u32], out: &mut Vec<u8>) -> Result<(), BlockIoError> {
            self.batched_reads.set(self.batched_reads.get() + 1);
            out.clear();
            let mut one = Vec::new();
            for &b in blocks {
                self.read_block(b, &mut one)?;
                out.extend_from_slice(&one);
            }
            Ok(())
        }
        fn write_blocks(&mut self, blocks: &[u32], data: &[u8]) -> Result<(), BlockIoError> {
            self.batched_writes += 1;
            for (&b, d) in blocks.iter().zip(data.chunks_exact(4)) {
                self.inner.write_block(b, d)?;
            }
            Ok(())
        }
    }

    fn io(bad_read: Option<BlockId>) -> Counting {
        let mut inner = MemBlockIo::new(8, 4);
        for b in 0..8 {
            inner.fill(b, b as u8);
        }
        Counting {
            inner,
            bad_read,
            batched_reads: std::cell::Cell::new(0),
            batched_writes: 0,
        }
    }

    fn restore(seq: SeqId, blocks: Vec<BlockId>, byte: u8) -> BlockMove {
        let image = vec![byte; blocks.len() * 4];
        BlockMove::Restore {
            seq,
            blocks,
            image,
            from: Place::Host,
            keep_tokens: 0,
            cache_tokens: vec![],
        }
    }

    #[test]
    fn consecutive_moves_of_a_kind_run_as_one_batch_in_decision_order() {
        let mut io = io(None);
        let mut plan = TransferPlan::default();
        plan.push(BlockMove::Offload {
            ticket: 1,
            blocks: vec![1, 2],
        });
        plan.push(BlockMove::Offload {
            ticket: 2,
            blocks: vec![3],
        });
        // Block 2 was released by the offload above and is reused: read first, then written.
        plan.push(restore(7, vec![2, 5], 9));
        plan.push(restore(8, vec![6], 8));
        let answers = plan.execute(&mut io);
        assert_eq!(io.batched_reads.get(), 1);
        assert_eq!(io.batched_writes, 1);
        assert_eq!(
            answers[0],
            TransferAnswer::Offloaded {
                ticket: 1,
                image: [[1u8; 4], [2; 4]].concat()
            }
        );
        assert_eq!(
            answers[1],
            TransferAnswer::Offloaded {
                ticket: 2,
                image: vec![3; 4]
            }
        );
        assert!(matches!(
            answers[2],
            TransferAnswer::Restored { seq: 7, .. }
        ));
        assert_eq!(io.inner.bytes(2), &[9; 4]);
        assert_eq!(io.inner.bytes(6), &[8; 4]);
    }

    #[test]
    fn a_failing_batch_is_retried_move_by_move_so_only_its_culprit_fails() {
        let mut io = io(Some(3));
        let mut plan = TransferPlan::default();
        for (ticket, blocks) in [(1, vec![1]), (2, vec![3, 4]), (3, vec![5])] {
            plan.push(BlockMove::Offload { ticket, blocks });
        }
        let answers = plan.execute(&mut io);
        assert!(matches!(
            answers[0],
            TransferAnswer::Offloaded { ticket: 1, .. }
        ));
        assert!(matches!(
            answers[1],
            TransferAnswer::OffloadFailed { ticket: 2, ref error } if error.block == 3
        ));
        assert!(matches!(
            answers[2],
            TransferAnswer::Offloaded { ticket: 3, .. }
        ));
    }

    #[test]
    fn an_offload_of_a_block_whose_restore_failed_is_not_the_kv() {
        let mut io = io(None);
        let mut plan = TransferPlan::default();
        // A short image: the restore into block 4 fails, so block 4 holds no one's KV.
        plan.push(BlockMove::Restore {
            seq: 1,
            blocks: vec![4],
            image: vec![1; 3],
            from: Place::Disk,
            keep_tokens: 16,
            cache_tokens: vec![],
        });
        plan.push(BlockMove::Offload {
            ticket: 9,
            blocks: vec![4],
        });
        let answers = plan.execute(&mut io);
        assert!(matches!(
            answers[0],
            TransferAnswer::RestoreFailed {
                seq: 1,
                keep_tokens: 16,
                from: Place::Disk,
                ..
            }
        ));
        assert!(matches!(
            answers[1],
            TransferAnswer::OffloadFailed { ticket: 9, .. }
        ));
    }

    #[test]
    fn copies_answer_each_pair() {
        let mut io = io(None);
        let mut plan = TransferPlan::default();
        plan.push(BlockMove::Copy {
            seq: 1,
            src: 1,
            dst: 6,
            keep_tokens: 0,
        });
        plan.push(BlockMove::Copy {
            seq: 2,
            src: 2,
            dst: 99,
            keep_tokens: 32,
        });
        let answers = plan.execute(&mut io);
        assert_eq!(answers[0], TransferAnswer::Copied { seq: 1 });
        assert!(matches!(
            answers[1],
            TransferAnswer::CopyFailed {
                seq: 2,
                keep_tokens: 32,
                ..
            }
        ));
        assert_eq!(io.inner.bytes(6), &[1; 4]);
    }
}
