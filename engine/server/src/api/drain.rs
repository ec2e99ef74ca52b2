//! Drain: stop taking requests, let in-flight ones finish within a grace period, then stop.
//!
//! Invariants: the phase only moves forward (Serving → Draining → Drained); a request is
//! counted in flight from admission check to the end of its response body (an [`InFlight`]
//! guard), and is counted *before* the phase is checked, so a drain never misses a request
//! that got in; once Drained, streams still running (grace expired) are cut.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tidegate_api::engine_admin::{DrainState, DrainStatus};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Serving,
    Draining,
    /// `cut`: the grace period ran out with requests still in flight.
    Drained {
        cut: bool,
    },
}

#[derive(Debug)]
pub struct Drain {
    phase: watch::Sender<Phase>,
    in_flight: AtomicU64,
    pub default_grace: Duration,
}

/// Counts one request in flight until dropped.
#[derive(Debug)]
pub struct InFlight {
    drain: Arc<Drain>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.drain.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl InFlight {
    /// Resolves when the drain grace expired and this request must be cut.
    pub async fn cut(&self) {
        let mut rx = self.drain.phase.subscribe();
        let _ = rx
            .wait_for(|p| matches!(p, Phase::Drained { cut: true }))
            .await;
    }
}

impl Drain {
    pub fn new(default_grace: Duration) -> Arc<Self> {
        Arc::new(Drain {
            phase: watch::Sender::new(Phase::Serving),
            in_flight: AtomicU64::new(0),
            default_grace,
        })
    }

    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Counts a new request in, unless draining.
    pub fn enter(self: &Arc<Self>) -> Option<InFlight> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight {
            drain: Arc::clone(self),
        };
        (self.phase() == Phase::Serving).then_some(guard)
    }

    pub fn status(&self) -> DrainStatus {
        DrainStatus {
            state: match self.phase() {
                Phase::Serving => DrainState::Serving,
                Phase::Draining => DrainState::Draining,
                Phase::Drained { .. } => DrainState::Drained,
            },
            in_flight: self.in_flight.load(Ordering::SeqCst),
        }
    }

    /// Starts draining (idempotent); the first call's grace period wins.
    pub fn start(self: &Arc<Self>, grace: Option<Duration>) -> DrainStatus {
        let started = self.phase.send_if_modified(|p| {
            if *p == Phase::Serving {
                *p = Phase::Draining;
                true
            } else {
                false
            }
        });
        if started {
            let grace = grace.unwrap_or(self.default_grace);
            let me = Arc::clone(self);
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + grace;
                let cut = loop {
                    if me.in_flight.load(Ordering::SeqCst) == 0 {
                        break false;
                    }
                    if tokio::time::Instant::now() >= deadline {
                        break true;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                };
                tracing::info!(cut, "drained");
                me.phase.send_replace(Phase::Drained { cut });
            });
            tracing::info!(grace_s = grace.as_secs_f64(), "draining");
        }
        self.status()
    }

    /// Resolves once drained.
    pub async fn drained(&self) {
        let mut rx = self.phase.subscribe();
        let _ = rx.wait_for(|p| matches!(p, Phase::Drained { .. })).await;
    }
}
