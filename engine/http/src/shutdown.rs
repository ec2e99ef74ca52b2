//! The signal a server stops on: SIGTERM (what Kubernetes sends) or Ctrl-C.

#[cfg(unix)]
/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
