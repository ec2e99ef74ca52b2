//! This router's share of the pool's rate limits: each of the R live routers enforces 1/R
//! of every tenant's requests/min and tokens/min, where R is the count of ready routers the
//! operator pushes with the engine set every tick (`RouterEndpoints::ready_routers`), and
//! `--limit-share` until the first push.
//!
//! Invariants: the share is at least 1; a push without a count keeps the current share (an
//! operator that saw no router ready does not make every router enforce the whole limit);
//! a share applies to the next request (the buckets refill towards the new capacity and
//! never hold more than a minute of it).

use std::sync::atomic::{AtomicU32, Ordering};

use tidegate_api::RateLimits;

/// The live share (routers sharing each tenant's limits).
#[derive(Debug)]
pub struct LimitShare(AtomicU32);

impl LimitShare {
    pub fn new(initial: u32) -> Self {
        LimitShare(AtomicU32::new(initial.max(1)))
    }

    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed).max(1)
    }

    /// Takes a pushed count of ready routers; returns the previous share when it changed.
    pub fn set(&self, ready_routers: Option<u32>) -> Option<u32> {
        let next = ready_routers?.max(1);
        let before = self.0.swap(next, Ordering::Relaxed);
        (before != next).then_some(before)
    }

    /// This router's part of a tier's limits: 1/share of each, rounded up (so a limit below
    /// the share still lets one request through per router).
    pub fn limits(&self, limits: Option<&RateLimits>) -> Option<RateLimits> {
        shared_limits(limits, self.get())
    }
}

/// A tier's limits divided among `share` routers, rounded up.
pub fn shared_limits(limits: Option<&RateLimits>, share: u32) -> Option<RateLimits> {
    let share = i64::from(share.max(1));
    limits.map(|l| RateLimits {
        requests_per_minute: l.requests_per_minute.map(|r| (r + share - 1) / share),
        tokens_per_minute: l.tokens_per_minute.map(|t| (t + share - 1) / share),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rpm: i64, tpm: i64) -> RateLimits {
        RateLimits {
            requests_per_minute: Some(rpm),
            tokens_per_minute: Some(tpm),
        }
    }

    #[test]
    fn the_share_follows_the_pushed_count_of_live_routers() {
        let s = LimitShare::new(2);
        let tier = limits(600, 10_000);
        assert_eq!(s.limits(Some(&tier)), Some(limits(300, 5_000)));
        // A router of three died: the two left each enforce a half, not a third.
        assert_eq!(s.set(Some(3)), Some(2));
        assert_eq!(s.limits(Some(&tier)), Some(limits(200, 3_334)));
        assert_eq!(s.set(Some(2)), Some(3));
        assert_eq!(s.limits(Some(&tier)), Some(limits(300, 5_000)));
        assert_eq!(s.set(Some(2)), None, "unchanged");
        assert_eq!(s.set(None), None, "no count: kept");
        assert_eq!(s.get(), 2);
        assert_eq!(s.set(Some(0)), Some(2), "at least one");
        assert_eq!(s.get(), 1);
        assert_eq!(s.limits(None), None);
    }

    #[test]
    fn the_pool_never_enforces_less_than_the_tier_over_its_live_routers() {
        for r in 1..=7u32 {
            for rpm in [1i64, 5, 59, 60, 1000] {
                let each = shared_limits(Some(&limits(rpm, rpm)), r).unwrap();
                let pool = each.requests_per_minute.unwrap() * i64::from(r);
                // Rounding up: at most R - 1 over the tier's limit, never under it.
                assert!(pool >= rpm && pool < rpm + i64::from(r), "R={r} rpm={rpm}");
            }
        }
    }
}
