//! StatusSink on a terminal: local mode's live table, like `kubectl get inferencepools`, one
//! row per pool and tick, and the plan's events under it, each line naming its pool; the
//! decision itself goes to the log (`RUST_LOG=info`) with the pool's name.
//!
//! Invariants: every reported tick prints exactly one row; a row's NAME and every event
//! line name the pool they are about; reporting never fails.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use tidegate_api::AdmissionState;
use tidegate_api::conditions::types;
use tidegate_api::status::InferencePoolStatus;
use tracing::info;

use crate::plan::EventPlan;
use crate::ports::{PoolRef, PoolReport, StatusError, StatusSink};
use crate::status_write::StatusWrite;

/// What a row shows of a pool besides its status.
#[derive(Clone, Debug, Default)]
struct RowExtras {
    model: String,
    /// The load generator's users of the pool now.
    users: usize,
}

/// Prints each tick to stdout.
pub struct ConsoleSink {
    started: Instant,
    extras: Mutex<HashMap<PoolRef, RowExtras>>,
}

impl ConsoleSink {
    /// A sink whose TIME column counts from `started`.
    pub fn new(started: Instant) -> Self {
        ConsoleSink {
            started,
            extras: Mutex::new(HashMap::new()),
        }
    }

    /// Names the model the pool's rows show.
    pub fn watch(&self, pool: &PoolRef, model: &str) {
        self.with_extras(pool, |e| e.model = model.to_string());
    }

    /// Sets the USERS column of the pool's next rows.
    pub fn set_users(&self, pool: &PoolRef, users: usize) {
        self.with_extras(pool, |e| e.users = users);
    }

    fn with_extras<T>(&self, pool: &PoolRef, f: impl FnOnce(&mut RowExtras) -> T) -> T {
        let mut extras = self.extras.lock().unwrap_or_else(|p| p.into_inner());
        f(extras.entry(pool.clone()).or_default())
    }

    /// Prints the table's header.
    pub fn header(&self) {
        println!(
            "{:<8} {:<16} {:<22} {:>5} {:>7} {:>9} {:>9} {:>5} {:<26} {:>5}",
            "TIME",
            "NAME",
            "MODEL",
            "READY",
            "DESIRED",
            "TOKENS/S",
            "QUEUE-P99",
            "UTIL",
            "ADMISSION",
            "USERS"
        );
    }

    fn row(&self, r: &PoolReport<'_>) -> String {
        let extras = self.with_extras(r.pool, |e| e.clone());
        let m = r.status.measured.as_ref();
        let admission = match r.plan.admission.state {
            AdmissionState::Open => "Open".to_string(),
            AdmissionState::PausedNewTenants => {
                format!("Paused({})", r.plan.admission.paused_tiers.join(","))
            }
        };
        format!(
            "{:<8} {:<16} {:<22} {:>5} {:>7} {:>9.1} {:>9} {:>5.2} {:<26} {:>5}",
            format!("{:.0}s", self.started.elapsed().as_secs_f64()),
            r.pool.name,
            extras.model,
            r.status.ready_replicas,
            r.status.desired_replicas,
            m.map_or(0.0, |m| m.decode_tokens_per_second),
            m.map_or("-".to_string(), |m| m.queue_wait_p99.clone()),
            m.map_or(0.0, |m| m.utilization),
            admission,
            extras.users
        )
    }
}

impl StatusSink for ConsoleSink {
    async fn report(&self, r: &PoolReport<'_>) -> Result<StatusWrite, StatusError> {
        println!("{}", self.row(r));
        for e in &r.plan.events {
            println!("{}", event_line(r.pool, e));
        }
        if let Some(line) = ready_change(r) {
            println!("{line}");
        }
        info!(pool = %r.pool, decision = %r.plan.explanation, "tick");
        // Every tick is shown: the console has no write to save.
        Ok(StatusWrite::Changed)
    }
}

/// The Ready condition under the table when it changed, e.g. `    local/demo condition
/// Ready=False ModelFetchFailed: …`: what a cluster's status says, where a person reads it.
fn ready_change(r: &PoolReport<'_>) -> Option<String> {
    let find = |s: &InferencePoolStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == types::READY)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let now = find(r.status)?;
    if r.previous.and_then(find).as_ref() == Some(&now) {
        return None;
    }
    Some(format!(
        "    {} condition Ready={} {}: {}",
        r.pool, now.0, now.1, now.2
    ))
}

/// An event under the table, e.g. `    local/demo event Normal ScaledUp: 1 → 2 replicas: …`.
fn event_line(pool: &PoolRef, e: &EventPlan) -> String {
    format!("    {pool} event {:?} {}: {}", e.kind, e.reason, e.note)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::EventKind;

    #[test]
    fn an_event_line_names_its_pool_before_the_event() {
        let pool = PoolRef {
            namespace: "local".into(),
            name: "chat".into(),
        };
        let e = EventPlan {
            kind: EventKind::Normal,
            reason: "ScaledDown",
            note: "2 → 1 replicas: quiet".into(),
        };
        assert_eq!(
            event_line(&pool, &e),
            "    local/chat event Normal ScaledDown: 2 → 1 replicas: quiet"
        );
    }
}
