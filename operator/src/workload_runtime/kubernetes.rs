//! `K8sRuntime`: the WorkloadRuntime port on Kubernetes. A pool runs as a Deployment of engine
//! pods (with a headless Service and a PodDisruptionBudget) behind a Deployment of router
//! pods (with a PodDisruptionBudget) and the front-door Service on the routers, all applied
//! with server-side apply under one field manager, owned by the InferencePool.
//!
//! Invariants:
//! - Before a scale-down, the replicas the driver drained get
//!   `controller.kubernetes.io/pod-deletion-cost: "-1000"`, so the ReplicaSet removes them
//!   and not a pod still serving.
//! - The admin-token Secret is created once with a random token and never rewritten; a
//!   Secret someone else created first is used as it is.
//! - Pods being deleted are not endpoints; an endpoint is ready when its Ready condition is.
//! - Engine endpoints come from the engine selector and routers from the router selector;
//!   neither listing ever holds the other's pods.
//! - What `observe` reads (the Deployment, the pods) comes from the watch caches; only
//!   writes and the admin Secret go to the API server.
//! - The front-door Service is applied last: on a pool that ran before the router existed,
//!   clients move to the routers only once the router Deployment has been applied.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tidegate_api::InferencePoolSpec;
use tracing::{debug, info};

use crate::k8s::cache::Caches;
use crate::k8s::model_fetch;
use crate::k8s::owners::OwnerBook;
use crate::k8s::{
    ADMIN_PORT, ADMIN_TOKEN_KEY, HTTP_PORT, ROUTER_ADMIN_PORT, ROUTER_HTTP_PORT, admin_secret_name,
    apply_params, engines_service_name, objects, render, router_name, router_selector_labels,
    selector_labels, selector_string,
};
use crate::ports::{Endpoint, PoolRef, RuntimeError, WorkloadRuntime, WorkloadState};

/// Annotation the ReplicaSet controller reads to choose which pods to remove first.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// How long a read admin token is reused before the Secret is read again.
const TOKEN_TTL: Duration = Duration::from_secs(600);

fn err(what: &str, pool: &PoolRef, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError(format!("{what} of {pool}: {e}"))
}

/// The Kubernetes workload runtime.
pub struct K8sRuntime {
    client: Client,
    owners: OwnerBook,
    caches: Caches,
    tokens: Mutex<HashMap<PoolRef, (String, Instant)>>,
}

impl K8sRuntime {
    /// A runtime that reads Deployments and pods from `caches` (started by the controller)
    /// and writes through `client`.
    pub fn new(client: Client, owners: OwnerBook, caches: Caches) -> Self {
        K8sRuntime {
            client,
            owners,
            caches,
            tokens: Mutex::new(HashMap::new()),
        }
    }

    async fn ssa<K>(&self, ns: &str, name: &str, obj: &K) -> Result<(), kube::Error>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        api.patch(name, &apply_params(), &Patch::Apply(obj)).await?;
        Ok(())
    }

    fn cached_token(&self, pool: &PoolRef) -> Option<String> {
        let tokens = self.tokens.lock().ok()?;
        let (token, at) = tokens.get(pool)?;
        (at.elapsed() < TOKEN_TTL).then(|| token.clone())
    }

    fn remember_token(&self, pool: &PoolRef, token: &str) {
        if let Ok(mut tokens) = self.tokens.lock() {
            tokens.insert(pool.clone(), (token.to_string(), Instant::now()));
        }
    }
}

/// The token in an admin Secret (data or stringData).
fn secret_token(secret: &Secret) -> Option<String> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(ADMIN_TOKEN_KEY)) {
        return String::from_utf8(v.0.clone()).ok();
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(ADMIN_TOKEN_KEY))
        .cloned()
}

/// A pod as an engine endpoint; None while it has no IP or is being deleted.
pub fn pod_endpoint(pod: &Pod) -> Option<Endpoint> {
    pod_at(pod, HTTP_PORT, ADMIN_PORT)
}

/// A pod as a router endpoint (the router contract's ports); None as for an engine.
pub fn router_pod_endpoint(pod: &Pod) -> Option<Endpoint> {
    pod_at(pod, ROUTER_HTTP_PORT, ROUTER_ADMIN_PORT)
}

fn pod_at(pod: &Pod, http_port: i32, admin_port: i32) -> Option<Endpoint> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let name = pod.metadata.name.clone()?;
    let status = pod.status.as_ref()?;
    let ip = status.pod_ip.clone().filter(|ip| !ip.is_empty())?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip
    };
    Some(Endpoint {
        name,
        api_url: format!("http://{host}:{http_port}"),
        admin_url: format!("http://{host}:{admin_port}"),
        ready,
    })
}

