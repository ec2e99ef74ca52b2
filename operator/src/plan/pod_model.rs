//! The learned pod model: a replica's step time (inter-token latency) as a function of its
//! batch occupancy, ITL(k) ≈ A + B·k, fitted per pool from what engines measure.
//!
//! From the line: the occupancy k* at which each session still gets the SLO's rate r
//! (1 / ITL(k*) = r, so k* = (1/r − A) / B), capped by maxBatchSize and never below one
//! session; the capacity at the SLO, k* × r tokens/s per replica. The seeds' T ÷ r is the same
//! figure: at k*, a replica makes T = k* / ITL(k*) = k* × r tokens/s.
//!
//! Fit: weighted least squares over the recent (occupancy, mean ITL) points, one per engine
//! per read, with a prior line held as two pseudo-points (at k = 0 and k = maxBatchSize), so
//! that points clustered at one occupancy (a steady load) pin the line where they are and
//! leave its slope near the prior instead of swinging it on noise. Points far from the
//! current fit (more than `OUTLIER_FACTOR` × the median residual) are left out of the next
//! fit: a pod that was starting, draining or stalled reads as one wild point, not a new line.
//!
//! Invariants: A ≥ 0 and B ≥ `MIN_SLOPE`, so every derived figure is finite and positive;
//! 1 ≤ k* ≤ maxBatchSize; with no points the model is its prior, which comes from the spec's
//! capacity hint (or maxBatchSize × r) and maxBatchSize, or from what status recorded.

use std::collections::VecDeque;

use tidegate_api::InferencePoolSpec;

/// One engine's figures over one rate window: its mean batch occupancy and the mean time
/// between the output tokens it produced meanwhile.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepSample {
    /// Requests running, averaged over the window.
    pub batch: f64,
    /// Mean inter-token latency over the window, seconds.
    pub itl_seconds: f64,
}

/// Points kept for the fit: at one point per engine per 15 s tick, an hour of a small pool
/// and a minute or so of a large one.
const MAX_POINTS: usize = 512;
/// Each prior pseudo-point counts as this many measured points. They sit at the ends of the
/// occupancy range, where one weighs on the slope as much as many points near the middle, so
/// half a point each is enough to hold the slope of a cluster and little enough that a
/// wrong hint gives way within a few minutes of a spread of points.
const PRIOR_WEIGHT: f64 = 0.5;
/// Share of the prior's ITL at full batch that is the per-step base cost A (the rest grows
/// with the batch): a decode step of a small batch is dominated by reading the weights once.
const PRIOR_BASE_SHARE: f64 = 0.5;
/// Points whose residual exceeds this many median residuals are outliers.
const OUTLIER_FACTOR: f64 = 4.0;
/// The smallest slope the fit may report (seconds per sequence): a flat line would put k* at
/// infinity; this keeps it at maxBatchSize.
const MIN_SLOPE: f64 = 1e-9;

/// A fitted line: ITL(k) = base + per_sequence × k.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Line {
    pub base_seconds: f64,
    pub per_sequence_seconds: f64,
}

impl Line {
    pub fn itl(&self, k: f64) -> f64 {
        self.base_seconds + self.per_sequence_seconds * k
    }

    fn sane(self) -> Line {
        Line {
            base_seconds: self.base_seconds.max(0.0),
            per_sequence_seconds: self.per_sequence_seconds.max(MIN_SLOPE),
        }
    }
}

/// The learned model of one pool's replicas.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodModel {
    prior: Option<Line>,
    points: VecDeque<StepSample>,
    fit: Option<Line>,
    /// Points learned from so far (outliers included).
    pub samples: u64,
}

/// What the model says about one pool at the SLO.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AtSlo {
    pub line: Line,
    /// k*: sessions a replica holds while each still gets r tokens/s (capped by maxBatchSize).
    pub sessions: f64,
    /// k* × r: the demand one replica serves at the SLO, tokens/s.
    pub capacity_tokens_per_second: f64,
}

impl PodModel {
    /// A model that starts from a line an earlier operator learned (restored from status).
    pub fn restored(line: Line) -> Self {
        PodModel {
            prior: Some(line.sane()),
            ..PodModel::default()
        }
    }

