//! The controller against a real API server that serves only the custom resources (no
//! Deployments, Secrets, Events): the workload runtime, metrics, engine control and registry
//! are in-memory fakes, owned-object watches and Events are off (`Capabilities::CRDS_ONLY`).
//! Checks that the status the operator writes is accepted by the CRD schema and fills the
//! printer columns, that a missing TierPolicy gives Ready=False TierPolicyNotFound, and that
//! creating the policy re-reconciles the pool at once.
//!
//! Runs only when TIDEGATE_TEST_KUBECONFIG names a kubeconfig (for example of the shared
//! CRD-only test server); otherwise it passes without doing anything.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tidegate_api::engine_admin::{AdmittedTenants, DrainState, DrainStatus, EnginePolicy};
use tidegate_api::{InferencePool, InferencePoolSpec, TierPolicy};
use tidegate_operator::driver::Driver;
use tidegate_operator::k8s::controller::Context;
use tidegate_operator::k8s::manager::{ControllerOptions, run_controller};
use tidegate_operator::k8s::metrics::OperatorMetrics;
use tidegate_operator::k8s::owners::OwnerBook;
use tidegate_operator::k8s::shutdown::Shutdown;
use tidegate_operator::plan::{MetricsProblem, PoolMetrics};
use tidegate_operator::ports::{
    ControlError, Endpoint, EngineControl, MetricsSource, PoolRef, RegistryError, RegistryStore,
    RuntimeError, WorkloadRuntime, WorkloadState,
};
use tidegate_operator::registry::Registry;
use tidegate_operator::status_sink::kubernetes::EventSink;

#[derive(Default)]
struct MemRuntime(Mutex<HashMap<PoolRef, i32>>);

impl WorkloadRuntime for MemRuntime {
    async fn observe(&self, pool: &PoolRef) -> Result<WorkloadState, RuntimeError> {
        let replicas = self.0.lock().ok().and_then(|m| m.get(pool).copied());
        Ok(WorkloadState {
            replicas,
            ready_replicas: replicas.unwrap_or(0),
            endpoints: vec![],
            routers: vec![],
            selector: format!("tidegate.dev/pool={}", pool.name),
            model_problem: None,
        })
    }
    async fn apply(
        &self,
        pool: &PoolRef,
        _: &InferencePoolSpec,
        replicas: i32,
        _: &[String],
    ) -> Result<(), RuntimeError> {
        if let Ok(mut m) = self.0.lock() {
            m.insert(pool.clone(), replicas);
        }
        Ok(())
    }
    async fn admin_token(&self, _: &PoolRef) -> Result<String, RuntimeError> {
        Ok("token".into())
    }
}

struct SteadyMetrics;

impl MetricsSource for SteadyMetrics {
    async fn read(
        &self,
        _: &PoolRef,
        _: &InferencePoolSpec,
        _: &[Endpoint],
        now_ms: u64,
    ) -> Result<PoolMetrics, MetricsProblem> {
        Ok(PoolMetrics {
            decode_tokens_per_second: 120.0,
            running: 4.0,
            queue_wait_p99_seconds: Some(0.05),
            kv_utilization: 0.4,
            pods_reporting: 1,
            sampled_at: now_ms,
            ..PoolMetrics::default()
        })
    }
}

struct NoEngines;

impl EngineControl for NoEngines {
    async fn push_endpoints(
        &self,
        _: &Endpoint,
        _: &str,
        _: &tidegate_api::router::RouterEndpoints,
    ) -> Result<tidegate_api::router::EndpointsView, ControlError> {
        Ok(Default::default())
    }
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
        _: u64,
    ) -> Result<AdmittedTenants, ControlError> {
        Ok(AdmittedTenants::default())
    }
    async fn drain(&self, _: &Endpoint, _: &str, _: u64) -> Result<DrainStatus, ControlError> {
        Ok(DrainStatus {
            state: DrainState::Drained,
            in_flight: 0,
        })
    }
    async fn drain_status(&self, _: &Endpoint, _: &str) -> Result<DrainStatus, ControlError> {
        Ok(DrainStatus {
            state: DrainState::Drained,
            in_flight: 0,
        })
    }
}

#[derive(Default)]
struct MemRegistry(Mutex<HashMap<PoolRef, Registry>>);

impl RegistryStore for MemRegistry {
    async fn load(&self, pool: &PoolRef) -> Result<Registry, RegistryError> {
        Ok(self
            .0
            .lock()
            .ok()
            .and_then(|m| m.get(pool).cloned())
            .unwrap_or_default())
    }
    async fn save(&self, pool: &PoolRef, r: &Registry) -> Result<(), RegistryError> {
        if let Ok(mut m) = self.0.lock() {
            m.insert(pool.clone(), r.clone());
        }
        Ok(())
    }
}

