//! Service attained lately, per tenant: the fair queue's measure of who has had the most.
//!
//! A tenant is charged, in tokens, for every request it is handed a slot for (the router's
//! estimate: prompt bytes ÷ 4 plus the asked or tier-capped output) and the charge is
//! corrected when the answer ends and the engine's `usage` says what it really cost. The
//! total decays exponentially with [`HALF_LIFE`], so "lately" means the last few half-lives:
//! a tenant that stopped sending is soon even with a new one again.
//!
//! Invariants: a total is never negative; time is passed in (no clock here); the map is
//! pruned of tenants whose total decayed below one token, so it holds about the tenants
//! active in the last few half-lives, not every tenant ever seen.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A charge loses half its weight in this time.
pub const HALF_LIFE: Duration = Duration::from_secs(10);
/// Below this many tenants the ledger is never pruned.
const PRUNE_FLOOR: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Total {
    tokens: f64,
    at: Instant,
}

impl Total {
    fn at(&self, now: Instant) -> f64 {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens * 0.5f64.powf(dt / HALF_LIFE.as_secs_f64())
    }
}

/// Decayed token totals by tenant.
#[derive(Debug)]
pub struct Ledger {
    totals: HashMap<String, Total>,
    prune_at: usize,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger {
            totals: HashMap::new(),
            prune_at: PRUNE_FLOOR,
        }
    }
}

impl Ledger {
    /// `tenant`'s decayed total at `now` (0 for a tenant never charged or long idle).
    pub fn service(&self, tenant: &str, now: Instant) -> f64 {
        self.totals.get(tenant).map_or(0.0, |t| t.at(now))
    }

    /// Adds `tokens` (negative: a refund) to `tenant`'s total, never below zero.
    pub fn add(&mut self, tenant: &str, tokens: f64, now: Instant) {
        let current = self.service(tenant, now);
        let total = Total {
            tokens: (current + tokens).max(0.0),
            at: now,
        };
        match self.totals.get_mut(tenant) {
            Some(t) => *t = total,
            None => {
                self.totals.insert(tenant.to_string(), total);
                self.prune(now);
            }
        }
    }

    /// Replaces a charge of `charged` tokens by the `actual` cost the engine reported.
    pub fn correct(&mut self, tenant: &str, charged: u64, actual: u64, now: Instant) {
        self.add(tenant, actual as f64 - charged as f64, now);
    }

    /// Tenants with a total.
    pub fn len(&self) -> usize {
        self.totals.len()
    }

    pub fn is_empty(&self) -> bool {
        self.totals.is_empty()
    }

    /// Forgets tenants whose total decayed below one token, once the map has doubled since
    /// the last pruning (amortised: a pruning per as many insertions as it scans).
    fn prune(&mut self, now: Instant) {
        if self.totals.len() < self.prune_at {
            return;
        }
        self.totals.retain(|_, t| t.at(now) >= 1.0);
        self.prune_at = (self.totals.len() * 2).max(PRUNE_FLOOR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_decay_and_corrections_apply() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        l.add("a", 100.0, t0);
        assert_eq!(l.service("a", t0), 100.0);
        assert_eq!(l.service("b", t0), 0.0);
        let later = t0 + HALF_LIFE;
        assert!(
            (l.service("a", later) - 50.0).abs() < 1e-9,
            "half after a half-life"
        );
        // Charged 100, the engine reported 30: 70 refunded (from the decayed total).
        l.correct("a", 100, 30, later);
        assert_eq!(l.service("a", later), 0.0, "never below zero");
        l.add("a", 40.0, later);
        l.correct("a", 40, 90, later);
        assert!((l.service("a", later) - 90.0).abs() < 1e-9);
    }

    #[test]
    fn idle_tenants_are_pruned() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        for i in 0..PRUNE_FLOOR - 1 {
            l.add(&format!("old-{i}"), 10.0, t0);
        }
        assert_eq!(l.len(), PRUNE_FLOOR - 1);
        // Ten half-lives on, every old total is below one token: the insertion that reaches
        // the floor prunes them.
        let later = t0 + HALF_LIFE * 10;
        l.add("new", 5.0, later);
        assert_eq!(l.len(), 1);
        assert!((l.service("new", later) - 5.0).abs() < 1e-9);
    }
}
