//! Eviction of idle KV: by TTL, under pressure (cheapest expected loss first), and of a
//! preempted running sequence; plus offloading blocks' bytes into the host/disk store.
//!
//! Invariants:
//! - only idle sessions whose KV is resident are evicted to make room; a running sequence's
//!   blocks are only taken by [`KvCacheManager::preempt_seq`], which the scheduler calls;
//! - a `Retain` tier is evicted under pressure only when no other tier's idle session can free
//!   a block, and never by TTL;
//! - an offload is a move in the step's transfer plan: the blocks are released at once, and
//!   the plan reads them before any later move or the forward pass can write them;
//! - when the store drops an older entry to make room, the session that pointed at it is
//!   removed too (no record ever points at a missing entry).

use std::collections::HashMap;

use super::block_pool::BlockId;
use super::manager::InFlight;
use super::manager::{IdleKv, IdleSession, KvCacheManager, SeqId, SessionKey};
use super::stats::EvictAction;
use super::tier::PressureAction;
use super::transfer::BlockMove;

/// What preempting a running sequence did with its KV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preempted {
    /// Its blocks are being copied out (a move in this step's transfer plan); once they arrive
    /// they are kept in host RAM or on disk and restored when the sequence resumes.
    Offloading,
    /// Freed; the sequence recomputes when it resumes (shared full blocks may still hit).
    Dropped,
}

/// Order of eviction, smallest first: sessions that free blocks on their own before those
/// that only free blocks shared with other idle sessions; other tiers before `Retain`; then
/// the cost model's expected loss per freed block; then least recently used.
#[derive(Clone, Copy, Debug)]
struct VictimRank {
    frees_nothing: bool,
    retain: bool,
    score: f64,
    last_use: u64,
}

impl VictimRank {
    fn cmp(&self, other: &VictimRank) -> std::cmp::Ordering {
        (self.frees_nothing, self.retain)
            .cmp(&(other.frees_nothing, other.retain))
            .then_with(|| self.score.total_cmp(&other.score))
            .then_with(|| self.last_use.cmp(&other.last_use))
    }
}

impl KvCacheManager {
    /// Makes at least `need` blocks free by evicting idle resident sessions (other than
    /// `exclude`), cheapest expected loss first. Returns whether `need` blocks are free.
    pub(super) fn ensure_free(
        &mut self,
        need: usize,
        now: u64,
        exclude: Option<&SessionKey>,
    ) -> bool {
        if self.pool.num_free() >= need {
            return true;
        }
        // Exact early refusal: a block comes free only if every holder of it is an evictable
        // idle session, so never evict anyone for a request that cannot fit anyway.
        let mut idle_holders: HashMap<BlockId, u32> = HashMap::new();
        for (key, idle) in &self.sessions {
            if let (false, IdleKv::Resident { blocks, .. }) = (Some(key) == exclude, &idle.kv) {
                for &b in blocks {
                    *idle_holders.entry(b).or_insert(0) += 1;
                }
            }
        }
        let freeable = idle_holders
            .iter()
            .filter(|&(&b, &n)| self.pool.ref_count(b) == n)
            .count();
        if self.pool.num_free() + freeable < need {
            return false;
        }
        while self.pool.num_free() < need {
            let Some(victim) = self.pick_victim(now, exclude) else {
                return false;
            };
            self.evict_session(&victim, now, true);
        }
        true
    }

    /// The idle resident session whose eviction loses least per block it frees.
    fn pick_victim(&self, now: u64, exclude: Option<&SessionKey>) -> Option<SessionKey> {
        let mut best: Option<(VictimRank, &SessionKey)> = None;
        for (key, idle) in &self.sessions {
            if Some(key) == exclude {
                continue;
            }
            let IdleKv::Resident { blocks, .. } = &idle.kv else {
                continue;
            };
            let freed = blocks
                .iter()
                .filter(|&&b| self.pool.ref_count(b) == 1)
                .count();
            let tier = self.tiers.get(idle.tier);
            let score = self.cost.victim_score(
                tier,
                now.saturating_sub(idle.last_use),
                idle.tokens.len(),
                blocks.len() * self.block_bytes,
                freed,
                tier.on_pressure == PressureAction::Offload,
            );
            let rank = VictimRank {
                frees_nothing: freed == 0,
                retain: tier.on_pressure == PressureAction::Retain,
                score,
                last_use: idle.last_use,
            };
            let better = best
                .as_ref()
                .is_none_or(|(r, k)| rank.cmp(r).then_with(|| key.cmp(k)).is_lt());
            if better {
                best = Some((rank, key));
            }
        }
        best.map(|(_, k)| k.clone())
    }

