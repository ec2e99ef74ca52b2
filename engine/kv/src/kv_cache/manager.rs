//! The KV cache manager: per-sequence block tables over the block pool, prefix hashing of full
//! blocks, and the hand-over of a finished sequence's blocks to its idle session.
//!
//! Invariants (checked by [`KvCacheManager::check`]):
//! - every pool reference is owned by exactly one holder: a running sequence's block table or
//!   a resident idle session's block list; a block appears at most once per holder, so a
//!   block's reference count equals the number of holders listing it;
//! - a holder's `hashes[i]` is the chained hash of its block `i`, for the leading full blocks
//!   whose tokens are known computed; only those blocks are ever shared, and a block with more
//!   than one holder is never written (a write into shared content copies it first);
//! - blocks are released last-block-first, so a freed sequence's prefix stays cached longest.
//!
//! Time is the caller's monotonic milliseconds (`now`); nothing here reads a clock.

use std::collections::{HashMap, HashSet, VecDeque};

use super::block_pool::{BlockId, BlockPool};
use super::cost::CostModel;
use super::offload_store::{OffloadStore, StoreConfig};
use super::prefix_hash::ROOT_HASH;
use super::stats::KvStats;
use super::tier::{TierId, Tiers};
use super::transfer::{Ticket, TransferPlan};

pub use super::ids::SeqId;

/// Sizing of the KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct KvConfig {
    /// Blocks in the device pool.
    pub num_blocks: u32,
    /// Tokens per block.
    pub block_size: usize,
    /// Bytes of one block (all layers, K and V); must equal the store's `block_bytes()`.
    pub block_bytes: usize,
    /// Host and disk budgets for offloaded KV.
    pub store: StoreConfig,
    /// Cost model constants.
    pub cost: CostModel,
    /// How many dropped session ids to remember, to tell "recompute" from "fresh".
    pub remembered_drops: usize,
}

impl KvConfig {
    /// A device-only cache (no host or disk tier) of `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: u32, block_size: usize, block_bytes: usize) -> Self {
        KvConfig {
            num_blocks,
            block_size: block_size.max(1),
            block_bytes,
            store: StoreConfig::default(),
            cost: CostModel::default(),
            remembered_drops: 4096,
        }
    }

    /// The device byte budget: `num_blocks × block_bytes`.
    pub fn device_budget_bytes(&self) -> usize {
        self.num_blocks as usize * self.block_bytes
    }
}

/// Who holds an idle session record: a named chat session, or a preempted sequence waiting to
/// resume.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum SessionKey {
    Named(String),
    Preempted(SeqId),
}

/// Blocks of a running sequence.
#[derive(Clone, Debug, Default)]
pub(super) struct SeqKv {
    pub(super) tier: TierId,
    pub(super) blocks: Vec<BlockId>,
    pub(super) hashes: Vec<u64>,
}

/// Where an idle session's KV is.
#[derive(Clone, Debug)]
pub(super) enum IdleKv {
    Resident {
        blocks: Vec<BlockId>,
        hashes: Vec<u64>,
    },
    Stored(super::ids::EntryId),
    /// Its blocks are released and their offload is in this step's transfer plan; the bytes
    /// reach the store when the move is answered (a return before that recomputes).
    Offloading(super::transfer::Ticket),
}

/// A session between requests (or a preempted sequence between steps).
#[derive(Clone, Debug)]
pub(super) struct IdleSession {
    pub(super) tier: TierId,
    /// Tokens whose KV the session holds.
    pub(super) tokens: Vec<u32>,
    pub(super) kv: IdleKv,
    pub(super) last_use: u64,
}

/// The KV cache manager. One owner (the engine loop, through the scheduler); no locks.
#[derive(Debug)]
pub struct KvCacheManager {
    pub(super) block_size: usize,
    pub(super) block_bytes: usize,
    pub(super) cost: CostModel,
    pub(super) tiers: Tiers,
    pub(super) pool: BlockPool,
    pub(super) seqs: HashMap<SeqId, SeqKv>,
    pub(super) sessions: HashMap<SessionKey, IdleSession>,
    pub(super) store: OffloadStore<SessionKey>,
    pub(super) drops: RecentKeys,
    pub(super) stats: KvStats,
    /// Block moves decided since the engine loop last took them.
    pub(super) transfers: TransferPlan,
    /// Offloads decided and not answered yet.
    pub(super) offloading: HashMap<Ticket, InFlight>,
    pub(super) next_ticket: Ticket,
}

/// An offload between its decision and its answer.
#[derive(Clone, Debug)]
pub(super) struct InFlight {
    pub(super) key: SessionKey,
    /// Its tier's name (the eviction is recounted as a drop if the bytes never arrive).
    pub(super) tier: String,
}

