//! Local workload runtime: each replica is a `tidegate-engine serve` process on this
//! machine, on loopback ports. Behaves like a Deployment: it keeps the asked-for count,
//! restarts a replica that crashed, and removes drained replicas first on a scale-down.
//!
//! Each replica's command line and environment come from the launch contract
//! (`tidegate_api::engine_launch`), as a pod's do, at a loopback site: the same pool fields
//! reach a local engine with the same meaning as in a cluster.
//!
//! With an engine book (`run --workload local`), the runtime records its engines there and
//! adopts the live ones at start: an operator that was killed mid-flight is followed by one
//! that takes its engines over, as a Deployment's pods outlive a crashed controller.
//!
//! Invariants: a removed replica gets SIGTERM (the engine drains in-flight requests) and
//! is killed only if it outlives the pool's drain grace period; every engine, child or
//! adopted, is killed when the runtime is dropped, so no engine outlives a clean shutdown.

pub mod engine_book;
pub mod model_fetch;
mod process;
mod router_process;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tidegate_api::InferencePoolSpec;
use tidegate_api::engine_launch::{EnvValue, LaunchSite, READYZ_PATH, engine_launch};
use tidegate_api::fetch_launch::model_dest;
use tidegate_api::model_uri::ModelUri;
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::ports::{Endpoint, PoolRef, RuntimeError, WorkloadRuntime, WorkloadState};
use engine_book::{EngineBook, PoolEntry, ReplicaEntry};
use model_fetch::{Fetch, FetchContext, LocalSecrets};
pub use process::LocalCommand;
use process::{Process, ProcessState, spawn_logged};

/// How local engines are started.
#[derive(Clone, Debug)]
pub struct LocalRuntimeConfig {
    /// The `tidegate-engine` binary.
    pub engine_bin: PathBuf,
    /// Relative `file://` model paths are resolved against this folder.
    pub base_dir: PathBuf,
    /// Engine logs go here, one file per replica.
    pub log_dir: PathBuf,
    /// Token the engines' admin API accepts.
    pub admin_token: String,
    /// Extra arguments for every engine (after the pool's own extraArgs).
    pub extra_args: Vec<String>,
    /// When set, the engines' /metrics targets are written here in Prometheus file_sd
    /// format (labels `namespace`, `pool` and `pod`), so a real Prometheus can scrape them.
    pub file_sd_path: Option<PathBuf>,
    /// When set, the engines are recorded here, and those still running when the runtime
    /// starts are adopted (with the admin token they were started with).
    pub engine_book: Option<PathBuf>,
    /// When set, each pool's router URL is written here (`[{namespace, pool, url}]`): the
    /// pool's front door, for clients and tests.
    pub routers_file: Option<PathBuf>,
    /// Secrets from the manifest files, for the model fetch step's credentials.
    pub secrets: LocalSecrets,
}

struct Replica {
    name: String,
    api_port: u16,
    admin_port: u16,
    process: Process,
}

#[derive(Default)]
struct LocalPool {
    desired: i32,
    /// The spec last applied, to replace crashed replicas with.
    spec: Option<InferencePoolSpec>,
    next_index: u32,
    replicas: Vec<Replica>,
    /// The pool's router (started at the first apply).
    router: Option<Replica>,
    /// The model fetch step (`s3://`, `hf://` models): engines start once it succeeded.
    fetch: Fetch,
}

/// Engine processes on this machine.
pub struct LocalRuntime {
    cfg: LocalRuntimeConfig,
    pools: Mutex<HashMap<PoolRef, LocalPool>>,
    http: reqwest::Client,
    /// The engine book as last written, to write it only when it changes.
    book_written: Mutex<Option<EngineBook>>,
}

impl LocalRuntime {
    /// A runtime; with an engine book, it starts with the engines of the book still running.
    pub fn new(mut cfg: LocalRuntimeConfig) -> Self {
        let book = cfg.engine_book.as_deref().and_then(EngineBook::load);
        let pools = book.map(|b| adopt(&mut cfg, b)).unwrap_or_default();
        LocalRuntime {
            cfg,
            pools: Mutex::new(pools),
            http: reqwest::Client::builder()
                .timeout(Duration::from_millis(800))
                .build()
                .unwrap_or_else(|_| reqwest::Client::new()),
            book_written: Mutex::new(None),
        }
    }

    /// The admin token engines accept (an adopted book's, if engines were adopted).
    pub fn token(&self) -> &str {
        &self.cfg.admin_token
    }

