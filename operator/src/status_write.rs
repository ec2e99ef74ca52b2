//! Whether a tick's status is worth a write to the API server (pure, no I/O).
//!
//! Every tick builds a fresh status, and its measured figures (`measured`, `podModel`, the
//! forecast's error and next-hour peak) move a
//! little on every tick under load; writing each one costs a request per pool per interval,
//! the largest share of what an operator with many pools asks of the API server. So:
//! - a change in anything but the figures (replicas, desired, admission, conditions,
//!   decisions, generation) is written at once;
//! - figures are written when one of them moved by more than `SIGNIFICANT` (or appeared or
//!   went), so a pool that starts or stops serving shows it at once;
//! - otherwise the figures are refreshed every `HEARTBEAT`, so `observedAt` is never older
//!   than that on a pool whose metrics flow.
//!
//! The live figures are always on the operator's /metrics; the status is the summary.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tidegate_api::status::{ForecastStatus, InferencePoolStatus, Measured, PodModelStatus};

use crate::plan::Millis;

/// Relative change of a figure that is written at once.
pub const SIGNIFICANT: f64 = 0.10;
/// Figures below this are treated as this for the relative test, so that noise around zero
/// (0.2 → 0.4 tokens/s, 0.3 → 0.6 % utilization) does not churn.
const FLOOR: f64 = 5.0;
/// How often unchanged-but-fresh figures are written anyway.
pub const HEARTBEAT_MS: Millis = 300_000;

/// Why a status is written, or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusWrite {
    /// Something a reader acts on changed.
    Changed,
    /// A measured figure moved by more than `SIGNIFICANT`.
    Figures,
    /// The figures are older than `HEARTBEAT_MS`.
    Heartbeat,
    /// Nothing worth a request.
    Skip,
}

impl StatusWrite {
    /// Whether to patch.
    pub fn due(self) -> bool {
        self != StatusWrite::Skip
    }
}

/// Decides for `next` against what the API server holds (`previous`); `written_at` is when
/// this operator last wrote this pool's status (None: not since it started).
pub fn decide(
    previous: Option<&InferencePoolStatus>,
    next: &InferencePoolStatus,
    written_at: Option<Millis>,
    now: Millis,
) -> StatusWrite {
    let Some(prev) = previous else {
        return StatusWrite::Changed;
    };
    if without_figures(prev) != without_figures(next) {
        return StatusWrite::Changed;
    }
    if prev.measured == next.measured
        && prev.pod_model == next.pod_model
        && prev.forecast == next.forecast
    {
        return StatusWrite::Skip;
    }
    if moved(
        prev.measured.as_ref(),
        next.measured.as_ref(),
        measured_figures,
    ) || moved(
        prev.pod_model.as_ref(),
        next.pod_model.as_ref(),
        pod_figures,
    ) || moved(
        prev.forecast.as_ref(),
        next.forecast.as_ref(),
        forecast_figures,
    ) {
        return StatusWrite::Figures;
    }
    match written_at {
        Some(at) if now.saturating_sub(at) < HEARTBEAT_MS => StatusWrite::Skip,
        _ => StatusWrite::Heartbeat,
    }
}

/// The status as the API server keeps it, less the figures: times to the whole second (a
/// status read back has lost the milliseconds a fresh one carries).
fn without_figures(s: &InferencePoolStatus) -> InferencePoolStatus {
    let mut s = InferencePoolStatus {
        measured: s.measured.as_ref().map(|_| Measured::default()),
        pod_model: s.pod_model.as_ref().map(|_| PodModelStatus::default()),
        forecast: s.forecast.as_ref().map(|f| ForecastStatus {
            recent_error: None,
            next_hour_peak_replicas: None,
            ..f.clone()
        }),
        ..s.clone()
    };
    if let Some(a) = s.admission.as_mut() {
        a.since = a.since.as_ref().map(whole_second);
    }
    s.last_scale_time = s.last_scale_time.as_ref().map(whole_second);
    for c in &mut s.conditions {
        c.last_transition_time = whole_second(&c.last_transition_time);
    }
    for d in &mut s.recent_decisions {
        d.time = whole_second(&d.time);
    }
    s
}

fn whole_second(t: &Time) -> Time {
    Time(Timestamp::from_second(t.0.as_second()).unwrap_or(t.0))
}

fn measured_figures(m: &Measured) -> Vec<f64> {
    vec![
        m.decode_tokens_per_second,
        m.per_replica_capacity,
        m.demand_tokens_per_second,
        m.utilization * 100.0,
        m.kv_utilization * 100.0,
        m.evictions_per_second,
        queue_wait_ms(&m.queue_wait_p99),
    ]
}

