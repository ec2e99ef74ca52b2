//! The planner's forecast stage: feeds the pool's demand to its forecaster, and says how many
//! replicas the forecast over the measured lead time needs, when the forecast is in use.
//!
//! The rule: order for the larger of the demand now and the forecast's peak over the lead
//! time (the time this pool's replicas take to be ready), both at the target occupancy. The
//! forecast only raises; the scale-down rule, its tolerance and its window are the reactive
//! planner's. So a forecast that is not in use changes nothing, and one in use costs at most
//! replicas ordered one lead time early.

use tidegate_api::{ForecastMode, InferencePoolSpec};

use super::forecast::Standing;
use super::replicas::TOLERANCE;
use super::trend::{Fall, Rise};
use super::{Basis, MeasuredPlan, Millis, PlanState};

/// The horizon of the reported peak.
const NEXT_HOUR_MS: u64 = 3_600_000;

/// The forecast's standing and figures this tick.
#[derive(Clone, Debug, PartialEq)]
pub struct ForecastPlan {
    pub standing: Standing,
    /// Its standing were the pool's `scaling.forecast` Auto (what Off would give up).
    pub with_auto: Standing,
    /// The lead time planned with, and whether it was measured (else half the grace period).
    pub lead_time_ms: u64,
    pub lead_time_measured: bool,
    /// Recent relative error of its predictions one lead time ahead.
    pub recent_error: Option<f64>,
    /// Replicas the forecast's peak over the next hour needs at the target (None while the
    /// profile does not cover the hour).
    pub next_hour_peak_replicas: Option<i32>,
    /// Replicas the forecast's peak over the lead time needs: Some only when in use.
    pub ahead_replicas: Option<i32>,
    /// The same at the scale-down rule's occupancy (the target less its tolerance): the pool
    /// is not scaled under it while the forecast is in use.
    pub ahead_floor: Option<i32>,
    /// That peak, steps/s.
    pub ahead_steps_per_second: Option<f64>,
    /// The demand's rising trend one lead time (and half the rate window) ahead, when
    /// the forecast is enabled and the rise exceeds the scale-down band.
    pub trend: Option<Rise>,
    /// Replicas that trend needs at the target.
    pub trend_replicas: Option<i32>,
    /// The demand's fall over the last minutes, when the forecast is enabled: the
    /// scale-down window shortens while it lasts.
    pub falling: Option<Fall>,
    /// The persisted profile (see `Forecaster::history`).
    pub history: String,
}

/// Feeds this tick's demand to the forecaster and reports what it forecasts.
pub fn forecast(
    spec: &InferencePoolSpec,
    m: &MeasuredPlan,
    state: &mut PlanState,
    now: Millis,
) -> ForecastPlan {
    let grace = spec.engine.startup_grace_period.as_std().as_millis() as u64;
    let lead = state.lead_time.estimate_ms(grace);
    let lambda = m.demand.steps_per_second(false);
    state.trend.observe(now, lambda);
    let f = &mut state.forecast;
    f.observe(now, lambda, lead);
    let enabled = spec.scaling.forecast == ForecastMode::Auto;
    let standing = f.standing(now, lead, enabled);
    let target = spec.slo.target_utilization * m.pod.sessions;
    let replicas_at = |steps: f64, k: f64| {
        let k = k.max(1e-6);
        let n = steps * m.pod.line.itl(k) / k;
        if n.is_finite() {
            n.ceil() as i32
        } else {
            i32::MAX
        }
    };
    let replicas = |steps: f64| replicas_at(steps, target);
    let ahead = (standing == Standing::InUse)
        .then(|| f.peak(now, lead))
        .flatten();
    // Ordering early pays only when the demand grows within the lead time by more than the
    // scale-down band: slower growth is what the target's headroom is for, and ordering for
    // it early only holds pods longer.
    let steep = match (ahead, f.peak(now, 0)) {
        (Some(peak), Some(here)) => peak > here * (1.0 + TOLERANCE),
        _ => false,
    };
    // The measured rates lag the demand by about half their window: look that much further.
    let lag = spec.scaling.metrics.rate_window.as_std().as_millis() as u64 / 2;
    // The profile, while in use, sees the day's rises coming; the trend is for what it does
    // not see (its first day, a day that does not repeat).
    let trend = (enabled && standing != Standing::InUse)
        .then(|| state.trend.rising(now, lead + lag))
        .flatten()
        .filter(|r| r.ahead > r.now * (1.0 + TOLERANCE));
    ForecastPlan {
        falling: enabled.then(|| state.trend.falling(now)).flatten(),
        trend,
        trend_replicas: trend.map(|r| replicas(r.ahead)),
        standing,
        with_auto: f.standing(now, lead, true),
        lead_time_ms: lead,
        lead_time_measured: state.lead_time.measured(),
        recent_error: f.recent_error(),
        next_hour_peak_replicas: f.peak(now, NEXT_HOUR_MS).map(replicas),
        ahead_replicas: ahead.filter(|_| steep).map(replicas),
        ahead_floor: ahead.map(|s| replicas_at(s, target * (1.0 - TOLERANCE))),
        ahead_steps_per_second: ahead,
        history: f.history(),
    }
}

/// The reactive requirement raised to the forecast's (or the rising trend's), when that is
/// higher; a scale-down stops where the forecast, with the scale-down rule's tolerance, needs
/// the replicas.
pub fn raise(fp: &ForecastPlan, raw: i32, current: i32, why: String) -> (i32, Basis, String) {
    let lead = tidegate_api::Duration::from_millis(fp.lead_time_ms);
    let floor = fp.ahead_floor.unwrap_or(0).min(current);
    let early = |n: &i32| *n > raw && *n > current;
    if let Some(n) = fp.ahead_replicas.filter(early) {
        let why = format!(
            "{why}; early for the forecast: {:.0} steps/s within the {lead} lead time need {n} (error {:.0}%)",
            fp.ahead_steps_per_second.unwrap_or_default(),
            fp.recent_error.unwrap_or_default() * 100.0,
        );
        return (n, Basis::Forecast, why);
    }
    if let (Some(n), Some(r)) = (fp.trend_replicas.filter(early), fp.trend) {
        let why = format!(
            "{why}; early for the rising demand: {:.0} steps/s now, +{:.0}/min, {:.0} within the {lead} lead time need {n}",
            r.now, r.per_minute, r.ahead,
        );
        return (n, Basis::Trend, why);
    }
    if floor > raw {
        let why =
            format!("{why}; held at {floor}: the forecast within the {lead} lead time needs them");
        return (floor, Basis::ForecastHold, why);
    }
    (raw, Basis::Demand, why)
}

/// Records this tick's replicas and any scale-up it ordered, for the lead time.
pub fn observe_lead_time(
    spec: &InferencePoolSpec,
    state: &mut PlanState,
    now: Millis,
    current: i32,
    ready: i32,
    ordered: Option<i32>,
) {
    let grace = spec.engine.startup_grace_period.as_std().as_millis() as u64;
    state.lead_time.observe(now, current, ready, ordered, grace);
}
