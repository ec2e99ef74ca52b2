//! First admissions seen by this engine (or accepted by this router), for
//! `GET /admin/v1/tenants?since=MS`.
//!
//! Invariants: a tenant's first admission time never moves once recorded (until it is
//! forgotten); the operator owns the pool-wide registry and merges these reports, so this
//! one is only a bounded buffer — past `max_tenants` the oldest entries are forgotten, and
//! the operator, which polls with `since`, has already read them. [`FirstAdmissions::record_now`]
//! and [`FirstAdmissions::since`] read the clock under the lock, so an answer's `now_ms`
//! is never older than an entry recorded after it: the next `since` cannot miss one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tidegate_api::engine_admin::{AdmittedTenant, AdmittedTenants};

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[derive(Debug)]
pub struct FirstAdmissions {
    seen: Mutex<HashMap<String, AdmittedTenant>>,
    max_tenants: usize,
}

impl Default for FirstAdmissions {
    fn default() -> Self {
        FirstAdmissions::new(100_000)
    }
}

impl FirstAdmissions {
    pub fn new(max_tenants: usize) -> Self {
        FirstAdmissions {
            seen: Mutex::new(HashMap::new()),
            max_tenants: max_tenants.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, AdmittedTenant>> {
        match self.seen.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Records an admission now; only the first one per tenant counts. Returns the time it
    /// was recorded at when this was the first (for [`FirstAdmissions::retract`]).
    pub fn record_now(&self, tenant: &str, tier: &str) -> Option<u64> {
        let mut seen = self.lock();
        let at_ms = now_ms();
        Self::insert(&mut seen, self.max_tenants, tenant, tier, at_ms).then_some(at_ms)
    }

    /// Records an admission at a given time; only the first one per tenant counts.
    pub fn record(&self, tenant: &str, tier: &str, at_ms: u64) {
        Self::insert(&mut self.lock(), self.max_tenants, tenant, tier, at_ms);
    }

    /// Whether `tenant` was first recorded at or after `since_ms` and is still held.
    pub fn contains_since(&self, tenant: &str, since_ms: u64) -> bool {
        self.lock()
            .get(tenant)
            .is_some_and(|t| t.first_admitted_ms >= since_ms)
    }

    /// Takes back the first record of `tenant` made at `at_ms` (a request refused right
    /// after it was recorded, before it entered a queue); a later or other record stays.
    pub fn retract(&self, tenant: &str, at_ms: u64) {
        let mut seen = self.lock();
        if seen
            .get(tenant)
            .is_some_and(|t| t.first_admitted_ms == at_ms)
        {
            seen.remove(tenant);
        }
    }

    fn insert(
        seen: &mut HashMap<String, AdmittedTenant>,
        max_tenants: usize,
        tenant: &str,
        tier: &str,
        at_ms: u64,
    ) -> bool {
        if seen.contains_key(tenant) {
            return false;
        }
        if seen.len() >= max_tenants {
            // Forget the older half.
            let mut times: Vec<u64> = seen.values().map(|t| t.first_admitted_ms).collect();
            times.sort_unstable();
            let cutoff = times[times.len() / 2];
            seen.retain(|_, t| t.first_admitted_ms > cutoff);
        }
        seen.insert(
            tenant.to_string(),
            AdmittedTenant {
                tenant: tenant.to_string(),
                tier: tier.to_string(),
                first_admitted_ms: at_ms,
            },
        );
        true
    }

    /// Tenants first admitted at or after `since_ms`, oldest first.
    pub fn since(&self, since_ms: u64) -> AdmittedTenants {
        let seen = self.lock();
        let now = now_ms();
        let mut tenants: Vec<AdmittedTenant> = seen
            .values()
            .filter(|t| t.first_admitted_ms >= since_ms)
            .cloned()
            .collect();
        tenants.sort_by(|a, b| {
            (a.first_admitted_ms, &a.tenant).cmp(&(b.first_admitted_ms, &b.tenant))
        });
        AdmittedTenants {
            now_ms: now,
            tenants,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_time_sticks_and_since_filters() {
        let r = FirstAdmissions::new(4);
        r.record("a", "free", 10);
        r.record("a", "free", 20);
        r.record("b", "gold", 30);
        let all = r.since(0);
        assert_eq!(all.tenants.len(), 2);
        assert_eq!(all.tenants[0].first_admitted_ms, 10);
        assert_eq!(r.since(11).tenants[0].tenant, "b");
        for (i, t) in ["c", "d", "e", "f"].iter().enumerate() {
            r.record(t, "free", 40 + i as u64);
        }
        assert!(r.since(0).tenants.len() <= 4);
        assert!(r.since(0).tenants.iter().any(|t| t.tenant == "f"));
    }

    #[test]
    fn record_now_is_never_older_than_an_earlier_answer() {
        let r = FirstAdmissions::new(8);
        let answer = r.since(0);
        let at = r.record_now("a", "free").expect("first record");
        assert!(at >= answer.now_ms, "the next since must see it");
        assert_eq!(r.record_now("a", "free"), None, "only the first counts");
        assert_eq!(r.since(answer.now_ms).tenants.len(), 1);
        assert!(r.contains_since("a", at) && !r.contains_since("a", at + 1));
    }

    #[test]
    fn retract_removes_only_its_own_record() {
        let r = FirstAdmissions::new(8);
        r.record("a", "free", 10);
        r.retract("a", 11);
        assert!(r.contains_since("a", 0), "another record stays");
        r.retract("a", 10);
        assert!(!r.contains_since("a", 0));
    }
}
