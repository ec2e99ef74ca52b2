//! The InferencePool controller: a thin reconcile around `Driver::tick`.
//!
//! reconcile(pool): an unreadable pool (see `lenient`) gets Ready=False InvalidSpec and is
//! otherwise left alone → record its owner reference → load its TierPolicy (missing: Ready=False
//! TierPolicyNotFound; unreadable: Ready=False TierPolicyInvalid and Invalid on the policy;
//! either way reconcile on with no tiers) → read API keys from the policy's Secret
//! → tick the driver (observe, plan, decide, then drain, scale or re-apply the spec, collect
//! and persist the registry, push) → report status and plan events to the StatusSink
//! (`KubeStatusSink`: patch the status when worth a write, publish Events) → record metrics
//! → requeue after spec.scaling.interval.
//!
//! Invariants:
//! - At most one tick per pool per interval: watch events that arrive sooner (our own status
//!   patch, owned-object churn) are debounced unless the pool's generation changed or its
//!   TierPolicy changed. This keeps status patches from re-triggering reconciles in a loop.
//! - Ticks of one pool are serialized by the driver (each pool's memory has its own lock),
//!   which keeps the engine pushes and registry writes of one pool from racing.
//! - Events never fail a reconcile (see `status_sink::kubernetes`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, Resource, ResourceExt};
use tidegate_api::conditions::{reasons, status as cstatus, types};
use tidegate_api::engine_admin::ApiKeyEntry;
use tidegate_api::status::InferencePoolStatus;
use tidegate_api::{InferencePool, TierPolicy, TierPolicySpec};
use tracing::{info, warn};

use super::deployment::model_location;
use super::image_volumes::{ImageVolumes, Support};
use super::lenient::Lenient;
use super::{render, unreadable};

use super::api_keys::parse_api_keys;
use super::cache::{CacheError, Caches};
use super::metrics::OperatorMetrics;
use super::owners::OwnerBook;
use super::secret_texts::SecretTexts;
use crate::driver::{Driver, DriverError, TickInput, TickOutcome};
use crate::plan::{ConditionPlan, Millis, merge_conditions};
use crate::ports::{
    EngineControl, MetricsSource, PoolRef, PoolReport, RegistryStore, StatusError, StatusSink,
    WorkloadRuntime,
};
use crate::status_sink::kubernetes::{EventSink, KubeStatusSink};

/// Wall clock in Unix milliseconds (injectable for tests).
pub type Clock = Arc<dyn Fn() -> Millis + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    })
}

/// Why a reconcile failed (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error("InferencePool has no namespace")]
    NoNamespace,
    #[error("status: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("watch cache: {0}")]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Status(#[from] StatusError),
}

impl Error {
    /// The `reason` label of tidegate_operator_reconcile_errors_total.
    pub fn metric_label(&self) -> &'static str {
        match self {
            // The status is written to the API server.
            Error::Kube(_) | Error::Status(_) => "kube",
            Error::Driver(d) => d.metric_label(),
            Error::NoNamespace => "invalid",
            Error::Serialize(_) => "serialize",
            Error::Cache(_) => "cache",
        }
    }
}

/// Per-pool bookkeeping of the controller (not of the planner).
#[derive(Default)]
struct PoolBook {
    /// When the last tick ran, and for which generation.
    last_tick: Option<(Instant, Option<i64>)>,
    /// Consecutive failures, for backoff.
    failures: u32,
}

/// Everything reconcile needs.
pub struct Context<W, M, E, R> {
    pub client: Client,
    pub driver: Driver<W, M, E, R>,
    pub owners: OwnerBook,
    /// Where each tick's status and events go.
    pub status: KubeStatusSink,
    pub metrics: Arc<OperatorMetrics>,
    pub clock: Clock,
    /// Pools whose TierPolicy changed since their last tick (skip the debounce).
    pub dirty: Arc<Mutex<HashSet<PoolRef>>>,
    /// Read API keys from Secrets (off where the API server has no Secrets).
    pub read_secrets: bool,
    /// Whether this cluster mounts oci:// models (image volumes); found out on first use.
    pub image_volumes: ImageVolumes,
    /// The watch caches ticks read (TierPolicies here; Deployments and pods in the runtime).
    /// `run_controller` starts them.
    pub caches: Caches,
    /// API-key Secret contents, read at most once per TTL.
    pub secret_texts: SecretTexts,
    books: Mutex<HashMap<PoolRef, PoolBook>>,
}

