//! Adapters of the RegistryStore port ([`crate::ports::RegistryStore`]): where a pool's
//! admitted-tenant registry is kept, so an operator restart loses no tenant.
//!
//! - [`config_map`]: ConfigMaps in the pool's namespace (sharded when large), in a cluster;
//! - [`file`](mod@file): a file per pool under a state folder, on this machine.

pub mod config_map;
pub mod file;
