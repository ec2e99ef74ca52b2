//! Watch caches: what a tick reads about the cluster comes from here, not from the API server.
//!
//! A pool's tick needs its engine Deployment, its engine and router pods and its TierPolicy.
//! Reading them with GET and LIST on every tick costs four requests per pool per interval
//! (a hundred pools at 15 s: about 27 requests a second); reading them from reflector stores
//! costs one watch per kind, whatever the number of pools. The stores are fed by watches that
//! `run_controller` drives (`Caches::start`), one per kind and watched namespace, and the
//! same streams are the controller's triggers for those kinds.
//!
//! Invariants:
//! - A tick triggered by a change of a cached object reads a store that already holds that
//!   change: the store takes each event before the event goes on to trigger (a pod that was
//!   just force-deleted is never pushed to the routers by the tick it triggered).
//! - A read waits until every store of its kind has had its first full list: an empty store
//!   during start-up would look like a pool with no Deployment and no pods, and a tick would
//!   act on it. Any number of ticks may wait at once (see `Cached`).
//! - Pods are watched by the pool label only (engines and routers alike) and kept without
//!   their managedFields, which are most of a pod's size and never read.
//! - Only objects the operator manages are cached: Deployments by the managed-by label, pods
//!   by the pool label. Secrets are not cached (the operator may only `get` them).

use std::sync::{Arc, OnceLock};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tidegate_api::TierPolicy;
use tokio::sync::watch;

use super::lenient::Lenient;
use super::{POOL_LABEL, managed_selector};

/// A store and whether it has had its first full list.
///
/// kube's `Store::wait_until_ready` wakes only the last of several tasks waiting at once
/// (one waker slot), and every pool's first tick waits at once after a restart; so one
/// task waits there per store and tells any number of readers through a watch channel.
#[derive(Clone)]
struct Cached<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    ready: watch::Receiver<bool>,
}

impl<K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static> Cached<K> {
    /// A store that becomes ready when its writer has had a first list (spawns the waiter).
    fn watched(store: Store<K>) -> Self {
        let (tx, ready) = watch::channel(false);
        let waiting = store.clone();
        tokio::spawn(async move {
            if waiting.wait_until_ready().await.is_ok() {
                let _ = tx.send(true);
            }
            // A dropped writer drops `tx`: readers then see the watch stopped.
        });
        Cached { store, ready }
    }

    /// A store that is ready now.
    fn filled(store: Store<K>) -> Self {
        let (_, ready) = watch::channel(true);
        Cached { store, ready }
    }

    async fn ready(&self, what: &'static str) -> Result<&Store<K>, CacheError> {
        let mut ready = self.ready.clone();
        ready
            .wait_for(|r| *r)
            .await
            .map_err(|_| CacheError::Stopped(what))?;
        Ok(&self.store)
    }
}

/// The stores of one watched scope (a namespace, or all of them).
#[derive(Clone)]
struct Scope {
    namespace: Option<String>,
    deployments: Option<Cached<Deployment>>,
    pods: Option<Cached<Pod>>,
    policies: Cached<Lenient<TierPolicy>>,
}

impl Scope {
    fn covers(&self, namespace: &str) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == namespace)
    }
}

/// The operator's watch caches (cheap to clone; clones share the stores).
#[derive(Clone, Default)]
pub struct Caches {
    scopes: Arc<OnceLock<Vec<Scope>>>,
}

/// Why a cache read has no answer.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("the watch caches were never started")]
    NotStarted,
    #[error("the {0} cache is not kept (this API server has no such objects)")]
    NotKept(&'static str),
    #[error("the {0} watch stopped")]
    Stopped(&'static str),
}

/// A cache's watch, after the store took each event: the objects it touched (deletions
/// included). Whoever drives it may use it as a trigger: the store is never behind it.
pub type Feed<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// The feeds of one watched scope, to be driven by that scope's controller.
pub struct ScopeFeeds {
    /// The namespace, or None for all.
    pub namespace: Option<String>,
    /// Managed Deployments (None where workloads are not cached).
    pub deployments: Option<Feed<Deployment>>,
    /// Pods with the pool label: engines and routers (None where workloads are not cached).
    pub pods: Option<Feed<Pod>>,
    /// TierPolicies.
    pub policies: Feed<Lenient<TierPolicy>>,
}

fn feed<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, Feed<K>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync,
    K: 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|o: &mut K| o.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects()
        .boxed();
    (store, stream)
}

fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

