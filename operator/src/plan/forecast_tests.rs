use super::*;

const TICK: Millis = 15_000;
const LEAD: u64 = 5 * 60_000;
/// Midnight UTC, some day.
const DAY0: Millis = 1_700_006_400_000 - 1_700_006_400_000 % DAY_MS;

/// A tidal day: demand peaks mid-afternoon at 1.6× its mean, bottoms out before dawn.
fn tide(t: Millis, scale: f64) -> f64 {
    let phase = ((t % DAY_MS) as f64 / DAY_MS as f64 - 15.0 / 24.0) * std::f64::consts::TAU;
    scale * 100.0 * (1.0 + 0.6 * phase.cos())
}

/// Feeds `f` from `from` to `to` with `demand(t)`.
fn feed(f: &mut Forecaster, from: Millis, to: Millis, demand: impl Fn(Millis) -> f64) {
    let mut t = from;
    while t < to {
        f.observe(t, demand(t), LEAD);
        t += TICK;
    }
}

fn learned_day() -> Forecaster {
    let mut f = Forecaster::default();
    feed(&mut f, DAY0, DAY0 + DAY_MS, |t| tide(t, 1.0));
    f
}

#[test]
fn a_day_learns_the_profile_and_the_next_day_is_forecast() {
    let mut f = learned_day();
    let day1 = DAY0 + DAY_MS;
    assert_eq!(
        f.standing(day1, LEAD, true),
        Standing::Learning,
        "no level yet today"
    );
    feed(&mut f, day1, day1 + 9 * 3_600_000, |t| tide(t, 1.0));
    let now = day1 + 9 * 3_600_000;
    assert_eq!(f.standing(now, LEAD, true), Standing::InUse);
    assert!(
        f.recent_error().expect("scored") < 0.02,
        "{:?}",
        f.recent_error()
    );
    // The morning rise: the peak over the lead time is the demand one lead time ahead.
    let peak = f.peak(now, LEAD).expect("covered");
    let want = tide(now + LEAD, 1.0);
    assert!((peak - want).abs() / want < 0.02, "{peak} vs {want}");
    assert!(peak > tide(now, 1.0), "rising: ahead of the demand now");
    assert_eq!(f.standing(now, LEAD, false), Standing::Off);
}

#[test]
fn a_holiday_at_half_the_load_is_forecast_at_half_the_tide() {
    let mut f = learned_day();
    let day1 = DAY0 + DAY_MS;
    feed(&mut f, day1, day1 + 10 * 3_600_000, |t| tide(t, 0.5));
    let now = day1 + 10 * 3_600_000;
    let peak = f.peak(now, LEAD).expect("covered");
    let want = tide(now + LEAD, 0.5);
    assert!((peak - want).abs() / want < 0.05, "{peak} vs {want}");
    assert_eq!(f.standing(now, LEAD, true), Standing::InUse);
}

#[test]
fn a_day_that_does_not_repeat_falls_back_to_the_demand_now() {
    let mut f = learned_day();
    let day1 = DAY0 + DAY_MS;
    // The tide turned upside down: busy at night, quiet in the afternoon.
    feed(&mut f, day1, day1 + 12 * 3_600_000, |t| {
        tide(t + DAY_MS / 2, 1.0)
    });
    assert_eq!(
        f.standing(day1 + 12 * 3_600_000, LEAD, true),
        Standing::Inaccurate,
        "error {:?}",
        f.recent_error()
    );
}

#[test]
fn a_burst_on_one_day_is_not_forecast_for_the_next() {
    let mut f = Forecaster::default();
    let burst = DAY0 + 14 * 3_600_000..DAY0 + 14 * 3_600_000 + BUCKET_MS;
    feed(&mut f, DAY0, DAY0 + DAY_MS, |t| {
        tide(t, 1.0) * if burst.contains(&t) { 1.5 } else { 1.0 }
    });
    let day1 = DAY0 + DAY_MS;
    feed(&mut f, day1, day1 + 13 * 3_600_000, |t| tide(t, 1.0));
    let at = day1 + 14 * 3_600_000 + BUCKET_MS / 2;
    let peak = f
        .peak(day1 + 13 * 3_600_000, 2 * 3_600_000)
        .expect("covered");
    assert!(peak < 1.05 * tide(at, 1.0), "{peak} vs {}", tide(at, 1.0));
}

#[test]
fn after_a_long_burst_today_the_forecast_follows_the_demand_back_down() {
    const HOUR: u64 = 3_600_000;
    let mut f = learned_day();
    let day1 = DAY0 + DAY_MS;
    // 70 minutes at 1.3×: most of the level's two hours were the burst.
    let burst = day1 + 12 * HOUR..day1 + 12 * HOUR + 70 * 60_000;
    let now = burst.end + 10 * 60_000;
    feed(&mut f, day1, now, |t| {
        tide(t, 1.0) * if burst.contains(&t) { 1.3 } else { 1.0 }
    });
    assert!(f.level().expect("level") > 1.1, "the burst is in the level");
    // The burst is over: the forecast starts from the demand now, not from the level.
    let peak = f.peak(now, LEAD).expect("covered");
    let want = tide(now + LEAD, 1.0);
    assert!(peak < 1.03 * want, "{peak} vs {want}");
    assert_eq!(f.standing(now, LEAD, true), Standing::InUse);
}

#[test]
fn the_history_survives_a_restart_and_garbage_restores_nothing() {
    let f = learned_day();
    let text = f.history();
    assert!(text.starts_with("v1 15m "), "{text}");
    assert!(text.len() < 1024, "bounded: {} bytes", text.len());
    let back = Forecaster::restored(&text, Some(0.03), DAY0 + DAY_MS);
    assert_eq!(back.history(), text);
    assert_eq!(back.recent_error(), Some(0.03));
    for bad in ["", "v2 15m 1,2", "v1 15m 1,2,3", "v1 15m x"] {
        let b = Forecaster::restored(bad, Some(0.03), 0);
        assert_eq!(b, Forecaster::default(), "{bad:?}");
    }
    let negative = text.replacen(",", ",-5,", 1);
    assert_eq!(
        Forecaster::restored(&negative, None, 0),
        Forecaster::default()
    );
}

#[test]
fn figures_stay_finite_on_bad_input() {
    let mut f = learned_day();
    for (i, x) in [f64::NAN, f64::INFINITY, -3.0, 0.0].into_iter().enumerate() {
        f.observe(DAY0 + DAY_MS + i as u64 * TICK, x, LEAD);
    }
    feed(
        &mut f,
        DAY0 + DAY_MS + 60_000,
        DAY0 + DAY_MS + 3_600_000,
        |_| 0.0,
    );
    if let Some(p) = f.peak(DAY0 + DAY_MS + 3_600_000, LEAD) {
        assert!(p.is_finite() && p >= 0.0);
    }
    assert!(f.recent_error().is_none_or(f64::is_finite));
}

#[test]
fn three_significant_figures() {
    assert_eq!(sig3(12.345), "12.3");
    assert_eq!(sig3(0.012345), "0.0123");
    assert_eq!(sig3(1234.6), "1235");
    assert_eq!(sig3(0.0), "0");
    assert_eq!(sig3(2.0), "2");
}