impl KvCacheManager {
    /// A manager with all blocks free.
    pub fn new(cfg: KvConfig, tiers: Tiers) -> Self {
        KvCacheManager {
            block_size: cfg.block_size.max(1),
            block_bytes: cfg.block_bytes,
            cost: cfg.cost,
            tiers,
            pool: BlockPool::new(cfg.num_blocks),
            seqs: HashMap::new(),
            sessions: HashMap::new(),
            store: OffloadStore::new(cfg.store),
            drops: RecentKeys::new(cfg.remembered_drops),
            stats: KvStats::default(),
            transfers: TransferPlan::default(),
            offloading: HashMap::new(),
            next_ticket: 0,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes per block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// The tier table.
    pub fn tiers(&self) -> &Tiers {
        &self.tiers
    }

    /// Replaces the tier table (a pushed TierPolicy). Live sequences and idle sessions keep
    /// their tier by name; a tier that disappeared maps to the new default. Returns the id
    /// map (`old id → new id`) so the caller can remap its own records the same way.
    pub fn set_tiers(&mut self, tiers: Tiers) -> Vec<TierId> {
        let map: Vec<TierId> = self
            .tiers
            .all()
            .iter()
            .map(|t| tiers.id_of(&t.name).unwrap_or(tiers.default_id()))
            .collect();
        let remap = |id: TierId| map.get(id).copied().unwrap_or(tiers.default_id());
        for s in self.seqs.values_mut() {
            s.tier = remap(s.tier);
        }
        for s in self.sessions.values_mut() {
            s.tier = remap(s.tier);
        }
        self.tiers = tiers;
        map
    }

    /// Replaces the cost model (calibrated from measured prefill speed and copy bandwidth).
    pub fn set_cost_model(&mut self, cost: CostModel) {
        self.cost = cost;
    }

    /// Blocks in the pool.
    pub fn blocks_total(&self) -> usize {
        self.pool.num_blocks()
    }

    /// Blocks held by sequences or idle sessions.
    pub fn blocks_used(&self) -> usize {
        self.pool.num_used()
    }

    /// Blocks that can be handed out without evicting any session.
    pub fn blocks_free(&self) -> usize {
        self.pool.num_free()
    }

    /// Bytes of offloaded KV in host RAM.
    pub fn host_bytes_used(&self) -> usize {
        self.store.host_used()
    }

    /// Bytes of offloaded KV on disk.
    pub fn disk_bytes_used(&self) -> usize {
        self.store.disk_used()
    }

    /// Idle sessions (resident or stored), including preempted sequences waiting to resume.
    pub fn idle_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Counters.
    pub fn stats(&self) -> &KvStats {
        &self.stats
    }

    /// The offload store's counters (spills, drops, disk errors).
    pub fn store_stats(&self) -> super::offload_store::StoreStats {
        self.store.stats()
    }

    /// The block table of a running sequence.
    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.seqs.get(&seq).map(|s| s.blocks.as_slice())
    }

    /// Whether `seq` has a block table.
    pub fn has_seq(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Grows `seq`'s block table to hold `total_tokens` tokens, evicting idle sessions if the
    /// pool is short. All or nothing: `None` (and no change to `seq`) when the blocks cannot be
    /// found even after evicting every evictable idle session.
    pub fn allocate_slots(&mut self, seq: SeqId, total_tokens: usize, now: u64) -> Option<()> {
        let have = self.seqs.get(&seq)?.blocks.len();
        let need = self.blocks_for(total_tokens).saturating_sub(have);
        if need == 0 {
            return Some(());
        }
        if !self.ensure_free(need, now, None) {
            return None;
        }
        let mut fresh = Vec::with_capacity(need);
        for _ in 0..need {
            fresh.push(self.pool.allocate()?);
        }
        self.seqs.get_mut(&seq)?.blocks.extend(fresh);
        Some(())
    }

    /// Records that the KV of `computed` (the sequence's first tokens) is now written, hashing
    /// the blocks that became full so later sequences can share them.
    pub fn cache_full_blocks(&mut self, seq: SeqId, computed: &[u32]) {
        let b = self.block_size;
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        let full = (computed.len() / b).min(s.blocks.len());
        while s.hashes.len() < full {
            let i = s.hashes.len();
            let parent = s.hashes.last().copied().unwrap_or(ROOT_HASH);
            let h = self
                .pool
                .set_content(s.blocks[i], parent, &computed[i * b..(i + 1) * b]);
            s.hashes.push(h);
        }
    }

    /// Frees `seq`'s blocks now (cancel, or finish without a session), and forgets any KV it
    /// had parked while preempted.
    pub fn free_seq(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            self.release_all(&s.blocks);
        }
        let key = SessionKey::Preempted(seq);
        if let Some(idle) = self.sessions.remove(&key) {
            self.discard_idle(idle);
        }
        self.drops.remove(&key);
    }

    /// Ends `seq`. With a session id, its blocks stay resident as that session's idle KV
    /// (replacing any older idle KV of the same session) for `computed` tokens; without one,
    /// they are freed.
    pub fn finish_seq(&mut self, seq: SeqId, session: Option<&str>, computed: &[u32], now: u64) {
        let Some(name) = session else {
            self.free_seq(seq);
            return;
        };
        self.cache_full_blocks(seq, computed);
        let Some(mut s) = self.seqs.remove(&seq) else {
            return;
        };
        self.free_seq(seq);
        // Keep only the blocks that hold computed tokens.
        let keep = self.blocks_for(computed.len()).min(s.blocks.len());
        let extra: Vec<BlockId> = s.blocks.drain(keep..).collect();
        self.release_all(&extra);
        let key = SessionKey::Named(name.to_string());
        if let Some(old) = self.sessions.remove(&key) {
            self.discard_idle(old);
        }
        self.drops.remove(&key);
        let tokens = computed[..computed.len().min(keep * self.block_size)].to_vec();
        self.sessions.insert(
            key,
            IdleSession {
                tier: s.tier,
                tokens,
                kv: IdleKv::Resident {
                    blocks: s.blocks,
                    hashes: s.hashes,
                },
                last_use: now,
            },
        );
    }

    /// Marks a named session as just used (a request for it is queued), so LRU eviction
    /// spares it while the request waits.
    pub fn touch_session(&mut self, session: &str, now: u64) {
        if let Some(idle) = self
            .sessions
            .get_mut(&SessionKey::Named(session.to_string()))
        {
            idle.last_use = idle.last_use.max(now);
        }
    }

    /// Forgets a named session's idle KV (resident or stored) at once.
    pub fn forget_session(&mut self, session: &str) {
        let key = SessionKey::Named(session.to_string());
        if let Some(idle) = self.sessions.remove(&key) {
            self.discard_idle(idle);
        }
    }

    pub(super) fn discard_idle(&mut self, idle: IdleSession) {
        match idle.kv {
            IdleKv::Resident { blocks, .. } => self.release_all(&blocks),
            IdleKv::Stored(id) => {
                self.store.remove(id);
            }
            IdleKv::Offloading(ticket) => {
                // The read still runs (it is in the plan); its answer finds no one waiting.
                self.offloading.remove(&ticket);
            }
        }
    }

    /// Releases blocks last-first, so earlier (prefix) blocks end up most recently used.
    pub(super) fn release_all(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            let ok = self.pool.release(b);
            debug_assert!(ok, "block {b} released twice");
        }
    }

