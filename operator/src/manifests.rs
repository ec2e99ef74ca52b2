//! Desired state read from files: the InferencePool and TierPolicy YAML a cluster takes, for
//! the commands that run without an API server (`local`, `render`).
//!
//! Invariants: a manifest that does not parse is reported with its file name and refused;
//! nothing is half-loaded. Files of a folder are read in name order, so the pools of a
//! folder come in a stable order.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Secret;

use tidegate_api::{InferencePool, TierPolicy, TierPolicySpec};

use crate::ports::PoolRef;

/// Pools, policies and Secrets found in files.
#[derive(Debug, Default)]
pub struct Manifests {
    pub pools: Vec<InferencePool>,
    pub policies: Vec<TierPolicy>,
    /// Secrets (namespace `default` where the manifest has none), for local mode's model
    /// fetch credentials: (namespace, name) → key → value.
    pub secrets: crate::workload_runtime::local::model_fetch::LocalSecrets,
}

/// Reads every `*.yaml`/`*.yml` file in `paths` (files or folders; documents separated by
/// `---`), keeping InferencePool and TierPolicy objects.
pub fn load_manifests(paths: &[PathBuf]) -> anyhow::Result<Manifests> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            entries.sort();
            files.extend(entries);
        } else {
            files.push(p.clone());
        }
    }
    let mut out = Manifests::default();
    for f in files {
        let text =
            std::fs::read_to_string(&f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        for doc in text.split("\n---") {
            let kind = doc
                .lines()
                .find_map(|l| l.strip_prefix("kind:"))
                .map(str::trim)
                .unwrap_or_default();
            match kind {
                "InferencePool" => out.pools.push(
                    serde_saphyr::from_str(doc)
                        .map_err(|e| anyhow::anyhow!("{}: InferencePool: {e}", f.display()))?,
                ),
                "TierPolicy" => out.policies.push(
                    serde_saphyr::from_str(doc)
                        .map_err(|e| anyhow::anyhow!("{}: TierPolicy: {e}", f.display()))?,
                ),
                "Secret" => {
                    let secret: Secret = serde_saphyr::from_str(doc)
                        .map_err(|e| anyhow::anyhow!("{}: Secret: {e}", f.display()))?;
                    let (key, data) = secret_data(secret);
                    out.secrets.insert(key, data);
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

/// A Secret's (namespace, name) and its keys: `data` (decoded) and `stringData`, the latter
/// winning as the API server has it.
fn secret_data(secret: Secret) -> ((String, String), BTreeMap<String, String>) {
    let ns = secret
        .metadata
        .namespace
        .unwrap_or_else(|| "default".into());
    let name = secret.metadata.name.unwrap_or_default();
    let mut data: BTreeMap<String, String> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    data.extend(secret.string_data.unwrap_or_default());
    ((ns, name), data)
}

/// The namespace and name of a pool read from a file (namespace `default`, name `pool`
/// where the manifest has none).
pub fn pool_ref(pool: &InferencePool) -> PoolRef {
    PoolRef {
        namespace: pool
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name: pool.metadata.name.clone().unwrap_or_else(|| "pool".into()),
    }
}

impl Manifests {
    /// The TierPolicy a pool names: by name, in the pool's namespace (a policy without a
    /// namespace matches any). `Ok(None)` for a pool without `tierPolicyRef`; an error
    /// naming the policy when the files do not hold it.
    pub fn tier_policy_of(&self, pool: &InferencePool) -> Result<Option<TierPolicySpec>, String> {
        let Some(r) = &pool.spec.tier_policy_ref else {
            return Ok(None);
        };
        let ns = pool_ref(pool).namespace;
        self.policies
            .iter()
            .filter(|p| p.metadata.name.as_deref() == Some(r.name.as_str()))
            .find(|p| p.metadata.namespace.as_ref().is_none_or(|n| *n == ns))
            .map(|p| Some(p.spec.clone()))
            .ok_or_else(|| r.name.clone())
    }
}