async fn client() -> Option<Client> {
    let path = std::env::var("TIDEGATE_TEST_KUBECONFIG").ok()?;
    let kc = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    Some(Client::try_from(config).expect("client"))
}

async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in tidegate_api::crds() {
        let name = crd.metadata.name.clone().expect("name");
        crds.patch(
            &name,
            &PatchParams::apply("tidegate-test").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("apply CRD");
    }
    // Wait until both kinds are served.
    for _ in 0..100 {
        let pools: Api<InferencePool> = Api::all(client.clone());
        let tiers: Api<TierPolicy> = Api::all(client.clone());
        if pools.list(&Default::default()).await.is_ok()
            && tiers.list(&Default::default()).await.is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("CRDs not served");
}

fn condition(status: &Value, type_: &str) -> Option<(String, String)> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
}

/// Polls the pool until `f` accepts its status.
async fn wait_for(api: &Api<InferencePool>, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..200 {
        if let Ok(p) = api.get("chat").await {
            let v = serde_json::to_value(&p).expect("json");
            if f(&v["status"]) {
                return v;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let last = api.get("chat").await.map(|p| serde_json::to_value(&p).ok());
    panic!("timed out waiting for {what}; last: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_fills_status_on_a_real_api_server() {
    let Some(client) = client().await else {
        eprintln!("TIDEGATE_TEST_KUBECONFIG not set; skipping");
        return;
    };
    install_crds(&client).await;
    let ns = format!("k8s-e2e-{}", std::process::id());
    let pools: Api<InferencePool> = Api::namespaced(client.clone(), &ns);
    let tiers: Api<TierPolicy> = Api::namespaced(client.clone(), &ns);
    let pool: InferencePool = serde_json::from_value(json!({
        "apiVersion": "tidegate.dev/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": "chat", "namespace": ns},
        "spec": {
            "model": {"name": "llama", "uri": "file:///models/llama"},
            "engine": {"image": "engine:1"},
            "replicas": {"min": 1, "max": 3},
            "scaling": {"interval": "30s", "capacityHintTokensPerSecond": 100.0},
            "tierPolicyRef": {"name": "tiers"}
        }
    }))
    .expect("pool");
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create pool");

    let owners = OwnerBook::new();
    let driver = Driver::new(
        MemRuntime::default(),
        SteadyMetrics,
        NoEngines,
        MemRegistry::default(),
    );
    let mut ctx = Context::new(
        client.clone(),
        driver,
        owners,
        EventSink::disabled(),
        Arc::new(OperatorMetrics::new()),
    );
    ctx.read_secrets = false;
    let (shutdown, _trigger) = Shutdown::manual();
    let controller = tokio::spawn(run_controller(
        Arc::new(ctx),
        ControllerOptions {
            namespaces: vec![ns.clone()],
            watch_owned: false,
        },
        shutdown,
    ));

    // The policy is missing: status is written anyway, with Ready=False TierPolicyNotFound.
    let v = wait_for(&pools, "a first status", |s| s["observedGeneration"] == 1).await;
    let s = &v["status"];
    assert_eq!(
        condition(s, "Ready"),
        Some(("False".into(), "TierPolicyNotFound".into())),
        "{s}"
    );
    assert_eq!(
        condition(s, "MetricsAvailable").map(|c| c.0),
        Some("True".into()),
        "{s}"
    );
    // Printer columns: Ready, Desired, Tokens/s, Queue-P99, Admission.
    assert!(s["readyReplicas"].is_i64(), "{s}");
    assert!(s["desiredReplicas"].as_i64().is_some_and(|d| d >= 1), "{s}");
    assert!(s["measured"]["decodeTokensPerSecond"].is_number(), "{s}");
    assert!(s["measured"]["queueWaitP99"].is_string(), "{s}");
    assert_eq!(s["admission"]["state"], "Open", "{s}");

    // Creating the policy re-reconciles the pool well before its 30s interval.
    let policy: TierPolicy = serde_json::from_value(json!({
        "apiVersion": "tidegate.dev/v1alpha1", "kind": "TierPolicy",
        "metadata": {"name": "tiers", "namespace": ns},
        "spec": {"tiers": [{"name": "free"}], "defaultTier": "free"}
    }))
    .expect("policy");
    tiers
        .create(&PostParams::default(), &policy)
        .await
        .expect("create policy");
    wait_for(&pools, "Ready without TierPolicyNotFound", |s| {
        condition(s, "Ready").is_some_and(|c| c.1 != "TierPolicyNotFound")
    })
    .await;

    controller.abort();
    let _ = pools.delete("chat", &Default::default()).await;
    let _ = tiers.delete("tiers", &Default::default()).await;
}
