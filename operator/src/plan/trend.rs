//! The demand's short-horizon trend: a straight line through the last few minutes of λ
//! (slot-steps per second, the unit `demand` computes), projected one lead time ahead.
//!
//! Why: the daily profile sees a tide that repeats; it sees nothing on its first day, nor a
//! ramp that comes at a new hour (a launch, a batch job, the llm-d ramp scenario). A ramp
//! that is already under way is visible in the last minutes of demand, and a reactive
//! planner that waits for it to arrive is one start-up time late on every step of it.
//!
//! The rule: least squares over the samples of the last `WINDOW_MS`; the trend is *rising*
//! only when the slope is positive, significant (`MIN_T` standard errors: the noise of a
//! steady load is not a trend), and the line stays near the samples (`MAX_SCATTER`); then the
//! projection is the line's value one horizon ahead, at most `MAX_GAIN` × λ now. Anything
//! else projects nothing, so a steady or falling load changes nothing.
//!
//! The same line read the other way: the demand is *falling* when the slope is negative by
//! `MIN_T` standard errors and at least `MIN_FALL_PER_MINUTE` of the mean a minute, and the
//! samples stay within `MAX_SCATTER` of their mean. A fall that clear is not the noise the
//! scale-down window waits out, so the planner shortens that window while it lasts
//! (`replicas::scale_down_window_ms`); it never orders fewer replicas than the demand now
//! needs.
//!
//! Invariants: pure (time comes in as `now`); bounded memory (`MAX_SAMPLES`); the projection
//! is finite, non-negative and only ever *raises* what the reactive rule orders.

use std::collections::VecDeque;

use super::Millis;

/// The line is fitted to the samples of this long...
const WINDOW_MS: u64 = 3 * 60_000;
/// ...and projected no further ahead than that.
const MAX_HORIZON_MS: u64 = WINDOW_MS;
/// A line needs at least this many samples...
const MIN_SAMPLES: usize = 6;
/// ...spread over at least this long.
const MIN_SPAN_MS: u64 = 90_000;
/// The slope must be this many standard errors above zero.
const MIN_T: f64 = 4.0;
/// The samples' scatter about the line, relative to its value now, must stay under this.
const MAX_SCATTER: f64 = 0.15;
/// The projection is at most this multiple of the line's value now.
const MAX_GAIN: f64 = 2.0;
/// A fall must be at least this fraction of the demand a minute: 30% within a 5-minute
/// scale-down window, three times the scale-down band. A tide's evening decline, or the
/// fading of a burst, is slower and keeps the window.
const MIN_FALL_PER_MINUTE: f64 = 0.06;
/// Samples kept, at most (a tick every 5 s fills the window with 36).
const MAX_SAMPLES: usize = 64;

/// The recent samples of λ for one pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trend {
    samples: VecDeque<(Millis, f64)>,
}

/// A rising line: where it is now and where it will be.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rise {
    /// The line's value now, steps/s.
    pub now: f64,
    /// Its value one horizon ahead (capped), steps/s.
    pub ahead: f64,
    /// Its slope, steps/s per minute.
    pub per_minute: f64,
}

/// A falling line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fall {
    /// The line's value now, steps/s.
    pub now: f64,
    /// Its slope, steps/s per minute (negative).
    pub per_minute: f64,
}

impl Trend {
    /// Records one measurement of λ at `now`.
    pub fn observe(&mut self, now: Millis, lambda: f64) {
        let lambda = if lambda.is_finite() {
            lambda.max(0.0)
        } else {
            0.0
        };
        match self.samples.back() {
            // Time went back (a restored state): start over.
            Some((t, _)) if *t > now => self.samples.clear(),
            // A second reading at the same instant replaces the first.
            Some((t, _)) if *t == now => {
                self.samples.pop_back();
            }
            _ => {}
        }
        self.samples.push_back((now, lambda));
        while self.samples.len() > MAX_SAMPLES
            || self
                .samples
                .front()
                .is_some_and(|(t, _)| now.saturating_sub(*t) > WINDOW_MS)
        {
            self.samples.pop_front();
        }
    }

