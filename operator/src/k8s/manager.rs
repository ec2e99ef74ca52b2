//! Wires the InferencePool controller: what it watches and how it runs.
//!
//! Watches: InferencePools (the trigger); TierPolicies, mapped to the pools of the same
//! namespace whose tierPolicyRef names them; and, unless the API server has none (local
//! workload), the Deployments, Services and PodDisruptionBudgets the operator owns, and the
//! pools' engine pods (see `engine_pods`: an engine that leaves reaches the routers at once).
//! With several namespaces, one controller runs per namespace over the same context.
//! The watch caches a tick reads (`cache`) are started here and driven with the controllers.
//!
//! Pools and policies are watched as `Lenient` objects: one the operator cannot parse is
//! reported on its own status and never fails the list the others arrive in. A shutdown
//! request stops the watches at once and leaves in-flight reconciles `DRAIN_LIMIT` to end.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, ResourceExt};
use tidegate_api::{InferencePool, TierPolicy};
use tracing::{debug, info, warn};

use super::controller::{Context, error_policy, reconcile};
use super::engine_pods::pool_of_engine_pod;
use super::lenient::Lenient;
use super::managed_selector;
use super::shutdown::Shutdown;
use crate::ports::{EngineControl, MetricsSource, PoolRef, RegistryStore, WorkloadRuntime};

/// What the controller watches.
#[derive(Clone, Debug, Default)]
pub struct ControllerOptions {
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// Watch the owned Deployments, Services and PDBs (off where the API server has none).
    pub watch_owned: bool,
}

fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Pools in `store` that reference `policy` (readable or not: only its name matters).
pub fn pools_using(
    store: &Store<Lenient<InferencePool>>,
    policy: &Lenient<TierPolicy>,
) -> Vec<ObjectRef<Lenient<InferencePool>>> {
    let ns = policy.namespace();
    let name = policy.name_any();
    store
        .state()
        .iter()
        .filter(|p| p.namespace() == ns)
        .filter(|p| {
            p.get()
                .ok()
                .and_then(|p| p.spec.tier_policy_ref.as_ref())
                .is_some_and(|r| r.name == name)
        })
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// Runs the controllers until `shutdown` is requested, then gives the reconciles in flight
/// at most `DRAIN_LIMIT` to finish.
pub async fn run_controller<W, M, E, R>(
    ctx: Arc<Context<W, M, E, R>>,
    opts: ControllerOptions,
    shutdown: Shutdown,
) where
    W: WorkloadRuntime + 'static,
    M: MetricsSource + 'static,
    E: EngineControl + 'static,
    R: RegistryStore + 'static,
{
    let client = ctx.client.clone();
    let scopes: Vec<Option<String>> = if opts.namespaces.is_empty() {
        vec![None]
    } else {
        opts.namespaces.iter().cloned().map(Some).collect()
    };
    let owned = watcher::Config::default().labels(&managed_selector());
    let mut streams: Vec<BoxStream<'static, ()>> = Vec::new();
    let mut stores = Vec::new();
    // The caches ticks read from; their feeds are also the controllers' triggers.
    let feeds = ctx.caches.start(&client, &scopes, opts.watch_owned);
    if feeds.is_empty() {
        warn!("the watch caches were started before; not starting the controller twice");
        return;
    }
    for feed in feeds {
        let ns = feed.namespace.as_deref();
        let mut controller = Controller::new(
            api::<Lenient<InferencePool>>(&client, ns),
            watcher::Config::default(),
        );
        let store = controller.store();
        stores.push(store.clone());
        let dirty = ctx.dirty.clone();
        let policy_ctx = ctx.clone();
        controller = controller.watches_stream(feed.policies, move |policy| {
            // A policy edit may name another key Secret: read it afresh.
            if let Some(ns) = policy.namespace() {
                policy_ctx.secret_texts.forget_namespace(&ns);
            }
            let pools = pools_using(&store, &policy);
            if let Ok(mut d) = dirty.lock() {
                for p in &pools {
                    d.insert(PoolRef {
                        namespace: p.namespace.clone().unwrap_or_default(),
                        name: p.name.clone(),
                    });
                }
            }
            pools
        });
        if let Some(deployments) = feed.deployments {
            controller = controller.owns_stream(deployments);
        }
        if opts.watch_owned {
            controller = controller
                .owns(api::<Service>(&client, ns), owned.clone())
                .owns(api::<PodDisruptionBudget>(&client, ns), owned.clone());
        }
        if let Some(pods) = feed.pods {
            let dirty = ctx.dirty.clone();
            controller =
                controller.watches_stream(pods, move |pod| pool_of_engine_pod(&dirty, &pod));
        }
        let stop = shutdown.clone();
        let stream = controller
            .graceful_shutdown_on(async move { stop.requested().await })
            .run(reconcile, error_policy, ctx.clone())
            .map(|res| match res {
                Ok((obj, _)) => debug!(pool = %obj, "reconcile done"),
                Err(e) => warn!(error = %e, "controller"),
            })
            .boxed();
        streams.push(stream);
    }
    info!(namespaces = ?opts.namespaces, watch_owned = opts.watch_owned, "controller started");
    let gc = forget_deleted(ctx.clone(), stores);
    tokio::select! {
        _ = futures::stream::select_all(streams).for_each(|_| async {}) => {}
        _ = gc => {}
        _ = shutdown.deadline() => {}
    }
    info!("controller stopped");
}

/// Every minute, forgets pools that are gone (their planner memory, owner refs, metrics).
async fn forget_deleted<W, M, E, R>(
    ctx: Arc<Context<W, M, E, R>>,
    stores: Vec<Store<Lenient<InferencePool>>>,
) where
    W: WorkloadRuntime,
    M: MetricsSource,
    E: EngineControl,
    R: RegistryStore,
{
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tick.tick().await;
        if stores
            .iter()
            .any(|s| s.wait_until_ready().now_or_never().is_none())
        {
            continue;
        }
        for pool in ctx.known_pools() {
            let key = ObjectRef::<Lenient<InferencePool>>::new(&pool.name).within(&pool.namespace);
            if stores.iter().all(|s| s.get(&key).is_none()) {
                info!(pool = %pool, "pool deleted; forgetting it");
                ctx.forget(&pool).await;
            }
        }
    }
}
