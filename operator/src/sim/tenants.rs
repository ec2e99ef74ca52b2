//! Tenants, their tiers, the admitted-tenant registry and the engines' admission gate.
//!
//! Invariants: a tenant is "existing" iff it was admitted within the memory window, exactly
//! the engine contract; the registry is pool-wide and updated at admission (the operator's
//! merge and push are taken as instantaneous). The gate refuses, in order: over a per-tenant
//! rate limit (429), a new tenant of a paused tier (503), and leaves queue-full (overload) to
//! the pool. Existing tenants and non-pausable tiers are never refused by the pause.

use super::rng::Rng;

/// Tiers, highest priority first (the engine serves its queue in this order).
pub const TIERS: [&str; 3] = ["enterprise", "standard", "free"];
pub const NTIERS: usize = TIERS.len();

/// Per-tier parameters, matching the TierPolicy the simulator passes to the planner.
#[derive(Clone, Copy, Debug)]
pub struct TierParams {
    /// Fraction of tenants in this tier.
    pub share: f64,
    pub queue_wait_target_s: f64,
    pub max_output_tokens: u32,
    pub requests_per_minute: u32,
    pub tokens_per_minute: u32,
    /// Idle KV is kept this long; a session returning later pays a full prefill.
    pub kv_idle_ttl_s: f64,
}

pub const TIER_PARAMS: [TierParams; NTIERS] = [
    TierParams {
        share: 0.05,
        queue_wait_target_s: 0.5,
        max_output_tokens: 8192,
        requests_per_minute: 6000,
        tokens_per_minute: 2_000_000,
        kv_idle_ttl_s: 1800.0,
    },
    TierParams {
        share: 0.25,
        queue_wait_target_s: 2.0,
        max_output_tokens: 4096,
        requests_per_minute: 600,
        tokens_per_minute: 200_000,
        kv_idle_ttl_s: 600.0,
    },
    TierParams {
        share: 0.70,
        queue_wait_target_s: 5.0,
        max_output_tokens: 1024,
        requests_per_minute: 20,
        tokens_per_minute: 20_000,
        kv_idle_ttl_s: 120.0,
    },
];

/// The TierPolicy handed to the planner (enterprise is never paused).
pub const TIER_POLICY_YAML: &str = r#"
defaultTier: free
tiers:
  - {name: enterprise, priority: 100, queueWaitTarget: 500ms, maxOutputTokens: 8192, admission: {pausable: false}}
  - {name: standard, priority: 50, queueWaitTarget: 2s, maxOutputTokens: 4096}
  - {name: free, priority: 10, queueWaitTarget: 5s, maxOutputTokens: 1024}
"#;

/// Share of requests that come from heavy tenants (bots, batch jobs).
const HEAVY_SHARE: f64 = 0.10;
/// Fraction of tenants that are heavy.
const HEAVY_FRACTION: f64 = 0.001;

const NEVER: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Tenant {
    tier: u8,
    /// Second of the last admission, or NEVER.
    admitted_at: u32,
    /// Rate-limit window (minute index) and what was used in it.
    window: u32,
    requests: u32,
    tokens: u32,
}

/// Why a request was refused: by the gate (pause, rate limit), the router (every queue
/// full) or the engine (it waited in a queue past its tier's target).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    NewTenantPause,
    RateLimit,
    Overload,
    QueueTimeout,
}

impl Refusal {
    pub const ALL: [Refusal; 4] = [
        Refusal::NewTenantPause,
        Refusal::RateLimit,
        Refusal::Overload,
        Refusal::QueueTimeout,
    ];

    /// A refusal the pool's capacity caused (counted as a miss), not its policy.
    pub fn is_miss(self) -> bool {
        matches!(self, Refusal::Overload | Refusal::QueueTimeout)
    }
}

