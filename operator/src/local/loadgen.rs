//! Built-in load generator for local mode: a tidal load from several tenants and tiers.
//!
//! Shape: existing tenants of every tier start first (they are admitted and become
//! *existing*); load then ramps up beyond what the pool can serve at its ceiling while new
//! tenants keep arriving; then it ebbs to nothing. Tenants are identified to engines with
//! the trusted-gateway headers (`x-tidegate-tenant`, `x-tidegate-tier`), as a gateway in
//! front of the pool would, and every request goes to the pool's router (its front door),
//! which resolves the tenant, applies admission and picks the engine. Invariants: requests
//! go only to the loopback router; every loop is bounded by the scenario's end time; every
//! outcome is counted exactly once; a new-tenant refusal of a tenant the pool had already
//! accepted a request of (answered, or refused after it waited: [`ACCEPTED_CODES`]) is
//! counted apart, with `/accepted_before` (the pool promises there are none; each user sends
//! one request at a time, so "before" is exact).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Pause between a user's answered request and its next one.
const THINK: Duration = Duration::from_millis(5);

/// Error codes of a refusal that came after the pool had accepted the request (it waited in
/// a queue, or reached an engine).
pub const ACCEPTED_CODES: &[&str] = &["queue_timeout", "engine_failed"];

/// The tally key of a refusal: `refused/STATUS/TYPE/KIND`, with `/accepted_before` when it is
/// a new-tenant refusal of a tenant the pool had accepted a request of.
pub fn refusal_key(status: u16, reason: &str, kind: &str, accepted_before: bool) -> String {
    let after = accepted_before && reason == "new_tenant_admission_paused";
    let tail = if after { "/accepted_before" } else { "" };
    format!("refused/{status}/{reason}/{kind}{tail}")
}

/// The tidal scenario, in wall-clock time.
#[derive(Clone, Debug)]
pub struct TideShape {
    pub warmup: Duration,
    pub ramp_up: Duration,
    pub high: Duration,
    pub ramp_down: Duration,
    /// Existing tenants active from the start.
    pub base_users: usize,
    /// Concurrent users at high tide (existing ones included).
    pub peak_users: usize,
    /// Output tokens asked per request.
    pub max_tokens: u32,
    /// Served model name.
    pub model: String,
}

impl TideShape {
    pub fn total(&self) -> Duration {
        self.warmup + self.ramp_up + self.high + self.ramp_down
    }

    /// Concurrent users wanted `t` after the start.
    pub fn users_at(&self, t: Duration) -> usize {
        let (w, u, h) = (
            self.warmup,
            self.warmup + self.ramp_up,
            self.warmup + self.ramp_up + self.high,
        );
        let frac =
            |a: Duration, b: Duration| (t - a).as_secs_f64() / (b - a).as_secs_f64().max(1e-9);
        let extra = (self.peak_users - self.base_users.min(self.peak_users)) as f64;
        if t < w {
            self.base_users
        } else if t < u {
            self.base_users + (extra * frac(w, u)) as usize
        } else if t < h {
            self.peak_users
        } else if t < self.total() {
            (self.peak_users as f64 * (1.0 - frac(h, self.total()))) as usize
        } else {
            0
        }
    }
}

/// Outcome counters, by reason.
#[derive(Default)]
pub struct Tally {
    counts: std::sync::Mutex<BTreeMap<String, u64>>,
    pub served: AtomicU64,
    pub tokens: AtomicU64,
}

impl Tally {
    fn add(&self, key: &str) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        *c.entry(key.to_string()).or_default() += 1;
    }

    /// Outcome counts, e.g. `served/existing`, `refused/new_tenant_admission_paused`.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A virtual user: one tenant of one tier.
#[derive(Clone, Debug)]
struct User {
    tenant: String,
    tier: String,
    existing: bool,
}

/// Tier of the i-th user: a mix of every tier, enterprise rarest.
fn tier_of(i: usize) -> &'static str {
    match i % 6 {
        0 => "enterprise",
        1 | 2 => "standard",
        _ => "free",
    }
}

