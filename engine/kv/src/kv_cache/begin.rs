//! Starting (or resuming) a sequence: reuse a returning session's resident blocks, restore its
//! offloaded bytes from host or disk, or fall back to shared-prefix hits and recompute.
//!
//! Invariants:
//! - at most `tokens.len() - 1` tokens are ever reported computed, so the sequence always
//!   computes at least its last token (the runner needs its logits);
//! - all or nothing: when the blocks for the reused prefix plus the first chunk cannot be
//!   found, `begin_seq` returns `None`, holds no block for the sequence and leaves the
//!   session's KV where it was (at most truncated to the part the new prompt shares);
//! - a reused partial block that other holders share is copied before it can be written
//!   (a copy move in the step's transfer plan); a sole holder's block just loses its hash;
//! - restored bytes count as computed only if every one of them arrived intact: a spill file
//!   that is missing, short or fails its checksum makes the return a recompute at once; a
//!   restore move that fails is answered back and the sequence recomputes from its hits
//!   (counted under `Recompute` and as a restore failure of the place the bytes were, and
//!   logged); a failed copy-on-write recomputes that one block. Restored blocks join the
//!   shared-prefix cache only when their move succeeded;
//! - a session whose offload is still in this step's plan is not restored: it recomputes.

use super::block_pool::BlockId;
use super::manager::{IdleKv, IdleSession, KvCacheManager, SeqId, SeqKv, SessionKey};
use super::offload_store::{EntryId, Place};
use super::prefix_hash::{ROOT_HASH, block_hash};
use super::stats::KvSource;
use super::tier::TierId;
use super::transfer::BlockMove;

/// What a sequence asks for when it starts (or resumes after preemption).
#[derive(Clone, Copy, Debug)]
pub struct SeqStart<'a> {
    /// The sequence.
    pub seq: SeqId,
    /// Its tier.
    pub tier: TierId,
    /// All its known tokens (prompt, plus tokens generated before a preemption).
    pub tokens: &'a [u32],
    /// Its chat session, whose idle KV it may reuse.
    pub session: Option<&'a str>,
    /// New tokens it will compute in its first step (room is made for them too).
    pub chunk: usize,
}

/// How a sequence started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Begin {
    /// Leading tokens whose KV is already in the block table.
    pub computed: usize,
    /// Where that KV came from.
    pub source: KvSource,
}

/// A stored session's restore, planned (see [`KvCacheManager::plan_restore`]).
struct Plan {
    /// Leading full blocks found in the shared-prefix cache.
    hits: usize,
    /// The stored entry's blocks up to this index are worth having.
    restore_to: usize,
    /// Whether reading them back beats recomputing them.
    worth: bool,
    /// Tokens computed if the restore succeeds (only the hits' tokens otherwise).
    computed: usize,
    /// Tokens the first step needs room for.
    total: usize,
    /// Nothing to restore, and the hits already cover the session's KV.
    as_resident: bool,
}

