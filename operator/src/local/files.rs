//! Local mode's desired state and registry: InferencePool and TierPolicy YAML read from
//! files (the same manifests a cluster takes), and the tenant registry kept in a file.
//!
//! Registry files are small and written once per change; plain blocking I/O is fine here.
//! Invariant: a manifest that does not parse is reported with its file name and refused;
//! nothing is half-loaded.

use std::path::{Path, PathBuf};

use tidegate_api::{InferencePool, TierPolicy};

use crate::ports::{PoolRef, RegistryError, RegistryStore};
use crate::registry::Registry;

/// Pools and policies found in files.
#[derive(Debug, Default)]
pub struct Manifests {
    pub pools: Vec<InferencePool>,
    pub policies: Vec<TierPolicy>,
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
                _ => {}
            }
        }
    }
    Ok(out)
}

/// The registry of each pool in a file under a state folder.
pub struct FileRegistry {
    dir: PathBuf,
}

impl FileRegistry {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileRegistry { dir: dir.into() }
    }

    fn path(&self, pool: &PoolRef) -> PathBuf {
        self.dir
            .join(format!("{}_{}.tenants.bin", pool.namespace, pool.name))
    }
}

fn io_err(p: &Path, e: impl std::fmt::Display) -> RegistryError {
    RegistryError(format!("{}: {e}", p.display()))
}

impl RegistryStore for FileRegistry {
    async fn load(&self, pool: &PoolRef) -> Result<Registry, RegistryError> {
        let p = self.path(pool);
        match std::fs::read(&p) {
            Ok(bytes) => Registry::decode(&bytes).map_err(|e| io_err(&p, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Registry::default()),
            Err(e) => Err(io_err(&p, e)),
        }
    }

    async fn save(&self, pool: &PoolRef, registry: &Registry) -> Result<(), RegistryError> {
        let p = self.path(pool);
        std::fs::create_dir_all(&self.dir).map_err(|e| io_err(&self.dir, e))?;
        // Write then rename, so a crash never leaves a torn registry.
        let tmp = p.with_extension("tmp");
        std::fs::write(&tmp, registry.encode()).map_err(|e| io_err(&tmp, e))?;
        std::fs::rename(&tmp, &p).map_err(|e| io_err(&p, e))
    }
}