fn pod_figures(p: &PodModelStatus) -> Vec<f64> {
    vec![
        p.itl_base_seconds * 1e6,
        p.itl_per_sequence_seconds * 1e6,
        p.sessions_at_slo,
    ]
}

fn forecast_figures(f: &ForecastStatus) -> Vec<f64> {
    vec![
        f.recent_error.unwrap_or_default() * 100.0,
        f64::from(f.next_hour_peak_replicas.unwrap_or_default()),
    ]
}

/// "350ms" → 350; what does not parse counts as 0 (a change to it is then caught by the
/// heartbeat).
fn queue_wait_ms(text: &str) -> f64 {
    text.parse::<tidegate_api::duration::Duration>()
        .map(|d| d.as_std().as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}

fn moved<T>(a: Option<&T>, b: Option<&T>, figures: fn(&T) -> Vec<f64>) -> bool {
    match (a, b) {
        (None, None) => false,
        (Some(a), Some(b)) => figures(a).iter().zip(figures(b)).any(|(x, y)| {
            let scale = x.abs().max(y.abs()).max(FLOOR);
            (x - y).abs() / scale > SIGNIFICANT
        }),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(tps: f64, observed_s: i64) -> InferencePoolStatus {
        InferencePoolStatus {
            replicas: 3,
            desired_replicas: 3,
            measured: Some(Measured {
                decode_tokens_per_second: tps,
                queue_wait_p99: "200ms".into(),
                observed_at: Some(crate::plan::to_time(observed_s as u64 * 1000)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_first_status_is_written() {
        assert_eq!(decide(None, &status(1.0, 0), None, 0), StatusWrite::Changed);
    }

    #[test]
    fn a_change_beyond_the_figures_is_written_at_once() {
        let prev = status(100.0, 0);
        let mut next = status(100.0, 15);
        next.desired_replicas = 4;
        assert_eq!(
            decide(Some(&prev), &next, Some(14_000), 15_000),
            StatusWrite::Changed
        );
        let mut next = status(100.0, 15);
        next.last_scale_time = Some(crate::plan::to_time(15_000));
        assert!(decide(Some(&prev), &next, Some(14_000), 15_000).due());
    }

    #[test]
    fn jitter_waits_for_the_heartbeat_and_a_big_move_does_not() {
        let prev = status(100.0, 0);
        let jitter = status(104.0, 15);
        assert_eq!(
            decide(Some(&prev), &jitter, Some(0), 15_000),
            StatusWrite::Skip
        );
        assert_eq!(
            decide(Some(&prev), &jitter, Some(0), HEARTBEAT_MS),
            StatusWrite::Heartbeat
        );
        // Since the operator started it has not written: the first tick refreshes.
        assert_eq!(
            decide(Some(&prev), &jitter, None, 15_000),
            StatusWrite::Heartbeat
        );
        let jump = status(130.0, 15);
        assert_eq!(
            decide(Some(&prev), &jump, Some(0), 15_000),
            StatusWrite::Figures
        );
    }

    #[test]
    fn a_status_read_back_with_whole_seconds_is_not_a_change() {
        let mut fresh = status(100.0, 15);
        fresh.last_scale_time = Some(crate::plan::to_time(12_345));
        let mut stored = fresh.clone();
        stored.last_scale_time = Some(crate::plan::to_time(12_000));
        assert_eq!(
            decide(Some(&stored), &fresh, Some(0), 15_000),
            StatusWrite::Skip
        );
        stored.last_scale_time = Some(crate::plan::to_time(11_000));
        assert_eq!(
            decide(Some(&stored), &fresh, Some(0), 15_000),
            StatusWrite::Changed
        );
    }

    #[test]
    fn an_identical_status_is_never_written() {
        let s = status(100.0, 0);
        assert_eq!(
            decide(Some(&s), &s.clone(), Some(0), 10 * HEARTBEAT_MS),
            StatusWrite::Skip
        );
    }

    #[test]
    fn figures_that_appear_or_go_are_written() {
        let prev = InferencePoolStatus {
            measured: None,
            ..status(0.0, 0)
        };
        assert!(decide(Some(&prev), &status(0.0, 15), Some(0), 15_000).due());
        let mut gone = status(100.0, 15);
        gone.pod_model = Some(PodModelStatus::default());
        assert_eq!(
            decide(Some(&status(100.0, 0)), &gone, Some(0), 15_000),
            StatusWrite::Changed
        );
    }

    #[test]
    fn small_figures_near_zero_do_not_churn() {
        let prev = status(0.2, 0);
        let next = status(0.4, 15);
        assert_eq!(
            decide(Some(&prev), &next, Some(0), 15_000),
            StatusWrite::Skip
        );
    }
}
