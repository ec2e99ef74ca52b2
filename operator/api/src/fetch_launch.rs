//! The model-fetch launch contract: how a pool whose model is fetched (`s3://`, `hf://`)
//! becomes the command line and environment of `tidegate-engine fetch-model`, the step that
//! runs before the engine (an init container in a cluster, a process before the engine's in
//! local mode), and where the engine then finds the model.
//!
//! One definition, three users, as for the engine's own launch ([`crate::engine_launch`]):
//! the fetch CLI declares its flags and variables with the names in [`flag`] and [`env`],
//! both workload runtimes call [`fetch_launch`], and `operator/tests/launch_contract.rs`
//! parses what it produces with the engine's own parser.
//!
//! Invariants:
//! - The model lands in `{cache_dir}/{cache_key(uri)}` ([`model_dest`]); that path is the
//!   engine's `--model`, known before the fetch runs.
//! - Credentials never travel as flags: they are variables whose values come from the pool's
//!   `model.source.credentialsSecret` (a Secret reference in a cluster, read by the runtime
//!   in local mode), under the names the stores' own tools use.

use crate::inference_pool::InferencePoolSpec;
use crate::launch_args::Args;
use crate::model_uri::{BadModelUri, ModelUri, cache_key};

/// The subcommand of the fetch step.
pub const FETCH_MODEL: &str = "fetch-model";

/// Long flag names of `tidegate-engine fetch-model` (without the leading `--`).
pub mod flag {
    /// The pool's `model.uri`.
    pub const URI: &str = "uri";
    /// The folder the model is written to (the engine's `--model`).
    pub const DEST: &str = "dest";
    /// `model.source.endpoint`: an S3-compatible store, or a Hugging Face hub mirror.
    pub const ENDPOINT: &str = "endpoint";
    /// `model.source.region` (S3).
    pub const REGION: &str = "region";
    /// Where a failure's one-line cause is written (a pod's termination message).
    pub const MESSAGE_FILE: &str = "message-file";
    pub const LOG_FORMAT: &str = "log-format";
}

/// Environment variables of `tidegate-engine fetch-model`.
pub mod env {
    /// S3 access key (the Secret's key of the same name).
    pub const AWS_ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
    /// S3 secret key (the Secret's key of the same name).
    pub const AWS_SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
    /// Optional S3 session token (the Secret's key of the same name).
    pub const AWS_SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";
    /// Hugging Face token (the Secret's key of the same name).
    pub const HF_TOKEN: &str = "HF_TOKEN";
    /// The Hugging Face cache root (`$HF_HOME/hub/models--ORG--NAME/...`), as the hub's tools
    /// read it.
    pub const HF_HOME: &str = "HF_HOME";
    /// `1`: never call the hub, serve from the cache only (as the hub's tools read it).
    pub const HF_HUB_OFFLINE: &str = "HF_HUB_OFFLINE";
}

/// The value of one variable of the fetch step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchEnvValue {
    Literal(String),
    /// A key of the pool's credentials Secret (`model.source.credentialsSecret`); an
    /// optional one may be missing from it.
    SecretKey {
        secret: String,
        key: &'static str,
        optional: bool,
    },
}

/// Where the fetch runs: what differs between a pod and local mode.
#[derive(Clone, Debug)]
pub struct FetchSite {
    /// The model cache folder (a pod's cache volume, local mode's state folder).
    pub cache_dir: String,
    /// `HF_HOME` to set; None leaves the process's own (local mode: the user's cache).
    pub hf_home: Option<String>,
    /// Where a failure's cause is written; None: the log only.
    pub message_file: Option<String>,
    /// `json` in a cluster, `text` on a terminal.
    pub log_format: &'static str,
}

/// The fetch step's command line (starting with the subcommand) and environment, and where
/// the model will be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchLaunch {
    pub args: Vec<String>,
    pub env: Vec<(&'static str, FetchEnvValue)>,
    /// The folder the fetch writes: the engine's `--model`.
    pub dest: String,
}

/// Where a fetched model lands under `cache_dir`.
pub fn model_dest(cache_dir: &str, uri: &str) -> String {
    format!("{}/{}", cache_dir.trim_end_matches('/'), cache_key(uri))
}

