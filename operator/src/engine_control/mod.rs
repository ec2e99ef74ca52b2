//! Adapters of the EngineControl port ([`crate::ports::EngineControl`]): the engines' and
//! routers' admin API. One adapter serves the cluster and this machine alike:
//!
//! - [`http`]: the admin API over HTTP with the pool's admin token.

pub mod http;
