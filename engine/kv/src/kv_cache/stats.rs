//! Counters the KV cache manager keeps for metrics: evictions by tier and action, restores by
//! source, failed restores by the place the bytes were, prefix and session reuse.
//!
//! Invariant: counters only grow; every eviction or restore the manager performs is counted
//! exactly once, at the moment it happens.

use std::collections::BTreeMap;

use super::offload_store::Place;

/// What an eviction did with the KV.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EvictAction {
    /// Freed; a return recomputes it.
    Drop,
    /// Copied to host RAM (or disk), then freed.
    Offload,
}

impl EvictAction {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            EvictAction::Drop => "drop",
            EvictAction::Offload => "offload",
        }
    }
}

/// Where a sequence's reused KV came from when it started (or resumed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvSource {
    /// No session history: only shared-prefix hits, if any.
    Fresh,
    /// The session's blocks were still on the device.
    Resident,
    /// Restored from host RAM.
    Host,
    /// Restored from a disk file.
    Disk,
    /// The session's KV was gone (dropped or not worth restoring): recomputed by prefill.
    Recompute,
}

impl KvSource {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            KvSource::Fresh => "fresh",
            KvSource::Resident => "resident",
            KvSource::Host => "host",
            KvSource::Disk => "disk",
            KvSource::Recompute => "recompute",
        }
    }
}

/// Counters of the KV cache manager.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvStats {
    /// Evictions of idle or preempted KV, by tier name and action.
    pub evictions: BTreeMap<(String, EvictAction), u64>,
    /// Returning sessions (or resumed preempted sequences) restored from host RAM.
    pub restores_host: u64,
    /// ... restored from disk.
    pub restores_disk: u64,
    /// ... recomputed by prefill (including those whose restore failed).
    pub restores_recompute: u64,
    /// Restores from host RAM that failed (the device write of a block failed); each was
    /// recomputed instead, so it is also in `restores_recompute`.
    pub restore_failures_host: u64,
    /// Restores from disk that failed (the spill file was missing, short, corrupt or
    /// unreadable, or the device write failed); also in `restores_recompute`.
    pub restore_failures_disk: u64,
    /// Returning sessions whose blocks were still resident.
    pub resident_hits: u64,
    /// Prompt tokens whose KV came from the shared-prefix cache.
    pub prefix_hit_tokens: u64,
    /// Blocks copied because a shared block had to be written (copy-on-write).
    pub cow_copies: u64,
}

impl KvStats {
    pub(super) fn evicted(&mut self, tier: &str, action: EvictAction) {
        *self
            .evictions
            .entry((tier.to_string(), action))
            .or_insert(0) += 1;
    }

    pub(super) fn restored(&mut self, source: KvSource) {
        match source {
            KvSource::Fresh => {}
            KvSource::Resident => self.resident_hits += 1,
            KvSource::Host => self.restores_host += 1,
            KvSource::Disk => self.restores_disk += 1,
            KvSource::Recompute => self.restores_recompute += 1,
        }
    }

    /// An eviction counted as an offload whose bytes never reached the store: a drop.
    pub(super) fn recount_as_drop(&mut self, tier: &str) {
        if let Some(n) = self
            .evictions
            .get_mut(&(tier.to_string(), EvictAction::Offload))
        {
            *n = n.saturating_sub(1);
        }
        self.evicted(tier, EvictAction::Drop);
    }

    /// A restore counted under `source` whose move failed: a recompute after all.
    pub(super) fn unrestored(&mut self, source: KvSource) {
        let n = match source {
            KvSource::Host => &mut self.restores_host,
            KvSource::Disk => &mut self.restores_disk,
            _ => return,
        };
        *n = n.saturating_sub(1);
        self.restores_recompute += 1;
    }

    pub(super) fn restore_failed(&mut self, from: Place) {
        match from {
            Place::Host => self.restore_failures_host += 1,
            Place::Disk => self.restore_failures_disk += 1,
        }
    }

    /// Failed restores by where the bytes were: `[(Host, n), (Disk, n)]`.
    pub fn restore_failures(&self) -> [(KvSource, u64); 2] {
        [
            (KvSource::Host, self.restore_failures_host),
            (KvSource::Disk, self.restore_failures_disk),
        ]
    }

    /// Evictions of `tier` with `action`.
    pub fn evictions_of(&self, tier: &str, action: EvictAction) -> u64 {
        self.evictions
            .get(&(tier.to_string(), action))
            .copied()
            .unwrap_or(0)
    }
}
