//! The API-key Secrets of tier policies, read by name and kept for a while.
//!
//! The operator may only `get` Secrets (never list or watch them: it would then see every
//! Secret of the namespace), so it cannot cache them by watch. Each pool of a policy reads
//! the same Secret; reading it on every tick of every pool costs a request per pool per
//! interval. A text read is reused for `TTL`, by every pool of the namespace, so a rotated
//! key takes effect within `TTL` (and at once on a TierPolicy change, which forgets it).
//!
//! Invariant: failures are never kept (the next tick reads again); a missing Secret is
//! (its creation then shows within `TTL`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

/// How long a read Secret text is reused.
pub const TTL: Duration = Duration::from_secs(60);

type Key = (String, String, String);

/// Secret texts by (namespace, secret, key).
#[derive(Default)]
pub struct SecretTexts {
    texts: Mutex<HashMap<Key, (Option<String>, Instant)>>,
}

impl SecretTexts {
    /// The text under `key` of Secret `namespace/name` (None: no such Secret; an empty text
    /// when the Secret lacks the key).
    pub async fn read(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<Option<String>, kube::Error> {
        let k: Key = (namespace.into(), name.into(), key.into());
        if let Some(text) = self.fresh(&k) {
            return Ok(text);
        }
        let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let text = api.get_opt(name).await?.map(|s| {
            s.data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .unwrap_or_default()
        });
        if let Ok(mut texts) = self.texts.lock() {
            texts.insert(k, (text.clone(), Instant::now()));
        }
        Ok(text)
    }

    fn fresh(&self, k: &Key) -> Option<Option<String>> {
        let texts = self.texts.lock().ok()?;
        let (text, at) = texts.get(k)?;
        (at.elapsed() < TTL).then(|| text.clone())
    }

    /// Forgets what was read in `namespace` (its TierPolicies changed).
    pub fn forget_namespace(&self, namespace: &str) {
        if let Ok(mut texts) = self.texts.lock() {
            texts.retain(|(ns, _, _), _| ns != namespace);
        }
    }
}
