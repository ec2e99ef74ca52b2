//! The Hugging Face cache, laid out as the hub's own tools write it, so a cache filled by
//! them serves a pool and a cache filled here serves them:
//!
//! ```text
//! $HF_HOME/hub/models--ORG--NAME/
//!   refs/REVISION            the commit a branch or tag pointed to
//!   blobs/ID                 file contents, named by SHA-256 (LFS files) or git blob id
//!   snapshots/COMMIT/FILE -> ../../blobs/ID
//! ```
//!
//! Invariant: a snapshot entry is linked only once its blob is whole and verified (the blob
//! reaches its name by rename, from `blobs/ID.incomplete`, the hub tools' own partial name).

use std::path::{Path, PathBuf};

use crate::error::Cause;

/// The hub cache folder (`…/hub`).
#[derive(Clone, Debug)]
pub struct HubCache {
    root: PathBuf,
}

impl HubCache {
    /// `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
    /// `~/.cache/huggingface/hub`: the hub tools' own order.
    pub fn from_env() -> Self {
        let var = |k| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let root = var("HF_HUB_CACHE")
            .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
            .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
            .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/hub")))
            .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"));
        HubCache { root }
    }

    pub fn at(root: PathBuf) -> Self {
        HubCache { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    /// The commit `revision` names here: itself when it is a commit hash, else the ref the
    /// cache recorded.
    pub fn resolve(&self, repo: &str, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_string());
        }
        let text = std::fs::read_to_string(self.repo_dir(repo).join("refs").join(revision)).ok()?;
        let commit = text.trim().to_string();
        is_commit(&commit).then_some(commit)
    }

    pub fn snapshot(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    pub fn blob(&self, repo: &str, id: &str) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(id)
    }

    /// The partial file of a blob being downloaded.
    pub fn incomplete(&self, repo: &str, id: &str) -> PathBuf {
        self.repo_dir(repo)
            .join("blobs")
            .join(format!("{id}.incomplete"))
    }

    /// Whether `file` of the snapshot is there and its blob too.
    pub fn has_file(&self, repo: &str, commit: &str, file: &str) -> bool {
        self.snapshot(repo, commit).join(file).is_file()
    }

    /// Links `snapshots/COMMIT/FILE` to its blob, relatively, as the hub tools do.
    pub fn link(&self, repo: &str, commit: &str, file: &str, id: &str) -> Result<(), Cause> {
        let link = self.snapshot(repo, commit).join(file);
        let depth = file.matches('/').count() + 2;
        let target = PathBuf::from("../".repeat(depth)).join("blobs").join(id);
        if let Some(dir) = link.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Cause::io(dir, e))?;
        }
        replace_symlink(&target, &link)
    }

    /// Records that `revision` points at `commit` (not for a commit itself).
    pub fn write_ref(&self, repo: &str, revision: &str, commit: &str) -> Result<(), Cause> {
        if is_commit(revision) {
            return Ok(());
        }
        let path = self.repo_dir(repo).join("refs").join(revision);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Cause::io(dir, e))?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, commit).map_err(|e| Cause::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Cause::io(&path, e))
    }

    /// The files of a cached snapshot; an entry whose blob is missing (a dangling link) is
    /// an error naming it.
    pub fn snapshot_files(&self, repo: &str, commit: &str) -> Result<Vec<String>, Cause> {
        let dir = self.snapshot(repo, commit);
        let mut files = Vec::new();
        walk(&dir, &dir, &mut files)?;
        if files.is_empty() {
            return Err(Cause::NotCached(format!("{} holds no file", dir.display())));
        }
        files.sort();
        Ok(files)
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), Cause> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Cause::NotCached(format!("{}: {e}", dir.display())))?;
    for entry in entries {
        let p = entry.map_err(|e| Cause::io(dir, e))?.path();
        if p.is_dir() {
            walk(root, &p, out)?;
        } else if p.is_file() {
            let rel = p.strip_prefix(root).unwrap_or(&p);
            out.push(rel.to_string_lossy().into_owned());
        } else {
            return Err(Cause::NotCached(format!(
                "{}: its blob is missing from the cache",
                p.display()
            )));
        }
    }
    Ok(())
}

/// A 40-hex-digit git commit id.
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// Points `link` at `target`, atomically (a new link, then a rename over the old one).
pub fn replace_symlink(target: &Path, link: &Path) -> Result<(), Cause> {
    let tmp = link.with_extension("link.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).map_err(|e| Cause::io(&tmp, e))?;
    std::fs::rename(&tmp, link).map_err(|e| Cause::io(link, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn a_linked_snapshot_resolves_through_its_ref() {
        let dir = tempfile::tempdir().unwrap();
        let cache = HubCache::at(dir.path().to_path_buf());
        let blob = cache.blob("org/m", "abc");
        std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
        std::fs::write(&blob, b"{}").unwrap();
        cache.link("org/m", C, "config.json", "abc").unwrap();
        cache.link("org/m", C, "sub/x.json", "abc").unwrap();
        cache.write_ref("org/m", "main", C).unwrap();
        assert_eq!(cache.resolve("org/m", "main").as_deref(), Some(C));
        assert_eq!(cache.resolve("org/m", C).as_deref(), Some(C));
        assert_eq!(
            cache.snapshot_files("org/m", C).unwrap(),
            ["config.json", "sub/x.json"]
        );
        assert!(dir.path().join("models--org--m/refs/main").is_file());
    }

    #[test]
    fn a_dangling_snapshot_entry_is_not_a_cached_model() {
        let dir = tempfile::tempdir().unwrap();
        let cache = HubCache::at(dir.path().to_path_buf());
        cache.link("org/m", C, "model.safetensors", "gone").unwrap();
        let e = cache.snapshot_files("org/m", C).unwrap_err();
        assert!(e.to_string().contains("blob is missing"), "{e}");
    }
}
