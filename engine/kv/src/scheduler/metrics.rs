//! One read-only snapshot of everything the engine's `/metrics` endpoint needs from the
//! scheduler and the KV cache, so the server never reaches into either.
//!
//! Invariant: a snapshot is a copy; taking one changes nothing.

use crate::kv_cache::{EvictAction, KvSource};

use super::core::Scheduler;
use super::request::State;

/// Gauges and counters at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Requests running / waiting.
    pub running: usize,
    /// Requests waiting, by tier name (every tier listed).
    pub waiting_by_tier: Vec<(String, usize)>,
    /// KV blocks held / in the pool.
    pub blocks_used: usize,
    /// KV blocks in the pool.
    pub blocks_total: usize,
    /// Offloaded KV bytes in host RAM / on disk.
    pub host_bytes: usize,
    /// Offloaded KV bytes on disk.
    pub disk_bytes: usize,
    /// Idle sessions (resident or offloaded), including preempted sequences.
    pub idle_sessions: usize,
    /// Evictions by tier name and action.
    pub evictions: Vec<(String, EvictAction, u64)>,
    /// Returning sessions by where their KV came from (resident, host, disk, recompute).
    pub restores: Vec<(KvSource, u64)>,
    /// Restores that failed and were recomputed, by where the bytes were (host, disk).
    pub restore_failures: Vec<(KvSource, u64)>,
    /// Prompt tokens served from the shared-prefix cache.
    pub prefix_hit_tokens: u64,
    /// Preemptions of running sequences.
    pub preemptions: u64,
    /// Tokens computed as prefill / decode.
    pub prefill_tokens: u64,
    /// Tokens computed as decode.
    pub decode_tokens: u64,
    /// Requests finished / cancelled.
    pub finished: u64,
    /// Requests cancelled.
    pub cancelled: u64,
}

impl Scheduler {
    /// A snapshot for metrics.
    pub fn snapshot(&self) -> Snapshot {
        let kv = &self.kv;
        let tiers = kv.tiers();
        let mut waiting_by_tier: Vec<(String, usize)> =
            tiers.all().iter().map(|t| (t.name.clone(), 0)).collect();
        for r in self.reqs.values().filter(|r| r.state == State::Waiting) {
            let name = &tiers.get(r.tier).name;
            if let Some(slot) = waiting_by_tier.iter_mut().find(|(n, _)| n == name) {
                slot.1 += 1;
            }
        }
        let s = kv.stats();
        Snapshot {
            running: self.running.len(),
            waiting_by_tier,
            blocks_used: kv.blocks_used(),
            blocks_total: kv.blocks_total(),
            host_bytes: kv.host_bytes_used(),
            disk_bytes: kv.disk_bytes_used(),
            idle_sessions: kv.idle_sessions(),
            evictions: s
                .evictions
                .iter()
                .map(|((tier, action), n)| (tier.clone(), *action, *n))
                .collect(),
            restores: vec![
                (KvSource::Resident, s.resident_hits),
                (KvSource::Host, s.restores_host),
                (KvSource::Disk, s.restores_disk),
                (KvSource::Recompute, s.restores_recompute),
            ],
            restore_failures: s.restore_failures().to_vec(),
            prefix_hit_tokens: s.prefix_hit_tokens,
            preemptions: self.stats.preemptions,
            prefill_tokens: self.stats.prefill_tokens,
            decode_tokens: self.stats.decode_tokens,
            finished: self.stats.finished,
            cancelled: self.stats.cancelled,
        }
    }
}
