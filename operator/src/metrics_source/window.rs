//! Pool metrics over a rate window from engines' own scrapes: the quantities the Prometheus
//! queries compute in a cluster (`rate(…[w])`, `avg_over_time(…[w])`, `max_over_time(…[w])`,
//! `histogram_quantile(0.99, sum by (le) (rate(…[w])))`), for local mode's direct scrapes.
//! Rates run from the baseline sample to the newest, without Prometheus' extrapolation to the
//! window's edges, and gauge averages weigh every read alike.
//!
//! Invariants: each engine's history is ordered by time and holds the samples inside the
//! window plus at most one older sample, the baseline its rates are taken from (so an
//! interval longer than the window still yields rates, from one scrape to the next); a
//! counter that went down (engine restart), a clock that went back or a gap longer than the
//! caller allows discards the engine's older samples, so no rate is negative or taken over a
//! stale baseline and the next read starts afresh; gauges are averaged over the samples
//! inside the window, the newest always included.

use std::collections::{BTreeMap, VecDeque};

use tidegate_api::exposition::{bucket_deltas, histogram_quantile};

use crate::plan::{PoolMetrics, StepSample};

/// The figures of one scrape of one engine that rates are computed from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineSample {
    pub at_ms: u64,
    pub decode_tokens: f64,
    pub running: f64,
    pub waiting: f64,
    pub kv_used: f64,
    pub kv_total: f64,
    pub evictions: f64,
    pub overload_refusals: f64,
    /// Requests that finished (completed, cancelled or failed).
    pub finished: f64,
    /// Inter-token latency histogram's sum (seconds) and count (tokens), all tiers summed.
    pub itl_sum: f64,
    pub itl_count: f64,
    /// Cumulative queue-wait histogram: (upper bound seconds, count), all tiers summed.
    pub queue_wait_buckets: Vec<(f64, f64)>,
}

/// The samples of one engine that the window needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineHistory {
    samples: VecDeque<EngineSample>,
}

impl EngineHistory {
    /// Adds the newest sample and forgets what the window no longer needs. The older samples
    /// are discarded when they cannot serve as a baseline: a counter went down (the engine
    /// restarted), the clock went back, or the last one is more than `max_gap_ms` old (the
    /// engine was not read for a while; Prometheus would give no rate over such a gap either).
    pub fn push(&mut self, s: EngineSample, window_ms: u64, max_gap_ms: u64) {
        let unusable = self.samples.back().is_some_and(|p| {
            s.decode_tokens < p.decode_tokens
                || s.evictions < p.evictions
                || s.overload_refusals < p.overload_refusals
                || s.finished < p.finished
                || s.itl_count < p.itl_count
                || waits_observed(&s) < waits_observed(p)
                || s.at_ms < p.at_ms
                || s.at_ms - p.at_ms > max_gap_ms
        });
        if unusable {
            self.samples.clear();
        }
        let start = s.at_ms.saturating_sub(window_ms);
        self.samples.push_back(s);
        // Keep one sample at or before the window's start, as the rates' baseline.
        while self.samples.get(1).is_some_and(|next| next.at_ms <= start) {
            self.samples.pop_front();
        }
    }

    /// When the newest sample was taken.
    pub fn newest_at(&self) -> Option<u64> {
        self.newest().map(|s| s.at_ms)
    }

    fn newest(&self) -> Option<&EngineSample> {
        self.samples.back()
    }

    /// The oldest sample and the newest, when they are distinct in time.
    fn span(&self) -> Option<(&EngineSample, &EngineSample, f64)> {
        let (first, last) = (self.samples.front()?, self.samples.back()?);
        let dt = last.at_ms.saturating_sub(first.at_ms) as f64 / 1000.0;
        (dt > 0.0).then_some((first, last, dt))
    }

    /// Samples inside the window (the baseline excluded unless it is the only one).
    fn in_window(&self, window_ms: u64) -> impl Iterator<Item = &EngineSample> {
        let start = self
            .newest()
            .map_or(0, |s| s.at_ms.saturating_sub(window_ms));
        let n = self.samples.len();
        self.samples
            .iter()
            .enumerate()
            .filter(move |(i, s)| s.at_ms > start || *i + 1 == n)
            .map(|(_, s)| s)
    }
}

/// Queue waits observed so far (the histogram's +Inf bucket).
fn waits_observed(s: &EngineSample) -> f64 {
    s.queue_wait_buckets.last().map_or(0.0, |(_, c)| *c)
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / f64::from(n) }
}