    /// The line projected `horizon_ms` past `now` (at most `MAX_HORIZON_MS`), when the
    /// demand is rising.
    pub fn rising(&self, now: Millis, horizon_ms: u64) -> Option<Rise> {
        let line = self.line(now)?;
        let significant = line.slope > 0.0 && line.slope > MIN_T * line.slope_error;
        if !significant || line.here <= 0.0 || line.scatter > MAX_SCATTER * line.here {
            return None;
        }
        let (here, slope) = (line.here, line.slope);
        let minutes = horizon_ms.min(MAX_HORIZON_MS) as f64 / 60_000.0;
        let ahead = (here + slope * minutes).min(MAX_GAIN * here);
        ahead.is_finite().then_some(Rise {
            now: here,
            ahead,
            per_minute: slope,
        })
    }

    /// The line, when the demand is falling clearly enough not to be noise.
    pub fn falling(&self, now: Millis) -> Option<Fall> {
        let line = self.line(now)?;
        let significant = line.slope < 0.0 && -line.slope > MIN_T * line.slope_error;
        // The scatter is measured against the mean: at the end of a fall the line's value now
        // nears zero, and a tight line there is still a fall.
        let tight = line.mean > 0.0 && line.scatter <= MAX_SCATTER * line.mean;
        let steep = -line.slope >= MIN_FALL_PER_MINUTE * line.mean;
        (significant && tight && steep && line.slope.is_finite()).then_some(Fall {
            now: line.here.max(0.0),
            per_minute: line.slope,
        })
    }

    /// The least-squares line through the window, once it holds enough samples.
    fn line(&self, now: Millis) -> Option<Fit> {
        let first = self.samples.front()?.0;
        if self.samples.len() < MIN_SAMPLES || now.saturating_sub(first) < MIN_SPAN_MS {
            return None;
        }
        // Minutes before now, so the intercept is the line's value now.
        let xs: Vec<(f64, f64)> = self
            .samples
            .iter()
            .map(|&(t, y)| (-(now.saturating_sub(t) as f64) / 60_000.0, y))
            .collect();
        fit(&xs)
    }
}

/// A least-squares line through (minutes from now, λ).
struct Fit {
    /// Its value at 0 (now).
    here: f64,
    slope: f64,
    slope_error: f64,
    /// The residuals' standard deviation.
    scatter: f64,
    /// The samples' mean.
    mean: f64,
}