    /// Kills one replica of a pool without draining it (failure injection for tests/demo).
    pub async fn crash_one(&self, pool: &PoolRef) -> Option<String> {
        let mut pools = self.pools.lock().await;
        let r = pools.get_mut(pool)?.replicas.first_mut()?;
        r.process.kill_now();
        Some(r.name.clone())
    }

    /// Stops every engine and router: SIGTERM, then a kill after `grace`.
    pub async fn shutdown(&self, grace: Duration) {
        let mut pools = self.pools.lock().await;
        for (_, pool) in pools.iter_mut() {
            for r in pool.replicas.drain(..) {
                stop_replica(r, grace);
            }
            if let Some(r) = pool.router.take() {
                stop_replica(r, Duration::from_secs(2));
            }
        }
    }

    /// The base URL of a pool's router, once it runs: the pool's front door.
    pub async fn router_url(&self, pool: &PoolRef) -> Option<String> {
        let pools = self.pools.lock().await;
        let r = pools.get(pool)?.router.as_ref()?;
        Some(format!("http://127.0.0.1:{}", r.api_port))
    }

    /// Starts the pool's router unless it runs; a router that exited is started again.
    fn ensure_router(
        &self,
        pool: &PoolRef,
        p: &mut LocalPool,
        spec: &InferencePoolSpec,
    ) -> Result<(), RuntimeError> {
        if let Some(r) = p.router.as_mut() {
            match r.process.state() {
                ProcessState::Running => return Ok(()),
                other => warn!(pool = %pool, state = ?other, "router exited; starting it again"),
            }
        }
        let name = router_process::router_name(pool);
        let (api_port, admin_port) = (free_port()?, free_port()?);
        let log = self.log_path(pool, &name)?;
        let launch = router_process::router_command(
            &self.cfg.engine_bin,
            &self.cfg.admin_token,
            spec,
            api_port,
            admin_port,
        );
        let process = spawn_logged(&launch, &log, "router")?;
        router_process::started(pool, api_port, admin_port, &log);
        p.router = Some(Replica {
            name,
            api_port,
            admin_port,
            process,
        });
        Ok(())
    }

    /// The state folder's model cache, where fetched models land.
    fn model_cache(&self) -> PathBuf {
        let state = self.cfg.log_dir.parent().unwrap_or(&self.cfg.log_dir);
        state.join("models")
    }

    /// Whether the pool's model is in place (always, for a `file://` model); starts its
    /// fetch step when it is due.
    fn model_ready(
        &self,
        pool: &PoolRef,
        p: &mut LocalPool,
        spec: &InferencePoolSpec,
    ) -> Result<bool, RuntimeError> {
        let cache = self.model_cache();
        let cx = FetchContext {
            engine_bin: &self.cfg.engine_bin,
            cache_dir: &cache,
            log_dir: &self.cfg.log_dir,
            secrets: &self.cfg.secrets,
        };
        std::fs::create_dir_all(&self.cfg.log_dir)
            .map_err(|e| RuntimeError(format!("log dir: {e}")))?;
        p.fetch.ready(pool, spec, &cx)
    }