impl<W, M, E, R> Context<W, M, E, R>
where
    W: WorkloadRuntime,
    M: MetricsSource,
    E: EngineControl,
    R: RegistryStore,
{
    /// A context; `owners` must be the book the runtime and registry were built with.
    pub fn new(
        client: Client,
        driver: Driver<W, M, E, R>,
        owners: OwnerBook,
        events: EventSink,
        metrics: Arc<OperatorMetrics>,
    ) -> Self {
        Context {
            status: KubeStatusSink::new(client.clone(), events),
            client,
            driver,
            owners,
            metrics,
            clock: system_clock(),
            dirty: Arc::default(),
            read_secrets: true,
            image_volumes: ImageVolumes::default(),
            caches: Caches::default(),
            secret_texts: SecretTexts::default(),
            books: Mutex::new(HashMap::new()),
        }
    }

    fn with_book<T>(&self, pool: &PoolRef, f: impl FnOnce(&mut PoolBook) -> T) -> T {
        let mut books = self.books.lock().unwrap_or_else(|p| p.into_inner());
        f(books.entry(pool.clone()).or_default())
    }

    /// Debounce: how long the pool waits before its next tick, when it ticked less than an
    /// interval ago for the same generation and its TierPolicy did not change since.
    fn not_due(
        &self,
        pool: &PoolRef,
        generation: Option<i64>,
        every: Duration,
    ) -> Option<Duration> {
        let forced = self
            .dirty
            .lock()
            .map(|mut d| d.remove(pool))
            .unwrap_or(false);
        let wait = self.with_book(pool, |b| match b.last_tick {
            Some((at, g)) if g == generation && !forced => every.checked_sub(at.elapsed()),
            _ => None,
        });
        wait.filter(|w| *w > Duration::from_millis(500))
    }

    /// Pools this controller has reconciled.
    pub fn known_pools(&self) -> Vec<PoolRef> {
        let books = self.books.lock().unwrap_or_else(|p| p.into_inner());
        books.keys().cloned().collect()
    }

    /// Forgets a deleted pool everywhere.
    pub async fn forget(&self, pool: &PoolRef) {
        self.driver.forget(pool);
        self.owners.forget(pool);
        self.metrics.forget(pool);
        self.status.forget(pool);
        let mut books = self.books.lock().unwrap_or_else(|p| p.into_inner());
        books.remove(pool);
    }
}

/// The pool's tick interval.
fn interval(pool: &InferencePool) -> Duration {
    pool.spec
        .scaling
        .interval
        .as_std()
        .max(Duration::from_secs(1))
}

/// The pool's TierPolicy, as far as it can be had.
enum Policy {
    /// No tierPolicyRef, or the policy itself.
    Found(Option<TierPolicySpec>),
    /// The referenced policy does not exist.
    Missing(String),
    /// The referenced policy exists but cannot be read (it was told so on its status).
    Unreadable(String),
}

/// Loads the pool's TierPolicy from the watch cache; an unreadable one gets Ready=False
/// Invalid on its status.
async fn load_policy(
    client: &Client,
    caches: &Caches,
    ns: &str,
    pool: &InferencePool,
    now: Millis,
) -> Result<Policy, Error> {
    let Some(r) = &pool.spec.tier_policy_ref else {
        return Ok(Policy::Found(None));
    };
    let Some(tp) = caches.policy(ns, &r.name).await? else {
        return Ok(Policy::Missing(r.name.clone()));
    };
    match &tp.parsed {
        Ok(tp) => Ok(Policy::Found(Some(tp.spec.clone()))),
        Err(bad) => {
            warn!(policy = %r.name, namespace = ns, error = %bad.message, "TierPolicy cannot be read");
            let api: Api<Lenient<TierPolicy>> = Api::namespaced(client.clone(), ns);
            let generation = tp.metadata.generation;
            unreadable::report(
                &api,
                &r.name,
                bad,
                unreadable::POLICY_REASON,
                generation,
                now,
            )
            .await?;
            Ok(Policy::Unreadable(r.name.clone()))
        }
    }
}

