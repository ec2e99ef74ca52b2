//! The outer loop over fake ports: every pool of a folder (examples/local-two-pools/) gets
//! its engines and its ticks, each tick is reported for its own pool and builds on that
//! pool's previous status; a folder naming a TierPolicy it lacks, or a pool twice, is refused.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tidegate_api::InferencePoolSpec;
use tidegate_api::engine_admin::{AdmittedTenants, DrainState, DrainStatus, EnginePolicy};
use tidegate_api::router::{EndpointsView, RouterEndpoints};

use super::*;
use crate::manifests::load_manifests;
use crate::plan::{MetricsProblem, PoolMetrics};
use crate::ports::{
    ControlError, Endpoint, RegistryError, RuntimeError, StatusError, WorkloadState,
};
use crate::registry::Registry;
use crate::status_write::StatusWrite;

/// What the fakes saw, per pool.
#[derive(Default)]
struct World {
    /// Engines running per pool (`apply` starts them).
    engines: HashMap<PoolRef, Vec<Endpoint>>,
    /// Every `apply`: pool name and replicas.
    applied: Vec<(String, i32)>,
    /// Every report: pool name, and whether it carried a previous status.
    reports: Vec<(String, bool)>,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<World>>);

impl Fake {
    fn world(&self) -> MutexGuard<'_, World> {
        self.0.lock().expect("world lock")
    }
}

impl WorkloadRuntime for Fake {
    async fn observe(&self, pool: &PoolRef) -> Result<WorkloadState, RuntimeError> {
        let w = self.world();
        let engines = w.engines.get(pool).cloned();
        Ok(WorkloadState {
            replicas: engines.as_ref().map(|e| e.len() as i32),
            ready_replicas: engines.as_ref().map_or(0, |e| e.len() as i32),
            endpoints: engines.unwrap_or_default(),
            routers: Vec::new(),
            selector: format!("pool={}", pool.name),
            model_problem: None,
        })
    }

    async fn apply(
        &self,
        pool: &PoolRef,
        _spec: &InferencePoolSpec,
        replicas: i32,
        _remove_first: &[String],
    ) -> Result<(), RuntimeError> {
        let mut w = self.world();
        w.applied.push((pool.name.clone(), replicas));
        let engines = w.engines.entry(pool.clone()).or_default();
        engines.truncate(replicas.max(0) as usize);
        while (engines.len() as i32) < replicas {
            let name = format!("{}-{}", pool.name, engines.len());
            engines.push(Endpoint {
                api_url: format!("http://{name}"),
                admin_url: format!("http://{name}-admin"),
                name,
                ready: true,
            });
        }
        Ok(())
    }

    async fn admin_token(&self, _pool: &PoolRef) -> Result<String, RuntimeError> {
        Ok("token".into())
    }
}

impl MetricsSource for Fake {
    async fn read(
        &self,
        _pool: &PoolRef,
        _spec: &InferencePoolSpec,
        endpoints: &[Endpoint],
        now_ms: u64,
    ) -> Result<PoolMetrics, MetricsProblem> {
        Ok(PoolMetrics {
            decode_tokens_per_second: 10.0,
            running: 1.0,
            queue_wait_p99_seconds: Some(0.01),
            pods_reporting: endpoints.len() as i32,
            sampled_at: now_ms,
            ..PoolMetrics::default()
        })
    }
}

impl EngineControl for Fake {
    async fn push_policy(
        &self,
        _: &Endpoint,
        _: &str,
        _: &EnginePolicy,
    ) -> Result<(), ControlError> {
        Ok(())
    }
    async fn tenants_since(
        &self,
        _: &Endpoint,
        _: &str,
        since_ms: u64,
    ) -> Result<AdmittedTenants, ControlError> {
        Ok(AdmittedTenants {
            now_ms: since_ms,
            tenants: Vec::new(),
        })
    }
    async fn drain(&self, _: &Endpoint, _: &str, _: u64) -> Result<DrainStatus, ControlError> {
        Ok(DrainStatus {
            state: DrainState::Drained,
            in_flight: 0,
        })
    }
    async fn drain_status(&self, ep: &Endpoint, token: &str) -> Result<DrainStatus, ControlError> {
        self.drain(ep, token, 0).await
    }
    async fn push_endpoints(
        &self,
        _: &Endpoint,
        _: &str,
        _: &RouterEndpoints,
    ) -> Result<EndpointsView, ControlError> {
        Ok(EndpointsView::default())
    }
}

