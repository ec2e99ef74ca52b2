//! Per-tenant rate limits (requests/min, tokens/min) as token buckets.
//!
//! Invariants: a bucket holds at most one minute of its limit and refills continuously; a
//! request is charged on both buckets or on neither; a request costing more than a whole
//! minute of tokens is charged the minute (it passes when the bucket is full, never starves);
//! unused output tokens are refunded when a request ends, and a request refused further
//! down (queue full, queue timeout) is refunded whole. Memory is bounded: past
//! `max_tenants` entries, full (idle) buckets are forgotten first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tidegate_api::RateLimits;

/// Refused: which limit, and when to come back.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[error("rate limit exceeded ({limit}); retry after {}s", retry_after.as_secs())]
pub struct RateLimited {
    pub limit: &'static str,
    pub retry_after: Duration,
}

impl RateLimited {
    pub fn metric_label(&self) -> &'static str {
        "rate_limited"
    }
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    level: f64,
    last: Instant,
}

impl Bucket {
    fn full(capacity: f64, now: Instant) -> Self {
        Bucket {
            level: capacity,
            last: now,
        }
    }

    fn refill(&mut self, capacity: f64, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.level = (self.level + dt * capacity / 60.0).min(capacity);
        self.last = now;
    }

    /// Seconds until `cost` is available (0 when it is now).
    fn wait_for(&self, cost: f64, capacity: f64) -> f64 {
        if self.level >= cost {
            0.0
        } else {
            (cost - self.level) / (capacity / 60.0)
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Buckets {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

/// All tenants' buckets.
#[derive(Debug)]
pub struct RateLimiter {
    tenants: Mutex<HashMap<String, Buckets>>,
    max_tenants: usize,
}

impl Default for RateLimiter {
    fn default() -> Self {
        RateLimiter::new(100_000)
    }
}

fn cap(limit: Option<i64>) -> Option<f64> {
    limit.filter(|&l| l > 0).map(|l| l as f64)
}

impl RateLimiter {
    pub fn new(max_tenants: usize) -> Self {
        RateLimiter {
            tenants: Mutex::new(HashMap::new()),
            max_tenants: max_tenants.max(1),
        }
    }

    /// Charges one request and `tokens` tokens, or says when to retry.
    pub fn check(
        &self,
        tenant: &str,
        limits: Option<&RateLimits>,
        tokens: u64,
        now: Instant,
    ) -> Result<(), RateLimited> {
        let Some(limits) = limits else {
            return Ok(());
        };
        let (req_cap, tok_cap) = (
            cap(limits.requests_per_minute),
            cap(limits.tokens_per_minute),
        );
        if req_cap.is_none() && tok_cap.is_none() {
            return Ok(());
        }
        let mut map = match self.tenants.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if !map.contains_key(tenant) && map.len() >= self.max_tenants {
            prune(&mut map, now, self.max_tenants);
        }
        let entry = map.entry(tenant.to_string()).or_default();
        let mut wait: f64 = 0.0;
        let mut which = "";
        if let Some(c) = req_cap {
            let b = entry.requests.get_or_insert(Bucket::full(c, now));
            b.refill(c, now);
            let w = b.wait_for(1.0, c);
            if w > wait {
                wait = w;
                which = "requests per minute";
            }
        }
        let token_cost = tok_cap.map(|c| (tokens as f64).min(c));
        if let (Some(c), Some(cost)) = (tok_cap, token_cost) {
            let b = entry.tokens.get_or_insert(Bucket::full(c, now));
            b.refill(c, now);
            let w = b.wait_for(cost, c);
            if w > wait {
                wait = w;
                which = "tokens per minute";
            }
        }
        if wait > 0.0 {
            return Err(RateLimited {
                limit: which,
                retry_after: Duration::from_secs(wait.ceil().max(1.0) as u64),
            });
        }
        if let Some(b) = entry.requests.as_mut() {
            b.level -= 1.0;
        }
        if let (Some(b), Some(cost)) = (entry.tokens.as_mut(), token_cost) {
            b.level -= cost;
        }
        Ok(())
    }

    /// Gives back tokens charged but not used, and the request itself when it was refused
    /// downstream (queue full, queue timeout): a refusal does not cost the tenant.
    pub fn refund(&self, tenant: &str, limits: Option<&RateLimits>, tokens: u64, request: bool) {
        let Some(limits) = limits else {
            return;
        };
        let mut map = match self.tenants.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let Some(entry) = map.get_mut(tenant) else {
            return;
        };
        if let (Some(c), Some(b)) = (cap(limits.tokens_per_minute), entry.tokens.as_mut()) {
            b.level = (b.level + tokens as f64).min(c);
        }
        if request
            && let (Some(c), Some(b)) = (cap(limits.requests_per_minute), entry.requests.as_mut())
        {
            b.level = (b.level + 1.0).min(c);
        }
    }
}

/// Forgets buckets that have been idle a minute (they would be full again); if none are,
/// forgets everything (fail open rather than grow without bound).
fn prune(map: &mut HashMap<String, Buckets>, now: Instant, max: usize) {
    let idle = |b: &Option<Bucket>| {
        b.is_none_or(|b| now.saturating_duration_since(b.last) >= Duration::from_secs(60))
    };
    map.retain(|_, e| !(idle(&e.requests) && idle(&e.tokens)));
    if map.len() >= max {
        map.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_per_minute() {
        let rl = RateLimiter::default();
        let limits = RateLimits {
            requests_per_minute: Some(2),
            tokens_per_minute: None,
        };
        let t0 = Instant::now();
        assert!(rl.check("a", Some(&limits), 10, t0).is_ok());
        assert!(rl.check("a", Some(&limits), 10, t0).is_ok());
        let err = rl.check("a", Some(&limits), 10, t0).unwrap_err();
        assert_eq!(err.retry_after, Duration::from_secs(30));
        assert!(rl.check("b", Some(&limits), 10, t0).is_ok(), "per tenant");
        assert!(
            rl.check("a", Some(&limits), 10, t0 + Duration::from_secs(30))
                .is_ok()
        );
    }

    #[test]
    fn tokens_per_minute_with_refund_and_oversize() {
        let rl = RateLimiter::default();
        let limits = RateLimits {
            requests_per_minute: None,
            tokens_per_minute: Some(100),
        };
        let t0 = Instant::now();
        assert!(
            rl.check("a", Some(&limits), 1000, t0).is_ok(),
            "oversize passes when full"
        );
        assert!(rl.check("a", Some(&limits), 10, t0).is_err());
        rl.refund("a", Some(&limits), 50, false);
        assert!(rl.check("a", Some(&limits), 50, t0).is_ok());
        assert!(rl.check("x", None, 1_000_000, t0).is_ok());
    }

    #[test]
    fn bounded_memory() {
        let rl = RateLimiter::new(10);
        let limits = RateLimits {
            requests_per_minute: Some(1),
            tokens_per_minute: None,
        };
        let t0 = Instant::now();
        for i in 0..1000 {
            let _ = rl.check(&format!("t{i}"), Some(&limits), 1, t0);
        }
        assert!(rl.tenants.lock().unwrap().len() <= 10);
    }
}