    /// The prior line from the spec: ITL at full batch is maxBatchSize ÷ T, where T is the
    /// capacity hint or maxBatchSize × r (every session exactly at the SLO).
    pub fn seed(spec: &InferencePoolSpec) -> Line {
        let b = f64::from(spec.engine.max_batch_size.max(1));
        let r = spec.slo.tokens_per_second_per_session.max(1e-6);
        let t = spec
            .scaling
            .capacity_hint_tokens_per_second
            .filter(|t| *t > 0.0)
            .unwrap_or(b * r);
        let full = b / t;
        Line {
            base_seconds: PRIOR_BASE_SHARE * full,
            per_sequence_seconds: (1.0 - PRIOR_BASE_SHARE) * full / b,
        }
        .sane()
    }

    /// Learns from one read's points and refits.
    pub fn observe(&mut self, spec: &InferencePoolSpec, points: &[StepSample]) {
        let prior = *self.prior.get_or_insert_with(|| Self::seed(spec));
        let usable = points
            .iter()
            .filter(|p| p.batch.is_finite() && p.itl_seconds.is_finite())
            .filter(|p| p.batch >= 0.5 && p.itl_seconds > 0.0);
        for p in usable {
            self.points.push_back(*p);
            self.samples += 1;
        }
        while self.points.len() > MAX_POINTS {
            self.points.pop_front();
        }
        if self.points.is_empty() {
            return;
        }
        let b = f64::from(spec.engine.max_batch_size.max(1));
        let first = fit(prior, b, self.points.iter().map(|p| (p, 1.0)));
        let cut = OUTLIER_FACTOR * median_residual(first, &self.points);
        let kept = self
            .points
            .iter()
            .map(|p| (p, if residual(first, p) <= cut { 1.0 } else { 0.0 }));
        self.fit = Some(fit(prior, b, kept).sane());
    }

    /// The current line: the fit, or the prior before any point.
    pub fn line(&self, spec: &InferencePoolSpec) -> Line {
        self.fit.or(self.prior).unwrap_or_else(|| Self::seed(spec))
    }

    /// The figures at the SLO.
    pub fn at_slo(&self, spec: &InferencePoolSpec) -> AtSlo {
        let line = self.line(spec);
        let b = f64::from(spec.engine.max_batch_size.max(1));
        let r = spec.slo.tokens_per_second_per_session.max(1e-6);
        let k = ((1.0 / r - line.base_seconds) / line.per_sequence_seconds).clamp(1.0, b);
        AtSlo {
            line,
            sessions: k,
            capacity_tokens_per_second: k * r,
        }
    }
}

fn residual(line: Line, p: &StepSample) -> f64 {
    (p.itl_seconds - line.itl(p.batch)).abs()
}

fn median_residual(line: Line, points: &VecDeque<StepSample>) -> f64 {
    let mut r: Vec<f64> = points.iter().map(|p| residual(line, p)).collect();
    r.sort_by(f64::total_cmp);
    // A floor keeps a perfect fit (the simulator's exact pods) from calling every later
    // point an outlier.
    r.get(r.len() / 2).copied().unwrap_or(0.0).max(1e-6)
}

