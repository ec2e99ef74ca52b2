//! `s3://BUCKET/PREFIX`: every object under the prefix (or the one object the prefix names),
//! from any S3-compatible store, through object_store's S3 client (signing, listing,
//! retries with backoff).
//!
//! Invariants:
//! - Each object is written under `dest` at its path relative to the prefix, whole and
//!   verified (size; MD5 when the ETag is a single-part object's); an object already there
//!   with the size and ETag the last fetch recorded is not downloaded again.
//! - A partial download resumes only for the same ETag (a GET with `If-Match`), so an object
//!   replaced in between is started over, never spliced.
//! - Files an earlier fetch wrote that are no longer under the prefix are removed: the
//!   folder is the prefix as it is now.

use std::path::{Path, PathBuf};

use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as StorePath;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt};
use tracing::info;

use crate::download::{Checksum, Partial};
use crate::error::Cause;
use crate::manifest::{Manifest, ManifestEntry};

/// Where and how to reach the store.
#[derive(Clone, Default)]
pub struct S3Options {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub credentials: crate::Credentials,
}

/// Fetches `s3://bucket/prefix` into `dest`.
pub async fn fetch(
    uri: &str,
    bucket: &str,
    prefix: &str,
    opts: &S3Options,
    dest: &Path,
) -> Result<(), Cause> {
    let store = store(bucket, opts)?;
    let prefix = prefix.trim_matches('/');
    let objects = list(&store, prefix).await?;
    let total: u64 = objects.iter().map(|(_, m)| m.size).sum();
    info!(%uri, objects = objects.len(), bytes = total, dest = %dest.display(), "fetching the model");
    let old = Manifest::load(dest);
    let mut entries = Vec::new();
    for (rel, meta) in &objects {
        let entry = ManifestEntry {
            path: rel.clone(),
            size: meta.size,
            version: meta.e_tag.clone().unwrap_or_default(),
        };
        let target = dest.join(rel);
        if old.as_ref().is_some_and(|m| m.has(&entry)) && file_size(&target) == Some(meta.size) {
            info!(file = %rel, "already fetched");
        } else {
            download(&store, meta, rel, dest, &target).await?;
        }
        entries.push(entry);
    }
    Manifest {
        uri: uri.to_string(),
        files: entries,
    }
    .commit(dest, old.as_ref())
}

/// The S3 client: the pool's endpoint and region over the environment's credentials
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, or the ambient
/// identity), path-style requests, plain HTTP only for an `http://` endpoint.
pub fn store(bucket: &str, opts: &S3Options) -> Result<AmazonS3, Cause> {
    let mut b = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_http_connector(crate::http::Connector);
    b = b.with_region(opts.region.as_deref().unwrap_or("us-east-1"));
    let c = &opts.credentials;
    if let (Some(id), Some(secret)) = (&c.access_key_id, &c.secret_access_key) {
        b = b.with_access_key_id(id).with_secret_access_key(secret);
        if let Some(t) = &c.session_token {
            b = b.with_token(t);
        }
    }
    if let Some(e) = &opts.endpoint {
        b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
    }
    b.build().map_err(Cause::from_store)
}

/// The objects to fetch, by path relative to the prefix: everything under `prefix/`, or the
/// single object named `prefix`. Nothing at all is a NotFound.
async fn list(store: &AmazonS3, prefix: &str) -> Result<Vec<(String, ObjectMeta)>, Cause> {
    let root = StorePath::from(prefix);
    let mut found = Vec::new();
    let mut stream = store.list(Some(&root));
    while let Some(meta) = stream.next().await {
        let meta = meta.map_err(Cause::from_store)?;
        let rel = relative(prefix, meta.location.as_ref());
        if !rel.is_empty() && !rel.split('/').any(|s| s == ".." || s.starts_with('.')) {
            found.push((rel, meta));
        }
    }
    if found.is_empty() && !prefix.is_empty() {
        // The prefix may name one object (s3://bucket/model.gguf).
        let meta = store.head(&root).await.map_err(|e| match e {
            object_store::Error::NotFound { .. } => {
                Cause::NotFound(format!("no object under {prefix:?}"))
            }
            e => Cause::from_store(e),
        })?;
        let name = prefix.rsplit('/').next().unwrap_or(prefix).to_string();
        found.push((name, meta));
    }
    if found.is_empty() {
        return Err(Cause::NotFound("the bucket is empty".into()));
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

fn relative(prefix: &str, location: &str) -> String {
    let rest = location.strip_prefix(prefix).unwrap_or(location);
    rest.trim_start_matches('/').to_string()
}

fn file_size(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|m| m.len())
}

/// An ETag that is the object's MD5: 32 hex digits (a multipart upload's has `-N`, an
/// SSE-KMS object's is not its MD5 either and is not recognisable; such a mismatch fails
/// the fetch, and says so).
fn etag_checksum(etag: Option<&str>) -> Checksum {
    let Some(t) = etag.map(|t| t.trim_matches('"')) else {
        return Checksum::None;
    };
    if t.len() == 32 && t.chars().all(|c| c.is_ascii_hexdigit()) {
        Checksum::Md5(t.to_string())
    } else {
        Checksum::None
    }
}

/// The partial file of an object: named by its ETag, so only the same version resumes.
pub fn partial_path(dest: &Path, rel: &str, etag: Option<&str>) -> PathBuf {
    let tag: String = etag
        .unwrap_or("none")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let flat = rel.replace('/', "%");
    dest.join(crate::manifest::PARTIAL_DIR)
        .join(format!("{flat}.{tag}.part"))
}

async fn download(
    store: &AmazonS3,
    meta: &ObjectMeta,
    rel: &str,
    dest: &Path,
    target: &Path,
) -> Result<(), Cause> {
    let etag = meta.e_tag.as_deref();
    let checksum = etag_checksum(etag);
    let part = partial_path(dest, rel, etag);
    let mut p = Partial::open(&part, &checksum, meta.size, rel).await?;
    if p.offset() < meta.size {
        let opts = GetOptions {
            range: (p.offset() > 0).then(|| GetRange::Offset(p.offset())),
            if_match: meta.e_tag.clone(),
            ..GetOptions::default()
        };
        let res = store
            .get_opts(&meta.location, opts)
            .await
            .map_err(Cause::from_store)?;
        let mut body = res.into_stream();
        while let Some(chunk) = body.next().await {
            p.write(&chunk.map_err(Cause::from_store)?).await?;
        }
    }
    p.finish(meta.size, &checksum, target).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_single_part_etag_is_an_md5() {
        assert_eq!(
            etag_checksum(Some("\"5d41402abc4b2a76b9719d911017c592\"")),
            Checksum::Md5("5d41402abc4b2a76b9719d911017c592".into())
        );
        assert_eq!(
            etag_checksum(Some("\"5d41402abc4b2a76b9719d911017c592-3\"")),
            Checksum::None
        );
        assert_eq!(etag_checksum(None), Checksum::None);
    }

    #[test]
    fn objects_are_placed_relative_to_the_prefix() {
        assert_eq!(relative("m/tiny", "m/tiny/config.json"), "config.json");
        assert_eq!(relative("m/tiny", "m/tiny/sub/a.bin"), "sub/a.bin");
        assert_eq!(relative("", "a.gguf"), "a.gguf");
    }
}