/// Runs the scenario until its end; returns the tally.
pub async fn run(shape: TideShape, front: watch::Receiver<Option<String>>) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let start = Instant::now();
    let end = start + shape.total();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap_or_else(|_| reqwest::Client::new());
    let mut tasks = Vec::new();
    for i in 0..shape.peak_users {
        let user = User {
            tenant: if i < shape.base_users {
                format!("tenant-{i:03}")
            } else {
                format!("newcomer-{i:03}")
            },
            tier: tier_of(i).to_string(),
            existing: i < shape.base_users,
        };
        let (shape, eps, tally, http) = (shape.clone(), front.clone(), tally.clone(), http.clone());
        tasks.push(tokio::spawn(async move {
            user_loop(i, user, shape, start, end, eps, tally, http).await;
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    tally
}

#[allow(clippy::too_many_arguments)]
async fn user_loop(
    index: usize,
    user: User,
    shape: TideShape,
    start: Instant,
    end: Instant,
    front: watch::Receiver<Option<String>>,
    tally: Arc<Tally>,
    http: reqwest::Client,
) {
    let mut n = 0usize;
    // Tenants of this user the pool accepted a request of (newcomers change name).
    let mut accepted: HashSet<String> = HashSet::new();
    while Instant::now() < end {
        if index >= shape.users_at(start.elapsed()) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        let Some(router) = front.borrow().clone() else {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        };
        n += 1;
        let kind = if user.existing { "existing" } else { "new" };
        // Newcomers keep arriving: every few requests a newcomer slot is a brand-new tenant.
        let tenant = if user.existing {
            user.tenant.clone()
        } else {
            format!("{}-{}", user.tenant, n / 4)
        };
        let body = serde_json::json!({
            "model": shape.model,
            "prompt": format!("Tenant {tenant} asks question number {n}:"),
            "max_tokens": shape.max_tokens,
            "ignore_eos": true,
            "temperature": 0.0,
        });
        let resp = http
            .post(format!("{router}/v1/completions"))
            .header("x-tidegate-tenant", &tenant)
            .header("x-tidegate-tier", &user.tier)
            .header("x-session-id", format!("{tenant}-{}", n % 3))
            .json(&body)
            .send()
            .await;
        let backoff = match resp {
            Ok(r) if r.status().is_success() => {
                let v: serde_json::Value = r.json().await.unwrap_or_default();
                let toks = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
                tally.served.fetch_add(1, Ordering::Relaxed);
                tally.tokens.fetch_add(toks, Ordering::Relaxed);
                tally.add(&format!("served/{kind}/{}", user.tier));
                accepted.insert(tenant.clone());
                // A short pause, not a think time: the sessions in flight (what the planner
                // counts) must not depend on how fast this machine's engines answer, or a
                // fast machine would never reach the ceiling's pause.
                THINK
            }
            Ok(r) => {
                let status = r.status().as_u16();
                let retry = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                let v: serde_json::Value = r.json().await.unwrap_or_default();
                let reason = v["error"]["type"].as_str().unwrap_or("unknown").to_string();
                let before = accepted.contains(&tenant);
                tally.add(&refusal_key(status, &reason, kind, before));
                let code = v["error"]["code"].as_str().unwrap_or("");
                if ACCEPTED_CODES.contains(&code) || status == 502 {
                    accepted.insert(tenant.clone());
                }
                // Honour Retry-After, capped so the demo keeps moving.
                Duration::from_secs(retry.unwrap_or(1).clamp(1, 3))
            }
            Err(e) if e.is_connect() => {
                // The router is not up (yet, or it is being restarted): nothing was sent.
                tally.add(&format!("unsent/router_unreachable/{kind}"));
                Duration::from_millis(250)
            }
            Err(e) => {
                // Sent, then lost: the connection broke or timed out mid-request.
                let why = if e.is_timeout() { "timeout" } else { "broken" };
                tally.add(&format!("error/{why}/{kind}"));
                Duration::from_millis(500)
            }
        };
        tokio::time::sleep(backoff).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paused_refusal_of_a_tenant_accepted_before_is_tallied_apart() {
        let paused = "new_tenant_admission_paused";
        assert_eq!(
            refusal_key(503, paused, "existing", true),
            "refused/503/new_tenant_admission_paused/existing/accepted_before"
        );
        assert_eq!(
            refusal_key(503, paused, "new", false),
            "refused/503/new_tenant_admission_paused/new"
        );
        // Only the pause is a broken promise: a rate limit after an answer is not.
        assert_eq!(
            refusal_key(429, "rate_limit_error", "new", true),
            "refused/429/rate_limit_error/new"
        );
    }
}
