//! Outcome accounting per request class (tier × existing/new) and the comparison table.
//!
//! Definitions (also printed under the table):
//! - SLO attainment of a class = requests that started decoding within their tier's queue-wait
//!   target ÷ (requests that started + requests refused for overload: every queue full, or
//!   waited in a queue past the tier's target, which the engine answers `queue_timeout`).
//!   Refusals by the new-tenant pause and by rate limits are reported separately, not as
//!   misses: they are the policy working as designed. Requests still queued at the end count with the wait
//!   they had so far.
//! - p99 is taken from a log-bucketed histogram (≤ 6% relative error).
//!
//! Invariant: every arrival is counted exactly once: started, refused (by one reason), or
//! still queued at the end (counted as started at the end).

use serde::Serialize;

use super::tenants::{NTIERS, Refusal, TIER_PARAMS, TIERS};

const PER_DECADE: f64 = 40.0;
/// Buckets: [0, 1 ms) then 40 per decade up to 10⁴ s.
const NBUCKETS: usize = 1 + 7 * 40 + 1;

#[derive(Clone, Debug)]
pub struct WaitHist {
    counts: Vec<u64>,
}

impl Default for WaitHist {
    fn default() -> Self {
        WaitHist {
            counts: vec![0; NBUCKETS],
        }
    }
}

impl WaitHist {
    fn bucket(wait_s: f64) -> usize {
        if wait_s < 1e-3 {
            0
        } else {
            (1 + ((wait_s / 1e-3).log10() * PER_DECADE) as usize).min(NBUCKETS - 1)
        }
    }

    fn upper(i: usize) -> f64 {
        if i == 0 {
            1e-3
        } else {
            1e-3 * 10f64.powf(i as f64 / PER_DECADE)
        }
    }

    pub fn add(&mut self, wait_s: f64) {
        self.counts[Self::bucket(wait_s)] += 1;
    }

    pub fn merge(&mut self, o: &WaitHist) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
    }

    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil() as u64;
        let mut cum = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cum += c;
            if cum >= rank {
                return Some(if i == 0 { 0.0 } else { Self::upper(i) });
            }
        }
        None
    }
}

#[derive(Clone, Debug, Default)]
pub struct ClassStats {
    pub arrived: u64,
    pub started: u64,
    pub within: u64,
    pub refused: [u64; 4],
    pub waits: WaitHist,
}

impl ClassStats {
    fn merge(&mut self, o: &ClassStats) {
        self.arrived += o.arrived;
        self.started += o.started;
        self.within += o.within;
        for i in 0..4 {
            self.refused[i] += o.refused[i];
        }
        self.waits.merge(&o.waits);
    }

    pub fn attainment(&self) -> Option<f64> {
        let misses: u64 = (Refusal::ALL.iter())
            .filter(|r| r.is_miss())
            .map(|&r| self.refused[ri(r)])
            .sum();
        let denom = self.started + misses;
        (denom > 0).then(|| self.within as f64 / denom as f64)
    }
}

pub fn ri(r: Refusal) -> usize {
    match r {
        Refusal::NewTenantPause => 0,
        Refusal::RateLimit => 1,
        Refusal::Overload => 2,
        Refusal::QueueTimeout => 3,
    }
}

/// Per-class outcomes: `[tier][existing as usize]`.
#[derive(Clone, Debug)]
pub struct Stats {
    pub classes: [[ClassStats; 2]; NTIERS],
    /// Queue-wait target of each tier slot, seconds.
    targets: [f64; NTIERS],
    /// Requests so far that started past their target or were refused for overload (for the
    /// timeline).
    pub missed: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats::with_targets(TIER_PARAMS.map(|p| p.queue_wait_target_s))
    }
}

impl Stats {
    pub fn with_targets(targets: [f64; NTIERS]) -> Self {
        Stats {
            classes: Default::default(),
            targets,
            missed: 0,
        }
    }

    pub fn arrived(&mut self, tier: usize, existing: bool) {
        self.classes[tier][usize::from(existing)].arrived += 1;
    }

    pub fn started(&mut self, tier: usize, existing: bool, wait_s: f64) {
        let c = &mut self.classes[tier][usize::from(existing)];
        c.started += 1;
        if wait_s <= self.targets[tier] {
            c.within += 1;
        } else {
            self.missed += 1;
        }
        c.waits.add(wait_s);
    }

    pub fn refused(&mut self, tier: usize, existing: bool, why: Refusal) {
        self.classes[tier][usize::from(existing)].refused[ri(why)] += 1;
        if why.is_miss() {
            self.missed += 1;
        }
    }

    fn sum(&self, f: impl Fn(usize, bool) -> bool) -> ClassStats {
        let mut s = ClassStats::default();
        for (t, row) in self.classes.iter().enumerate() {
            for (e, c) in row.iter().enumerate() {
                if f(t, e == 1) {
                    s.merge(c);
                }
            }
        }
        s
    }
}

/// Refusals by reason.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Refusals {
    pub new_tenant_pause: u64,
    pub rate_limit: u64,
    pub overload: u64,
    /// Pause refusals of existing tenants or non-pausable tiers (must be 0).
    pub pause_of_protected: u64,
    /// Overload refusals of existing tenants.
    pub overload_existing: u64,
    /// Requests the engines dropped for waiting past their tier's target (`queue_timeout`).
    pub queue_timeout: u64,
    /// Queue timeouts of existing tenants.
    pub queue_timeout_existing: u64,
}