/// The tenant population and registry.
#[derive(Debug)]
pub struct Tenants {
    all: Vec<Tenant>,
    heavy: Vec<u32>,
    memory_s: u32,
    /// The limits the gate applies, per tier slot.
    params: [TierParams; NTIERS],
}

impl Tenants {
    /// `initial` tenants, all admitted just before the start (they are existing tenants).
    pub fn new(initial: u32, memory_s: u32, rng: &mut Rng) -> Self {
        let mut t = Tenants {
            all: Vec::with_capacity(initial as usize * 2),
            heavy: Vec::new(),
            memory_s,
            params: TIER_PARAMS,
        };
        for _ in 0..initial {
            let id = t.add(rng);
            t.all[id as usize].admitted_at = 0;
        }
        t
    }

    /// Named tenants of a trace file, by tier slot, under the given tiers' limits. With
    /// `known`, every one counts as admitted just before the start.
    pub fn of_tiers(
        tiers: &[u8],
        memory_s: u32,
        params: [TierParams; NTIERS],
        known: bool,
    ) -> Self {
        let all = tiers
            .iter()
            .map(|&tier| Tenant {
                tier,
                admitted_at: if known { 0 } else { NEVER },
                window: NEVER,
                requests: 0,
                tokens: 0,
            })
            .collect();
        Tenants {
            all,
            heavy: Vec::new(),
            memory_s,
            params,
        }
    }

    /// A brand-new tenant (not admitted yet).
    pub fn add(&mut self, rng: &mut Rng) -> u32 {
        let u = rng.f64();
        let mut acc = 0.0;
        let mut tier = NTIERS - 1;
        for (i, p) in TIER_PARAMS.iter().enumerate() {
            acc += p.share;
            if u < acc {
                tier = i;
                break;
            }
        }
        let id = self.all.len() as u32;
        self.all.push(Tenant {
            tier: tier as u8,
            admitted_at: NEVER,
            window: NEVER,
            requests: 0,
            tokens: 0,
        });
        if rng.chance(HEAVY_FRACTION) {
            self.heavy.push(id);
        }
        id
    }

    /// Tenants known so far (admitted or not).
    pub fn count(&self) -> usize {
        self.all.len()
    }

    /// The tenant of a request from the existing population (heavy tenants are overrepresented).
    pub fn pick(&self, rng: &mut Rng) -> u32 {
        if !self.heavy.is_empty() && rng.chance(HEAVY_SHARE) {
            self.heavy[rng.below(self.heavy.len() as u64) as usize]
        } else {
            rng.below(self.all.len() as u64) as u32
        }
    }

    pub fn tier(&self, id: u32) -> usize {
        usize::from(self.all[id as usize].tier)
    }

    /// Admitted within the memory window.
    pub fn existing(&self, id: u32, now_s: u32) -> bool {
        let a = self.all[id as usize].admitted_at;
        a != NEVER && now_s.saturating_sub(a) <= self.memory_s
    }

    /// Rate limit, then pause. On success the request is counted against the limits; the
    /// caller records admission with [`Tenants::admitted`] once the pool has queued it.
    pub fn gate(
        &mut self,
        id: u32,
        tokens: u32,
        now_s: u32,
        paused: &[bool; NTIERS],
    ) -> Result<(), Refusal> {
        let existing = self.existing(id, now_s);
        let t = &mut self.all[id as usize];
        let p = self.params[usize::from(t.tier)];
        let minute = now_s / 60;
        if t.window != minute {
            t.window = minute;
            t.requests = 0;
            t.tokens = 0;
        }
        if t.requests + 1 > p.requests_per_minute || t.tokens + tokens > p.tokens_per_minute {
            return Err(Refusal::RateLimit);
        }
        if paused[usize::from(t.tier)] && !existing {
            return Err(Refusal::NewTenantPause);
        }
        t.requests += 1;
        t.tokens += tokens;
        Ok(())
    }

    pub fn admitted(&mut self, id: u32, now_s: u32) {
        self.all[id as usize].admitted_at = now_s;
    }
}