/// Weighted least squares of ITL on occupancy, with the prior's two pseudo-points.
fn fit<'a>(
    prior: Line,
    max_batch: f64,
    points: impl Iterator<Item = (&'a StepSample, f64)>,
) -> Line {
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let mut add = |x: f64, y: f64, w: f64| {
        sw += w;
        sx += w * x;
        sy += w * y;
        sxx += w * x * x;
        sxy += w * x * y;
    };
    add(0.0, prior.itl(0.0), PRIOR_WEIGHT);
    add(max_batch, prior.itl(max_batch), PRIOR_WEIGHT);
    for (p, w) in points {
        add(p.batch, p.itl_seconds, w);
    }
    let det = sw * sxx - sx * sx;
    if det.abs() < 1e-12 {
        return prior;
    }
    let slope = (sw * sxy - sx * sy) / det;
    Line {
        base_seconds: (sy - slope * sx) / sw,
        per_sequence_seconds: slope,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max_batch: i32, r: f64) -> InferencePoolSpec {
        let yaml = format!(
            "model: {{name: m, uri: \"file:///m\"}}\nengine: {{image: e, maxBatchSize: {max_batch}}}\nreplicas: {{min: 1, max: 10}}\nslo: {{tokensPerSecondPerSession: {r}}}\n"
        );
        serde_saphyr::from_str(&yaml).expect("spec")
    }

    /// A tiny deterministic noise source (no RNG crate in the operator).
    fn noise(i: u64) -> f64 {
        let x = i
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((x >> 33) as f64 / (1u64 << 31) as f64) - 0.5
    }

    #[test]
    fn the_prior_is_maxbatch_times_r_at_the_slo() {
        let s = spec(16, 20.0);
        let m = PodModel::default();
        let at = m.at_slo(&s);
        assert!((at.line.itl(16.0) - 0.05).abs() < 1e-12);
        assert!((at.sessions - 16.0).abs() < 1e-9);
        assert!((at.capacity_tokens_per_second - 320.0).abs() < 1e-9);
    }

    #[test]
    fn learns_the_line_from_spread_points_despite_noise_and_outliers() {
        let s = spec(32, 20.0);
        let truth = Line {
            base_seconds: 0.02,
            per_sequence_seconds: 0.001,
        };
        let mut m = PodModel::default();
        for i in 0..400u64 {
            let k = 2.0 + (i % 25) as f64;
            let mut itl = truth.itl(k) * (1.0 + 0.05 * noise(i));
            if i % 37 == 0 {
                itl *= 6.0; // a stalled pod
            }
            m.observe(
                &s,
                &[StepSample {
                    batch: k,
                    itl_seconds: itl,
                }],
            );
        }
        let at = m.at_slo(&s);
        assert!((at.line.base_seconds - 0.02).abs() < 0.002, "{:?}", at.line);
        assert!(
            (at.line.per_sequence_seconds - 0.001).abs() < 0.0001,
            "{:?}",
            at.line
        );
        // 1/r = 50 ms = 20 ms + 1 ms × k* → k* = 30.
        assert!((at.sessions - 30.0).abs() < 2.0, "{at:?}");
    }

    #[test]
    fn clustered_points_pin_the_operating_point_and_keep_the_prior_slope_near() {
        let s = spec(16, 20.0);
        let mut m = PodModel::default();
        // The simulator's pod at occupancy ~11: ITL = 20 ms + 1.875 ms × 11.
        for i in 0..300u64 {
            let k = 11.0 + 0.3 * noise(i);
            let itl = 0.02 + 0.001_875 * k;
            m.observe(
                &s,
                &[StepSample {
                    batch: k,
                    itl_seconds: itl,
                }],
            );
        }
        let line = m.line(&s);
        let at11 = line.itl(11.0);
        assert!((at11 - 0.040_625).abs() < 0.0005, "{line:?}");
        assert!(line.per_sequence_seconds > 0.0005 && line.per_sequence_seconds < 0.004);
    }

    #[test]
    fn a_pod_too_slow_for_r_still_holds_one_session_and_a_fast_one_is_capped() {
        let s = spec(8, 100.0);
        let mut m = PodModel::default();
        m.observe(
            &s,
            &[StepSample {
                batch: 4.0,
                itl_seconds: 0.5,
            }; 20],
        );
        assert_eq!(m.at_slo(&s).sessions, 1.0);
        let mut fast = PodModel::default();
        fast.observe(
            &s,
            &[StepSample {
                batch: 4.0,
                itl_seconds: 0.0001,
            }; 20],
        );
        assert_eq!(fast.at_slo(&s).sessions, 8.0);
    }

    #[test]
    fn garbage_points_are_ignored_and_a_restored_line_is_the_prior() {
        let s = spec(16, 20.0);
        let line = Line {
            base_seconds: 0.01,
            per_sequence_seconds: 0.002,
        };
        let mut m = PodModel::restored(line);
        let bad = [
            StepSample {
                batch: f64::NAN,
                itl_seconds: 0.1,
            },
            StepSample {
                batch: 3.0,
                itl_seconds: f64::INFINITY,
            },
            StepSample {
                batch: 0.0,
                itl_seconds: 0.1,
            },
            StepSample {
                batch: 3.0,
                itl_seconds: -1.0,
            },
        ];
        m.observe(&s, &bad);
        assert_eq!(m.samples, 0);
        assert_eq!(m.line(&s), line);
    }
}