    fn model_path(&self, spec: &InferencePoolSpec) -> Result<PathBuf, RuntimeError> {
        let uri = &spec.model.uri;
        if ModelUri::parse(uri).is_ok_and(|k| k.is_fetched()) {
            let cache = self.model_cache();
            return Ok(PathBuf::from(model_dest(&cache.to_string_lossy(), uri)));
        }
        let path = uri.strip_prefix("file://").ok_or_else(|| {
            RuntimeError(format!(
                "local mode serves file://, s3:// and hf:// models, not {uri}"
            ))
        })?;
        let p = Path::new(path);
        Ok(if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.cfg.base_dir.join(p)
        })
    }

    /// The command line and environment of one replica: the launch contract at a loopback
    /// site (the same function the Kubernetes Deployment builder calls), then this
    /// runtime's own extra arguments.
    pub fn engine_command(
        &self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        replica: &str,
        api_port: u16,
        admin_port: u16,
    ) -> Result<LocalCommand, RuntimeError> {
        let model = self.model_path(spec)?;
        if spec.engine.resources.memory.is_none() && spec.engine.kv_cache.memory_fraction > 0.5 {
            // As in a pod without a memory limit; on a shared machine that is most of it.
            warn!(pool = %pool, fraction = spec.engine.kv_cache.memory_fraction,
                "no engine.resources.memory: this engine sizes its KV pool from the machine's free memory");
        }
        let kv_disk_dir = spec.engine.kv_cache.disk_offload.as_ref().map(|_| {
            let state = self.cfg.log_dir.parent().unwrap_or(&self.cfg.log_dir);
            state
                .join("kv")
                .join(format!("{}.{replica}", pool.namespace))
        });
        let site = LaunchSite {
            model_path: model.to_string_lossy().into_owned(),
            bind_host: "127.0.0.1".to_string(),
            api_port,
            admin_port,
            kv_disk_dir: kv_disk_dir
                .as_ref()
                .map(|d| d.to_string_lossy().into_owned()),
            log_format: "text",
        };
        let launch =
            engine_launch(spec, &site).map_err(|e| RuntimeError(format!("{pool}: {e}")))?;
        let mut args = launch.args;
        args.extend(self.cfg.extra_args.iter().cloned());
        let env = launch
            .env
            .into_iter()
            .map(|(name, value)| {
                let value = match value {
                    EnvValue::Literal(v) => v,
                    EnvValue::AdminToken => self.cfg.admin_token.clone(),
                };
                (name.to_string(), value)
            })
            .collect();
        Ok(LocalCommand {
            program: self.cfg.engine_bin.clone(),
            args,
            env,
            kv_disk_dir,
        })
    }

    fn spawn(
        &self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        index: u32,
    ) -> Result<Replica, RuntimeError> {
        let name = format!("{}-{index}", pool.name);
        let api_port = free_port()?;
        let admin_port = free_port()?;
        let launch = self.engine_command(pool, spec, &name, api_port, admin_port)?;
        if let Some(dir) = &launch.kv_disk_dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| RuntimeError(format!("{}: {e}", dir.display())))?;
        }
        let log_path = self.log_path(pool, &name)?;
        let process = spawn_logged(&launch, &log_path, "engine")?;
        info!(pool = %pool, replica = %name, api = api_port, admin = admin_port, log = %log_path.display(), "engine started");
        Ok(Replica {
            name,
            api_port,
            admin_port,
            process,
        })
    }

    /// The log file of process `name` of `pool` (its folder created).
    fn log_path(&self, pool: &PoolRef, name: &str) -> Result<PathBuf, RuntimeError> {
        std::fs::create_dir_all(&self.cfg.log_dir)
            .map_err(|e| RuntimeError(format!("log dir: {e}")))?;
        Ok(self
            .cfg
            .log_dir
            .join(format!("{}.{name}.log", pool.namespace)))
    }

    /// Rewrites the file_sd targets of every pool (write then rename: Prometheus never
    /// reads a torn file).
    async fn write_file_sd(&self) {
        let Some(path) = &self.cfg.file_sd_path else {
            return;
        };
        let pools = self.pools.lock().await;
        // One group per replica, labelled as the chart's PodMonitor labels pods in a cluster.
        let groups: Vec<serde_json::Value> = pools
            .iter()
            .flat_map(|(pref, p)| {
                p.replicas.iter().map(move |r| {
                    serde_json::json!({
                        "targets": [format!("127.0.0.1:{}", r.api_port)],
                        "labels": { "namespace": pref.namespace, "pool": pref.name, "pod": r.name },
                    })
                })
            })
            .collect();
        write_whole(
            path,
            &serde_json::Value::Array(groups).to_string(),
            "Prometheus file_sd targets",
        );
    }

    /// Rewrites the routers file (write then rename).
    async fn write_routers(&self) {
        let Some(path) = &self.cfg.routers_file else {
            return;
        };
        let pools = self.pools.lock().await;
        let mut rows: Vec<serde_json::Value> = pools
            .iter()
            .filter_map(|(pref, p)| {
                let r = p.router.as_ref()?;
                Some(serde_json::json!({
                    "namespace": pref.namespace,
                    "pool": pref.name,
                    "url": format!("http://127.0.0.1:{}", r.api_port),
                }))
            })
            .collect();
        drop(pools);
        rows.sort_by_key(|r| r.to_string());
        write_whole(
            path,
            &serde_json::Value::Array(rows).to_string(),
            "the routers file",
        );
    }

    /// Rewrites the engine book when what it records changed.
    async fn write_book(&self) {
        let Some(path) = &self.cfg.engine_book else {
            return;
        };
        let book = {
            let pools = self.pools.lock().await;
            let mut entries: Vec<PoolEntry> = pools
                .iter()
                .map(|(pref, p)| PoolEntry {
                    namespace: pref.namespace.clone(),
                    name: pref.name.clone(),
                    desired: p.desired,
                    next_index: p.next_index,
                    replicas: p.replicas.iter().filter_map(replica_entry).collect(),
                    router: p.router.as_ref().and_then(replica_entry),
                })
                .collect();
            entries.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            EngineBook {
                admin_token: self.cfg.admin_token.clone(),
                pools: entries,
            }
        };
        let mut written = self.book_written.lock().await;
        if written.as_ref() == Some(&book) {
            return;
        }
        match book.save(path) {
            Ok(()) => *written = Some(book),
            Err(e) => warn!(path = %path.display(), error = %e, "could not write the engine book"),
        }
    }

    async fn ready(&self, r: &Replica) -> bool {
        self.ready_at(r.api_port).await
    }

    async fn ready_at(&self, api_port: u16) -> bool {
        matches!(
            self.http.get(format!("http://127.0.0.1:{api_port}{READYZ_PATH}")).send().await,
            Ok(resp) if resp.status().is_success()
        )
    }
}

