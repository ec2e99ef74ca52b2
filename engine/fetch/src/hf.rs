//! `hf://ORG/NAME[@REVISION]`: a Hugging Face model repository, resolved in the cache first
//! ([`crate::hf_cache`]), downloaded through the hub's HTTP API when it is reachable.
//!
//! - `HF_HUB_OFFLINE=1`: the cache only; a revision it has no snapshot of is an error.
//! - Otherwise the hub is asked which commit the revision is and which files it has
//!   (`/api/models/REPO/revision/REV?blobs=true`); the files the engine reads are
//!   downloaded into the cache (`/REPO/resolve/COMMIT/FILE`, resumed with a Range request),
//!   each checked for its size and, for LFS files, its SHA-256.
//! - A hub that cannot be reached falls back to the cache, and says so.
//!
//! `dest` becomes a symlink to the snapshot folder, replaced atomically.

use std::path::Path;

use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::BodyExt;
use serde::Deserialize;
use tracing::{info, warn};

use crate::download::{Checksum, Partial};
use crate::error::Cause;
use crate::hf_cache::{HubCache, replace_symlink};
use crate::http::Getter;

/// The hub, when no endpoint is given.
pub const HUB: &str = "https://huggingface.co";

/// How the hub is reached.
#[derive(Clone, Debug, Default)]
pub struct HfOptions {
    /// A mirror of the hub (`HF_ENDPOINT`); None: the hub.
    pub endpoint: Option<String>,
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE`: the cache only.
    pub offline: bool,
}

#[derive(Debug, Deserialize)]
struct RepoInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Sibling {
    rfilename: String,
    #[serde(default)]
    blob_id: Option<String>,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    lfs: Option<Lfs>,
}

#[derive(Debug, Deserialize)]
struct Lfs {
    sha256: String,
    size: u64,
}

/// Fetches the repository's files into the cache and points `dest` at the snapshot.
pub async fn fetch(
    repo: &str,
    revision: &str,
    opts: &HfOptions,
    cache: &HubCache,
    dest: &Path,
) -> Result<(), Cause> {
    let commit = if opts.offline {
        info!(repo, revision, cache = %cache.root().display(), "HF_HUB_OFFLINE: serving from the cache only");
        from_cache(repo, revision, cache, "HF_HUB_OFFLINE is set")?
    } else {
        let getter = Getter::new().map_err(|e| Cause::Other(format!("TLS setup: {e}")))?;
        match repo_info(&getter, repo, revision, opts).await {
            Ok(info) => download(&getter, repo, revision, &info, opts, cache).await?,
            Err(Cause::Unreachable(why)) => {
                warn!(repo, %why, "the hub cannot be reached; serving from the cache");
                from_cache(
                    repo,
                    revision,
                    cache,
                    &format!("the hub cannot be reached: {why}"),
                )?
            }
            Err(e) => return Err(e),
        }
    };
    let snapshot = cache.snapshot(repo, &commit);
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Cause::io(dir, e))?;
    }
    replace_symlink(&snapshot, dest)?;
    info!(repo, revision, commit, dest = %dest.display(), snapshot = %snapshot.display(), "model ready");
    Ok(())
}

/// The cached commit of `revision`, whose snapshot links resolve.
fn from_cache(repo: &str, revision: &str, cache: &HubCache, why: &str) -> Result<String, Cause> {
    let commit = cache.resolve(repo, revision).ok_or_else(|| {
        Cause::NotCached(format!(
            "{why}; {} has no ref {revision:?}",
            cache.root().display()
        ))
    })?;
    let files = cache.snapshot_files(repo, &commit)?;
    info!(
        repo,
        revision,
        commit,
        files = files.len(),
        "found in the cache"
    );
    Ok(commit)
}

fn base(opts: &HfOptions) -> String {
    opts.endpoint
        .clone()
        .or_else(|| std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()))
        .unwrap_or_else(|| HUB.to_string())
        .trim_end_matches('/')
        .to_string()
}

fn headers(opts: &HfOptions, range_from: u64) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(t) = &opts.token
        && let Ok(v) = HeaderValue::from_str(&format!("Bearer {t}"))
    {
        h.insert(http::header::AUTHORIZATION, v);
    }
    if range_from > 0
        && let Ok(v) = HeaderValue::from_str(&format!("bytes={range_from}-"))
    {
        h.insert(http::header::RANGE, v);
    }
    h
}

/// A refusal by the hub, by status.
fn refused(status: StatusCode, what: &str, opts: &HfOptions) -> Cause {
    match status {
        StatusCode::UNAUTHORIZED if opts.token.is_none() => Cause::NotFound(format!(
            "{what}: 401 (no such repository, or it is private or gated and needs a token: HF_TOKEN)"
        )),
        StatusCode::UNAUTHORIZED => {
            Cause::Denied(format!("{what}: 401, the hub refused the token"))
        }
        StatusCode::FORBIDDEN => Cause::Denied(format!(
            "{what}: 403 (a gated model: accept its terms on the hub with the token's account)"
        )),
        StatusCode::NOT_FOUND => Cause::NotFound(format!("{what}: 404")),
        s => Cause::Other(format!("{what}: the hub answered {s}")),
    }
}

async fn repo_info(
    getter: &Getter,
    repo: &str,
    revision: &str,
    opts: &HfOptions,
) -> Result<RepoInfo, Cause> {
    let rev = revision.replace('/', "%2F");
    let url = format!("{}/api/models/{repo}/revision/{rev}?blobs=true", base(opts));
    let res = getter
        .get(&url, &headers(opts, 0))
        .await
        .map_err(|e| Cause::Unreachable(e.0))?;
    if !res.status().is_success() {
        return Err(refused(
            res.status(),
            &format!("revision {revision:?}"),
            opts,
        ));
    }
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| Cause::Unreachable(crate::http::chain(&e)))?
        .to_bytes();
    serde_json::from_slice(&body)
        .map_err(|e| Cause::Other(format!("the hub's answer for {url}: {e}")))
}

/// Whether the engine reads a file of the repository: top-level configs, tokenizers,
/// templates and weights in the formats it loads (not PyTorch pickles, ONNX, Flax or
/// TensorFlow copies of the same weights).
pub fn wanted(file: &str) -> bool {
    if file.contains('/') || file.starts_with('.') {
        return false;
    }
    let ext = file.rsplit('.').next().unwrap_or_default();
    matches!(
        ext,
        "json" | "safetensors" | "gguf" | "txt" | "model" | "jinja"
    )
}

/// Downloads every wanted file the cache lacks; returns the commit.
async fn download(
    getter: &Getter,
    repo: &str,
    revision: &str,
    info: &RepoInfo,
    opts: &HfOptions,
    cache: &HubCache,
) -> Result<String, Cause> {
    let commit = &info.sha;
    let files: Vec<&Sibling> = info
        .siblings
        .iter()
        .filter(|s| wanted(&s.rfilename))
        .collect();
    if files.is_empty() {
        return Err(Cause::NotFound(format!(
            "revision {revision:?} ({commit}) has no file the engine reads (config.json, *.safetensors, *.gguf, tokenizer files)"
        )));
    }
    info!(
        repo,
        revision,
        commit,
        files = files.len(),
        "fetching from the hub"
    );
    for s in files {
        if cache.has_file(repo, commit, &s.rfilename) {
            continue;
        }
        let (id, size, checksum) = match (&s.lfs, &s.blob_id, s.size) {
            (Some(l), _, _) => (l.sha256.clone(), l.size, Checksum::Sha256(l.sha256.clone())),
            (None, Some(b), Some(size)) => (b.clone(), size, Checksum::None),
            _ => {
                return Err(Cause::Other(format!(
                    "the hub gave no blob id or size for {}",
                    s.rfilename
                )));
            }
        };
        let blob = cache.blob(repo, &id);
        if !blob.is_file() {
            let url = format!("{}/{repo}/resolve/{commit}/{}", base(opts), s.rfilename);
            fetch_blob(
                getter,
                &url,
                &cache.incomplete(repo, &id),
                &blob,
                size,
                &checksum,
                &s.rfilename,
                opts,
            )
            .await?;
        }
        cache.link(repo, commit, &s.rfilename, &id)?;
    }
    cache.write_ref(repo, revision, commit)?;
    Ok(commit.clone())
}

#[allow(clippy::too_many_arguments)]
async fn fetch_blob(
    getter: &Getter,
    url: &str,
    part: &Path,
    blob: &Path,
    size: u64,
    checksum: &Checksum,
    name: &str,
    opts: &HfOptions,
) -> Result<(), Cause> {
    let mut p = Partial::open(part, checksum, size, name).await?;
    if p.offset() < size {
        let res = getter
            .get(url, &headers(opts, p.offset()))
            .await
            .map_err(|e| Cause::Unreachable(e.0))?;
        match res.status() {
            StatusCode::PARTIAL_CONTENT => {}
            StatusCode::OK => p.restart(checksum).await?,
            s => return Err(refused(s, name, opts)),
        }
        let mut body = res.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| Cause::Unreachable(format!("{name}: {}", crate::http::chain(&e))))?;
            if let Some(chunk) = frame.data_ref() {
                p.write(chunk).await?;
            }
        }
    }
    p.finish(size, checksum, blob).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_files_the_engine_reads_are_fetched() {
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "m.Q4_1.gguf",
            "tokenizer.model",
        ] {
            assert!(wanted(f), "{f}");
        }
        for f in [
            "pytorch_model.bin",
            "onnx/model.onnx",
            ".gitattributes",
            "README.md",
            "flax_model.msgpack",
        ] {
            assert!(!wanted(f), "{f}");
        }
    }

    #[test]
    fn a_401_without_a_token_says_a_token_may_be_needed() {
        let e = refused(
            StatusCode::UNAUTHORIZED,
            "revision \"main\"",
            &HfOptions::default(),
        );
        assert!(e.to_string().contains("HF_TOKEN"), "{e}");
        let with = HfOptions {
            token: Some("t".into()),
            ..HfOptions::default()
        };
        assert!(matches!(
            refused(StatusCode::UNAUTHORIZED, "x", &with),
            Cause::Denied(_)
        ));
    }
}