impl RegistryStore for Fake {
    async fn load(&self, _: &PoolRef) -> Result<Registry, RegistryError> {
        Ok(Registry::default())
    }
    async fn save(&self, _: &PoolRef, _: &Registry) -> Result<(), RegistryError> {
        Ok(())
    }
}

impl StatusSink for Fake {
    async fn report(&self, r: &PoolReport<'_>) -> Result<StatusWrite, StatusError> {
        let mut w = self.world();
        w.reports.push((r.pool.name.clone(), r.previous.is_some()));
        Ok(StatusWrite::Changed)
    }
}

fn example(folder: &str) -> Vec<PathBuf> {
    vec![
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../examples")
            .join(folder),
    ]
}

#[tokio::test(start_paused = true)]
async fn every_pool_of_the_folder_gets_its_engines_and_its_ticks() {
    let files = example("local-two-pools");
    let manifests = load_manifests(&files).expect("manifests");
    let mut pools = resolve(&manifests, &files).expect("pools");
    let names: Vec<&str> = pools.iter().map(|p| p.pref.name.as_str()).collect();
    assert_eq!(names, ["batch", "chat"], "both pools, in file order");
    assert!(
        pools.iter().all(|p| p.tiers.is_some()),
        "each has its tiers"
    );

    let fake = Fake::default();
    let driver = Driver::new(fake.clone(), fake.clone(), fake.clone(), fake.clone());
    let mut ticks: BTreeMap<String, usize> = BTreeMap::new();
    for round in 0..3 {
        wait_due(&pools).await;
        for t in tick_due(&driver, &fake, &mut pools, 1_000 * round).await {
            t.outcome.expect("tick");
            *ticks.entry(pools[t.index].pref.name.clone()).or_default() += 1;
        }
    }
    assert_eq!(
        ticks,
        BTreeMap::from([("batch".to_string(), 3), ("chat".to_string(), 3)]),
        "every pool ticks at its interval"
    );
    let w = fake.world();
    for name in ["batch", "chat"] {
        assert!(
            w.applied.iter().any(|(p, n)| p == name && *n >= 1),
            "{name} got its engines: {:?}",
            w.applied
        );
        let pref = PoolRef {
            namespace: "local".into(),
            name: name.into(),
        };
        assert_eq!(
            w.engines.get(&pref).map(Vec::len),
            Some(1),
            "{name}: replicas.min"
        );
        let seen: Vec<bool> = w
            .reports
            .iter()
            .filter(|(p, _)| p == name)
            .map(|r| r.1)
            .collect();
        assert_eq!(
            seen,
            [false, true, true],
            "{name}: each tick builds on its own last status"
        );
    }
    assert!(pools.iter().all(|p| p.status.is_some()));
}

#[test]
fn a_missing_tier_policy_or_a_pool_named_twice_is_refused() {
    let files = example("local-two-pools");
    let mut manifests = load_manifests(&files).expect("manifests");
    let policies = std::mem::take(&mut manifests.policies);
    let err = resolve(&manifests, &files).err().expect("refused");
    assert!(
        err.to_string()
            .contains("TierPolicy demo-tiers referenced by local/batch"),
        "{err}"
    );
    manifests.policies = policies;
    let again = manifests.pools[0].clone();
    manifests.pools.push(again);
    let err = resolve(&manifests, &files).err().expect("refused");
    assert!(
        err.to_string().contains("local/batch appears twice"),
        "{err}"
    );
    manifests.pools.clear();
    assert!(resolve(&manifests, &files).is_err(), "no pool");
}