    /// Verifies the invariants in the module note, the pool's and the store's.
    pub fn check(&self) -> Result<(), String> {
        self.pool.check()?;
        self.store.check()?;
        let mut refs: HashMap<BlockId, u32> = HashMap::new();
        let mut holders: Vec<&[BlockId]> =
            self.seqs.values().map(|s| s.blocks.as_slice()).collect();
        for idle in self.sessions.values() {
            match &idle.kv {
                IdleKv::Resident { blocks, .. } => holders.push(blocks),
                IdleKv::Stored(id) => {
                    if self.store.peek(*id).is_none() {
                        return Err(format!("session points at missing store entry {id}"));
                    }
                }
                IdleKv::Offloading(t) => {
                    if !self.offloading.contains_key(t) {
                        return Err(format!("session points at unknown offload {t}"));
                    }
                }
            }
        }
        for blocks in holders {
            let mut seen = HashSet::new();
            for &b in blocks {
                if !seen.insert(b) {
                    return Err(format!("block {b} twice in one table"));
                }
                *refs.entry(b).or_insert(0) += 1;
            }
        }
        for b in 0..self.pool.num_blocks() as BlockId {
            let want = refs.get(&b).copied().unwrap_or(0);
            if self.pool.ref_count(b) != want {
                return Err(format!(
                    "block {b}: ref {} but {want} holders",
                    self.pool.ref_count(b)
                ));
            }
        }
        if self.pool.num_used() > self.pool.num_blocks() {
            return Err("more blocks used than exist".into());
        }
        Ok(())
    }
}

/// A bounded set of recently dropped session keys (oldest forgotten first).
#[derive(Debug)]
pub(super) struct RecentKeys {
    cap: usize,
    order: VecDeque<SessionKey>,
    set: HashSet<SessionKey>,
}

impl RecentKeys {
    fn new(cap: usize) -> Self {
        RecentKeys {
            cap,
            order: VecDeque::new(),
            set: HashSet::new(),
        }
    }

    pub(super) fn insert(&mut self, key: SessionKey) {
        if self.cap == 0 || !self.set.insert(key.clone()) {
            return;
        }
        self.order.push_back(key);
        while self.order.len() > self.cap {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    /// Removes `key`; returns whether it was there. (Its queue slot ages out lazily.)
    pub(super) fn remove(&mut self, key: &SessionKey) -> bool {
        self.set.remove(key)
    }
}
