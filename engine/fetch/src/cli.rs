//! `tidegate-engine fetch-model`: the flags and variables of the launch contract
//! (`tidegate_api::fetch_launch`), parsed here and nowhere else.

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use tidegate_api::fetch_launch::{env, flag};
use tidegate_http::logging::{LogFormat, init_logging};

use crate::{Credentials, FetchRequest};

/// Fetch a model (`s3://`, `hf://`) into a folder before the engine starts: resumable,
/// verified, atomic. Exits non-zero with the URI and the cause on the last line (and in
/// `--message-file`).
#[derive(clap::Args, Debug, Clone)]
pub struct FetchArgs {
    /// The model URI (`s3://BUCKET/PREFIX`, `hf://ORG/NAME[@REVISION]`).
    #[arg(long = flag::URI)]
    pub uri: String,
    /// Folder the model is written to (an `hf://` model: a link to its cache snapshot).
    #[arg(long = flag::DEST)]
    pub dest: PathBuf,
    /// An S3-compatible store's URL, or a Hugging Face hub mirror.
    #[arg(long = flag::ENDPOINT)]
    pub endpoint: Option<String>,
    /// The S3 bucket's region.
    #[arg(long = flag::REGION)]
    pub region: Option<String>,
    /// A file the failure's one-line cause is written to (a pod's termination message).
    #[arg(long = flag::MESSAGE_FILE)]
    pub message_file: Option<PathBuf>,
    /// Log line format.
    #[arg(long = flag::LOG_FORMAT, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub secrets: FetchSecrets,
    /// The Hugging Face cache root (`$HF_HOME/hub/…`).
    #[arg(long = "hf-home", env = env::HF_HOME)]
    pub hf_home: Option<PathBuf>,
    /// Serve `hf://` models from the cache only.
    #[arg(long = "hf-offline", env = env::HF_HUB_OFFLINE, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new(), default_value = "false")]
    pub offline: bool,
}

/// Credentials: variables only (never flags, so they stay out of `ps` and pod specs).
#[derive(clap::Args, Clone, Default)]
pub struct FetchSecrets {
    #[arg(long = "aws-access-key-id", env = env::AWS_ACCESS_KEY_ID, hide = true, hide_env_values = true)]
    pub access_key_id: Option<String>,
    #[arg(long = "aws-secret-access-key", env = env::AWS_SECRET_ACCESS_KEY, hide = true, hide_env_values = true)]
    pub secret_access_key: Option<String>,
    #[arg(long = "aws-session-token", env = env::AWS_SESSION_TOKEN, hide = true, hide_env_values = true)]
    pub session_token: Option<String>,
    #[arg(long = "hf-token", env = env::HF_TOKEN, hide = true, hide_env_values = true)]
    pub hf_token: Option<String>,
}

impl std::fmt::Debug for FetchSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FetchSecrets(..)")
    }
}

/// Runs the fetch; on failure writes the message file and returns the error.
pub fn run(args: FetchArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let req = FetchRequest {
        uri: args.uri.clone(),
        dest: args.dest.clone(),
        endpoint: args.endpoint.clone(),
        region: args.region.clone(),
        credentials: Credentials {
            access_key_id: args.secrets.access_key_id.clone(),
            secret_access_key: args.secrets.secret_access_key.clone(),
            session_token: args.secrets.session_token.clone(),
            hf_token: args.secrets.hf_token.clone(),
        },
        hf_home: args.hf_home.clone(),
        offline: args.offline,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match runtime.block_on(crate::fetch(&req)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let message = format!("model fetch failed: {e}");
            tracing::error!("{message}");
            if let Some(file) = &args.message_file {
                // Kubernetes keeps at most 4 KiB of a termination message.
                let cut: String = message.chars().take(3800).collect();
                let _ = std::fs::write(file, cut);
            }
            Err(anyhow::anyhow!(message))
        }
    }
}
