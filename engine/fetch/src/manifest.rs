//! The record a finished fetch leaves in its folder: which files it wrote, at which size
//! and version (S3's ETag), so the next fetch skips what is already there and removes what
//! the source no longer has.
//!
//! Invariant: the manifest is written last (temp + rename): a folder with a manifest holds
//! every file it lists, whole.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tracing::info;

use crate::error::Cause;

/// The manifest's file name in a fetched folder.
pub const MANIFEST: &str = ".tidegate-fetch.json";
/// Where partial downloads wait, inside the fetched folder (same filesystem: renames are
/// atomic).
pub const PARTIAL_DIR: &str = ".partial";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub path: String,
    pub size: u64,
    pub version: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub uri: String,
    pub files: Vec<ManifestEntry>,
}

impl Manifest {
    /// The manifest of an earlier fetch into `dir`, if one finished.
    pub fn load(dir: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(dir.join(MANIFEST)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Whether the earlier fetch wrote this file at this size and version.
    pub fn has(&self, e: &ManifestEntry) -> bool {
        !e.version.is_empty() && self.files.contains(e)
    }

    /// Records this fetch as finished: removes the files of `old` the source no longer has
    /// and the partial folder, then writes the manifest (temp + rename).
    pub fn commit(&self, dir: &Path, old: Option<&Manifest>) -> Result<(), Cause> {
        for gone in old.iter().flat_map(|m| &m.files) {
            if !self.files.iter().any(|f| f.path == gone.path) {
                let p = dir.join(&gone.path);
                info!(file = %gone.path, "removing a file the source no longer has");
                std::fs::remove_file(&p)
                    .or_else(not_found_ok)
                    .map_err(|e| Cause::io(&p, e))?;
            }
        }
        let partial = dir.join(PARTIAL_DIR);
        std::fs::remove_dir_all(&partial)
            .or_else(not_found_ok)
            .map_err(|e| Cause::io(&partial, e))?;
        let text = serde_json::to_string_pretty(self).map_err(|e| Cause::Other(e.to_string()))?;
        let tmp = dir.join(format!("{MANIFEST}.tmp"));
        std::fs::write(&tmp, text).map_err(|e| Cause::io(&tmp, e))?;
        let path = dir.join(MANIFEST);
        std::fs::rename(&tmp, &path).map_err(|e| Cause::io(&path, e))
    }
}

fn not_found_ok(e: std::io::Error) -> std::io::Result<()> {
    if e.kind() == std::io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}
