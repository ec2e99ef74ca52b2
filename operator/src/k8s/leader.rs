//! Leader election on a coordination.k8s.io Lease, written simply: one Lease
//! `tidegate-operator` in the operator's namespace (POD_NAMESPACE), held by this pod's name
//! (POD_NAME, or the host name). A candidate takes the Lease when it is free, expired, or
//! already its own; the leader renews it every RENEW and exits when it cannot for longer than
//! the lease duration (a new process elects again; two leaders never act at once for longer
//! than one lease duration, the standard bound). Updates use the resourceVersion, so two
//! candidates cannot both win a race.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::{info, warn};

/// Name of the Lease.
pub const LEASE_NAME: &str = "tidegate-operator";
/// How long a Lease is valid without renewal.
pub const LEASE_SECONDS: i32 = 15;
/// How often the leader renews.
pub const RENEW: Duration = Duration::from_secs(5);

/// A leader-election participant.
pub struct LeaderElector {
    api: Api<Lease>,
    identity: String,
}

/// Whether a Lease may be taken by `me` at `now`.
pub fn can_take(lease: &Lease, me: &str, now: Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return true;
    };
    match spec.holder_identity.as_deref() {
        None | Some("") => true,
        Some(h) if h == me => true,
        Some(_) => {
            let secs = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS));
            match &spec.renew_time {
                Some(t) => t.0.as_second() + secs < now.as_second(),
                None => true,
            }
        }
    }
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, identity: String) -> Self {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            identity,
        }
    }

    /// Identity from POD_NAME, else HOSTNAME, else a random suffix.
    pub fn default_identity() -> String {
        std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| {
                format!(
                    "tidegate-operator-{}",
                    super::objects::random_token()
                        .unwrap_or_default()
                        .chars()
                        .take(8)
                        .collect::<String>()
                )
            })
    }

    fn spec(&self, previous: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
        let same_holder = previous
            .and_then(|s| s.holder_identity.as_deref())
            .is_some_and(|h| h == self.identity);
        let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            acquire_time: if same_holder {
                previous.and_then(|s| s.acquire_time.clone())
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if same_holder {
                transitions
            } else {
                transitions + 1
            }),
            ..LeaseSpec::default()
        }
    }

    /// One attempt to take or renew the Lease; Ok(true) when this process holds it.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        match self.api.get_opt(LEASE_NAME).await? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(LEASE_NAME.to_string()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.spec(None, now)),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Some(mut lease) => {
                if !can_take(&lease, &self.identity, now) {
                    return Ok(false);
                }
                lease.spec = Some(self.spec(lease.spec.as_ref(), now));
                match self
                    .api
                    .replace(LEASE_NAME, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Waits until this process leads.
    pub async fn acquire(&self) {
        let mut logged = false;
        loop {
            match self.try_acquire().await {
                Ok(true) => {
                    info!(identity = %self.identity, lease = LEASE_NAME, "became leader");
                    return;
                }
                Ok(false) if !logged => {
                    info!(identity = %self.identity, "another operator leads; waiting");
                    logged = true;
                }
                Ok(false) => {}
                Err(e) => warn!(error = %e, "leader election"),
            }
            tokio::time::sleep(RENEW).await;
        }
    }

    /// Renews until the Lease is lost; returns why.
    pub async fn hold(&self) -> String {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(RENEW).await;
            match self.try_acquire().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => return "another operator took the Lease".to_string(),
                Err(e) => {
                    warn!(error = %e, "renewing the Lease");
                    if last_ok.elapsed() > Duration::from_secs(LEASE_SECONDS as u64) {
                        return format!("could not renew the Lease for {LEASE_SECONDS}s: {e}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed: i64) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_string()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(
                    Timestamp::from_second(renewed).expect("timestamp"),
                )),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn takes_free_own_or_expired_leases_only() {
        let now = Timestamp::from_second(1_000).expect("timestamp");
        assert!(can_take(&lease("me", 999), "me", now));
        assert!(!can_take(&lease("other", 990), "me", now));
        assert!(can_take(&lease("other", 980), "me", now));
        assert!(can_take(&lease("", 999), "me", now));
    }
}
