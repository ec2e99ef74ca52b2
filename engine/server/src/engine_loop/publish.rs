//! Copies the scheduler's snapshot into the shared Prometheus metrics (counters are raised to
//! the snapshot's cumulative totals, gauges set).
//!
//! Invariant: reads the scheduler only; never changes engine state.

use crate::metrics::Metrics;
use tidegate_kv::scheduler::Scheduler;

/// Publishes one snapshot.
pub(super) fn publish(m: &Metrics, sched: &Scheduler) {
    let s = sched.snapshot();
    Metrics::raise_to(&m.decode_tokens, s.decode_tokens);
    Metrics::raise_to(&m.prefill_tokens, s.prefill_tokens);
    m.requests_running.set(s.running as i64);
    m.requests_waiting
        .set(s.waiting_by_tier.iter().map(|(_, n)| *n as i64).sum());
    m.kv_blocks_used.set(s.blocks_used as i64);
    m.kv_blocks_total.set(s.blocks_total as i64);
    for (tier, action, n) in &s.evictions {
        m.evictions_total(tier, action.as_str(), *n);
    }
    for (source, n) in &s.restores {
        m.restores_total(source.as_str(), *n);
    }
    for (source, n) in &s.restore_failures {
        m.kv_restore_failures_total(source.as_str(), *n);
    }
}
