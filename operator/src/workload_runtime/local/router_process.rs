//! The pool router as a local process: `tidegate-engine route` on loopback ports, its
//! command line from the router contract (`tidegate_api::router::router_args`) as a router
//! pod's is, and the same admin token as the engines (it proves the router to them).
//!
//! Invariants: one router per pool, started at the pool's first apply (a pool at zero
//! replicas has a router, which holds requests until an engine is ready); it gets no static
//! engines: the driver pushes the engine set every tick, as in a cluster.

use std::path::Path;

use tidegate_api::InferencePoolSpec;
use tidegate_api::engine_launch::env as engine_env;
use tidegate_api::router::{RouterSite, env as router_env, router_args};
use tracing::info;

use super::process::LocalCommand;
use crate::ports::PoolRef;

/// The router's process name in logs and the engine book.
pub fn router_name(pool: &PoolRef) -> String {
    format!("{}-router", pool.name)
}

/// The router's command line and environment at a loopback site.
pub fn router_command(
    engine_bin: &Path,
    admin_token: &str,
    spec: &InferencePoolSpec,
    api_port: u16,
    admin_port: u16,
) -> LocalCommand {
    let site = RouterSite {
        bind_host: "127.0.0.1".to_string(),
        api_port,
        admin_port,
        endpoints: Vec::new(),
        // One router locally: it enforces the whole of each tenant's limits.
        limit_share: 1,
        log_format: "text",
    };
    LocalCommand {
        program: engine_bin.to_path_buf(),
        args: router_args(spec, &site),
        env: vec![
            (engine_env::ADMIN_TOKEN.to_string(), admin_token.to_string()),
            (
                router_env::ROUTER_TOKEN.to_string(),
                admin_token.to_string(),
            ),
        ],
        kv_disk_dir: None,
    }
}

/// Logs a router start.
pub fn started(pool: &PoolRef, api_port: u16, admin_port: u16, log: &Path) {
    info!(pool = %pool, router = %router_name(pool), api = api_port, admin = admin_port, log = %log.display(), "router started");
}
