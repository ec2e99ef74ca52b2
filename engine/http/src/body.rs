//! Reading a request body within `--max-body-bytes` and the body read timeout, and refusing
//! an oversized one so that the client actually receives the 413.
//!
//! Why the draining: a server that answers before the body has arrived and then closes the
//! connection leaves the rest of the body unread in its socket; the kernel answers that
//! data with a TCP reset, and a client that writes the whole body before it reads (Python's
//! urllib, many SDKs) gets "connection reset" instead of the 413 that was already sent. So
//! an oversized body is read and thrown away, within bounds, before the answer goes out
//! (the lingering close of nginx and Apache, done here before the response because hyper
//! closes the socket right after it).
//!
//! Invariants: at most `limit` bytes are ever buffered; draining discards at most
//! [`drain_cap`] bytes and takes at most [`DRAIN_MAX_TIME`]; a client that announced a body
//! larger than the drain cap, or that waits for `100 Continue`, is answered at once (it is
//! not made to send data that would be thrown away); every 413 carries `Connection: close`,
//! since the rest of its body may still be on the way.
//!
//! So: a client that writes a body of up to 64 MiB (or four times the limit, if larger)
//! whole before reading gets the 413 and its JSON error, unless the upload takes longer
//! than [`DRAIN_MAX_TIME`]; beyond that the connection is closed once the 413 is sent, and
//! such a client may see a reset instead (the kernel's answer to unread data), which is the
//! documented price of not reading an unbounded body.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{HeaderMap, header};
use futures::StreamExt;

use crate::error::ApiError;

/// Oversized body bytes discarded before answering 413: at least this many (64 MiB: the
/// largest body a client is promised the JSON error for, whatever the limit).
pub const DRAIN_MIN_BYTES: u64 = 64 << 20;
/// Time spent discarding an oversized body at most (64 MiB at about 50 Mbit/s).
pub const DRAIN_MAX_TIME: Duration = Duration::from_secs(10);

/// Oversized body bytes discarded at most before answering 413: four times the limit, at
/// least [`DRAIN_MIN_BYTES`] (a client that overshoots a small limit by a few megabytes still
/// hears why).
pub fn drain_cap(limit: usize) -> u64 {
    (limit as u64).saturating_mul(4).max(DRAIN_MIN_BYTES)
}

/// The body of `request`, at most `limit` bytes, read within `timeout`.
pub async fn read_limited(
    request: Request,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, ApiError> {
    let (parts, body) = request.into_parts();
    let declared = content_length(&parts.headers);
    if declared.is_some_and(|n| n > limit as u64) {
        let cap = drain_cap(limit);
        if !expects_continue(&parts.headers) && declared.is_some_and(|n| n <= cap) {
            drain(body.into_data_stream(), cap, DRAIN_MAX_TIME.min(timeout)).await;
        }
        return Err(ApiError::TooLarge(limit));
    }
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    let read = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::invalid(format!("Could not read the request body: {e}"), None)
            })?;
            if buf.len() + chunk.len() > limit {
                return Ok(false);
            }
            buf.extend_from_slice(&chunk);
        }
        Ok::<bool, ApiError>(true)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(true)) => Ok(Bytes::from(buf)),
        Ok(Ok(false)) => {
            // A body without a (truthful) length went over: discard what follows, bounded.
            drain(stream, drain_cap(limit), DRAIN_MAX_TIME.min(timeout)).await;
            Err(ApiError::TooLarge(limit))
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ApiError::BodyTimeout(timeout)),
    }
}

/// Reads and discards up to `cap` bytes of `stream` within `max_time`.
async fn drain(mut stream: axum::body::BodyDataStream, cap: u64, max_time: Duration) {
    let discard = async {
        let mut seen: u64 = 0;
        while let Some(Ok(chunk)) = stream.next().await {
            seen += chunk.len() as u64;
            if seen > cap {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(max_time, discard).await;
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn request(body: &'static [u8], headers: &[(&'static str, &str)]) -> Request {
        let mut b = axum::http::Request::builder().method("POST").uri("/");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::from(body)).expect("request")
    }

    #[tokio::test]
    async fn limits_and_reads() {
        let t = Duration::from_secs(1);
        let ok = read_limited(request(b"abc", &[]), 3, t).await;
        assert_eq!(ok.ok().as_deref(), Some(&b"abc"[..]));
        let over = read_limited(request(b"abcd", &[]), 3, t).await;
        assert!(matches!(over, Err(ApiError::TooLarge(3))));
        let declared = read_limited(request(b"ab", &[("content-length", "99")]), 3, t).await;
        assert!(matches!(declared, Err(ApiError::TooLarge(3))));
        let cont = request(b"", &[("content-length", "99"), ("expect", "100-continue")]);
        assert!(matches!(
            read_limited(cont, 3, t).await,
            Err(ApiError::TooLarge(3))
        ));
    }
}
