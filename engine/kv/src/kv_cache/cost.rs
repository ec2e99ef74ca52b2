//! The expected-cost model that decides what to do with KV a session is not using.
//!
//! Costs are in microseconds of engine time (the resource a pod sells). For an idle session
//! with `t` tokens of KV occupying `bytes`, idle for `idle` ms, in a tier with return
//! probability `p0` and idle TTL `ttl`:
//!
//! - chance it returns: `P = p0 × ttl / (ttl + idle)` (halves at one TTL, decays like 1/idle,
//!   which matches how chat sessions go cold);
//! - drop (free, recompute on return): `P × prefill_us_per_token × t`;
//! - offload (copy to host now, copy back on return): `write(bytes) + P × read(bytes)`;
//! - retain: holding the blocks costs memory × residence time; it is paid by whoever cannot be
//!   admitted, so the TTL bounds it and pressure ends it.
//!
//! Uses:
//! - an `Offload` tier offloads only when offloading is expected to be cheaper than dropping
//!   (tiny sessions are cheaper to recompute than to copy);
//! - under pressure the victim is the idle session whose eviction loses least per block freed,
//!   `min(drop, offload) / blocks × (1 + priority)`: stale sessions (low `P`) of low tiers go
//!   first, and for equal scores the least recently used;
//! - a returning session is restored from host or disk only when the read is cheaper than
//!   recomputing its tokens; a preempted sequence (which will return, `P = 1`) is offloaded
//!   only when `write + read` beats recomputing it.
//!
//! Invariant: every function is pure and total (no NaN for zero TTL or zero tokens).

use super::tier::TierConfig;

/// Machine constants of the cost model. Defaults fit a small model on a 2-core CPU host; the
/// engine can calibrate them from measurements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// Prefill cost of one token.
    pub prefill_us_per_token: f64,
    /// Copying one MiB from the device pool into host RAM.
    pub host_write_us_per_mib: f64,
    /// Copying one MiB from host RAM back into the pool.
    pub host_read_us_per_mib: f64,
    /// Writing one MiB to a disk file.
    pub disk_write_us_per_mib: f64,
    /// Reading one MiB back from a disk file.
    pub disk_read_us_per_mib: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            prefill_us_per_token: 2_000.0,
            host_write_us_per_mib: 200.0,
            host_read_us_per_mib: 200.0,
            disk_write_us_per_mib: 1_000.0,
            disk_read_us_per_mib: 500.0,
        }
    }
}

const MIB: f64 = 1024.0 * 1024.0;

impl CostModel {
    /// Chance that an idle session of `tier` idle for `idle_ms` comes back.
    pub fn p_return(&self, tier: &TierConfig, idle_ms: u64) -> f64 {
        let p0 = tier.return_probability.clamp(0.0, 1.0);
        let ttl = tier.idle_ttl_ms as f64;
        if ttl <= 0.0 {
            return if idle_ms == 0 { p0 } else { 0.0 };
        }
        p0 * ttl / (ttl + idle_ms as f64)
    }

    /// Recomputing `tokens` by prefill.
    pub fn prefill_us(&self, tokens: usize) -> f64 {
        self.prefill_us_per_token * tokens as f64
    }

    /// Expected cost of dropping the KV of `tokens` tokens.
    pub fn drop_cost(&self, p_return: f64, tokens: usize) -> f64 {
        p_return * self.prefill_us(tokens)
    }

    /// Expected cost of offloading `bytes` to host RAM.
    pub fn offload_cost(&self, p_return: f64, bytes: usize) -> f64 {
        let mib = bytes as f64 / MIB;
        mib * self.host_write_us_per_mib + p_return * mib * self.host_read_us_per_mib
    }

    /// Whether an `Offload` tier's idle session should be offloaded rather than dropped.
    pub fn offload_beats_drop(&self, p_return: f64, tokens: usize, bytes: usize) -> bool {
        self.offload_cost(p_return, bytes) < self.drop_cost(p_return, tokens)
    }

    /// Expected loss of evicting an idle session per block freed, weighted by tier priority.
    /// Lower is a better victim.
    pub fn victim_score(
        &self,
        tier: &TierConfig,
        idle_ms: u64,
        tokens: usize,
        bytes: usize,
        freed_blocks: usize,
        can_offload: bool,
    ) -> f64 {
        let p = self.p_return(tier, idle_ms);
        let mut loss = self.drop_cost(p, tokens);
        if can_offload {
            loss = loss.min(self.offload_cost(p, bytes));
        }
        let weight = 1.0 + f64::from(tier.priority.max(0));
        loss / freed_blocks.max(1) as f64 * weight
    }

    /// Whether reading `bytes` back (from disk when `from_disk`) beats recomputing `tokens`.
    pub fn restore_beats_recompute(&self, bytes: usize, tokens: usize, from_disk: bool) -> bool {
        let per_mib = if from_disk {
            self.disk_read_us_per_mib
        } else {
            self.host_read_us_per_mib
        };
        bytes as f64 / MIB * per_mib < self.prefill_us(tokens)
    }

    /// Whether a preempted sequence (sure to return) should be offloaded rather than dropped.
    pub fn preempt_offload_beats_drop(&self, tokens: usize, bytes: usize) -> bool {
        self.offload_beats_drop(1.0, tokens, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tier::PressureAction;
    use super::*;

    #[test]
    fn return_probability_decays_with_idle_time() {
        let m = CostModel::default();
        let t = TierConfig::new("t", 0, 1000, PressureAction::Offload);
        assert!((m.p_return(&t, 0) - 0.5).abs() < 1e-9);
        assert!((m.p_return(&t, 1000) - 0.25).abs() < 1e-9);
        assert!(m.p_return(&t, 100_000) < 0.01);
        let z = TierConfig::new("z", 0, 0, PressureAction::Drop);
        assert_eq!(m.p_return(&z, 5), 0.0);
    }

    #[test]
    fn offload_wins_for_long_sessions_and_stale_loses_first() {
        let m = CostModel::default();
        // 1000 tokens at 36 KiB per token (a small model): recompute 2 s, copy ~7 ms.
        assert!(m.offload_beats_drop(0.5, 1000, 1000 * 36 * 1024));
        // A session nobody returns to is cheaper to drop.
        assert!(!m.offload_beats_drop(0.0, 1000, 1000 * 36 * 1024));
        let t = TierConfig::new("t", 0, 1000, PressureAction::Drop);
        let fresh = m.victim_score(&t, 0, 100, 0, 4, false);
        let stale = m.victim_score(&t, 60_000, 100, 0, 4, false);
        assert!(stale < fresh);
        let hi = TierConfig::new("hi", 100, 1000, PressureAction::Drop);
        assert!(m.victim_score(&hi, 0, 100, 0, 4, false) > fresh);
    }
}
