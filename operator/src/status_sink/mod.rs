//! Adapters of the StatusSink port ([`crate::ports::StatusSink`]): where each tick's status
//! and events are reported.
//!
//! - [`kubernetes`]: the InferencePool's status subresource (written when
//!   `crate::status_write` says it is worth a request) and Kubernetes Events;
//! - [`console`]: local mode's live table and decision log, one line per pool and tick.
//!
//! Invariant: a sink never changes what the tick decided; it only reports it.

pub mod console;
pub mod kubernetes;
