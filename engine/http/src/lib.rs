//! tidegate's HTTP kit: what the engine's and the router's HTTP servers share.
//!
//! - [`error`]: every refusal in OpenAI's error shape, with its status, Retry-After and metric
//!   label; [`error::SubmitError`] is an engine's (or the router queue's) reason to refuse.
//! - [`body`]: request bodies read under a size and time limit.
//! - [`auth`]: the admin API's bearer token (flags, checks).
//! - [`tenancy`]: the pushed policy compiled for lookups, who a request is, rate limits, and
//!   the new-tenant gate ([`tenancy::gate`]).
//! - [`metrics_answer`], [`logging`], [`shutdown`]: the `/metrics` answer, log set-up, signals.
//!
//! Boundary: no model, KV or scheduler code; both the engine and the router depend on this
//! crate, never the other way round.

pub mod auth;
pub mod body;
pub mod error;
pub mod logging;
pub mod metrics_answer;
pub mod shutdown;
pub mod tenancy;