/// Pool metrics from the histories of the engines that answered this read.
pub fn pool_metrics<'a>(
    engines: impl IntoIterator<Item = &'a EngineHistory>,
    window_ms: u64,
    now_ms: u64,
) -> PoolMetrics {
    let mut m = PoolMetrics {
        sampled_at: now_ms,
        ..PoolMetrics::default()
    };
    let (mut kv_used, mut kv_total) = (0.0, 0.0);
    let mut waits: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for h in engines {
        let Some(newest) = h.newest() else { continue };
        m.pods_reporting += 1;
        m.running += mean(h.in_window(window_ms).map(|s| s.running));
        m.waiting += mean(h.in_window(window_ms).map(|s| s.waiting));
        kv_used += newest.kv_used;
        kv_total += newest.kv_total;
        let Some((first, last, dt)) = h.span() else {
            continue;
        };
        m.decode_tokens_per_second += (last.decode_tokens - first.decode_tokens) / dt;
        m.evictions_per_second += (last.evictions - first.evictions) / dt;
        m.overload_refusals_per_second += (last.overload_refusals - first.overload_refusals) / dt;
        m.requests_finished_per_second += (last.finished - first.finished) / dt;
        // deriv() in PromQL: the queue's change from the baseline to the newest read.
        m.waiting_growth_per_second += (last.waiting - first.waiting) / dt;
        let tokens = last.itl_count - first.itl_count;
        if tokens > 0.0 {
            m.step_samples.push(StepSample {
                batch: mean(h.in_window(window_ms).map(|s| s.running)),
                itl_seconds: (last.itl_sum - first.itl_sum) / tokens,
            });
        }
        for (le, count) in bucket_deltas(&first.queue_wait_buckets, &last.queue_wait_buckets) {
            // Equal bounds of different engines meet under the same key.
            waits.entry(le.to_bits()).or_insert((le, 0.0)).1 += count;
        }
    }
    m.kv_utilization = if kv_total > 0.0 {
        kv_used / kv_total
    } else {
        0.0
    };
    // Keyed by the bound's bits: for the non-negative bounds of a histogram, their order is
    // the bounds' order.
    let summed: Vec<(f64, f64)> = waits.into_values().collect();
    m.queue_wait_p99_seconds = histogram_quantile(0.99, &summed);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Longer than any gap in these tests but the last one.
    const GAP: u64 = 60_000;

    fn sample(at_s: u64, tokens: f64, running: f64, waiting: f64) -> EngineSample {
        EngineSample {
            at_ms: at_s * 1000,
            decode_tokens: tokens,
            running,
            waiting,
            kv_used: 10.0,
            kv_total: 100.0,
            ..EngineSample::default()
        }
    }

    fn history(window_ms: u64, samples: &[EngineSample]) -> EngineHistory {
        let mut h = EngineHistory::default();
        for s in samples {
            h.push(s.clone(), window_ms, GAP);
        }
        h
    }

    #[test]
    fn rates_span_the_window_and_gauges_are_averaged_over_it() {
        // Scrapes every 2 s, window 10 s: the baseline is the sample at 10 s for now = 20 s.
        let samples: Vec<EngineSample> = (0..=10)
            .map(|i| sample(2 * i, 100.0 * (2 * i) as f64, f64::from(i as u32), 0.0))
            .collect();
        let h = history(10_000, &samples);
        let m = pool_metrics([&h], 10_000, 20_000);
        assert_eq!(m.pods_reporting, 1);
        assert!((m.decode_tokens_per_second - 100.0).abs() < 1e-9, "{m:?}");
        // running was 6, 7, 8, 9, 10 at 12 … 20 s (the baseline at 10 s is outside).
        assert!((m.running - 8.0).abs() < 1e-9, "{m:?}");
        // No inter-token latency observed: no point for the pod model.
        assert!(m.step_samples.is_empty());
        assert!((m.kv_utilization - 0.1).abs() < 1e-9);
    }

    #[test]
    fn one_blip_does_not_move_the_average_much() {
        let mut samples: Vec<EngineSample> =
            (0..=5).map(|i| sample(2 * i, 0.0, 4.0, 0.0)).collect();
        samples.push(sample(12, 0.0, 24.0, 3.0));
        let h = history(10_000, &samples);
        let m = pool_metrics([&h], 10_000, 12_000);
        // 4, 4, 4, 4, 24 over the window: 8, where one scrape alone said 24.
        assert!((m.running - 8.0).abs() < 1e-9, "{m:?}");
        // The queue grew by 3 from the baseline (2 s) to the newest read (12 s).
        assert!((m.waiting_growth_per_second - 0.3).abs() < 1e-9, "{m:?}");
    }

    #[test]
    fn each_engine_gives_the_pod_model_its_occupancy_and_mean_itl() {
        let mut a = sample(0, 0.0, 6.0, 0.0);
        (a.itl_sum, a.itl_count, a.finished) = (10.0, 400.0, 5.0);
        let mut b = sample(10, 0.0, 10.0, 0.0);
        (b.itl_sum, b.itl_count, b.finished) = (14.0, 500.0, 25.0);
        let h = history(10_000, &[a, b]);
        let m = pool_metrics([&h], 10_000, 10_000);
        // 4 s of latency over 100 tokens; running 10 in the window (the baseline is out).
        assert_eq!(m.step_samples.len(), 1);
        assert!(
            (m.step_samples[0].itl_seconds - 0.04).abs() < 1e-12,
            "{m:?}"
        );
        assert!((m.step_samples[0].batch - 10.0).abs() < 1e-12);
        assert!((m.requests_finished_per_second - 2.0).abs() < 1e-12);
    }

    #[test]
    fn an_interval_longer_than_the_window_still_yields_rates() {
        let h = history(
            5_000,
            &[sample(0, 0.0, 1.0, 0.0), sample(15, 300.0, 1.0, 0.0)],
        );
        let m = pool_metrics([&h], 5_000, 15_000);
        assert!((m.decode_tokens_per_second - 20.0).abs() < 1e-9, "{m:?}");
    }

    #[test]
    fn a_restarted_engine_gives_no_rate_until_its_next_scrape() {
        let mut h = history(
            10_000,
            &[sample(0, 5000.0, 1.0, 0.0), sample(2, 5200.0, 1.0, 0.0)],
        );
        h.push(sample(4, 30.0, 1.0, 0.0), 10_000, GAP);
        let m = pool_metrics([&h], 10_000, 4_000);
        assert_eq!(m.decode_tokens_per_second, 0.0, "{m:?}");
        assert_eq!(m.pods_reporting, 1);
        h.push(sample(6, 130.0, 1.0, 0.0), 10_000, GAP);
        let m = pool_metrics([&h], 10_000, 6_000);
        assert!((m.decode_tokens_per_second - 50.0).abs() < 1e-9, "{m:?}");
    }

    #[test]
    fn queue_wait_p99_is_taken_over_the_pool_s_summed_buckets() {
        let buckets = |fast: f64, slow: f64| {
            vec![
                (0.1, fast),
                (1.0, fast + slow),
                (f64::INFINITY, fast + slow),
            ]
        };
        let mut a0 = sample(0, 0.0, 1.0, 0.0);
        a0.queue_wait_buckets = buckets(0.0, 0.0);
        let mut a1 = sample(2, 0.0, 1.0, 0.0);
        a1.queue_wait_buckets = buckets(1000.0, 0.0);
        let mut b0 = a0.clone();
        b0.queue_wait_buckets = buckets(0.0, 0.0);
        let mut b1 = a1.clone();
        b1.queue_wait_buckets = buckets(0.0, 5.0);
        let (a, b) = (history(10_000, &[a0, a1]), history(10_000, &[b0, b1]));
        let m = pool_metrics([&a, &b], 10_000, 2_000);
        // 1005 waits, 5 of them slow: the pool's p99 is in the fast bucket.
        let p99 = m.queue_wait_p99_seconds.expect("observed");
        assert!(p99 <= 0.1, "{p99}");
        // With no waits observed there is no p99.
        let idle = history(
            10_000,
            &[sample(0, 0.0, 0.0, 0.0), sample(2, 0.0, 0.0, 0.0)],
        );
        assert_eq!(
            pool_metrics([&idle], 10_000, 2_000).queue_wait_p99_seconds,
            None
        );
    }

    #[test]
    fn a_baseline_older_than_the_gap_or_from_a_clock_gone_back_is_dropped() {
        let mut h = history(
            10_000,
            &[sample(0, 0.0, 1.0, 0.0), sample(2, 100.0, 1.0, 0.0)],
        );
        // Not read for an hour: no rate over the hour, a fresh start.
        h.push(sample(3_600, 900.0, 1.0, 0.0), 10_000, GAP);
        assert_eq!(
            pool_metrics([&h], 10_000, 3_600_000).decode_tokens_per_second,
            0.0
        );
        h.push(sample(3_602, 1_000.0, 1.0, 0.0), 10_000, GAP);
        assert_eq!(
            pool_metrics([&h], 10_000, 3_602_000).decode_tokens_per_second,
            50.0
        );
        // The clock went back a minute.
        h.push(sample(3_542, 1_100.0, 1.0, 0.0), 10_000, GAP);
        assert_eq!(
            pool_metrics([&h], 10_000, 3_542_000).decode_tokens_per_second,
            0.0
        );
    }

    #[test]
    fn fewer_queue_waits_observed_than_before_means_a_restart() {
        let mut a = sample(0, 0.0, 1.0, 0.0);
        a.queue_wait_buckets = vec![(1.0, 50.0), (f64::INFINITY, 50.0)];
        let mut b = sample(2, 0.0, 1.0, 0.0);
        b.queue_wait_buckets = vec![(1.0, 3.0), (f64::INFINITY, 4.0)];
        let h = history(10_000, &[a, b]);
        // Only the new process's sample is left: nothing to take a rate or a p99 from.
        let m = pool_metrics([&h], 10_000, 2_000);
        assert_eq!(m.queue_wait_p99_seconds, None, "{m:?}");
    }
}
