//! The engine admin API client (ports::EngineControl over HTTP).
//!
//! Invariants: every call carries the bearer token and a short timeout, so one hung engine
//! cannot stall a tick for long; errors name the engine.

use std::time::Duration;

use tidegate_api::engine_admin::{
    AdmittedTenants, DRAIN_PATH, DrainRequest, DrainStatus, EnginePolicy, POLICY_PATH, TENANTS_PATH,
};
use tidegate_api::router::{ENDPOINTS_PATH, EndpointsView, RouterEndpoints};

use crate::ports::{ControlError, Endpoint, EngineControl};

/// Timeout of one admin call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP client for engines' admin API.
#[derive(Clone)]
pub struct HttpEngineControl {
    http: reqwest::Client,
}

impl Default for HttpEngineControl {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpEngineControl {
    pub fn new() -> Self {
        HttpEngineControl {
            http: reqwest::Client::builder()
                .timeout(CALL_TIMEOUT)
                .build()
                .unwrap_or_else(|_| reqwest::Client::new()),
        }
    }
}

fn err(ep: &Endpoint, message: impl std::fmt::Display) -> ControlError {
    ControlError {
        endpoint: ep.name.clone(),
        message: message.to_string(),
    }
}

async fn check(ep: &Endpoint, resp: reqwest::Response) -> Result<reqwest::Response, ControlError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.text().await.unwrap_or_default();
    Err(err(
        ep,
        format!(
            "HTTP {status}: {}",
            body.chars().take(200).collect::<String>()
        ),
    ))
}

impl HttpEngineControl {
    /// Sends one admin call with the bearer token; a failure to send or a non-2xx answer is
    /// an error naming the endpoint.
    async fn send(
        &self,
        ep: &Endpoint,
        token: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ControlError> {
        let resp = req
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| err(ep, e))?;
        check(ep, resp).await
    }

    /// [`Self::send`], then the answer's JSON body.
    async fn send_json<T: serde::de::DeserializeOwned>(
        &self,
        ep: &Endpoint,
        token: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<T, ControlError> {
        let resp = self.send(ep, token, req).await?;
        resp.json().await.map_err(|e| err(ep, e))
    }
}

impl EngineControl for HttpEngineControl {
    async fn push_policy(
        &self,
        ep: &Endpoint,
        token: &str,
        policy: &EnginePolicy,
    ) -> Result<(), ControlError> {
        let req = self
            .http
            .put(format!("{}{POLICY_PATH}", ep.admin_url))
            .json(policy);
        self.send(ep, token, req).await.map(|_| ())
    }

    async fn tenants_since(
        &self,
        ep: &Endpoint,
        token: &str,
        since_ms: u64,
    ) -> Result<AdmittedTenants, ControlError> {
        let req = self
            .http
            .get(format!("{}{TENANTS_PATH}?since={since_ms}", ep.admin_url));
        self.send_json(ep, token, req).await
    }

    async fn drain(
        &self,
        ep: &Endpoint,
        token: &str,
        grace_seconds: u64,
    ) -> Result<DrainStatus, ControlError> {
        let req = self
            .http
            .post(format!("{}{DRAIN_PATH}", ep.admin_url))
            .json(&DrainRequest {
                grace_seconds: Some(grace_seconds),
            });
        self.send_json(ep, token, req).await
    }

    async fn drain_status(&self, ep: &Endpoint, token: &str) -> Result<DrainStatus, ControlError> {
        let req = self.http.get(format!("{}{DRAIN_PATH}", ep.admin_url));
        self.send_json(ep, token, req).await
    }

    async fn push_endpoints(
        &self,
        router: &Endpoint,
        token: &str,
        set: &RouterEndpoints,
    ) -> Result<EndpointsView, ControlError> {
        let req = self
            .http
            .put(format!("{}{ENDPOINTS_PATH}", router.admin_url))
            .json(set);
        self.send_json(router, token, req).await
    }
}