impl Drop for LocalRuntime {
    fn drop(&mut self) {
        // kill_on_drop ends every child, and adopted engines are killed here: nothing may
        // outlive a clean shutdown.
        if let Ok(mut pools) = self.pools.try_lock() {
            for r in pools
                .values_mut()
                .flat_map(|p| p.replicas.iter_mut().chain(p.router.as_mut()))
            {
                if matches!(r.process, Process::Adopted { .. }) {
                    r.process.kill_now();
                }
            }
            pools.clear();
        }
    }
}

/// The pools of `book` with the engines that still run; takes the book's admin token when
/// any engine is adopted (they accept no other).
fn adopt(cfg: &mut LocalRuntimeConfig, book: EngineBook) -> HashMap<PoolRef, LocalPool> {
    let mut pools = HashMap::new();
    let mut adopted = 0;
    for entry in book.pools {
        let pref = PoolRef {
            namespace: entry.namespace,
            name: entry.name,
        };
        let replicas: Vec<Replica> = entry.replicas.into_iter().filter_map(adopt_entry).collect();
        let router = entry.router.and_then(adopt_entry);
        if replicas.is_empty() && router.is_none() {
            continue;
        }
        if let Some(r) = &router {
            info!(pool = %pref, router = %r.name, api = r.api_port, "adopted the router an earlier operator started");
        }
        adopted += replicas.len() + usize::from(router.is_some());
        let names: Vec<&str> = replicas.iter().map(|r| r.name.as_str()).collect();
        info!(pool = %pref, replicas = ?names, desired = entry.desired, "adopted the engines an earlier operator started");
        pools.insert(
            pref,
            LocalPool {
                desired: entry.desired,
                // Known at the first apply: until then a crashed replica is not replaced.
                spec: None,
                next_index: entry.next_index,
                replicas,
                router,
                fetch: Fetch::default(),
            },
        );
    }
    if adopted > 0 {
        cfg.admin_token = book.admin_token;
    }
    pools
}

/// The process of a book entry, when it still runs (engine or router alike).
fn adopt_entry(r: ReplicaEntry) -> Option<Replica> {
    process::engine_alive(r.pid, r.api_port).then(|| Replica {
        process: Process::Adopted {
            pid: r.pid,
            api_port: r.api_port,
        },
        name: r.name,
        api_port: r.api_port,
        admin_port: r.admin_port,
    })
}

/// Writes `text` to `path` whole: a temporary file, then a rename, so readers never see a
/// torn file. A failure is logged (the next observation writes it again).
fn write_whole(path: &Path, text: &str, what: &str) {
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .is_err()
    {
        warn!(path = %path.display(), "could not write {what}");
    }
}

fn replica_entry(r: &Replica) -> Option<ReplicaEntry> {
    Some(ReplicaEntry {
        name: r.name.clone(),
        pid: r.process.pid()?,
        api_port: r.api_port,
        admin_port: r.admin_port,
    })
}