impl Caches {
    /// Makes the watches of every scope (None: all namespaces); returns their feeds, which
    /// the caller must drive (reads wait until each store has had its first list).
    /// `workloads`: also cache Deployments and pods (off where the API server serves only the
    /// custom resources). Starting twice keeps the first stores and returns no feeds.
    pub fn start(
        &self,
        client: &Client,
        scopes: &[Option<String>],
        workloads: bool,
    ) -> Vec<ScopeFeeds> {
        let mut feeds = Vec::new();
        let mut built = Vec::new();
        for ns in scopes {
            let ns_ref = ns.as_deref();
            let (policies, policy_feed) = feed(api(client, ns_ref), watcher::Config::default());
            let mut scope = ScopeFeeds {
                namespace: ns.clone(),
                deployments: None,
                pods: None,
                policies: policy_feed,
            };
            let (mut deployments, mut pods) = (None, None);
            if workloads {
                let config = watcher::Config::default().labels(&managed_selector());
                let (s, f) = feed(api(client, ns_ref), config);
                deployments = Some(s);
                scope.deployments = Some(f);
                let config = watcher::Config::default().labels(POOL_LABEL);
                let (s, f) = feed(api(client, ns_ref), config);
                pods = Some(s);
                scope.pods = Some(f);
            }
            built.push(Scope {
                namespace: ns.clone(),
                deployments: deployments.map(Cached::watched),
                pods: pods.map(Cached::watched),
                policies: Cached::watched(policies),
            });
            feeds.push(scope);
        }
        match self.scopes.set(built) {
            Ok(()) => feeds,
            Err(_) => Vec::new(),
        }
    }

    /// Caches filled with these objects, as after a first list (for tests and tools).
    pub fn preloaded(
        deployments: Vec<Deployment>,
        pods: Vec<Pod>,
        policies: Vec<Lenient<TierPolicy>>,
    ) -> Self {
        let caches = Caches::default();
        let scope = Scope {
            namespace: None,
            deployments: Some(Cached::filled(filled(deployments))),
            pods: Some(Cached::filled(filled(pods))),
            policies: Cached::filled(filled(policies)),
        };
        let _ = caches.scopes.set(vec![scope]);
        caches
    }

    fn scope(&self, namespace: &str) -> Result<&Scope, CacheError> {
        let scopes = self.scopes.get().ok_or(CacheError::NotStarted)?;
        scopes
            .iter()
            .find(|s| s.covers(namespace))
            .ok_or(CacheError::NotStarted)
    }

    /// The Deployment `namespace/name` the operator manages, if there is one.
    pub async fn deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Deployment>>, CacheError> {
        let cached = self
            .scope(namespace)?
            .deployments
            .as_ref()
            .ok_or(CacheError::NotKept("Deployment"))?;
        let store = cached.ready("Deployment").await?;
        Ok(store.get(&ObjectRef::new(name).within(namespace)))
    }

    /// Pods of `namespace` carrying every label of `selector`.
    pub async fn pods(
        &self,
        namespace: &str,
        selector: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<Arc<Pod>>, CacheError> {
        let cached = self
            .scope(namespace)?
            .pods
            .as_ref()
            .ok_or(CacheError::NotKept("Pod"))?;
        let store = cached.ready("Pod").await?;
        Ok(store.state_filter(|p| {
            p.namespace().as_deref() == Some(namespace)
                && selector
                    .iter()
                    .all(|(k, v)| p.labels().get(k).is_some_and(|have| have == v))
        }))
    }

    /// The TierPolicy `namespace/name`, readable or not.
    pub async fn policy(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Lenient<TierPolicy>>>, CacheError> {
        let store = self.scope(namespace)?.policies.ready("TierPolicy").await?;
        Ok(store.get(&ObjectRef::new(name).within(namespace)))
    }
}

fn filled<K>(objects: Vec<K>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Every pool's first tick after a restart waits for the caches at once: all of them
    /// must go on when the first list arrives (kube's store alone wakes only the last).
    #[tokio::test]
    async fn many_waiters_all_go_on_when_the_store_is_ready() {
        let (store, mut writer) = reflector::store::<Deployment>();
        let cached = Cached::watched(store);
        let waiters: Vec<_> = (0..50)
            .map(|_| {
                let c = cached.clone();
                tokio::spawn(async move { c.ready("Deployment").await.map(|s| s.len()) })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        for w in waiters {
            let n = tokio::time::timeout(Duration::from_secs(2), w)
                .await
                .expect("every waiter woke")
                .expect("task");
            assert_eq!(n.expect("ready"), 0);
        }
    }

    #[tokio::test]
    async fn a_read_before_start_says_so() {
        let caches = Caches::default();
        assert!(matches!(
            caches.policy("ns", "p").await,
            Err(CacheError::NotStarted)
        ));
    }
}