/// API keys of a policy (its Secret read at most once per `secret_texts::TTL`); problems are
/// logged and yield no keys (requests then fall to the default tier or the gateway headers).
async fn load_api_keys(
    client: &Client,
    texts: &SecretTexts,
    ns: &str,
    pool: &PoolRef,
    policy: &TierPolicySpec,
) -> Vec<ApiKeyEntry> {
    let Some(src) = &policy.tenancy.api_keys else {
        return Vec::new();
    };
    let text = match texts.read(client, ns, &src.secret_name, &src.key).await {
        Ok(Some(text)) => text,
        Ok(None) => {
            warn!(pool = %pool, secret = %src.secret_name, "API key Secret not found; no API keys");
            return Vec::new();
        }
        Err(e) => {
            warn!(pool = %pool, secret = %src.secret_name, error = %e, "cannot read the API key Secret; no API keys");
            return Vec::new();
        }
    };
    let tiers: Vec<&str> = policy.tiers.iter().map(|t| t.name.as_str()).collect();
    parse_api_keys(&text, &tiers).unwrap_or_else(|e| {
        warn!(pool = %pool, secret = %src.secret_name, key = %src.key, error = %e, "API keys refused; no API keys");
        Vec::new()
    })
}

/// Ready=False TierPolicyNotFound or TierPolicyInvalid, keeping lastTransitionTime if it was
/// already so. `policy` is a `Policy::Missing` or `Policy::Unreadable`.
fn mark_policy_problem(
    status: &mut InferencePoolStatus,
    previous: Option<&InferencePoolStatus>,
    policy: &Policy,
    now: Millis,
    generation: Option<i64>,
) {
    let (reason, message) = match policy {
        Policy::Found(_) => return,
        Policy::Missing(name) => (
            reasons::TIER_POLICY_NOT_FOUND,
            format!(
                "TierPolicy {name:?} not found in this namespace; serving with a single default tier"
            ),
        ),
        Policy::Unreadable(name) => (
            reasons::TIER_POLICY_INVALID,
            format!(
                "TierPolicy {name:?} cannot be read (its status says why); serving with a single default tier"
            ),
        ),
    };
    let planned = [ConditionPlan {
        type_: types::READY,
        status: cstatus::FALSE,
        reason,
        message,
    }];
    let prev = previous.map(|p| p.conditions.as_slice()).unwrap_or(&[]);
    let merged = merge_conditions(prev, &planned, now, generation);
    status.conditions.retain(|c| c.type_ != types::READY);
    status
        .conditions
        .extend(merged.into_iter().filter(|c| c.type_ == types::READY));
}

/// Why the pool's model cannot be mounted here: an `oci://` model on a cluster without image
/// volumes. None for every other model, and when the cluster mounts them.
async fn unmountable_model<W, M, E, R>(
    pool: &InferencePool,
    ns: &str,
    ctx: &Context<W, M, E, R>,
) -> Result<Option<String>, Error> {
    let is_image = model_location(&pool.spec.model.uri).is_ok_and(|m| m.image.is_some());
    if !is_image {
        return Ok(None);
    }
    // The pool's own engine Deployment is what the dry run asks about; a spec the builder
    // refuses is the driver's to report.
    let Ok(objects) = render::pool_objects(&pool.name_any(), ns, &pool.spec, 1, Vec::new()) else {
        return Ok(None);
    };
    match ctx
        .image_volumes
        .check(&ctx.client, ns, &objects.deployment)
        .await?
    {
        Support::Yes => Ok(None),
        Support::No(why) => Ok(Some(why)),
    }
}

