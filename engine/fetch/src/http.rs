//! The one HTTP client of the fetch step: hyper over rustls with the ring provider and the
//! system's root certificates (the TLS stack kube uses, so the workspace links one), serving
//! both object_store's S3 client (as its `HttpConnector`) and the hub's downloads.
//!
//! Invariant: plain `http://` is allowed only where the caller asked for it (an endpoint the
//! pool names with `http://`, as S3-compatible stores on a private network and tests have).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector as StoreConnector, HttpError, HttpErrorKind, HttpRequest,
    HttpRequestBody, HttpResponse, HttpResponseBody, HttpService,
};

/// Redirects followed at most (the hub sends LFS files to a CDN).
const MAX_REDIRECTS: usize = 5;

type Https<B> = Client<HttpsConnector<HttpConnector>, B>;

/// The TLS connector: ring, the system's roots, HTTP/1.1. An image without a CA bundle
/// still fetches over plain `http://` (an S3-compatible store on a private network); its
/// `https://` fetches then fail with an unknown-issuer error, and a warning says why.
fn connector() -> std::io::Result<HttpsConnector<HttpConnector>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    match hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider.clone())
    {
        Ok(b) => Ok(b.https_or_http().enable_http1().build()),
        Err(e) => {
            tracing::warn!(error = %e, "no system root certificates: https:// sources cannot be verified and will fail");
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(std::io::Error::other)?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            Ok(hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(config)
                .https_or_http()
                .enable_http1()
                .build())
        }
    }
}

fn client<B>() -> std::io::Result<Https<B>>
where
    B: hyper::body::Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Ok(Client::builder(TokioExecutor::new()).build(connector()?))
}

/// object_store's requests over the hyper client.
#[derive(Debug, Clone)]
struct StoreService {
    client: Https<HttpRequestBody>,
}

#[async_trait::async_trait]
impl HttpService for StoreService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let res = self.client.request(req).await.map_err(|e| {
            let kind = if e.is_connect() {
                HttpErrorKind::Connect
            } else {
                HttpErrorKind::Request
            };
            HttpError::new(kind, e)
        })?;
        let (parts, body) = res.into_parts();
        let body = body.map_err(|e| HttpError::new(HttpErrorKind::Interrupted, e));
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}

/// The connector object_store's S3 client is built with.
#[derive(Debug, Default)]
pub struct Connector;

impl StoreConnector for Connector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        let client = client().map_err(|e| object_store::Error::Generic {
            store: "S3",
            source: Box::new(e),
        })?;
        Ok(HttpClient::new(StoreService { client }))
    }
}

/// A GET client for the hub's API and files.
#[derive(Debug, Clone)]
pub struct Getter {
    client: Https<Empty<Bytes>>,
}

/// A GET that did not get an answer (connection refused, DNS, TLS).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreachable(pub String);

impl Getter {
    pub fn new() -> std::io::Result<Self> {
        Ok(Getter { client: client()? })
    }

    /// GETs `url` with `headers`, following redirects (headers are kept on the same host
    /// only: a token never goes to a CDN).
    pub async fn get(
        &self,
        url: &str,
        headers: &HeaderMap,
    ) -> Result<Response<Incoming>, Unreachable> {
        let mut uri: Uri = url
            .parse()
            .map_err(|e| Unreachable(format!("{url}: {e}")))?;
        let origin = uri.authority().cloned();
        for _ in 0..=MAX_REDIRECTS {
            let mut req = Request::get(uri.clone());
            for (k, v) in headers {
                let auth = k == http::header::AUTHORIZATION;
                if !auth || uri.authority() == origin.as_ref() {
                    req = req.header(k, v);
                }
            }
            let req = req
                .body(Empty::new())
                .map_err(|e| Unreachable(format!("{uri}: {e}")))?;
            let res = self
                .client
                .request(req)
                .await
                .map_err(|e| Unreachable(format!("{uri}: {}", chain(&e))))?;
            if !res.status().is_redirection() || res.status() == StatusCode::NOT_MODIFIED {
                return Ok(res);
            }
            let next = res
                .headers()
                .get(http::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| Unreachable(format!("{uri}: a redirect without Location")))?;
            uri = join(&uri, next)?;
        }
        Err(Unreachable(format!(
            "{url}: more than {MAX_REDIRECTS} redirects"
        )))
    }
}

/// A redirect's target: absolute, or a path on the same host.
fn join(base: &Uri, location: &str) -> Result<Uri, Unreachable> {
    if location.starts_with("http://") || location.starts_with("https://") {
        return location
            .parse()
            .map_err(|e| Unreachable(format!("{location}: {e}")));
    }
    let scheme = base.scheme_str().unwrap_or("https");
    let authority = base.authority().map(|a| a.as_str()).unwrap_or_default();
    format!("{scheme}://{authority}{location}")
        .parse()
        .map_err(|e| Unreachable(format!("{location}: {e}")))
}

/// An error and its sources, on one line (hyper's own message is only "client error").
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_redirect_stays_on_the_host() {
        let base: Uri = "https://hub.example/org/m/resolve/main/a".parse().unwrap();
        assert_eq!(
            join(&base, "/api/x").unwrap().to_string(),
            "https://hub.example/api/x"
        );
        assert_eq!(
            join(&base, "https://cdn.example/b").unwrap().to_string(),
            "https://cdn.example/b"
        );
    }
}
