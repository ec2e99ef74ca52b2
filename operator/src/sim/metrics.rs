//! The metrics pipeline as the operator sees it in a cluster: Prometheus scrapes every pod's
//! counters and gauges every `scrape_interval`; a query at time t sees only samples already
//! scraped, takes rates over `rate_window` (increase between the first and last sample in
//! the window, without Prometheus' extrapolation), averages the running/waiting gauges over
//! the same window (avg_over_time: an instant gauge of a large pool is noisy, ~5%) and
//! computes the queue-wait p99 with
//! `histogram_quantile`'s linear interpolation over the engine's histogram buckets.
//!
//! Invariants: a query never sees the future (only samples with t ≤ now); fewer than two
//! samples in the window means no data; an outage window makes every query fail, as an
//! unreachable Prometheus would.

use std::collections::VecDeque;

use crate::plan::{MetricsProblem, PoolMetrics};

use super::pool::{PodSample, PodState, Pool};

/// Upper bounds (seconds) of the engine's queue-wait histogram buckets; +Inf is implied.
pub const WAIT_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
const NB: usize = WAIT_BUCKETS.len() + 1;

#[derive(Clone, Debug)]
struct Sample {
    t_us: u64,
    tokens: f64,
    /// Cumulative (non-cumulative per bucket here; summed at query time).
    hist: [u64; NB],
    overload: u64,
    evictions: u64,
    running: f64,
    waiting: f64,
    kv: f64,
    pods: i32,
}

#[derive(Debug)]
pub struct Pipeline {
    pub scrape_interval_us: u64,
    pub rate_window_us: u64,
    /// Prometheus unreachable in [start, end) (microseconds).
    pub outage: Option<(u64, u64)>,
    samples: VecDeque<Sample>,
    hist: [u64; NB],
    pub overload_total: u64,
    pub evictions_total: u64,
}

impl Pipeline {
    pub fn new(scrape_interval_us: u64, rate_window_us: u64, outage: Option<(u64, u64)>) -> Self {
        Pipeline {
            scrape_interval_us,
            rate_window_us,
            outage,
            samples: VecDeque::new(),
            hist: [0; NB],
            overload_total: 0,
            evictions_total: 0,
        }
    }

    /// The engine observes a queue wait (every request that starts decoding).
    pub fn observe_wait(&mut self, wait_s: f64) {
        let i = WAIT_BUCKETS
            .iter()
            .position(|&b| wait_s <= b)
            .unwrap_or(WAIT_BUCKETS.len());
        self.hist[i] += 1;
    }

    fn keep_pod_samples(&self) -> usize {
        (self.rate_window_us / self.scrape_interval_us.max(1)) as usize + 2
    }

    /// One scrape of every ready pod.
    pub fn scrape(&mut self, pool: &mut Pool, now: u64) {
        pool.advance_all(now);
        let keep = self.keep_pod_samples();
        let (mut running, mut waiting, mut pods) = (0.0, 0.0, 0);
        for i in 0..pool.pods.len() {
            let tokens = pool.pod_tokens(i);
            let pod = &mut pool.pods[i];
            if pod.state != PodState::Ready {
                pod.samples.clear();
                continue;
            }
            pods += 1;
            running += f64::from(pod.running());
            waiting += f64::from(pod.queued());
            let s = PodSample {
                t_us: now,
                tokens,
                waiting: pod.queued(),
                running: pod.running(),
            };
            pod.samples.push_back(s);
            while pod.samples.len() > keep {
                pod.samples.pop_front();
            }
        }
        let kv = if pods > 0 {
            running / (f64::from(pods) * f64::from(pool.model.max_batch))
        } else {
            0.0
        };
        self.samples.push_back(Sample {
            t_us: now,
            tokens: pool.tokens_total,
            hist: self.hist,
            overload: self.overload_total,
            evictions: self.evictions_total,
            running,
            waiting,
            kv,
            pods,
        });
        while self
            .samples
            .front()
            .is_some_and(|s| now.saturating_sub(s.t_us) > 2 * self.rate_window_us)
        {
            self.samples.pop_front();
        }
    }

    fn reachable(&self, now: u64) -> Result<(), MetricsProblem> {
        match self.outage {
            Some((a, b)) if (a..b).contains(&now) => Err(MetricsProblem::Unreachable(
                "simulated Prometheus outage".to_string(),
            )),
            _ => Ok(()),
        }
    }

    fn window(&self, now: u64) -> Result<(&Sample, &Sample), MetricsProblem> {
        self.reachable(now)?;
        let from = now.saturating_sub(self.rate_window_us);
        let mut it = self
            .samples
            .iter()
            .filter(|s| s.t_us >= from && s.t_us <= now);
        let first = it.next();
        let last = it.next_back();
        match (first, last) {
            (Some(f), Some(l)) if l.t_us > f.t_us => Ok((f, l)),
            _ => Err(MetricsProblem::NoData(
                "fewer than two samples in the rate window".to_string(),
            )),
        }
    }

