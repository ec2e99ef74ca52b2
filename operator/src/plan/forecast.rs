//! The pool's demand forecast: a daily profile learned online from the pool's own demand,
//! scaled by how today compares with it.
//!
//! The quantity is the planner's own demand in the unit that does not move when the pool
//! scales: slot-steps per second (λ, see `demand`). The model is seasonal-naive blended with
//! the recent level:
//! - **profile**: one value per 15-minute bucket of the (UTC) day, the mean λ of that bucket
//!   on the days seen, the newest day weighing half (`DAY_WEIGHT`), so a change of habit is
//!   learned in a few days and a single odd day is half forgotten the next;
//! - **level**: how today runs against the profile, λ now ÷ profile now: the median of its
//!   5-minute means over the last two hours (`LEVEL_SLOTS`), so a 15-minute burst does not
//!   lift the forecast for the hour after it, and a holiday at half the usual load forecasts
//!   half the usual tide within the hour;
//! - forecast at t = min(level, λ now ÷ profile now) × profile(t), the profile interpolated
//!   between bucket centres: the level is slow to forget a burst longer than an hour (two
//!   overlapping ones), and once the demand is back down the forecast must not order for it.
//!
//! It tracks its own error: every observation also predicts λ one lead time ahead, and when
//! that time comes the prediction is scored against what was measured (relative error,
//! smoothed over about an hour). The forecast is *in use* only while that error is under
//! `MAX_ERROR` and the profile covers the horizon; otherwise the planner is purely reactive,
//! so a day that does not repeat costs no more than the reactive rule.
//!
//! Invariants: pure (time comes in as `now`); bounded memory (96 buckets, at most
//! `MAX_PENDING` predictions awaiting their score); every figure it returns is finite and
//! non-negative; the forecast only ever *adds* to what the reactive rule orders.

use std::collections::VecDeque;

use super::Millis;

/// Width of a profile bucket.
pub const BUCKET_MS: u64 = 15 * 60 * 1000;
/// Buckets in a day.
pub const BUCKETS: usize = 96;
const DAY_MS: u64 = 86_400_000;
/// Weight of the newest day in a bucket's profile value.
const DAY_WEIGHT: f64 = 0.5;
/// The level is the median of this many ratio means...
const LEVEL_SLOTS: usize = 24;
/// ...each over this long.
const LEVEL_SLOT_MS: u64 = 5 * 60_000;
/// Time constant of the recent error.
const ERROR_TAU_MS: f64 = 60.0 * 60_000.0;
/// The forecast is used while its recent relative error is under this.
pub const MAX_ERROR: f64 = 0.2;
/// Relative errors are taken against at least this share of the profile's peak, so that a
/// quiet night's noise on a handful of sessions does not count as a large error.
const ERROR_FLOOR_OF_PEAK: f64 = 0.05;
/// A bucket counts as seen once it holds observations over at least this share of it.
const MIN_BUCKET_COVER: f64 = 0.5;
/// A bucket is read as the median of it and this many neighbours on each side.
const MEDIAN_REACH: usize = 2;
/// Predictions awaiting their score, at most.
const MAX_PENDING: usize = 2048;
/// The forecast peak over a horizon is taken at this step.
const PEAK_STEP_MS: u64 = 60_000;
/// Version tag of the persisted form.
const FORMAT: &str = "v1";

/// Why the forecast is not in use, or that it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// In use: the planner orders for the forecast when it is higher than the demand now.
    InUse,
    /// Disabled in the pool's spec (`scaling.forecast: Off`).
    Off,
    /// The profile does not yet cover now and the lead time ahead (the first day).
    Learning,
    /// Predictions have not been scored yet (just started, or just restored).
    Unscored,
    /// Its recent error is over `MAX_ERROR`: a day that does not repeat.
    Inaccurate,
}

impl std::fmt::Display for Standing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Standing::InUse => "in use",
            Standing::Off => "off in the pool's spec",
            Standing::Learning => "learning the day's profile",
            Standing::Unscored => "not yet scored against what happened",
            Standing::Inaccurate => "recent error too large: planning on the demand now",
        })
    }
}

/// The current bucket's running mean.
#[derive(Clone, Debug, PartialEq)]
struct Bucket {
    /// Absolute bucket number (ms since the epoch ÷ `BUCKET_MS`).
    number: u64,
    sum: f64,
    n: u32,
    /// Time covered by observations in this bucket.
    covered_ms: u64,
    last: Millis,
}

