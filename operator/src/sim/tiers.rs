//! The tiers of one run: their names, the parameters the engines apply (queue-wait target,
//! output cap, rate limits, KV idle TTL) and the TierPolicy handed to the planner.
//!
//! The simulator has `NTIERS` tier slots, highest priority first: slot order is the order an
//! engine serves its queue in. The built-in tiers fill all three; a user's TierPolicy fills
//! as many as it has tiers, by descending priority (ties by name).
//!
//! Invariants: the planner's TierPolicy names its tiers after the slots (`TIERS[i]`), so the
//! pause it decides maps back to a slot by name; every other field (priority, pausable,
//! targets) is the user's. `names[i]` is what the report prints for slot `i`.

use tidegate_api::{Tier, TierPolicySpec};

use super::tenants::{NTIERS, TIER_PARAMS, TIER_POLICY_YAML, TIERS, TierParams};

/// The tiers of one run.
#[derive(Clone, Debug)]
pub struct TierTable {
    /// The user's names, one per used slot.
    pub names: Vec<String>,
    pub params: [TierParams; NTIERS],
    /// The TierPolicy the planner plans with, tiers named after their slots.
    pub planner: TierPolicySpec,
}

impl TierTable {
    /// The simulator's own enterprise/standard/free tiers.
    pub fn builtin() -> anyhow::Result<Self> {
        let planner = serde_saphyr::from_str(TIER_POLICY_YAML)
            .map_err(|e| anyhow::anyhow!("simulator tier policy: {e}"))?;
        Ok(TierTable {
            names: TIERS.iter().map(|s| s.to_string()).collect(),
            params: TIER_PARAMS,
            planner,
        })
    }

    /// The tiers of a user's TierPolicy (at most `NTIERS`).
    pub fn from_policy(policy: &TierPolicySpec) -> anyhow::Result<Self> {
        if policy.tiers.len() > NTIERS {
            anyhow::bail!(
                "the simulator models at most {NTIERS} tiers; the TierPolicy has {}",
                policy.tiers.len()
            );
        }
        if policy.tier(&policy.default_tier).is_none() {
            anyhow::bail!(
                "the TierPolicy's defaultTier {:?} names none of its tiers",
                policy.default_tier
            );
        }
        let mut order: Vec<_> = policy.tiers.iter().collect();
        order.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then_with(|| a.name.cmp(&b.name))
        });
        let mut params = [TierParams::unused(); NTIERS];
        let mut planner = policy.clone();
        planner.tiers.clear();
        for (slot, tier) in order.iter().enumerate() {
            params[slot] = TierParams::of(tier);
            let mut renamed = (*tier).clone();
            renamed.name = TIERS[slot].to_string();
            if tier.name == policy.default_tier {
                planner.default_tier = TIERS[slot].to_string();
            }
            planner.tiers.push(renamed);
        }
        Ok(TierTable {
            names: order.iter().map(|t| t.name.clone()).collect(),
            params,
            planner,
        })
    }

    /// The slot of a tier named by the user.
    pub fn slot(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Queue-wait targets per slot, for attainment.
    pub fn targets(&self) -> [f64; NTIERS] {
        self.params.map(|p| p.queue_wait_target_s)
    }
}

impl TierParams {
    /// A slot no tier uses.
    pub const fn unused() -> Self {
        TierParams {
            share: 0.0,
            queue_wait_target_s: 0.0,
            max_output_tokens: 0,
            requests_per_minute: 0,
            tokens_per_minute: 0,
            kv_idle_ttl_s: 0.0,
        }
    }

    /// What the engines apply for one tier of a TierPolicy (absent limits: unlimited).
    pub fn of(t: &Tier) -> Self {
        let limit = |v: Option<i64>| v.map_or(u32::MAX, |v| v.clamp(0, i64::from(u32::MAX)) as u32);
        let limits = t.rate_limits.as_ref();
        TierParams {
            share: 0.0,
            queue_wait_target_s: t.queue_wait_target.as_std().as_secs_f64(),
            max_output_tokens: t.max_output_tokens.max(1) as u32,
            requests_per_minute: limit(limits.and_then(|l| l.requests_per_minute)),
            tokens_per_minute: limit(limits.and_then(|l| l.tokens_per_minute)),
            kv_idle_ttl_s: t.kv_retention.idle_ttl.as_std().as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_policy_fills_slots_by_priority_and_the_planner_sees_slot_names() {
        let policy: TierPolicySpec = serde_saphyr::from_str(
            r#"
defaultTier: bronze
tiers:
  - {name: bronze, priority: 1, queueWaitTarget: 10s}
  - {name: gold, priority: 9, queueWaitTarget: 1s, rateLimits: {requestsPerMinute: 5}, admission: {pausable: false}}
"#,
        )
        .expect("policy");
        let t = TierTable::from_policy(&policy).expect("table");
        assert_eq!(t.names, ["gold", "bronze"]);
        assert_eq!(t.slot("bronze"), Some(1));
        assert_eq!(t.params[0].requests_per_minute, 5);
        assert_eq!(t.params[1].requests_per_minute, u32::MAX);
        assert_eq!(t.targets()[1], 10.0);
        assert_eq!(t.planner.default_tier, "standard");
        assert!(!t.planner.tiers[0].admission.pausable);
        assert_eq!(t.planner.tiers[0].name, "enterprise");
    }

    #[test]
    fn the_builtin_table_is_the_simulators_own() {
        let t = TierTable::builtin().expect("builtin");
        assert_eq!(t.names, TIERS);
        assert_eq!(t.planner.tiers.len(), NTIERS);
    }
}