    /// What the operator's Prometheus query returns at `now`.
    pub fn query(&self, pool: &Pool, now: u64) -> Result<PoolMetrics, MetricsProblem> {
        let (f, l) = self.window(now)?;
        let dt = (l.t_us - f.t_us) as f64 / 1e6;
        let mut delta = [0u64; NB];
        for (i, d) in delta.iter_mut().enumerate() {
            *d = l.hist[i] - f.hist[i];
        }
        let saturated = pool
            .pods
            .iter()
            .filter(|p| p.state == PodState::Ready)
            .filter_map(|p| pod_rate(&p.samples, f.t_us, now, true))
            .collect();
        Ok(PoolMetrics {
            decode_tokens_per_second: (l.tokens - f.tokens) / dt,
            saturated_pod_tokens_per_second: saturated,
            running: self.avg_over_window(now, f.t_us, |s| s.running),
            waiting: self.avg_over_window(now, f.t_us, |s| s.waiting),
            queue_wait_p99_seconds: histogram_quantile(0.99, &delta),
            kv_utilization: l.kv,
            evictions_per_second: (l.evictions - f.evictions) as f64 / dt,
            overload_refusals_per_second: (l.overload - f.overload) as f64 / dt,
            pods_reporting: l.pods,
            sampled_at: l.t_us / 1000,
        })
    }

    /// avg_over_time of a pool-wide gauge over the samples in the window.
    fn avg_over_window(&self, now: u64, from: u64, g: impl Fn(&Sample) -> f64) -> f64 {
        let (mut sum, mut n) = (0.0, 0.0);
        for s in self
            .samples
            .iter()
            .filter(|s| s.t_us >= from && s.t_us <= now)
        {
            sum += g(s);
            n += 1.0;
        }
        if n > 0.0 { sum / n } else { 0.0 }
    }

    /// Per-pod decode tokens/s over the rate window (HPA's per-pod metric), ready pods only.
    pub fn pod_rates(&self, pool: &Pool, now: u64) -> Result<Vec<f64>, MetricsProblem> {
        let (f, _) = self.window(now)?;
        Ok(pool
            .pods
            .iter()
            .filter(|p| p.state == PodState::Ready)
            .filter_map(|p| pod_rate(&p.samples, f.t_us, now, false))
            .collect())
    }

    /// Per-pod running gauges at the last scrape (batch occupancy), ready pods only.
    pub fn pod_running(&self, pool: &Pool, now: u64) -> Result<Vec<f64>, MetricsProblem> {
        self.window(now)?;
        Ok(pool
            .pods
            .iter()
            .filter(|p| p.state == PodState::Ready)
            .filter_map(|p| p.samples.back().map(|s| f64::from(s.running)))
            .collect())
    }

    /// Pool-wide waiting requests at the last scrape.
    pub fn waiting(&self, now: u64) -> Result<f64, MetricsProblem> {
        let (_, l) = self.window(now)?;
        Ok(l.waiting)
    }
}

/// A pod's decode rate over the window; with `only_saturated`, None unless it had requests
/// waiting at some scrape in the window.
fn pod_rate(s: &VecDeque<PodSample>, from: u64, now: u64, only_saturated: bool) -> Option<f64> {
    let mut it = s.iter().filter(|x| x.t_us >= from && x.t_us <= now);
    let first = it.next()?;
    let mut last = first;
    let mut saturated = first.waiting > 0;
    for x in it {
        saturated |= x.waiting > 0;
        last = x;
    }
    if last.t_us <= first.t_us || (only_saturated && !saturated) {
        return None;
    }
    Some((last.tokens - first.tokens) / ((last.t_us - first.t_us) as f64 / 1e6))
}

/// Prometheus' histogram_quantile over per-bucket counts (the last bucket is +Inf).
pub fn histogram_quantile(q: f64, counts: &[u64; NB]) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut cum = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        let before = cum;
        cum += c;
        if (cum as f64) >= rank && c > 0 {
            if i == WAIT_BUCKETS.len() {
                return Some(WAIT_BUCKETS[WAIT_BUCKETS.len() - 1]);
            }
            let lo = if i == 0 { 0.0 } else { WAIT_BUCKETS[i - 1] };
            let hi = WAIT_BUCKETS[i];
            return Some(lo + (hi - lo) * (rank - before as f64) / c as f64);
        }
    }
    Some(WAIT_BUCKETS[WAIT_BUCKETS.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_interpolates_like_prometheus() {
        let mut c = [0u64; NB];
        c[0] = 98; // ≤ 5 ms
        c[7] = 2; // (0.5, 1]
        let p99 = histogram_quantile(0.99, &c).expect("data");
        assert!((p99 - 0.75).abs() < 1e-9, "{p99}");
        assert_eq!(histogram_quantile(0.99, &[0; NB]), None);
    }
}
