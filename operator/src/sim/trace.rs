//! Traffic traces: how many sessions start each second, and how many new tenants appear.
//!
//! A trace is an analytic rate: `base_rate(t) = activity(t) × population × per_tenant_rate`,
//! plus `new_tenant_rate(t)` tenants/s, each sending its first request when it appears. The
//! realised population grows as new tenants appear, so the simulator recomputes the rate each
//! second from the population it actually has; `expected_base_rate` is the same rate from the
//! expected population, which is what the oracle is allowed to know in advance.
//!
//! Invariants: rates are finite and non-negative; `scale` multiplies populations, new-tenant
//! rates and replica bounds together, so a small-scale run keeps the shape of the full one.

use serde::Serialize;

use super::rng::Rng;

/// The traces the `simulate` command knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceKind {
    /// A day with a tidal shape (peak mid-afternoon, trough before dawn) and short bursts.
    Tidal,
    /// The tidal day's shape at half its load (a holiday): the day after a tidal day that
    /// does not repeat it.
    Holiday,
    /// A quiet morning, then a flash crowd (existing tenants and a wave of new ones).
    Flash,
    /// Steady growth from new tenants, well beyond the pool's maximum capacity.
    Ramp,
    /// Constant load for an hour: a planner must hold it still.
    Steady,
    /// Constant load that steps up (tests).
    Step,
    /// Load over the ceiling, then back down (tests).
    Ceiling,
}

impl TraceKind {
    pub fn parse(s: &str) -> Option<Vec<TraceKind>> {
        Some(match s {
            "tidal" => vec![TraceKind::Tidal],
            "holiday" => vec![TraceKind::Holiday],
            "flash" => vec![TraceKind::Flash],
            "ramp" => vec![TraceKind::Ramp],
            "steady" => vec![TraceKind::Steady],
            "all" => vec![
                TraceKind::Steady,
                TraceKind::Tidal,
                TraceKind::Holiday,
                TraceKind::Flash,
                TraceKind::Ramp,
            ],
            _ => return None,
        })
    }

    /// The day before this one, when the trace is a day of a daily pattern: the planner
    /// runs it first and carries what it learned (its forecast) into this one.
    pub fn day_before(self) -> Option<TraceKind> {
        match self {
            TraceKind::Tidal | TraceKind::Holiday => Some(TraceKind::Tidal),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TraceKind::Tidal => "tidal",
            TraceKind::Holiday => "holiday",
            TraceKind::Flash => "flash",
            TraceKind::Ramp => "ramp",
            TraceKind::Steady => "steady",
            TraceKind::Step => "step",
            TraceKind::Ceiling => "ceiling",
        }
    }
}

/// How much the tidal day's short bursts multiply every tenant's activity (15 minutes each,
/// eight of them starting between 06:00 and 22:00 at random).
pub const TIDAL_BURST_FACTOR: f64 = 1.3;

/// Base session starts per tenant per second at activity 1 (≈ 25 sessions a day).
pub const PER_TENANT_RATE: f64 = 2.9e-4;

/// One trace, at one scale.
#[derive(Clone, Debug)]
pub struct Trace {
    pub kind: TraceKind,
    pub duration_s: u64,
    pub initial_tenants: u32,
    pub max_replicas: i32,
    /// When the step (flash crowd, step up) starts, for time-to-react.
    pub step_at: Option<u64>,
    /// (start, end, factor) multiplicative bursts.
    bursts: Vec<(u64, u64, f64)>,
    scale: f64,
    /// Expected population at each minute (for the oracle).
    expected_population: Vec<f64>,
}

const DAY: u64 = 86_400;