fn fit(xs: &[(f64, f64)]) -> Option<Fit> {
    if xs.len() < 3 {
        return None;
    }
    let nf = xs.len() as f64;
    let mx = xs.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = xs.iter().map(|p| p.1).sum::<f64>() / nf;
    let sxx: f64 = xs.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = xs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let here = my - slope * mx;
    let ss: f64 = xs
        .iter()
        .map(|p| (p.1 - (here + slope * p.0)).powi(2))
        .sum();
    let scatter = (ss / (nf - 2.0)).sqrt();
    Some(Fit {
        here,
        slope,
        slope_error: scatter / sxx.sqrt(),
        scatter,
        mean: my,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Millis = 15_000;

    /// Fixed pseudo-random noise in [-1, 1).
    fn noise(i: u64) -> f64 {
        (i.wrapping_mul(2_654_435_761) % 1000) as f64 / 500.0 - 1.0
    }

    fn fed(lambda: impl Fn(u64) -> f64, ticks: u64) -> (Trend, Millis) {
        let mut t = Trend::default();
        for i in 0..ticks {
            t.observe(i * TICK, lambda(i));
        }
        (t, (ticks - 1) * TICK)
    }

    #[test]
    fn a_steady_noisy_load_does_not_rise() {
        for ticks in 6..240 {
            let (t, now) = fed(|i| 500.0 * (1.0 + 0.1 * noise(i)), ticks);
            assert_eq!(t.rising(now, 120_000), None, "after {ticks} ticks");
        }
    }

    #[test]
    fn a_ramp_rises_at_its_slope_and_is_projected_one_horizon_ahead() {
        // 300 steps/s, +100 a minute (25 a tick), ±3% noise.
        let (t, now) = fed(|i| (300.0 + 25.0 * i as f64) * (1.0 + 0.03 * noise(i)), 20);
        let r = t.rising(now, 120_000).expect("rising");
        let here = 300.0 + 25.0 * 19.0;
        assert!((r.now - here).abs() < 0.05 * here, "{r:?}");
        assert!((r.per_minute - 100.0).abs() < 20.0, "{r:?}");
        assert!(
            (r.ahead - (r.now + 2.0 * r.per_minute)).abs() < 1e-6,
            "{r:?}"
        );
        // Not projected past the window's length, nor past MAX_GAIN × now.
        let far = t.rising(now, 3_600_000).expect("rising");
        assert!(
            (far.ahead - (r.now + 3.0 * r.per_minute)).abs() < 1e-6,
            "{far:?}"
        );
        let (steep, now) = fed(|i| 10.0 + 50.0 * i as f64, 20);
        let s = steep.rising(now, 180_000).expect("rising");
        assert!(s.ahead <= MAX_GAIN * s.now + 1e-9, "{s:?}");
    }

    #[test]
    fn a_steady_noisy_load_does_not_fall() {
        for ticks in 6..240 {
            let (t, now) = fed(|i| 500.0 * (1.0 + 0.1 * noise(i)), ticks);
            assert_eq!(t.falling(now), None, "after {ticks} ticks");
        }
    }

    #[test]
    fn a_descent_falls_at_its_slope_and_a_climb_does_not() {
        // 1000 steps/s, -80 a minute (20 a tick), ±3% noise.
        let (t, now) = fed(|i| (1000.0 - 20.0 * i as f64) * (1.0 + 0.03 * noise(i)), 20);
        let f = t.falling(now).expect("falling");
        assert!((f.per_minute + 80.0).abs() < 16.0, "{f:?}");
        assert!((f.now - 620.0).abs() < 0.05 * 620.0, "{f:?}");
        // Down to nearly nothing: still a fall, though the line's value now is small.
        let (t, now) = fed(|i| 300.0 - 25.0 * i as f64, 12);
        assert!(t.falling(now).is_some());
        let (t, now) = fed(|i| 300.0 + 25.0 * i as f64, 20);
        assert_eq!(t.falling(now), None);
        // A slow decline (2% of the level a minute), however clean, keeps the window.
        let (t, now) = fed(|i| 1000.0 - 5.0 * i as f64, 20);
        assert_eq!(t.falling(now), None, "slow decline");
        let (t, now) = fed(|i| 1000.0 - 20.0 * i as f64, 5);
        assert_eq!(t.falling(now), None, "five samples");
    }

    #[test]
    fn a_falling_load_and_too_few_samples_project_nothing() {
        let (t, now) = fed(|i| 1000.0 - 20.0 * i as f64, 20);
        assert_eq!(t.rising(now, 120_000), None);
        let (t, now) = fed(|i| 300.0 + 25.0 * i as f64, 5);
        assert_eq!(t.rising(now, 120_000), None, "five samples");
    }

    #[test]
    fn memory_is_bounded_and_time_going_back_starts_over() {
        let mut t = Trend::default();
        for i in 0..10_000 {
            t.observe(i * 1000, f64::from(i as u32));
        }
        assert!(t.samples.len() <= MAX_SAMPLES);
        t.observe(5, f64::NAN);
        assert_eq!(t.samples.len(), 1);
        assert_eq!(t.samples[0], (5, 0.0));
        t.observe(5, 7.0);
        assert_eq!(t.samples.len(), 1, "the same instant replaces");
    }
}
