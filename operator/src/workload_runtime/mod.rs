//! Adapters of the WorkloadRuntime port ([`crate::ports::WorkloadRuntime`]): what runs a
//! pool's engine replicas and its router.
//!
//! - [`kubernetes`]: a Deployment, Services and PodDisruptionBudgets per pool, server-side
//!   applied (the objects are built by `crate::k8s`);
//! - [`local`]: engine and router processes on this machine, on loopback ports.
//!
//! Invariant: an adapter depends on the port and on object builders, never on the commands
//! that wire it (`crate::run`, `crate::local`).

pub mod kubernetes;
pub mod local;
