//! The model fetch step in local mode: `tidegate-engine fetch-model` run once per pool before
//! its engines start, as the init container runs in a pod, from the same launch contract.
//!
//! Invariants:
//! - No engine of a pool whose model is fetched starts before its fetch succeeded.
//! - A failed fetch is retried with a growing back-off (as a kubelet restarts a failing init
//!   container), and its cause (the fetch's own message: URI and cause) is what
//!   [`Fetch::problem`] reports until a fetch succeeds.
//! - Credentials come from a Secret among the manifest files (`model.source.credentialsSecret`,
//!   its `stringData` or `data`), as the pod's come from the cluster's Secret.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tidegate_api::InferencePoolSpec;
use tidegate_api::fetch_launch::{FetchEnvValue, FetchLaunch, FetchSite, fetch_launch};
use tracing::{info, warn};

use super::process::{LocalCommand, Process, ProcessState, spawn_logged};
use crate::ports::{PoolRef, RuntimeError};

/// Secrets from the manifest files: (namespace, name) → key → value.
pub type LocalSecrets = BTreeMap<(String, String), BTreeMap<String, String>>;

/// First and longest wait before a failed fetch runs again.
const BACKOFF_FIRST: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Where a pool's fetch stands.
#[derive(Debug)]
enum Stage {
    Running {
        process: Process,
        uri: String,
    },
    Done {
        uri: String,
    },
    Failed {
        uri: String,
        message: String,
        retry_at: Instant,
    },
}

/// One pool's fetch step.
#[derive(Debug, Default)]
pub struct Fetch {
    stage: Option<Stage>,
    failures: u32,
}

/// What a runtime needs to run fetches.
pub struct FetchContext<'a> {
    pub engine_bin: &'a Path,
    pub cache_dir: &'a Path,
    pub log_dir: &'a Path,
    pub secrets: &'a LocalSecrets,
}

/// Where the fetch runs in local mode: the state folder's model cache, the user's own
/// Hugging Face cache (`HF_HOME` as the environment has it).
pub fn local_fetch_site(cache_dir: &Path, message_file: Option<&Path>) -> FetchSite {
    FetchSite {
        cache_dir: cache_dir.to_string_lossy().into_owned(),
        hf_home: None,
        message_file: message_file.map(|p| p.to_string_lossy().into_owned()),
        log_format: "text",
    }
}

impl Fetch {
    /// Whether the pool's model is in place; starts or restarts the fetch when it is due.
    pub fn ready(
        &mut self,
        pool: &PoolRef,
        spec: &InferencePoolSpec,
        cx: &FetchContext<'_>,
    ) -> Result<bool, RuntimeError> {
        let uri = spec.model.uri.clone();
        let msg_file = cx
            .log_dir
            .join(format!("{}.{}.fetch-message", pool.namespace, pool.name));
        let site = local_fetch_site(cx.cache_dir, Some(&msg_file));
        let Some(launch) = fetch_launch(spec, &site).map_err(|e| RuntimeError(e.to_string()))?
        else {
            return Ok(true);
        };
        match &mut self.stage {
            Some(Stage::Done { uri: done }) if *done == uri => return Ok(true),
            Some(Stage::Running {
                process,
                uri: running,
            }) if *running == uri => match process.state() {
                ProcessState::Running => return Ok(false),
                ProcessState::Succeeded => {
                    info!(pool = %pool, %uri, "model fetched");
                    self.failures = 0;
                    self.stage = Some(Stage::Done { uri });
                    return Ok(true);
                }
                ProcessState::Failed(status) => {
                    let message = read_message(&msg_file).unwrap_or_else(|| {
                        format!("model fetch failed: {uri}: fetch-model {status}")
                    });
                    self.fail(pool, uri, message);
                    return Ok(false);
                }
                ProcessState::Gone => {}
            },
            Some(Stage::Failed {
                uri: failed,
                retry_at,
                ..
            }) if *failed == uri && Instant::now() < *retry_at => {
                return Ok(false);
            }
            _ => {}
        }
        let _ = std::fs::remove_file(&msg_file);
        match command(pool, &launch, cx) {
            Ok(cmd) => {
                let log = cx
                    .log_dir
                    .join(format!("{}.{}.fetch.log", pool.namespace, pool.name));
                let process = spawn_logged(&cmd, &log, "fetch-model")?;
                info!(pool = %pool, %uri, dest = %launch.dest, log = %log.display(), "fetching the model before the engines start");
                self.stage = Some(Stage::Running { process, uri });
            }
            Err(message) => self.fail(pool, uri, message),
        }
        Ok(false)
    }

    fn fail(&mut self, pool: &PoolRef, uri: String, message: String) {
        self.failures += 1;
        let wait = BACKOFF_FIRST
            .saturating_mul(1 << self.failures.min(8).saturating_sub(1))
            .min(BACKOFF_MAX);
        warn!(pool = %pool, %message, retry_in_s = wait.as_secs(), "the model fetch failed; no engine starts until it succeeds");
        self.stage = Some(Stage::Failed {
            uri,
            message,
            retry_at: Instant::now() + wait,
        });
    }

    /// The last failure's cause, while no fetch has succeeded since.
    pub fn problem(&self) -> Option<String> {
        match &self.stage {
            Some(Stage::Failed { message, .. }) => Some(message.clone()),
            _ => None,
        }
    }
}

/// The fetch's command: the contract's arguments, its variables with the Secret's values.
fn command(
    pool: &PoolRef,
    launch: &FetchLaunch,
    cx: &FetchContext<'_>,
) -> Result<LocalCommand, String> {
    let mut env = Vec::new();
    for (name, value) in &launch.env {
        match value {
            FetchEnvValue::Literal(v) => env.push((name.to_string(), v.clone())),
            FetchEnvValue::SecretKey {
                secret,
                key,
                optional,
            } => {
                let data = cx
                    .secrets
                    .get(&(pool.namespace.clone(), secret.clone()))
                    .ok_or_else(|| {
                        format!(
                            "model fetch cannot start: Secret {}/{secret} (model.source.credentialsSecret) is not in the manifest files",
                            pool.namespace
                        )
                    })?;
                match data.get(*key) {
                    Some(v) => env.push((name.to_string(), v.clone())),
                    None if *optional => {}
                    None => {
                        return Err(format!(
                            "model fetch cannot start: Secret {}/{secret} has no key {key}",
                            pool.namespace
                        ));
                    }
                }
            }
        }
    }
    Ok(LocalCommand {
        program: cx.engine_bin.to_path_buf(),
        args: launch.args.clone(),
        env,
        kv_disk_dir: None,
    })
}

/// The one-line cause the fetch wrote.
fn read_message(path: &PathBuf) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.trim();
    (!line.is_empty()).then(|| line.to_string())
}
