//! tidegate operator: CRD generation, pure planning, the control loop over ports, the
//! adapters behind the ports (in folders named for the port they implement), and the
//! commands that wire them: `run` (an API server), `local` (files, this machine) and
//! `simulate` (a simulated pool).

pub mod admin_token;
pub mod bench_plan;
pub mod crdgen;
pub mod driver;
pub mod engine_control;
pub mod k8s;
pub mod local;
pub mod manifests;
pub mod metrics_source;
pub mod plan;
pub mod ports;
pub mod registry;
pub mod registry_store;
pub mod run;
pub mod sim;
pub mod status_build;
pub mod status_sink;
pub mod status_write;
pub mod workload_runtime;

/// The operator's name: the field manager of its server-side applies, the reporter of its
/// Events.
pub const OPERATOR_NAME: &str = "tidegate-operator";
