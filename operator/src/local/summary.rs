//! What local mode's summary says about one pool: its peak and path of replica counts
//! (and whether the path reversed), the time to its first scale-up, how long admission was
//! paused, and what its load generator's requests came to.
//!
//! Invariants: the path holds every replica count the pool ran, in order, without repeats;
//! a pause still open at the end counts up to the end.

use std::time::{Duration, Instant};

use tidegate_api::{AdmissionState, InferencePool};

use super::loadgen;
use crate::driver::TickOutcome;

/// What the summary reports about a pool.
#[derive(Default)]
pub struct Summary {
    peak_replicas: i32,
    /// Every replica count the pool ran, in order, without repeats.
    path: Vec<i32>,
    first_scale_up: Option<Duration>,
    paused_since: Option<Instant>,
    paused_total: Duration,
    pauses: u32,
    max_tier_count_paused: usize,
}

impl Summary {
    /// Takes in one tick of the pool.
    pub fn record(&mut self, out: &TickOutcome, pool: &InferencePool, started: Instant) {
        let replicas = out.workload.replicas.unwrap_or(0);
        self.peak_replicas = self.peak_replicas.max(replicas);
        if self.path.last() != Some(&replicas) {
            self.path.push(replicas);
        }
        if replicas > pool.spec.replicas.min && self.first_scale_up.is_none() {
            self.first_scale_up = Some(started.elapsed());
        }
        let paused = out.plan.admission.state == AdmissionState::PausedNewTenants;
        match (paused, self.paused_since) {
            (true, None) => {
                self.paused_since = Some(Instant::now());
                self.pauses += 1;
            }
            (false, Some(since)) => {
                self.paused_total += since.elapsed();
                self.paused_since = None;
            }
            _ => {}
        }
        self.max_tier_count_paused = self
            .max_tier_count_paused
            .max(out.plan.admission.paused_tiers.len());
    }

    /// The summary's lines (the load's, when it ran).
    pub fn lines(&self, tally: Option<&loadgen::Tally>) -> Vec<String> {
        let paused = self.paused_total + self.paused_since.map(|t| t.elapsed()).unwrap_or_default();
        let mut lines = vec![
            format!("peak replicas:           {}", self.peak_replicas),
            format!("replica path:            {}", path_words(&self.path)),
            format!(
                "time to first scale-up:  {}",
                self.first_scale_up
                    .map_or("never".to_string(), |d| format!("{:.0}s", d.as_secs_f64()))
            ),
            format!(
                "admission paused:        {:.0}s in {} pause(s), up to {} tier(s)",
                paused.as_secs_f64(),
                self.pauses,
                self.max_tier_count_paused
            ),
        ];
        if let Some(t) = tally {
            lines.push(format!(
                "requests served:         {} ({} tokens)",
                t.served.load(std::sync::atomic::Ordering::Relaxed),
                t.tokens.load(std::sync::atomic::Ordering::Relaxed)
            ));
            lines.extend(
                t.snapshot()
                    .into_iter()
                    .map(|(k, v)| format!("  {k:<48} {v}")),
            );
        }
        lines
    }
}

/// Direction changes of the replica count beyond the one a load that rises and falls needs
/// (up, then down): 0 for 1 → 2 → 3 → 2 → 1, 2 for 1 → 3 → 2 → 3 → 1.
fn reversals(path: &[i32]) -> usize {
    let ups: Vec<bool> = path.windows(2).map(|w| w[1] > w[0]).collect();
    let changes = ups.windows(2).filter(|d| d[0] != d[1]).count();
    let one_peak = ups.first() == Some(&true) && changes > 0;
    changes - usize::from(one_peak)
}

/// `0 → 1 → 2 → 3 → 2 → 1 (no reversal)`.
fn path_words(path: &[i32]) -> String {
    let steps: Vec<String> = path.iter().map(i32::to_string).collect();
    let n = reversals(path);
    let verdict = if n == 0 {
        "no reversal".to_string()
    } else {
        format!("{n} reversal(s)")
    };
    format!("{} ({verdict})", steps.join(" → "))
}

#[cfg(test)]
mod tests {
    use super::{path_words, reversals};

    #[test]
    fn a_rise_and_fall_is_no_reversal_and_a_flap_is() {
        assert_eq!(reversals(&[]), 0);
        assert_eq!(reversals(&[1]), 0);
        assert_eq!(reversals(&[0, 1, 2, 3, 2, 1]), 0);
        assert_eq!(reversals(&[1, 2, 3]), 0);
        assert_eq!(reversals(&[3, 2, 1]), 0);
        assert_eq!(reversals(&[1, 3, 2, 3, 1]), 2);
        assert_eq!(reversals(&[3, 2, 3]), 1);
        assert_eq!(path_words(&[0, 1, 3, 1]), "0 → 1 → 3 → 1 (no reversal)");
        assert_eq!(path_words(&[1, 2, 1, 2]), "1 → 2 → 1 → 2 (1 reversal(s))");
    }
}