/// One (trace, policy) run, summarised.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub trace: &'static str,
    pub policy: &'static str,
    pub requests: u64,
    /// SLO attainment per tier (all tenants), enterprise/standard/free.
    pub attainment_by_tier: [Option<f64>; NTIERS],
    pub attainment_existing: Option<f64>,
    pub attainment_new: Option<f64>,
    pub p99_wait_existing_s: Option<f64>,
    pub p99_wait_new_s: Option<f64>,
    pub gpu_hours: f64,
    pub refused: Refusals,
    /// Seconds from the step to the first scale-up decision (traces with a step).
    pub react_s: Option<f64>,
    pub scale_events: u64,
    /// Changes of direction of the replica count within 10 minutes of the move before.
    pub reversals: u64,
    /// Replicas ordered beyond what the policy still ran 10–20 minutes later (worst case).
    pub worst_overshoot: i32,
    /// The pool's maxScaleUpStep, to compare the overshoot with.
    pub max_step: i32,
    pub peak_replicas: i32,
    pub pause_transitions: u64,
    pub kv_reuse_hit_rate: Option<f64>,
    pub wall_seconds: f64,
}

impl RunResult {
    #[allow(clippy::too_many_arguments)]
    pub fn from_stats(
        trace: &'static str,
        policy: &'static str,
        s: &Stats,
        gpu_hours: f64,
        react_s: Option<f64>,
        scale_events: u64,
        peak_replicas: i32,
        pause_transitions: u64,
        kv: (u64, u64),
        wall_seconds: f64,
    ) -> Self {
        let all = s.sum(|_, _| true);
        let existing = s.sum(|_, e| e);
        let new = s.sum(|_, e| !e);
        let protected = s.sum(|t, e| e || t == 0);
        let mut by_tier = [None; NTIERS];
        for (t, a) in by_tier.iter_mut().enumerate() {
            *a = s.sum(|u, _| u == t).attainment();
        }
        RunResult {
            trace,
            policy,
            requests: all.arrived,
            attainment_by_tier: by_tier,
            attainment_existing: existing.attainment(),
            attainment_new: new.attainment(),
            p99_wait_existing_s: existing.waits.quantile(0.99),
            p99_wait_new_s: new.waits.quantile(0.99),
            gpu_hours,
            refused: Refusals {
                new_tenant_pause: all.refused[0],
                rate_limit: all.refused[1],
                overload: all.refused[2],
                pause_of_protected: protected.refused[0],
                overload_existing: existing.refused[2],
                queue_timeout: all.refused[3],
                queue_timeout_existing: existing.refused[3],
            },
            react_s,
            scale_events,
            reversals: 0,
            worst_overshoot: 0,
            max_step: 0,
            peak_replicas,
            pause_transitions,
            kv_reuse_hit_rate: (kv.0 + kv.1 > 0).then(|| kv.0 as f64 / (kv.0 + kv.1) as f64),
            wall_seconds,
        }
    }
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".to_string(), |v| format!("{:.2}%", 100.0 * v))
}

fn secs(x: Option<f64>) -> String {
    x.map_or("-".to_string(), |v| {
        if v < 10.0 {
            format!("{v:.2}s")
        } else {
            format!("{v:.0}s")
        }
    })
}

fn count(n: u64) -> String {
    if n >= 10_000_000 {
        format!("{:.1}M", n as f64 / 1e6)
    } else if n >= 100_000 {
        format!("{:.0}k", n as f64 / 1e3)
    } else {
        n.to_string()
    }
}

/// The comparison table of one trace. `baseline` names the policy GPU-hours are relative to.
pub fn table(results: &[RunResult], baseline: &str) -> String {
    table_with_tiers(results, baseline, &TIERS)
}

/// The table with the given tier names, one attainment column per name (slot order).
pub fn table_with_tiers<S: AsRef<str>>(
    results: &[RunResult],
    baseline: &str,
    tiers: &[S],
) -> String {
    let base = results
        .iter()
        .find(|r| r.policy == baseline)
        .map(|r| r.gpu_hours);
    let ntiers = tiers.len().min(NTIERS);
    let mut header: Vec<&str> = vec!["policy", "requests"];
    header.extend(tiers.iter().take(ntiers).map(AsRef::as_ref));
    header.extend([
        "existing",
        "new",
        "p99 exist",
        "p99 new",
        "GPU-h",
        "vs HPA",
        "ref pause",
        "ref rate",
        "ref overload",
        "ovl exist",
        "timeout exist",
        "react",
        "scales",
        "rev",
        "overshoot",
        "peak",
    ]);
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let mut row = vec![r.policy.to_string(), count(r.requests)];
            row.extend(r.attainment_by_tier[..ntiers].iter().map(|a| pct(*a)));
            row.extend([
                pct(r.attainment_existing),
                pct(r.attainment_new),
                secs(r.p99_wait_existing_s),
                secs(r.p99_wait_new_s),
                if r.gpu_hours < 100.0 {
                    format!("{:.1}", r.gpu_hours)
                } else {
                    format!("{:.0}", r.gpu_hours)
                },
                base.map_or("-".into(), |b| format!("{:.0}%", 100.0 * r.gpu_hours / b)),
                count(r.refused.new_tenant_pause),
                count(r.refused.rate_limit),
                count(r.refused.overload),
                count(r.refused.overload_existing),
                count(r.refused.queue_timeout_existing),
                secs(r.react_s),
                r.scale_events.to_string(),
                r.reversals.to_string(),
                format!("{}/{}", r.worst_overshoot, r.max_step),
                r.peak_replicas.to_string(),
            ]);
            row
        })
        .collect();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        cells
            .iter()
            .zip(&width)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(header.iter().map(|s| s.to_string()).collect());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out
}
