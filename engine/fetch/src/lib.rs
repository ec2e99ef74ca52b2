//! Model sources: the step before an engine starts (`tidegate-engine fetch-model`; an init
//! container in a cluster, the same command in local mode) that brings a fetched model
//! (`s3://`, `hf://`) into a cache folder the engine then reads as a plain directory.
//!
//! Invariants:
//! - What the engine reads is whole and verified: every file reaches its name by rename
//!   after its size (and the source's checksum, where it has one) matched.
//! - A fetch interrupted anywhere resumes where it stopped, for the same content only.
//! - A failure is one line naming the URI and the cause ([`error::FetchError`]), which the
//!   operator puts in the pool's status.
//! - Credentials come from the environment only, never from flags or logs.

pub mod cli;
mod download;
pub mod error;
pub mod hf;
pub mod hf_cache;
mod http;
mod manifest;
pub mod s3;

use std::path::PathBuf;

use tidegate_api::model_uri::ModelUri;

pub use error::{Cause, FetchError};
pub use manifest::MANIFEST;

/// Credentials for the source (from the environment).
#[derive(Clone, Default)]
pub struct Credentials {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub hf_token: Option<String>,
}

/// One fetch.
#[derive(Clone)]
pub struct FetchRequest {
    pub uri: String,
    pub dest: PathBuf,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub credentials: Credentials,
    /// `HF_HOME`; None: the hub tools' default.
    pub hf_home: Option<PathBuf>,
    pub offline: bool,
}

/// Fetches `req.uri` into `req.dest`.
pub async fn fetch(req: &FetchRequest) -> Result<(), FetchError> {
    let fail = |cause| FetchError {
        uri: req.uri.clone(),
        cause,
    };
    let kind = ModelUri::parse(&req.uri).map_err(|e| fail(Cause::Other(e.to_string())))?;
    match kind {
        ModelUri::S3 { bucket, prefix } => {
            let opts = s3::S3Options {
                endpoint: req.endpoint.clone(),
                region: req.region.clone(),
                credentials: req.credentials.clone(),
            };
            std::fs::create_dir_all(&req.dest).map_err(|e| fail(Cause::io(&req.dest, e)))?;
            s3::fetch(&req.uri, bucket, prefix, &opts, &req.dest)
                .await
                .map_err(fail)
        }
        ModelUri::Hf { repo, revision } => {
            let cache = match &req.hf_home {
                Some(home) => hf_cache::HubCache::at(home.join("hub")),
                None => hf_cache::HubCache::from_env(),
            };
            let opts = hf::HfOptions {
                endpoint: req.endpoint.clone(),
                token: req.credentials.hf_token.clone(),
                offline: req.offline,
            };
            hf::fetch(repo, revision, &opts, &cache, &req.dest)
                .await
                .map_err(fail)
        }
        _ => Err(fail(Cause::Other(
            "not a fetched model (file://, pvc:// and oci:// are read in place)".into(),
        ))),
    }
}
