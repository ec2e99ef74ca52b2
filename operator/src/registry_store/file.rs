//! RegistryStore on this machine: each pool's admitted-tenant registry in a file under a
//! state folder (`<namespace>_<name>.tenants.bin`), for local mode and `run --workload local`.
//!
//! Registry files are small and written once per change; plain blocking I/O is fine here.
//! Invariants: a save is written then renamed, so a crash never leaves a torn registry; a
//! missing file is an empty registry, an unreadable one an error (never silently emptied).

use std::path::{Path, PathBuf};

use crate::ports::{PoolRef, RegistryError, RegistryStore};
use crate::registry::Registry;

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
