//! The metrics pipeline as the operator sees it in a cluster: Prometheus scrapes every pod's
//! counters and gauges every `scrape_interval`; a query at time t sees only samples already
//! scraped, takes rates over `rate_window` (increase between the first and last sample in
//! the window, without Prometheus' extrapolation), averages the running/waiting gauges over
//! the same window (avg_over_time: an instant gauge of a large pool is noisy, ~5%) and
//! computes the queue-wait p99 with
//! `histogram_quantile`'s linear interpolation over the engine's histogram buckets.
//!
//! Invariants: waits are observed into the metrics contract's queue-wait buckets and the p99
//! is the contract's `histogram_quantile`, so the simulated planner reads the p99 a real
//! pool's Prometheus would give for the same waits; a query never sees the future (only samples with t ≤ now); fewer than two
//! samples in the window means no data; an outage window makes every query fail, as an
//! unreachable Prometheus would.

use std::collections::VecDeque;

use tidegate_api::engine_metrics::QUEUE_WAIT_BUCKETS;
use tidegate_api::exposition::{cumulative_from_counts, histogram_quantile};

use crate::plan::{MetricsProblem, PoolMetrics, StepSample};

use super::pool::{PodSample, PodState, Pool};

/// Buckets of the queue-wait histogram: the contract's bounds and +Inf.
const NB: usize = QUEUE_WAIT_BUCKETS.len() + 1;

#[derive(Clone, Debug)]
struct Sample {
    t_us: u64,
    tokens: f64,
    /// Waits observed so far, per bucket (made cumulative across buckets at query time).
    hist: [u64; NB],
    overload: u64,
    evictions: u64,
    finished: u64,
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
    /// Requests that finished decoding.
    pub finished_total: u64,
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
            finished_total: 0,
        }
    }

    /// The engine observes a queue wait (every request that starts decoding).
    pub fn observe_wait(&mut self, wait_s: f64) {
        // `le` buckets: a wait equal to a bound counts in that bound's bucket.
        let i = QUEUE_WAIT_BUCKETS
            .iter()
            .position(|&b| wait_s <= b)
            .unwrap_or(QUEUE_WAIT_BUCKETS.len());
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
            let (tokens, itl_sum) = (pool.pod_tokens(i), pool.pod_itl_sum(i));
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
                itl_sum,
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
            finished: self.finished_total,
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
        let step_samples = pool
            .pods
            .iter()
            .filter(|p| p.state == PodState::Ready)
            .filter_map(|p| step_sample(&p.samples, f.t_us, now))
            .collect();
        Ok(PoolMetrics {
            decode_tokens_per_second: (l.tokens - f.tokens) / dt,
            step_samples,
            running: self.avg_over_window(now, f.t_us, |s| s.running),
            waiting: self.avg_over_window(now, f.t_us, |s| s.waiting),
            queue_wait_p99_seconds: histogram_quantile(
                0.99,
                &cumulative_from_counts(QUEUE_WAIT_BUCKETS, &delta),
            ),
            kv_utilization: l.kv,
            evictions_per_second: (l.evictions - f.evictions) as f64 / dt,
            overload_refusals_per_second: (l.overload - f.overload) as f64 / dt,
            requests_finished_per_second: (l.finished - f.finished) as f64 / dt,
            waiting_growth_per_second: (l.waiting - f.waiting) / dt,
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
            .filter_map(|p| pod_rate(&p.samples, f.t_us, now))
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

/// A pod's decode rate over the window.
fn pod_rate(s: &VecDeque<PodSample>, from: u64, now: u64) -> Option<f64> {
    let mut it = s.iter().filter(|x| x.t_us >= from && x.t_us <= now);
    let first = it.next()?;
    let last = it.next_back()?;
    (last.t_us > first.t_us)
        .then(|| (last.tokens - first.tokens) / ((last.t_us - first.t_us) as f64 / 1e6))
}

/// A pod's point for the pod model, as the operator's queries compute it: mean running over
/// the window, and rate(itl_sum) ÷ rate(itl_count), None when it made no token.
fn step_sample(s: &VecDeque<PodSample>, from: u64, now: u64) -> Option<StepSample> {
    let window: Vec<&PodSample> = s
        .iter()
        .filter(|x| x.t_us >= from && x.t_us <= now)
        .collect();
    let (first, last) = (window.first()?, window.last()?);
    let tokens = last.tokens - first.tokens;
    if tokens <= 0.0 {
        return None;
    }
    let running = window.iter().map(|x| f64::from(x.running)).sum::<f64>() / window.len() as f64;
    Some(StepSample {
        batch: running,
        itl_seconds: (last.itl_sum - first.itl_sum) / tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::pool::PodModel;
    use tidegate_api::engine_metrics::QUEUE_WAIT_SECONDS;
    use tidegate_api::exposition::{cumulative_from_counts, histogram_quantile as engine_p};

    /// The p99 the simulated operator reads for `waits`, observed between two scrapes.
    fn simulated_p99(waits: &[f64]) -> Option<f64> {
        let mut pool = Pool::new(PodModel {
            max_batch: 16,
            max_queue: 64,
            itl_base_s: 0.02,
            itl_per_seq_s: 0.001_875,
            prefill_cost: 0.02,
        });
        pool.add_ready(0);
        let mut p = Pipeline::new(15_000_000, 60_000_000, None);
        p.scrape(&mut pool, 0);
        for w in waits {
            p.observe_wait(*w);
        }
        p.scrape(&mut pool, 15_000_000);
        p.query(&pool, 15_000_000)
            .expect("two samples")
            .queue_wait_p99_seconds
    }

    /// What a real pool's Prometheus gives for the same waits: the engine's histogram.
    fn engine_p99(waits: &[f64]) -> Option<f64> {
        let bounds = QUEUE_WAIT_SECONDS.buckets;
        let mut counts = vec![0u64; bounds.len() + 1];
        for w in waits {
            counts[bounds.iter().position(|b| w <= b).unwrap_or(bounds.len())] += 1;
        }
        engine_p(0.99, &cumulative_from_counts(bounds, &counts))
    }

    #[test]
    fn the_simulated_p99_is_the_engine_histogram_s() {
        // Waits just over the 1 s target, and spread over the range the targets lie in.
        let just_over = vec![1.2; 100];
        let spread: Vec<f64> = (0..1000).map(|i| f64::from(i) * 0.009).collect();
        for waits in [just_over, spread] {
            let (sim, engine) = (simulated_p99(&waits), engine_p99(&waits));
            let (sim, engine) = (sim.expect("observed"), engine.expect("observed"));
            assert!(
                (sim - engine).abs() < 1e-9,
                "simulated p99 {sim} but the engine's histogram gives {engine}"
            );
        }
    }
}