impl WorkloadRuntime for K8sRuntime {
    async fn observe(&self, pool: &PoolRef) -> Result<WorkloadState, RuntimeError> {
        let ns = &pool.namespace;
        let dep = self
            .caches
            .deployment(ns, &pool.name)
            .await
            .map_err(|e| err("reading the Deployment", pool, e))?;
        let engine_pods = self
            .caches
            .pods(ns, &selector_labels(&pool.name))
            .await
            .map_err(|e| err("listing pods", pool, e))?;
        let mut endpoints: Vec<Endpoint> =
            engine_pods.iter().filter_map(|p| pod_endpoint(p)).collect();
        endpoints.sort_by(|a, b| a.name.cmp(&b.name));
        let router_pods = self
            .caches
            .pods(ns, &router_selector_labels(&pool.name))
            .await
            .map_err(|e| err("listing router pods", pool, e))?;
        let mut routers: Vec<Endpoint> = router_pods
            .iter()
            .filter_map(|p| router_pod_endpoint(p))
            .collect();
        routers.sort_by(|a, b| a.name.cmp(&b.name));
        let selector = selector_string(&pool.name);
        let replicas = dep
            .as_ref()
            .map(|d| d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1));
        let ready_replicas = dep
            .as_ref()
            .and_then(|d| d.status.as_ref())
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        Ok(WorkloadState {
            replicas,
            ready_replicas,
            endpoints,
            routers,
            selector,
            model_problem: model_fetch::fetch_failure(engine_pods.iter().map(|p| p.as_ref())),
        })
    }

    async fn apply(
        &self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        replicas: i32,
        remove_first: &[String],
    ) -> Result<(), RuntimeError> {
        let ns = &pool.namespace;
        let name = &pool.name;
        let owners = self.owners.refs(pool);
        if !remove_first.is_empty() {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            let patch = serde_json::json!({
                "metadata": { "annotations": { DELETION_COST: "-1000" } }
            });
            for victim in remove_first {
                match pods
                    .patch(victim, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => debug!(pool = %pool, pod = %victim, "marked for removal first"),
                    // Already gone: nothing to choose.
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        return Err(err(&format!("marking pod {victim} for removal"), pool, e));
                    }
                }
            }
        }
        // The same builder `tidegate-operator render` prints.
        let objs = render::pool_objects(name, ns, spec, replicas, owners)
            .map_err(|e| err("building the Deployment", pool, e))?;
        let router = router_name(name);
        self.ssa::<Deployment>(ns, name, &objs.deployment)
            .await
            .map_err(|e| err("applying the Deployment", pool, e))?;
        self.ssa::<Service>(ns, &engines_service_name(name), &objs.engines_service)
            .await
            .map_err(|e| err("applying the engines' Service", pool, e))?;
        self.ssa::<PodDisruptionBudget>(ns, name, &objs.pdb)
            .await
            .map_err(|e| err("applying the PodDisruptionBudget", pool, e))?;
        self.ssa::<Deployment>(ns, &router, &objs.router_deployment)
            .await
            .map_err(|e| err("applying the router Deployment", pool, e))?;
        self.ssa::<PodDisruptionBudget>(ns, &router, &objs.router_pdb)
            .await
            .map_err(|e| err("applying the router PodDisruptionBudget", pool, e))?;
        self.ssa::<Service>(ns, name, &objs.service)
            .await
            .map_err(|e| err("applying the Service", pool, e))?;
        info!(pool = %pool, replicas, routers = spec.router.replicas, "applied the engine and router Deployments, Services and PodDisruptionBudgets");
        Ok(())
    }

    async fn admin_token(&self, pool: &PoolRef) -> Result<String, RuntimeError> {
        if let Some(token) = self.cached_token(pool) {
            return Ok(token);
        }
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &pool.namespace);
        let name = admin_secret_name(&pool.name);
        let existing = secrets
            .get_opt(&name)
            .await
            .map_err(|e| err("reading the admin Secret", pool, e))?;
        let token = match existing {
            Some(secret) => secret_token(&secret)
                .ok_or_else(|| err("reading the admin Secret", pool, "no `token` key"))?,
            None => {
                let token =
                    objects::random_token().map_err(|e| err("making an admin token", pool, e))?;
                let secret = objects::admin_secret(
                    &pool.name,
                    &pool.namespace,
                    &token,
                    self.owners.refs(pool),
                );
                match secrets.create(&PostParams::default(), &secret).await {
                    Ok(_) => {
                        info!(pool = %pool, secret = %name, "created the engine admin token");
                        token
                    }
                    // Created concurrently: use theirs, never overwrite.
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        let secret = secrets
                            .get(&name)
                            .await
                            .map_err(|e| err("reading the admin Secret", pool, e))?;
                        secret_token(&secret).ok_or_else(|| {
                            err("reading the admin Secret", pool, "no `token` key")
                        })?
                    }
                    Err(e) => return Err(err("creating the admin Secret", pool, e)),
                }
            }
        };
        self.remember_token(pool, &token);
        Ok(token)
    }
}