/// The fetch step of `spec` at `site`; None when its model is read in place.
pub fn fetch_launch(
    spec: &InferencePoolSpec,
    site: &FetchSite,
) -> Result<Option<FetchLaunch>, BadModelUri> {
    let uri = &spec.model.uri;
    let kind = ModelUri::parse(uri)?;
    if !kind.is_fetched() {
        return Ok(None);
    }
    let source = spec.model.source.clone().unwrap_or_default();
    let dest = model_dest(&site.cache_dir, uri);
    let mut a = Args(vec![FETCH_MODEL.to_string()]);
    a.flag(flag::URI, uri);
    a.flag(flag::DEST, &dest);
    if let Some(endpoint) = &source.endpoint {
        a.flag(flag::ENDPOINT, endpoint);
    }
    if let Some(region) = &source.region {
        a.flag(flag::REGION, region);
    }
    if let Some(file) = &site.message_file {
        a.flag(flag::MESSAGE_FILE, file);
    }
    a.flag(flag::LOG_FORMAT, site.log_format);
    let mut vars = Vec::new();
    if let Some(home) = &site.hf_home
        && matches!(kind, ModelUri::Hf { .. })
    {
        vars.push((env::HF_HOME, FetchEnvValue::Literal(home.clone())));
    }
    if let Some(secret) = &source.credentials_secret {
        let key = |key, optional| FetchEnvValue::SecretKey {
            secret: secret.clone(),
            key,
            optional,
        };
        match kind {
            ModelUri::S3 { .. } => {
                vars.push((env::AWS_ACCESS_KEY_ID, key(env::AWS_ACCESS_KEY_ID, false)));
                vars.push((
                    env::AWS_SECRET_ACCESS_KEY,
                    key(env::AWS_SECRET_ACCESS_KEY, false),
                ));
                vars.push((env::AWS_SESSION_TOKEN, key(env::AWS_SESSION_TOKEN, true)));
            }
            _ => vars.push((env::HF_TOKEN, key(env::HF_TOKEN, false))),
        }
    }
    Ok(Some(FetchLaunch {
        args: a.0,
        env: vars,
        dest,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(model: serde_json::Value) -> InferencePoolSpec {
        serde_json::from_value(serde_json::json!({
            "model": model,
            "engine": {"image": "img"},
            "replicas": {"min": 1, "max": 2}
        }))
        .expect("spec")
    }

    fn site() -> FetchSite {
        FetchSite {
            cache_dir: "/cache/".into(),
            hf_home: Some("/cache/hf".into()),
            message_file: Some("/dev/termination-log".into()),
            log_format: "json",
        }
    }

    #[test]
    fn a_model_read_in_place_has_no_fetch_step() {
        let s = spec(serde_json::json!({"name": "m", "uri": "pvc://w/m"}));
        assert_eq!(fetch_launch(&s, &site()), Ok(None));
    }

    #[test]
    fn an_s3_model_fetches_into_its_cache_folder_with_keys_from_the_secret() {
        let s = spec(
            serde_json::json!({"name": "m", "uri": "s3://b/p", "source": {
            "credentialsSecret": "creds", "endpoint": "http://s3:8333", "region": "eu-1"}}),
        );
        let l = fetch_launch(&s, &site()).expect("ok").expect("fetched");
        assert_eq!(l.dest, format!("/cache/{}", cache_key("s3://b/p")));
        assert_eq!(l.args[0], FETCH_MODEL);
        let joined = l.args.join(" ");
        assert!(joined.contains("--uri s3://b/p"), "{joined}");
        assert!(joined.contains("--endpoint http://s3:8333 --region eu-1"));
        assert!(joined.contains("--message-file /dev/termination-log"));
        let names: Vec<&str> = l.env.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                env::AWS_ACCESS_KEY_ID,
                env::AWS_SECRET_ACCESS_KEY,
                env::AWS_SESSION_TOKEN
            ],
            "no HF_HOME for S3"
        );
        assert!(matches!(
            &l.env[2].1,
            FetchEnvValue::SecretKey { optional: true, .. }
        ));
    }

    #[test]
    fn an_hf_model_gets_the_cache_root_and_its_token() {
        let s = spec(serde_json::json!({"name": "m", "uri": "hf://org/m@v1",
            "source": {"credentialsSecret": "hf"}}));
        let l = fetch_launch(&s, &site()).expect("ok").expect("fetched");
        assert_eq!(
            l.env,
            vec![
                (env::HF_HOME, FetchEnvValue::Literal("/cache/hf".into())),
                (
                    env::HF_TOKEN,
                    FetchEnvValue::SecretKey {
                        secret: "hf".into(),
                        key: env::HF_TOKEN,
                        optional: false
                    }
                )
            ]
        );
    }
}
