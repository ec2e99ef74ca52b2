//! The local runtime's engine book: which engine processes run for which pool, on which
//! ports, with which admin token. The runtime rewrites it whenever that changes, so an
//! operator that was killed (its engines keep running, as a Deployment's pods outlive a
//! crashed controller) is followed by one that adopts them instead of starting the pool
//! from nothing.
//!
//! Invariants: the file is written then renamed (never torn) and readable by its owner only
//! (it holds the admin token); a book that cannot be read adopts nothing.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tracing::warn;

/// Everything a later runtime needs to take over.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineBook {
    /// The token the engines' admin API accepts.
    pub admin_token: String,
    pub pools: Vec<PoolEntry>,
}

/// One pool's engines.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolEntry {
    pub namespace: String,
    pub name: String,
    /// Replicas asked for.
    pub desired: i32,
    /// Index of the next replica's name.
    pub next_index: u32,
    pub replicas: Vec<ReplicaEntry>,
    /// The pool's router process (books written before routers existed have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<ReplicaEntry>,
}

/// One engine process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaEntry {
    pub name: String,
    pub pid: u32,
    pub api_port: u16,
    pub admin_port: u16,
}

impl EngineBook {
    /// The book at `path`; none when there is no file or it cannot be read (logged).
    pub fn load(path: &Path) -> Option<EngineBook> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                warn!(path = %path.display(), error = %e, "cannot read the engine book; adopting no engine");
                return None;
            }
        };
        serde_json::from_str(&text)
            .inspect_err(|e| warn!(path = %path.display(), error = %e, "engine book does not parse; adopting no engine"))
            .ok()
    }

    /// Writes the book to `path` (then renames it into place), readable by its owner only.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("tmp");
        write_private(&tmp, text.as_bytes())?;
        std::fs::rename(&tmp, path)
    }
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_book_loads_back_and_a_broken_one_adopts_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("engines.json");
        assert_eq!(EngineBook::load(&path), None, "no file yet");
        let book = EngineBook {
            admin_token: "secret".into(),
            pools: vec![PoolEntry {
                namespace: "ns".into(),
                name: "p".into(),
                desired: 2,
                next_index: 3,
                replicas: vec![ReplicaEntry {
                    name: "p-2".into(),
                    pid: 42,
                    api_port: 20001,
                    admin_port: 20002,
                }],
                router: None,
            }],
        };
        book.save(&path).expect("save");
        assert_eq!(EngineBook::load(&path), Some(book));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o077, 0, "the admin token is the owner's only");
        }
        std::fs::write(&path, "{not json").expect("write");
        assert_eq!(EngineBook::load(&path), None);
    }
}