    /// Applies the tier's action to idle session `key`'s resident KV: offload (when the cost
    /// model says it beats dropping and the store takes it) or drop.
    fn evict_session(&mut self, key: &SessionKey, now: u64, pressure: bool) {
        let Some(idle) = self.sessions.remove(key) else {
            return;
        };
        let IdleKv::Resident { blocks, .. } = &idle.kv else {
            self.sessions.insert(key.clone(), idle);
            return;
        };
        let tier = self.tiers.get(idle.tier).clone();
        if tier.on_pressure == PressureAction::Retain && !pressure {
            self.sessions.insert(key.clone(), idle);
            return;
        }
        let blocks = blocks.clone();
        let bytes = blocks.len() * self.block_bytes;
        let p = self.cost.p_return(&tier, now.saturating_sub(idle.last_use));
        let offload = tier.on_pressure == PressureAction::Offload
            && self.cost.offload_beats_drop(p, idle.tokens.len(), bytes);
        if offload {
            self.offload_blocks(key, &blocks, idle.tokens.clone(), idle.tier, now);
            self.stats.evicted(&tier.name, EvictAction::Offload);
        } else {
            self.stats.evicted(&tier.name, EvictAction::Drop);
            self.drops.insert(key.clone());
        }
        self.release_all(&blocks);
    }

    /// Plans the offload of `blocks` as `key`'s idle KV (with `last_use` = now): the session
    /// waits in [`IdleKv::Offloading`] until the move is answered, when its bytes go to the
    /// store ([`KvCacheManager::apply_transfers`]). The blocks may be released at once: every
    /// later write to them comes later in the plan.
    fn offload_blocks(
        &mut self,
        key: &SessionKey,
        blocks: &[u32],
        tokens: Vec<u32>,
        tier: usize,
        now: u64,
    ) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.transfers.push(BlockMove::Offload {
            ticket,
            blocks: blocks.to_vec(),
        });
        let name = self.tiers.get(tier).name.clone();
        let in_flight = InFlight {
            key: key.clone(),
            tier: name,
        };
        self.offloading.insert(ticket, in_flight);
        self.sessions.insert(
            key.clone(),
            IdleSession {
                tier,
                tokens,
                kv: IdleKv::Offloading(ticket),
                last_use: now,
            },
        );
    }

    /// Applies each tier's TTL: idle resident sessions idle for at least their tier's TTL are
    /// offloaded or dropped (`Retain` tiers stay). Returns how many were evicted.
    pub fn evict_expired(&mut self, now: u64) -> usize {
        self.poll_spills();
        let expired: Vec<SessionKey> = self
            .sessions
            .iter()
            .filter(|(_, s)| matches!(s.kv, IdleKv::Resident { .. }))
            .filter(|(_, s)| {
                let t = self.tiers.get(s.tier);
                t.on_pressure != PressureAction::Retain
                    && now.saturating_sub(s.last_use) >= t.idle_ttl_ms
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in &expired {
            self.evict_session(key, now, false);
        }
        expired.len()
    }

    /// Evicts idle sessions until `need` blocks are free (the admission path's "KV short →
    /// evict idle sessions"). Returns whether `need` blocks are free.
    pub fn make_room(&mut self, need: usize, now: u64) -> bool {
        self.ensure_free(need, now, None)
    }

    /// Takes running sequence `seq`'s blocks away: offloads its `computed` tokens' KV when its
    /// tier offloads and the copy beats recomputing, else drops it. The sequence keeps its id;
    /// a later [`KvCacheManager::begin_seq`] for it restores or recomputes.
    pub fn preempt_seq(&mut self, seq: SeqId, computed: &[u32], now: u64) -> Preempted {
        self.cache_full_blocks(seq, computed);
        let Some(s) = self.seqs.remove(&seq) else {
            return Preempted::Dropped;
        };
        let key = SessionKey::Preempted(seq);
        let tier = self.tiers.get(s.tier).clone();
        let keep = self.blocks_for(computed.len()).min(s.blocks.len());
        let bytes = keep * self.block_bytes;
        let mut outcome = Preempted::Dropped;
        if tier.on_pressure == PressureAction::Offload
            && keep > 0
            && self.cost.preempt_offload_beats_drop(computed.len(), bytes)
        {
            let tokens = computed[..computed.len().min(keep * self.block_size)].to_vec();
            self.offload_blocks(&key, &s.blocks[..keep], tokens, s.tier, now);
            outcome = Preempted::Offloading;
        }
        let action = match outcome {
            Preempted::Offloading => EvictAction::Offload,
            Preempted::Dropped => EvictAction::Drop,
        };
        self.stats.evicted(&tier.name, action);
        if outcome == Preempted::Dropped {
            self.drops.insert(key);
        }
        self.release_all(&s.blocks);
        outcome
    }
}
