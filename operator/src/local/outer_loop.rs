//! Local mode's outer loop: every InferencePool of the files, each with its TierPolicy,
//! ticked through the same `Driver::tick` the cluster's controller calls, each tick reported
//! to a StatusSink. `local::run` gives it local mode's ports (engine processes, the engines'
//! /metrics, the file registry, the console); tests give it fakes.
//!
//! Invariants: each pool ticks at its own `spec.scaling.interval` (at least `MIN_INTERVAL`),
//! one tick at a time; pools due together tick concurrently; a tick builds on the status the
//! same pool's previous tick reported; a failed tick changes nothing and the pool ticks
//! again one interval later.

use std::path::PathBuf;
use std::time::Duration;

use futures::future::join_all;
use tidegate_api::status::InferencePoolStatus;
use tidegate_api::{InferencePool, TierPolicySpec};
use tokio::time::Instant;

use crate::driver::{Driver, TickInput, TickOutcome};
use crate::manifests::{Manifests, pool_ref};
use crate::plan::Millis;
use crate::ports::{
    EngineControl, MetricsSource, PoolRef, PoolReport, RegistryStore, StatusSink, WorkloadRuntime,
};

/// The shortest tick interval local mode runs a pool at.
pub const MIN_INTERVAL: Duration = Duration::from_millis(200);

/// One pool of the files, with what its ticks carry over.
pub struct LocalPool {
    pub pref: PoolRef,
    pub pool: InferencePool,
    pub tiers: Option<TierPolicySpec>,
    /// What the last tick reported (the manifest has no status).
    pub status: Option<InferencePoolStatus>,
    next_due: Instant,
}

impl LocalPool {
    /// How often the pool ticks.
    pub fn interval(&self) -> Duration {
        self.pool.spec.scaling.interval.as_std().max(MIN_INTERVAL)
    }
}

/// The pools of the files with their TierPolicies, due at once. Refused: no pool, a pool
/// named twice, a TierPolicy named by a pool and missing from the files.
pub fn resolve(manifests: &Manifests, files: &[PathBuf]) -> anyhow::Result<Vec<LocalPool>> {
    anyhow::ensure!(
        !manifests.pools.is_empty(),
        "no InferencePool found in {files:?}"
    );
    let now = Instant::now();
    let mut pools: Vec<LocalPool> = Vec::new();
    for pool in &manifests.pools {
        let pref = pool_ref(pool);
        anyhow::ensure!(
            pools.iter().all(|p| p.pref != pref),
            "InferencePool {pref} appears twice in {files:?}"
        );
        let tiers = manifests.tier_policy_of(pool).map_err(|name| {
            anyhow::anyhow!("TierPolicy {name} referenced by {pref} is not in {files:?}")
        })?;
        pools.push(LocalPool {
            pref,
            pool: pool.clone(),
            tiers,
            status: None,
            next_due: now,
        });
    }
    Ok(pools)
}

/// Sleeps until the first pool is due.
pub async fn wait_due(pools: &[LocalPool]) {
    if let Some(at) = pools.iter().map(|p| p.next_due).min() {
        tokio::time::sleep_until(at).await;
    }
}

/// What one tick of one pool gave: its outcome, or why it failed.
pub struct Ticked {
    /// Index of the pool in the slice given to [`tick_due`].
    pub index: usize,
    pub outcome: anyhow::Result<TickOutcome>,
}

/// Ticks every pool that is due (concurrently), reports each outcome to `sink`, and sets
/// when each ticks next.
pub async fn tick_due<W, M, E, R, S>(
    driver: &Driver<W, M, E, R>,
    sink: &S,
    pools: &mut [LocalPool],
    now_ms: Millis,
) -> Vec<Ticked>
where
    W: WorkloadRuntime,
    M: MetricsSource,
    E: EngineControl,
    R: RegistryStore,
    S: StatusSink,
{
    let now = Instant::now();
    let due: Vec<usize> = (0..pools.len())
        .filter(|&i| pools[i].next_due <= now)
        .collect();
    let ticks = due.iter().map(|&i| {
        let p = &pools[i];
        let input = TickInput {
            pool: &p.pref,
            spec: &p.pool.spec,
            tiers: p.tiers.as_ref(),
            api_keys: &[],
            previous: p.status.as_ref(),
            // The manifest is read once: one generation for the whole run.
            generation: Some(1),
            now: now_ms,
        };
        async move { driver.tick(&input).await }
    });
    let results = join_all(ticks).await;
    let mut out = Vec::with_capacity(due.len());
    for (index, result) in due.into_iter().zip(results) {
        let p = &mut pools[index];
        p.next_due = next_due(p.next_due, p.interval(), Instant::now());
        let outcome = match result {
            Ok(tick) => report(sink, p, tick, now_ms).await,
            Err(e) => Err(e.into()),
        };
        out.push(Ticked { index, outcome });
    }
    out
}

/// Reports a tick and keeps its status for the next one.
async fn report<S: StatusSink>(
    sink: &S,
    p: &mut LocalPool,
    tick: TickOutcome,
    now: Millis,
) -> anyhow::Result<TickOutcome> {
    sink.report(&PoolReport {
        pool: &p.pref,
        previous: p.status.as_ref(),
        status: &tick.status,
        plan: &tick.plan,
        workload: &tick.workload,
        uid: None,
        now,
    })
    .await?;
    p.status = Some(tick.status.clone());
    Ok(tick)
}

/// The next deadline: one interval after the last, or after now when the tick ran late.
fn next_due(last: Instant, interval: Duration, now: Instant) -> Instant {
    let next = last + interval;
    if next < now { now + interval } else { next }
}

#[cfg(test)]
#[path = "outer_loop_tests.rs"]
mod tests;
