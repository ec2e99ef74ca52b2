//! Conversion from the TierPolicy the operator pushes (the CRD spec in `tidegate-api`) to the
//! tier table the KV cache and scheduler use.
//!
//! Invariant: the conversion is total for a spec the API server accepted (unique names, a
//! default that names a tier); for anything else `Tiers::from_policy` answers `None` and the
//! caller keeps its current table.

use tidegate_api::tier_policy::{PressureAction as ApiAction, Tier, TierPolicySpec};

use super::tier::{PressureAction, TierConfig, Tiers};

impl From<ApiAction> for PressureAction {
    fn from(a: ApiAction) -> Self {
        match a {
            ApiAction::Retain => PressureAction::Retain,
            ApiAction::Offload => PressureAction::Offload,
            ApiAction::Drop => PressureAction::Drop,
        }
    }
}

impl From<&Tier> for TierConfig {
    fn from(t: &Tier) -> Self {
        let ttl = u64::try_from(t.kv_retention.idle_ttl.as_std().as_millis()).unwrap_or(u64::MAX);
        let wait = u64::try_from(t.queue_wait_target.as_std().as_millis()).unwrap_or(u64::MAX);
        TierConfig {
            queue_wait_ms: wait,
            ..TierConfig::new(&t.name, t.priority, ttl, t.kv_retention.on_pressure.into())
        }
    }
}

impl Tiers {
    /// The tier table of a TierPolicy spec; `None` if it has no tiers or its default tier is
    /// not one of them. Tier ids follow the spec's order.
    pub fn from_policy(spec: &TierPolicySpec) -> Option<Tiers> {
        Tiers::new(
            spec.tiers.iter().map(TierConfig::from).collect(),
            &spec.default_tier,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_a_pushed_policy() {
        let spec: TierPolicySpec = serde_json::from_value(serde_json::json!({
            "tiers": [
                {"name": "free", "priority": 0, "kvRetention": {"idleTTL": "30s", "onPressure": "Drop"}},
                {"name": "pro", "priority": 50, "kvRetention": {"idleTTL": "10m", "onPressure": "Offload"}},
                {"name": "enterprise", "priority": 100, "kvRetention": {"onPressure": "Retain"}}
            ],
            "defaultTier": "free"
        }))
        .unwrap();
        let tiers = Tiers::from_policy(&spec).unwrap();
        assert_eq!(tiers.default_id(), 0);
        let pro = tiers.get(tiers.id_of("pro").unwrap());
        assert_eq!(
            (pro.priority, pro.idle_ttl_ms, pro.on_pressure),
            (50, 600_000, PressureAction::Offload)
        );
        assert_eq!(pro.queue_wait_ms, 2_000, "the TierPolicy default");
        assert_eq!(tiers.get(0).idle_ttl_ms, 30_000);
        assert_eq!(tiers.get(2).on_pressure, PressureAction::Retain);
        let mut bad = spec.clone();
        bad.default_tier = "nope".into();
        assert!(Tiers::from_policy(&bad).is_none());
    }
}