/// Length of the common prefix of two token lists.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl KvCacheManager {
    /// Gives a starting sequence a block table covering the KV it can reuse plus room for its
    /// first `chunk` new tokens. A preempted sequence resumes its own parked KV; otherwise a
    /// named session's idle KV is used; otherwise shared-prefix hits. `None` when the blocks
    /// cannot be found (nothing changes for the caller's request).
    pub fn begin_seq(&mut self, start: SeqStart<'_>, now: u64) -> Option<Begin> {
        if self.seqs.contains_key(&start.seq) || start.tokens.is_empty() {
            return None;
        }
        let preempted = SessionKey::Preempted(start.seq);
        let key = if self.sessions.contains_key(&preempted) || self.drops.remove(&preempted) {
            preempted
        } else if let Some(name) = start.session {
            SessionKey::Named(name.to_string())
        } else {
            let computed = self.begin_prefix(start, now)?;
            return Some(Begin {
                computed,
                source: KvSource::Fresh,
            });
        };
        let idle = self.sessions.remove(&key);
        let known =
            idle.is_some() || matches!(key, SessionKey::Preempted(_)) || self.drops.remove(&key);
        let begun = match idle {
            Some(
                idle @ IdleSession {
                    kv: IdleKv::Resident { .. },
                    ..
                },
            ) => self.begin_resident(start, key.clone(), idle, now),
            Some(
                idle @ IdleSession {
                    kv: IdleKv::Offloading(_),
                    ..
                },
            ) => {
                // Its bytes are still on their way out in this step's plan: recompute.
                self.discard_idle(idle);
                self.begin_prefix(start, now).map(|computed| Begin {
                    computed,
                    source: KvSource::Recompute,
                })
            }
            Some(idle) => self.begin_stored(start, key.clone(), idle, now),
            None => self.begin_prefix(start, now).map(|computed| Begin {
                computed,
                source: if known {
                    KvSource::Recompute
                } else {
                    KvSource::Fresh
                },
            }),
        };
        match &begun {
            Some(b) => {
                self.stats.restored(b.source);
                debug_assert!(b.computed < start.tokens.len());
            }
            None if known && !self.sessions.contains_key(&key) => self.drops.insert(key),
            None => {}
        }
        begun
    }

    /// Shared-prefix hits for `tokens` (full blocks only, at most `cap` tokens): the acquired
    /// blocks and their chained hashes.
    fn acquire_prefix_hits(&mut self, tokens: &[u32], cap: usize) -> (Vec<BlockId>, Vec<u64>) {
        let b = self.block_size;
        let mut blocks = Vec::new();
        let mut hashes = Vec::new();
        let mut parent = ROOT_HASH;
        for i in 0..cap / b {
            let chunk = &tokens[i * b..(i + 1) * b];
            let Some(hit) = self.pool.lookup(parent, chunk) else {
                break;
            };
            self.pool.acquire(hit);
            parent = block_hash(parent, chunk);
            blocks.push(hit);
            hashes.push(parent);
        }
        (blocks, hashes)
    }

    /// Fresh start (or recompute): shared-prefix hits plus new blocks for the first chunk.
    /// Returns the computed token count.
    fn begin_prefix(&mut self, start: SeqStart<'_>, now: u64) -> Option<usize> {
        let SeqStart {
            seq,
            tier,
            tokens,
            chunk,
            ..
        } = start;
        let (blocks, hashes) = self.acquire_prefix_hits(tokens, tokens.len() - 1);
        let computed = blocks.len() * self.block_size;
        let total = (computed + chunk).min(tokens.len());
        let need = self.blocks_for(total).saturating_sub(blocks.len());
        if !self.ensure_free(need, now, None) {
            self.release_all(&blocks);
            return None;
        }
        self.stats.prefix_hit_tokens += computed as u64;
        self.install(seq, tier, blocks, hashes, need)?;
        Some(computed)
    }

    /// Returning session with resident blocks: keep those its new prompt shares.
    fn begin_resident(
        &mut self,
        start: SeqStart<'_>,
        key: SessionKey,
        idle: IdleSession,
        now: u64,
    ) -> Option<Begin> {
        let SeqStart {
            seq,
            tier,
            tokens,
            chunk,
            ..
        } = start;
        let IdleSession {
            tier: stier,
            tokens: stok,
            kv:
                IdleKv::Resident {
                    mut blocks,
                    mut hashes,
                },
            ..
        } = idle
        else {
            return None;
        };
        let b = self.block_size;
        let reuse = common_prefix(&stok, tokens).min(tokens.len() - 1);
        let keep = self.blocks_for(reuse).min(blocks.len());
        let reuse = reuse.min(keep * b);
        let extra: Vec<BlockId> = blocks.drain(keep..).collect();
        self.release_all(&extra);
        hashes.truncate(reuse / b);
        // A partial last block gets written: it must not stay shared or hashed.
        let partial = !reuse.is_multiple_of(b);
        let cow = partial && keep > 0 && self.pool.ref_count(blocks[keep - 1]) > 1;
        let total = (reuse + chunk).min(tokens.len());
        let need = self.blocks_for(total).saturating_sub(keep) + usize::from(cow);
        if !self.ensure_free(need, now, Some(&key)) {
            self.sessions.insert(
                key,
                IdleSession {
                    tier: stier,
                    tokens: stok[..reuse].to_vec(),
                    kv: IdleKv::Resident { blocks, hashes },
                    last_use: now,
                },
            );
            return None;
        }
        if partial && keep > 0 {
            let last = blocks[keep - 1];
            if cow {
                let copy = self.pool.allocate()?;
                // If the copy fails, the answer sends the sequence back to that block's start.
                self.transfers.push(BlockMove::Copy {
                    seq,
                    src: last,
                    dst: copy,
                    keep_tokens: (keep - 1) * b,
                });
                self.stats.cow_copies += 1;
                self.pool.release(last);
                blocks[keep - 1] = copy;
            } else {
                self.pool.clear_content(last);
            }
        }
        self.install(seq, tier, blocks, hashes, need - usize::from(cow))?;
        Some(Begin {
            computed: reuse,
            source: KvSource::Resident,
        })
    }

    /// What a stored session's return will reuse, decided before any byte moves.
    fn plan_restore(&self, id: EntryId, stored: &[u32], start: SeqStart<'_>, hits: usize) -> Plan {
        let bsz = self.block_size;
        let cap = start.tokens.len() - 1;
        let stored_reuse = common_prefix(stored, start.tokens).min(cap);
        let (stored_bytes, place) = self.store.peek(id).unwrap_or((0, Place::Host));
        let stored_blocks = stored_bytes / self.block_bytes.max(1);
        let restore_to = self.blocks_for(stored_reuse).min(stored_blocks);
        let stored_reuse = stored_reuse.min(restore_to * bsz);
        let restore_n = restore_to.saturating_sub(hits);
        let worth = restore_n > 0
            && self.cost.restore_beats_recompute(
                restore_n * self.block_bytes,
                stored_reuse.saturating_sub(hits * bsz),
                place == Place::Disk,
            );
        let computed = if worth {
            stored_reuse.max(hits * bsz)
        } else {
            hits * bsz
        };
        // Nothing to read and the hits cover what the session had: as good as resident.
        let as_resident = restore_n == 0 && hits * bsz >= stored_reuse && stored_reuse > 0;
        Plan {
            hits,
            restore_to,
            worth,
            computed,
            total: (computed + start.chunk).min(start.tokens.len()),
            as_resident,
        }
    }

    /// Returning session (or resuming preempted sequence) whose KV is in host RAM or on disk:
    /// shared-prefix hits first, then the rest restored from the store when reading beats
    /// recomputing. A restore that fails (bad spill file, failed block write) recomputes.
    fn begin_stored(
        &mut self,
        start: SeqStart<'_>,
        key: SessionKey,
        idle: IdleSession,
        now: u64,
    ) -> Option<Begin> {
        let IdleKv::Stored(id) = idle.kv else {
            return None;
        };
        let bsz = self.block_size;
        let (hit_blocks, hashes) = self.acquire_prefix_hits(start.tokens, start.tokens.len() - 1);
        let plan = self.plan_restore(id, &idle.tokens, start, hit_blocks.len());
        let need = self.blocks_for(plan.total).saturating_sub(plan.hits);
        if !self.ensure_free(need, now, Some(&key)) {
            self.release_all(&hit_blocks);
            // Evictions made while trying may have pushed this entry out of the store.
            if self.store.peek(id).is_some() {
                self.sessions.insert(key, idle);
            } else {
                self.drops.insert(key);
            }
            return None;
        }
        self.stats.prefix_hit_tokens += (plan.hits * bsz) as u64;
        let mut blocks = hit_blocks;
        let (restored, restore_image) = if plan.worth {
            match self.restore_entry(&key, id, &plan, &mut blocks) {
                Some((from, first, image)) => (Some(from), Some((first, image))),
                None => (None, None),
            }
        } else {
            self.store.remove(id);
            (None, None)
        };
        let (computed, source) = match restored {
            Some(Place::Host) => (plan.computed, KvSource::Host),
            Some(Place::Disk) => (plan.computed, KvSource::Disk),
            None if plan.as_resident => (plan.hits * bsz, KvSource::Resident),
            None => (plan.hits * bsz, KvSource::Recompute),
        };
        let more = self
            .blocks_for(plan.total.max(computed))
            .saturating_sub(blocks.len());
        self.install(start.seq, start.tier, blocks, hashes, more)?;
        if let (Some(from), Some((first, image))) = (restored, restore_image) {
            let blocks = self.seqs.get(&start.seq)?.blocks[first..plan.restore_to].to_vec();
            // The restored blocks join the shared-prefix cache only once their bytes landed.
            self.transfers.push(BlockMove::Restore {
                seq: start.seq,
                blocks,
                image,
                from,
                keep_tokens: plan.hits * bsz,
                cache_tokens: start.tokens[..computed].to_vec(),
            });
        }
        Some(Begin { computed, source })
    }

    /// Takes entry `id` out of the store and allocates fresh blocks for its blocks
    /// `plan.hits..plan.restore_to`, appended to `blocks`. Returns where the bytes were, the
    /// index in `blocks` of the first fresh block and the images to write there, or `None`
    /// when the entry is gone or its spill file could not be read back intact (counted and
    /// logged; the caller recomputes).
    fn restore_entry(
        &mut self,
        key: &SessionKey,
        id: EntryId,
        plan: &Plan,
        blocks: &mut Vec<BlockId>,
    ) -> Option<(Place, usize, Vec<u8>)> {
        let taken = self.store.take(id);
        // Waiting for this entry's file may have answered other writes, failed ones too.
        self.forget_failed_spills();
        let (bytes, place) = match taken {
            Ok(found) => found?,
            Err(e) => {
                self.stats.restore_failed(Place::Disk);
                tracing::warn!(session = ?key, error = %e, "KV restore from disk failed; recomputing");
                return None;
            }
        };
        let bb = self.block_bytes;
        let want = plan.hits * bb..plan.restore_to * bb;
        // The entry's bytes are ours now: pass them on without a copy when they start at the
        // first block to restore (the usual case: no shared-prefix hits).
        let image = if want.start == 0 && want.end <= bytes.len() {
            let mut bytes = bytes;
            bytes.truncate(want.end);
            bytes
        } else {
            bytes.get(want)?.to_vec()
        };
        let first = blocks.len();
        for _ in plan.hits..plan.restore_to {
            blocks.push(self.pool.allocate()?);
        }
        Some((place, first, image))
    }

    /// Registers `seq` with `blocks` (already held) plus `more` freshly allocated blocks.
    fn install(
        &mut self,
        seq: SeqId,
        tier: TierId,
        mut blocks: Vec<BlockId>,
        hashes: Vec<u64>,
        more: usize,
    ) -> Option<()> {
        for _ in 0..more {
            blocks.push(self.pool.allocate()?);
        }
        self.seqs.insert(
            seq,
            SeqKv {
                tier,
                blocks,
                hashes,
            },
        );
        Some(())
    }
}
