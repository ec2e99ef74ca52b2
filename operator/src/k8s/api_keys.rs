//! API keys of a TierPolicy: the Secret named in `spec.tenancy.apiKeys` holds, under its
//! key (default `tenants.yaml`), a YAML list of `{tenant, tier, apiKey}`. Engines receive
//! only SHA-256 digests of the keys.

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tidegate_api::engine_admin::ApiKeyEntry;

use super::objects::hex;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawEntry {
    tenant: String,
    tier: String,
    api_key: String,
}

/// Why a key list was refused.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeysError {
    #[error("not a YAML list of {{tenant, tier, apiKey}}: {0}")]
    Yaml(String),
    #[error("entry {0}: tenant, tier and apiKey must not be empty")]
    Empty(usize),
    #[error("entry {0}: tier {1:?} is not a tier of the policy")]
    UnknownTier(usize, String),
}

/// Lower-case hex SHA-256 of an API key.
pub fn key_digest(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

/// Parses the key list; `tiers` are the policy's tier names (an entry naming another tier is
/// refused, so that a typo does not silently land tenants in the default tier).
pub fn parse_api_keys(yaml: &str, tiers: &[&str]) -> Result<Vec<ApiKeyEntry>, ApiKeysError> {
    if yaml.trim().is_empty() {
        return Ok(Vec::new());
    }
    let raw: Vec<RawEntry> =
        serde_saphyr::from_str(yaml).map_err(|e| ApiKeysError::Yaml(e.to_string()))?;
    raw.into_iter()
        .enumerate()
        .map(|(i, e)| {
            if e.tenant.is_empty() || e.tier.is_empty() || e.api_key.is_empty() {
                return Err(ApiKeysError::Empty(i));
            }
            if !tiers.contains(&e.tier.as_str()) {
                return Err(ApiKeysError::UnknownTier(i, e.tier));
            }
            Ok(ApiKeyEntry {
                key_sha256: key_digest(&e.api_key),
                tenant: e.tenant,
                tier: e.tier,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_digests() {
        let yaml = "- tenant: acme\n  tier: gold\n  apiKey: abc\n";
        let keys = parse_api_keys(yaml, &["gold"]).expect("parse");
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].tenant, "acme");
        assert_eq!(
            keys[0].key_sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn bad_lists_are_refused() {
        assert!(parse_api_keys("tenant: x", &["gold"]).is_err());
        assert!(matches!(
            parse_api_keys("- {tenant: a, tier: silver, apiKey: k}", &["gold"]),
            Err(ApiKeysError::UnknownTier(0, _))
        ));
        assert!(matches!(
            parse_api_keys("- {tenant: '', tier: gold, apiKey: k}", &["gold"]),
            Err(ApiKeysError::Empty(0))
        ));
        assert!(parse_api_keys("", &[]).expect("empty").is_empty());
    }
}