/// The forecaster's memory for one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Forecaster {
    profile: Vec<Option<f64>>,
    bucket: Option<Bucket>,
    /// λ now ÷ profile now: the means of the recent 5-minute slots (slot number, sum, n).
    level: VecDeque<(u64, f64, u32)>,
    /// λ now ÷ profile now, at the latest observation (not persisted).
    latest: Option<f64>,
    /// (due, predicted λ) awaiting their score.
    pending: VecDeque<(Millis, f64)>,
    /// Recent relative error, and when it was last updated.
    error: Option<(f64, Millis)>,
}

impl Default for Forecaster {
    fn default() -> Self {
        Forecaster {
            profile: vec![None; BUCKETS],
            bucket: None,
            level: VecDeque::new(),
            latest: None,
            pending: VecDeque::new(),
            error: None,
        }
    }
}

fn finite(x: f64) -> f64 {
    if x.is_finite() { x.max(0.0) } else { 0.0 }
}

/// Smoothing weight of a sample `dt_ms` after the previous one, for time constant `tau_ms`.
fn weight(dt_ms: u64, tau_ms: f64) -> f64 {
    1.0 - (-(dt_ms as f64) / tau_ms).exp()
}

impl Forecaster {
    /// Feeds one measurement of λ (steps/s) at `now`, with the lead time the forecast must
    /// look ahead; scores the predictions that fall due.
    pub fn observe(&mut self, now: Millis, lambda: f64, lead_ms: u64) {
        let lambda = finite(lambda);
        self.score(now, lambda);
        self.accumulate(now, lambda);
        match self.at(now) {
            Some(p) if p > self.error_floor() => {
                self.latest = Some(lambda / p);
                self.track_level(now, lambda / p);
            }
            Some(_) => self.latest = None,
            None => {
                self.latest = None;
                self.level.clear();
            }
        }
        if let Some(pred) = self.modelled(now + lead_ms) {
            if self.pending.len() >= MAX_PENDING {
                self.pending.pop_front();
            }
            self.pending.push_back((now + lead_ms, pred));
        }
    }

    fn track_level(&mut self, now: Millis, ratio: f64) {
        let slot = now / LEVEL_SLOT_MS;
        match self.level.back_mut() {
            Some((n, sum, count)) if *n == slot => {
                *sum += ratio;
                *count += 1;
            }
            _ => self.level.push_back((slot, ratio, 1)),
        }
        while self
            .level
            .front()
            .is_some_and(|(n, _, _)| slot.saturating_sub(*n) >= LEVEL_SLOTS as u64)
        {
            self.level.pop_front();
        }
    }

    /// The median of the recent slots' mean ratios.
    fn level(&self) -> Option<f64> {
        let mut means: Vec<f64> = self
            .level
            .iter()
            .map(|(_, sum, n)| sum / f64::from((*n).max(1)))
            .collect();
        if means.is_empty() {
            return None;
        }
        means.sort_by(f64::total_cmp);
        let mid = means.len() / 2;
        Some(if means.len() % 2 == 1 {
            means[mid]
        } else {
            0.5 * (means[mid - 1] + means[mid])
        })
    }

    fn score(&mut self, now: Millis, lambda: f64) {
        let floor = self.error_floor();
        while let Some(&(due, pred)) = self.pending.front() {
            if due > now {
                break;
            }
            self.pending.pop_front();
            // A prediction scored long after it fell due (no observation in between) says
            // nothing about now.
            if now - due > BUCKET_MS {
                continue;
            }
            let e = (pred - lambda).abs() / lambda.max(floor).max(1e-9);
            self.error = Some(match self.error {
                Some((err, at)) => {
                    let w = weight(now.saturating_sub(at).max(1000), ERROR_TAU_MS);
                    (err + w * (e - err), now)
                }
                None => (e, now),
            });
        }
    }

    fn accumulate(&mut self, now: Millis, lambda: f64) {
        let number = now / BUCKET_MS;
        if let Some(b) = &mut self.bucket
            && b.number == number
        {
            b.covered_ms += now.saturating_sub(b.last).min(BUCKET_MS);
            b.sum += lambda;
            b.n += 1;
            b.last = now;
            return;
        }
        if let Some(done) = self.bucket.take() {
            self.close(&done);
        }
        self.bucket = Some(Bucket {
            number,
            sum: lambda,
            n: 1,
            covered_ms: 0,
            last: now,
        });
    }

    fn close(&mut self, b: &Bucket) {
        if b.n == 0 || (b.covered_ms as f64) < MIN_BUCKET_COVER * BUCKET_MS as f64 {
            return;
        }
        let mean = b.sum / f64::from(b.n);
        let slot = &mut self.profile[(b.number % BUCKETS as u64) as usize];
        *slot = Some(match *slot {
            Some(old) => old + DAY_WEIGHT * (mean - old),
            None => mean,
        });
    }

