//! First admissions seen by this engine, for `GET /admin/v1/tenants?since=MS`.
//!
//! Invariants: a tenant's first admission time never moves once recorded (until it is
//! forgotten); the operator owns the pool-wide registry and merges these reports, so this
//! one is only a bounded buffer — past `max_tenants` the oldest entries are forgotten, and
//! the operator, which polls with `since`, has already read them.

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

    /// Records an admission; only the first one per tenant counts.
    pub fn record(&self, tenant: &str, tier: &str, at_ms: u64) {
        let mut seen = match self.seen.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if seen.contains_key(tenant) {
            return;
        }
        if seen.len() >= self.max_tenants {
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
    }

    /// Tenants first admitted at or after `since_ms`, oldest first.
    pub fn since(&self, since_ms: u64) -> AdmittedTenants {
        let now = now_ms();
        let seen = match self.seen.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
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
}