/// Writes Ready=False, reason ModelVolumeUnsupported, on a pool whose model cannot be mounted;
/// nothing is applied for it.
async fn report_unmountable_model(
    client: &Client,
    pool: &InferencePool,
    ns: &str,
    why: String,
    now: Millis,
) -> Result<(), Error> {
    let generation = pool.meta().generation;
    let previous = pool.status.clone().unwrap_or_default();
    let planned = [ConditionPlan {
        type_: types::READY,
        status: cstatus::FALSE,
        reason: reasons::MODEL_VOLUME_UNSUPPORTED,
        message: format!("spec.model.uri {}: {why}", pool.spec.model.uri),
    }];
    let merged = merge_conditions(&previous.conditions, &planned, now, generation);
    let mut status = previous;
    status.observed_generation = generation;
    status.conditions.retain(|c| c.type_ != types::READY);
    status
        .conditions
        .extend(merged.into_iter().filter(|c| c.type_ == types::READY));
    let api: Api<InferencePool> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({ "status": status });
    api.patch_status(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    warn!(pool = %format!("{ns}/{}", pool.name_any()), %why, "the pool's model cannot be mounted here; nothing applied");
    Ok(())
}

/// Reconciles one InferencePool: reports it when it cannot be read, ticks it otherwise.
pub async fn reconcile<W, M, E, R>(
    obj: Arc<Lenient<InferencePool>>,
    ctx: Arc<Context<W, M, E, R>>,
) -> Result<Action, Error>
where
    W: WorkloadRuntime,
    M: MetricsSource,
    E: EngineControl,
    R: RegistryStore,
{
    match obj.get() {
        Ok(pool) => reconcile_pool(pool, &ctx).await,
        Err(bad) => {
            let ns = obj.namespace().ok_or(Error::NoNamespace)?;
            let name = obj.name_any();
            warn!(pool = %format!("{ns}/{name}"), error = %bad.message, "InferencePool cannot be read; reporting it on its status");
            let api: Api<Lenient<InferencePool>> = Api::namespaced(ctx.client.clone(), &ns);
            let generation = obj.metadata.generation;
            let now = (ctx.clock)();
            unreadable::report(&api, &name, bad, unreadable::POOL_REASON, generation, now).await?;
            ctx.metrics.error("unreadable");
            // A fix is a spec change, which triggers a reconcile by itself.
            Ok(Action::await_change())
        }
    }
}

/// The pool's TierPolicy as found, its tiers (none when it is missing or unreadable) and its
/// API keys (when Secrets can be read).
async fn tiers_and_keys<W, M, E, R>(
    ctx: &Context<W, M, E, R>,
    ns: &str,
    pref: &PoolRef,
    pool: &InferencePool,
) -> Result<(Policy, Option<TierPolicySpec>, Vec<ApiKeyEntry>), Error> {
    let policy = load_policy(&ctx.client, &ctx.caches, ns, pool, (ctx.clock)()).await?;
    let tiers = match &policy {
        Policy::Found(t) => t.clone(),
        Policy::Missing(_) | Policy::Unreadable(_) => None,
    };
    let keys = match (&tiers, ctx.read_secrets) {
        (Some(t), true) => load_api_keys(&ctx.client, &ctx.secret_texts, ns, pref, t).await,
        _ => Vec::new(),
    };
    Ok((policy, tiers, keys))
}

/// Ticks one readable InferencePool.
async fn reconcile_pool<W, M, E, R>(
    pool: &InferencePool,
    ctx: &Context<W, M, E, R>,
) -> Result<Action, Error>
where
    W: WorkloadRuntime,
    M: MetricsSource,
    E: EngineControl,
    R: RegistryStore,
{
    let ns = pool.namespace().ok_or(Error::NoNamespace)?;
    let pref = PoolRef {
        namespace: ns.clone(),
        name: pool.name_any(),
    };
    if pool.meta().deletion_timestamp.is_some() {
        ctx.forget(&pref).await;
        return Ok(Action::await_change());
    }
    let every = interval(pool);
    let generation = pool.meta().generation;

    if let Some(wait) = ctx.not_due(&pref, generation, every) {
        return Ok(Action::requeue(wait));
    }

    ctx.owners.record(pool);
    if let Some(why) = unmountable_model(pool, &ns, ctx).await? {
        report_unmountable_model(&ctx.client, pool, &ns, why, (ctx.clock)()).await?;
        // A cluster does not grow image volumes by itself: look again in a while, or at
        // once on a spec change (a pvc:// model).
        return Ok(Action::requeue(Duration::from_secs(300)));
    }
    let (policy, tiers, keys) = tiers_and_keys(ctx, &ns, &pref, pool).await?;

    let now = (ctx.clock)();
    let previous = pool.status.as_ref();
    let outcome = ctx
        .driver
        .tick(&TickInput {
            pool: &pref,
            spec: &pool.spec,
            tiers: tiers.as_ref(),
            api_keys: &keys,
            previous,
            generation,
            now,
        })
        .await?;

    let mut status = outcome.status.clone();
    mark_policy_problem(&mut status, previous, &policy, now, generation);
    let uid = pool.uid();
    let write = ctx
        .status
        .report(&PoolReport {
            pool: &pref,
            previous,
            status: &status,
            plan: &outcome.plan,
            workload: &outcome.workload,
            uid: uid.as_deref(),
            now,
        })
        .await?;
    ctx.metrics.status_write(write);
    ticked(ctx, &pref, generation, &outcome, &policy);
    Ok(Action::requeue(every))
}

/// Records a successful tick: operator metrics, the debounce book, the log line.
fn ticked<W, M, E, R>(
    ctx: &Context<W, M, E, R>,
    pref: &PoolRef,
    generation: Option<i64>,
    outcome: &TickOutcome,
    policy: &Policy,
) where
    W: WorkloadRuntime,
    M: MetricsSource,
    E: EngineControl,
    R: RegistryStore,
{
    ctx.metrics.reconciles.inc();
    ctx.metrics.record(pref, outcome);
    ctx.with_book(pref, |b| {
        b.last_tick = Some((Instant::now(), generation));
        b.failures = 0;
    });
    info!(
        pool = %pref,
        replicas = outcome.workload.replicas.unwrap_or(0),
        ready = outcome.workload.ready_replicas,
        desired = outcome.plan.desired_replicas,
        admission = outcome.plan.admission.state.as_str(),
        tier_policy_problem = !matches!(policy, Policy::Found(_)),
        reapplied = outcome.reapplied,
        decision = %outcome.plan.explanation,
        "reconciled"
    );
}

/// Backoff after a failed reconcile: 5s, 10s, 20s… capped at 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let secs = 5u64.saturating_mul(1u64 << failures.saturating_sub(1).min(6));
    Duration::from_secs(secs.min(300))
}

/// Counts the error and requeues with backoff.
pub fn error_policy<W, M, E, R>(
    pool: Arc<Lenient<InferencePool>>,
    error: &Error,
    ctx: Arc<Context<W, M, E, R>>,
) -> Action
where
    W: WorkloadRuntime,
    M: MetricsSource,
    E: EngineControl,
    R: RegistryStore,
{
    ctx.metrics.error(error.metric_label());
    let pref = PoolRef {
        namespace: pool.namespace().unwrap_or_default(),
        name: pool.name_any(),
    };
    let failures = ctx.with_book(&pref, |b| {
        b.failures = b.failures.saturating_add(1);
        b.failures
    });
    let wait = backoff(failures);
    warn!(pool = %pref, error = %error, reason = error.metric_label(), retry_in_s = wait.as_secs(), "reconcile failed");
    Action::requeue(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(5));
        assert_eq!(backoff(2), Duration::from_secs(10));
        assert_eq!(backoff(3), Duration::from_secs(20));
        assert_eq!(backoff(30), Duration::from_secs(300));
    }
}