    /// The profile at time `t`, interpolated between bucket centres; None where a bucket it
    /// needs has not been seen.
    fn at(&self, t: Millis) -> Option<f64> {
        let x = (t % DAY_MS) as f64 / BUCKET_MS as f64 - 0.5;
        let x = x.rem_euclid(BUCKETS as f64);
        let i0 = x.floor() as usize % BUCKETS;
        let i1 = (i0 + 1) % BUCKETS;
        let frac = x - x.floor();
        let (a, b) = (self.robust(i0)?, self.robust(i1)?);
        Some(a + frac * (b - a))
    }

    /// Bucket `i` as the median of it and its neighbours within half an hour: a burst on one
    /// past day that filled a bucket or two is not forecast for every day after.
    fn robust(&self, i: usize) -> Option<f64> {
        let here = self.profile[i]?;
        let mut v: Vec<f64> = (0..=2 * MEDIAN_REACH)
            .filter_map(|d| self.profile[(i + BUCKETS + d - MEDIAN_REACH) % BUCKETS])
            .collect();
        if v.len() < 2 * MEDIAN_REACH + 1 {
            return Some(here);
        }
        v.sort_by(f64::total_cmp);
        Some(v[MEDIAN_REACH])
    }

    /// The model's prediction of λ at `t`, level × profile: what its error scores, so that a
    /// day the profile does not describe turns it off (the latest ratio alone would make any
    /// smooth day look predictable one lead time ahead).
    fn modelled(&self, t: Millis) -> Option<f64> {
        Some(finite(self.level()? * self.at(t)?))
    }

    /// The forecast of λ at `t` the planner orders for: the lower of the level and the latest
    /// ratio, × profile.
    fn point(&self, t: Millis) -> Option<f64> {
        let level = self.level()?;
        let ratio = self.latest.map_or(level, |r| r.min(level));
        Some(finite(ratio * self.at(t)?))
    }

    fn error_floor(&self) -> f64 {
        let peak = self.profile.iter().flatten().fold(0.0f64, |m, &v| m.max(v));
        ERROR_FLOOR_OF_PEAK * peak
    }

    /// The highest forecast λ over `[now, now + horizon]`; None where the profile does not
    /// cover it.
    pub fn peak(&self, now: Millis, horizon_ms: u64) -> Option<f64> {
        let steps = horizon_ms.div_ceil(PEAK_STEP_MS);
        (0..=steps)
            .map(|i| self.point(now + (i * PEAK_STEP_MS).min(horizon_ms)))
            .try_fold(0.0f64, |m, p| Some(m.max(p?)))
    }

    /// Recent relative error of the predictions one lead time ahead.
    pub fn recent_error(&self) -> Option<f64> {
        self.error.map(|(e, _)| e)
    }

    /// Whether the forecast may be used at `now` for a lead time ahead, and if not why.
    pub fn standing(&self, now: Millis, lead_ms: u64, enabled: bool) -> Standing {
        if !enabled {
            Standing::Off
        } else if self.peak(now, lead_ms).is_none() {
            Standing::Learning
        } else {
            match self.recent_error() {
                None => Standing::Unscored,
                Some(e) if e >= MAX_ERROR => Standing::Inaccurate,
                Some(_) => Standing::InUse,
            }
        }
    }

    /// The persisted form: format, bucket width and the profile, values to 3 significant
    /// figures, unseen buckets empty ("v1 15m 12.3,13.1,,…").
    pub fn history(&self) -> String {
        let values: Vec<String> = self
            .profile
            .iter()
            .map(|v| v.map(sig3).unwrap_or_default())
            .collect();
        format!("{FORMAT} 15m {}", values.join(","))
    }

    /// A forecaster restored from `history` and the error an earlier operator reported; a
    /// history that does not parse restores nothing (the profile is relearned).
    pub fn restored(history: &str, recent_error: Option<f64>, now: Millis) -> Forecaster {
        let mut f = Forecaster::default();
        let mut parts = history.splitn(3, ' ');
        if parts.next() != Some(FORMAT) || parts.next() != Some("15m") {
            return f;
        }
        let values: Vec<&str> = parts.next().unwrap_or_default().split(',').collect();
        if values.len() != BUCKETS {
            return f;
        }
        let parsed: Option<Vec<Option<f64>>> = values
            .iter()
            .map(|v| match v.trim() {
                "" => Some(None),
                s => s
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .map(Some),
            })
            .collect();
        if let Some(p) = parsed {
            f.profile = p;
            f.error = recent_error.filter(|e| e.is_finite()).map(|e| (e, now));
        }
        f
    }
}

/// `x` to three significant figures, without trailing zeros.
fn sig3(x: f64) -> String {
    if x == 0.0 {
        return "0".to_string();
    }
    let digits = (2 - x.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{x:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
#[path = "forecast_tests.rs"]
mod tests;
