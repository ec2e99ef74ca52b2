//! What both launch contracts — the engine's ([`crate::engine_launch`]) and the router's
//! ([`crate::router`]) — are built from: a command-line builder, the value of an environment
//! variable, the duration format their flags take, and the two token variables each process
//! reads. A leaf: it imports neither contract, so neither imports the other.

/// Environment variables that carry the pool's admin token to its processes.
pub mod env {
    /// The admin bearer token (engine and router admin APIs).
    pub const ADMIN_TOKEN: &str = "TIDEGATE_ADMIN_TOKEN";
    /// The shared secret engines require before believing the router's identity headers.
    pub const ROUTER_TOKEN: &str = "TIDEGATE_ROUTER_TOKEN";
}

/// The value of one environment variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvValue {
    Literal(String),
    /// The pool's admin token: a Secret reference in a cluster, the token itself locally.
    AdminToken,
}

/// The token variables every process of a pool gets: the admin token (its admin API) and
/// the router token (what the router proves itself with, what engines check), both the
/// pool's admin token: one Secret, one trust domain.
pub fn token_env() -> Vec<(&'static str, EnvValue)> {
    vec![
        (env::ADMIN_TOKEN, EnvValue::AdminToken),
        (env::ROUTER_TOKEN, EnvValue::AdminToken),
    ]
}

/// Seconds as the engine's and router's duration flags take them, rounded up.
pub fn whole_seconds(d: &crate::Duration) -> String {
    format!("{}s", d.as_std().as_secs_f64().ceil() as u64)
}

/// A command line under construction: `--name value` pairs after the subcommand.
pub(crate) struct Args(pub(crate) Vec<String>);

impl Args {
    pub(crate) fn flag(&mut self, name: &str, value: impl ToString) {
        self.0.push(format!("--{name}"));
        self.0.push(value.to_string());
    }
}
