//! The API listener of a draining engine: when the drain completes it closes its port first
//! (a client that still has this engine in its endpoint list gets "connection refused" and
//! goes to another one at once), and only a moment later does the server close the
//! connections it already accepted.
//!
//! Why: hyper's graceful shutdown closes every connection that has no request in progress,
//! including one accepted an instant earlier whose request is still on its way; that client
//! sees the connection dropped without an answer and cannot tell whether anything was done.
//! With the port closed first, such a connection instead gets its request answered with
//! 503 `draining` and Retry-After during `LINGER`.
//!
//! Invariants: after the drain completes no connection is accepted; every connection accepted
//! before it is served for at least `LINGER` after it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use super::drain::Drain;

/// How long connections accepted before the drain completed are still served after it.
pub const LINGER: Duration = Duration::from_secs(1);

pub struct ClosingListener {
    inner: Option<TcpListener>,
    addr: SocketAddr,
    drain: Arc<Drain>,
}

impl ClosingListener {
    pub fn new(inner: TcpListener, drain: Arc<Drain>) -> std::io::Result<Self> {
        Ok(ClosingListener {
            addr: inner.local_addr()?,
            inner: Some(inner),
            drain,
        })
    }
}

impl axum::serve::Listener for ClosingListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            let Some(listener) = &self.inner else {
                // Closed: the server stops asking once its graceful shutdown begins.
                return std::future::pending().await;
            };
            let drained = tokio::select! {
                r = listener.accept() => match r {
                    Ok(conn) => return conn,
                    Err(e) => {
                        // Out of descriptors and the like: back off, as axum's own loop does.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        false
                    }
                },
                () = self.drain.drained() => true,
            };
            if drained {
                tracing::info!("drained: API port closed");
                self.inner = None;
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}
