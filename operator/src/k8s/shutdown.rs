//! One shutdown request for the whole operator: SIGTERM or Ctrl-C, or a test's trigger.
//!
//! kube's graceful shutdown (`shutdown_on_signal`) stops a controller's watches and then
//! waits for its runner, and the runner never finishes while its store has not become ready:
//! with an initial list that keeps failing (a kind not served, an object that does not
//! parse) the operator logged "graceful shutdown requested" and kept running. Here the
//! signal is taken once, every part that waits (the Lease, the controllers) races it, and
//! the controllers get at most [`DRAIN_LIMIT`] to finish the reconciles in flight.
//!
//! Invariants:
//! - once requested, a shutdown stays requested: `requested()` resolves at once for every
//!   clone, however late it is called;
//! - the operator exits within `DRAIN_LIMIT` of the request, whatever its watches do.

use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

/// How long in-flight reconciles may take to finish after a shutdown request. Below the
/// 30 s a Kubernetes pod gets by default between SIGTERM and SIGKILL.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// A shutdown request that can be waited on from anywhere (clone it freely).
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// Requests the shutdown its `Shutdown` waits for (tests, or the signal task).
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

impl Trigger {
    /// Requests the shutdown.
    pub fn fire(&self) {
        self.0.send_replace(true);
    }
}

impl Shutdown {
    /// A shutdown that only `Trigger::fire` requests.
    pub fn manual() -> (Shutdown, Trigger) {
        let (tx, rx) = watch::channel(false);
        (Shutdown { rx }, Trigger(tx))
    }

    /// A shutdown requested by SIGTERM or Ctrl-C (call inside the Tokio runtime).
    pub fn on_signals() -> Shutdown {
        let (shutdown, trigger) = Shutdown::manual();
        tokio::spawn(async move {
            signal().await;
            info!("shutdown requested");
            trigger.fire();
        });
        shutdown
    }

    /// Resolves once the shutdown is requested (at once if it already was).
    pub async fn requested(&self) {
        let mut rx = self.rx.clone();
        // An error means the trigger is gone without firing: then nothing will ever request
        // the shutdown, so wait forever rather than shut down.
        if rx.wait_for(|fired| *fired).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves `DRAIN_LIMIT` after the request: the deadline for in-flight work.
    pub async fn deadline(&self) {
        self.requested().await;
        tokio::time::sleep(DRAIN_LIMIT).await;
        warn!(
            limit_s = DRAIN_LIMIT.as_secs(),
            "reconciles still running at the shutdown deadline; exiting without them"
        );
    }
}

/// SIGTERM or Ctrl-C, whichever comes first.
async fn signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn requested_resolves_for_every_clone_even_late() {
        let (shutdown, trigger) = Shutdown::manual();
        let early = shutdown.clone();
        assert!(early.requested().now_or_never().is_none());
        trigger.fire();
        assert!(early.requested().now_or_never().is_some());
        assert!(shutdown.clone().requested().now_or_never().is_some());
    }

    #[tokio::test]
    async fn a_dropped_trigger_never_requests() {
        let (shutdown, trigger) = Shutdown::manual();
        drop(trigger);
        let waited = tokio::time::timeout(Duration::from_millis(50), shutdown.requested()).await;
        assert!(waited.is_err());
    }
}
