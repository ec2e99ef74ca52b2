//! The admin API's protection, the same for the engine and the router: a bearer token (from a
//! file or the environment) or an explicit opt-out, never an open admin API by default.
//!
//! Invariant: a token is compared in constant time and never printed (`Debug` redacts it).

use std::path::PathBuf;

use anyhow::{Context, bail};
use axum::http::{HeaderMap, header};
use clap::Args;
use tidegate_api::engine_launch::env as launch_env;
use tidegate_api::router::env as router_env;

use crate::error::ApiError;

/// An admin API without a token or an explicit --admin-disabled (the engine's and the
/// router's start errors say the same).
pub const ADMIN_TOKEN_MISSING: &str = "the admin API needs a token: pass --admin-token-file or \
     set TIDEGATE_ADMIN_TOKEN (or disable the admin API explicitly with --admin-disabled)";

/// How the admin API is protected.
#[derive(Clone)]
pub enum AdminAuth {
    /// Bearer token every admin request must carry.
    Token(String),
    /// No admin API at all (explicit opt-out; nothing listens).
    Disabled,
}

impl std::fmt::Debug for AdminAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminAuth::Token(_) => f.write_str("Token(<redacted>)"),
            AdminAuth::Disabled => f.write_str("Disabled"),
        }
    }
}

/// Checks `headers` for `Authorization: Bearer <token>` (constant-time compare); the admin
/// APIs of the engine and of the router both use it.
pub fn check_bearer(headers: &HeaderMap, token: Option<&str>) -> Result<(), ApiError> {
    let Some(token) = token else {
        return Err(ApiError::AdminUnauthorized);
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(p) if crate::tenancy::same_secret(p.as_bytes(), token.as_bytes()) => Ok(()),
        _ => Err(ApiError::AdminUnauthorized),
    }
}

/// The admin token and the router token, as the engine and the router both take them.
#[derive(Debug, Args)]
pub struct AdminFlags {
    /// File holding the admin bearer token.
    #[arg(long, env = "TIDEGATE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// The admin bearer token itself (prefer the file; this is read from the environment).
    #[arg(long, env = launch_env::ADMIN_TOKEN, hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Run without an admin API (nothing listens on --admin-listen).
    #[arg(long, env = "TIDEGATE_ADMIN_DISABLED")]
    pub admin_disabled: bool,
    /// The pool router's shared secret (read from the environment): the engine believes the
    /// router's tenant and tier headers only from a request that carries it, and the router
    /// sends them only when it has it.
    #[arg(long, env = router_env::ROUTER_TOKEN, hide_env_values = true)]
    pub router_token: Option<String>,
}

impl AdminFlags {
    /// The router token, when one is set and not blank.
    pub fn router_token(&self) -> Option<String> {
        self.router_token
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    }

    /// The admin API's protection: disabled, or the token (refused when missing or empty).
    pub fn admin_auth(&self) -> anyhow::Result<AdminAuth> {
        if self.admin_disabled {
            return Ok(AdminAuth::Disabled);
        }
        read_admin_token(
            self.admin_token_file.as_deref(),
            self.admin_token.as_deref(),
        )
    }
}

fn read_admin_token(
    token_file: Option<&std::path::Path>,
    token: Option<&str>,
) -> anyhow::Result<AdminAuth> {
    let token = match (token_file, token) {
        (Some(path), _) => std::fs::read_to_string(path)
            .with_context(|| format!("reading admin token file {}", path.display()))?,
        (None, Some(token)) => token.to_string(),
        (None, None) => bail!("{ADMIN_TOKEN_MISSING}"),
    };
    let token = token.trim().to_string();
    if token.is_empty() {
        bail!("the admin token is empty: {ADMIN_TOKEN_MISSING}");
    }
    Ok(AdminAuth::Token(token))
}