fn free_port() -> Result<u16, RuntimeError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| RuntimeError(format!("no free port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| RuntimeError(e.to_string()))
}

/// SIGTERM now (the engine drains), SIGKILL after `grace` if still running.
fn stop_replica(r: Replica, grace: Duration) {
    r.process.stop(r.name, grace);
}

impl WorkloadRuntime for LocalRuntime {
    async fn observe(&self, pool: &PoolRef) -> Result<WorkloadState, RuntimeError> {
        let mut pools = self.pools.lock().await;
        let Some(p) = pools.get_mut(pool) else {
            return Ok(WorkloadState {
                selector: format!("tidegate.dev/pool={}", pool.name),
                ..WorkloadState::default()
            });
        };
        // A replica whose process exited is gone.
        // An engine that exits 0 finished a drain: it is retired, not replaced (the driver
        // drains replicas only to remove them). Any other exit is a crash: replaced below.
        // An adopted engine that is gone counts as retired too (how it ended is not known):
        // if it crashed, the driver sees one replica fewer than it wants and orders it again.
        let mut retired = 0;
        p.replicas.retain_mut(|r| match r.process.state() {
            ProcessState::Running => true,
            ProcessState::Succeeded => {
                info!(pool = %pool, replica = %r.name, "engine drained and exited");
                retired += 1;
                false
            }
            ProcessState::Gone => {
                info!(pool = %pool, replica = %r.name, "adopted engine exited; counted as retired");
                retired += 1;
                false
            }
            ProcessState::Failed(status) => {
                warn!(pool = %pool, replica = %r.name, %status, "engine process exited");
                false
            }
        });
        p.desired -= retired;
        // Replace what crashed, as a ReplicaSet would (once the model is in place).
        if let Some(spec) = p.spec.clone()
            && self.model_ready(pool, p, &spec)?
        {
            while (p.replicas.len() as i32) < p.desired {
                let index = p.next_index;
                p.next_index += 1;
                warn!(pool = %pool, "starting a replacement engine");
                p.replicas.push(self.spawn(pool, &spec, index)?);
            }
        }
        if let Some(spec) = p.spec.clone() {
            self.ensure_router(pool, p, &spec)?;
        }
        let router = p
            .router
            .as_ref()
            .map(|r| (r.name.clone(), r.api_port, r.admin_port));
        let mut endpoints = Vec::new();
        for r in &p.replicas {
            endpoints.push(Endpoint {
                name: r.name.clone(),
                api_url: format!("http://127.0.0.1:{}", r.api_port),
                admin_url: format!("http://127.0.0.1:{}", r.admin_port),
                ready: self.ready(r).await,
            });
        }
        drop(pools);
        let mut routers = Vec::new();
        if let Some((name, api, admin)) = router {
            routers.push(Endpoint {
                name,
                api_url: format!("http://127.0.0.1:{api}"),
                admin_url: format!("http://127.0.0.1:{admin}"),
                ready: self.ready_at(api).await,
            });
        }
        self.write_file_sd().await;
        self.write_routers().await;
        self.write_book().await;
        let pools = self.pools.lock().await;
        let desired = pools.get(pool).map_or(0, |p| p.desired);
        let model_problem = pools.get(pool).and_then(|p| p.fetch.problem());
        Ok(WorkloadState {
            replicas: Some(desired),
            ready_replicas: endpoints.iter().filter(|e| e.ready).count() as i32,
            endpoints,
            routers,
            selector: format!("tidegate.dev/pool={}", pool.name),
            model_problem,
        })
    }

    async fn apply(
        &self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        replicas: i32,
        remove_first: &[String],
    ) -> Result<(), RuntimeError> {
        let mut pools = self.pools.lock().await;
        let p = pools.entry(pool.clone()).or_default();
        p.desired = replicas;
        p.spec = Some(spec.clone());
        let grace = spec.engine.drain_grace_period.as_std();
        while (p.replicas.len() as i32) > replicas {
            let idx = p
                .replicas
                .iter()
                .position(|r| remove_first.contains(&r.name))
                .unwrap_or(p.replicas.len() - 1);
            let r = p.replicas.remove(idx);
            info!(pool = %pool, replica = %r.name, "removing engine (SIGTERM, drain)");
            stop_replica(r, grace);
        }
        // Engines start once the model is in place; until then observe() keeps asking.
        let model_ready = self.model_ready(pool, p, spec)?;
        while model_ready && (p.replicas.len() as i32) < replicas {
            let index = p.next_index;
            p.next_index += 1;
            let r = self.spawn(pool, spec, index)?;
            p.replicas.push(r);
        }
        self.ensure_router(pool, p, spec)?;
        drop(pools);
        self.write_book().await;
        Ok(())
    }

    async fn admin_token(&self, _pool: &PoolRef) -> Result<String, RuntimeError> {
        Ok(self.token().to_string())
    }
}

#[cfg(test)]
mod tests;