impl Trace {
    pub fn new(kind: TraceKind, scale: f64, seed: u64) -> Self {
        let mut rng = Rng::new(seed).fork(0x7ace);
        let (duration_s, tenants, max, step_at) = match kind {
            TraceKind::Tidal | TraceKind::Holiday => (DAY, 200_000.0, 1000.0, None),
            TraceKind::Flash => (DAY / 2, 200_000.0, 1000.0, Some(4 * 3600)),
            TraceKind::Ramp => (8 * 3600, 80_000.0, 500.0, None),
            TraceKind::Steady => (3600, 200_000.0, 1000.0, None),
            TraceKind::Step => (2 * 3600, 200_000.0, 1000.0, Some(3600)),
            TraceKind::Ceiling => (3 * 3600, 200_000.0, 250.0, None),
        };
        let bursts = if matches!(kind, TraceKind::Tidal | TraceKind::Holiday) {
            (0..8)
                .map(|_| {
                    let start = 6 * 3600 + rng.below(16 * 3600);
                    (start, start + 15 * 60, TIDAL_BURST_FACTOR)
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut t = Trace {
            kind,
            duration_s,
            initial_tenants: ((tenants * scale).round() as u32).max(10),
            max_replicas: ((max * scale).round() as i32).max(3),
            step_at,
            bursts,
            scale,
            expected_population: Vec::new(),
        };
        let minutes = duration_s / 60 + 16;
        let mut pop = f64::from(t.initial_tenants);
        t.expected_population = (0..minutes)
            .map(|m| {
                let here = pop;
                pop += 60.0 * t.new_tenant_rate(m as f64 * 60.0 + 30.0);
                here
            })
            .collect();
        t
    }

    /// Activity multiplier of an existing tenant at time t (seconds from the start).
    pub fn activity(&self, t: f64) -> f64 {
        let day_phase = (t / DAY as f64 - 15.0 / 24.0) * std::f64::consts::TAU;
        let base = match self.kind {
            TraceKind::Tidal => 1.0 + 0.6 * day_phase.cos(),
            TraceKind::Holiday => 0.5 * (1.0 + 0.6 * day_phase.cos()),
            TraceKind::Flash => {
                let t0 = self.step_at.unwrap_or(0) as f64;
                if t < t0 {
                    0.5
                } else if t < t0 + 2400.0 {
                    0.5 * 3.5
                } else {
                    0.5 + 0.5 * 2.5 * (-(t - t0 - 2400.0) / 1800.0).exp()
                }
            }
            TraceKind::Ramp => 1.0,
            TraceKind::Steady => 0.8,
            TraceKind::Step => {
                if t < self.step_at.unwrap_or(0) as f64 {
                    0.3
                } else {
                    1.5
                }
            }
            TraceKind::Ceiling => {
                if t < 5400.0 {
                    1.5
                } else {
                    0.3
                }
            }
        };
        let burst: f64 = self
            .bursts
            .iter()
            .filter(|(s, e, _)| (*s as f64) <= t && t < *e as f64)
            .map(|(_, _, f)| *f)
            .product();
        base * burst
    }

    /// New tenants per second at time t.
    pub fn new_tenant_rate(&self, t: f64) -> f64 {
        let n0 = f64::from(self.initial_tenants);
        match self.kind {
            // 4% of the population per day, with the tidal shape.
            TraceKind::Tidal | TraceKind::Holiday | TraceKind::Steady | TraceKind::Step => {
                0.04 * n0 / DAY as f64 * self.activity(t).min(2.0)
            }
            TraceKind::Flash => {
                let t0 = self.step_at.unwrap_or(0) as f64;
                let wave = if (t0..t0 + 1200.0).contains(&t) {
                    0.10 * n0 / 1200.0
                } else {
                    0.0
                };
                0.04 * n0 / DAY as f64 + wave
            }
            // Population grows to 6× over the trace: demand from ~30% to ~130% of what the
            // maximum replicas serve with every batch slot full (~190% of it at 70%).
            TraceKind::Ramp => 5.0 * n0 / self.duration_s as f64,
            // Enough new tenants to matter at the ceiling.
            TraceKind::Ceiling => 0.5 * n0 / self.duration_s as f64,
        }
    }

    /// Base sessions per second for a population (new tenants' first requests not included).
    pub fn base_rate(&self, t: f64, population: f64) -> f64 {
        self.activity(t) * population * PER_TENANT_RATE
    }

    /// What the oracle knows: base sessions plus new tenants' first requests at time t.
    pub fn expected_base_rate(&self, t: f64) -> f64 {
        let m = ((t.max(0.0) / 60.0) as usize).min(self.expected_population.len() - 1);
        self.base_rate(t, self.expected_population[m]) + self.new_tenant_rate(t)
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tidal_day_peaks_in_the_afternoon() {
        let t = Trace::new(TraceKind::Tidal, 1.0, 1);
        assert!(t.activity(15.0 * 3600.0) > 1.5 && t.activity(3.0 * 3600.0) < 0.45);
        let r = Trace::new(TraceKind::Ramp, 1.0, 1);
        let end = r.expected_base_rate(r.duration_s as f64 - 60.0);
        let start = r.expected_base_rate(0.0);
        assert!(end > 3.0 * start, "{start} → {end}");
    }
}
