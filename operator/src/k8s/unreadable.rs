//! Reporting objects the operator cannot parse (see `lenient`): Ready=False on the object's
//! own status, with the field and the reason in the message. The status is what
//! `kubectl get`, Argo CD and an API server without Events all show.
//!
//! Invariants:
//! - an unreadable pool is left as it is: its workload keeps its replicas and its engines
//!   their last policy until the spec can be read again (acting on a guess is worse);
//! - the patch is a merge patch of raw JSON through the status subresource, so it needs no
//!   parsed object, and it keeps the other conditions and Ready's transition time when Ready
//!   was already False: repeating it changes nothing and triggers no new watch event.
//!
//! Limit: the API server validates the whole object on a status write too, and lets an
//! unchanged invalid field through (validation ratcheting) only when its rule evaluates to
//! false. A stored duration beyond what CEL's `duration()` can convert (about 2562047h)
//! makes the rule fail to evaluate instead, so the patch is refused: the reconcile then fails
//! with that error, is logged with the field, and is retried with backoff; other objects are
//! unaffected.

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tidegate_api::conditions::{reasons, status as cstatus, types};

use super::lenient::{Lenient, Unreadable};
use crate::plan::{ConditionPlan, Millis, merge_conditions};

/// The status merge patch that reports `bad` with `reason` (InvalidSpec for a pool, Invalid
/// for a TierPolicy).
pub fn unreadable_patch(
    kind: &str,
    bad: &Unreadable,
    reason: &'static str,
    generation: Option<i64>,
    now: Millis,
) -> Value {
    let planned = [ConditionPlan {
        type_: types::READY,
        status: cstatus::FALSE,
        reason,
        message: format!(
            "the operator cannot read this {kind}: {}; it acts on it again once the spec is fixed",
            bad.message
        ),
    }];
    let conditions = merge_conditions(&bad.conditions, &planned, now, generation);
    json!({ "status": { "observedGeneration": generation, "conditions": conditions } })
}

/// Writes Ready=False `reason` on the unreadable object `name` of `api`.
pub async fn report<K>(
    api: &Api<Lenient<K>>,
    name: &str,
    bad: &Unreadable,
    reason: &'static str,
    generation: Option<i64>,
    now: Millis,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
{
    let kind = K::kind(&());
    let patch = unreadable_patch(&kind, bad, reason, generation, now);
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The reason of an unreadable pool.
pub const POOL_REASON: &str = reasons::INVALID_SPEC;
/// The reason of an unreadable TierPolicy.
pub const POLICY_REASON: &str = reasons::INVALID;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn bad(conditions: Vec<Condition>) -> Unreadable {
        Unreadable {
            message: "spec.scaling.interval: invalid duration \"9999999999h\": out of range".into(),
            conditions,
        }
    }

    fn condition(type_: &str, status: &str, at: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Something".into(),
            message: String::new(),
            last_transition_time: Time(at.parse().unwrap()),
            observed_generation: Some(1),
        }
    }

    #[test]
    fn names_the_field_and_sets_ready_false() {
        let p = unreadable_patch("InferencePool", &bad(vec![]), POOL_REASON, Some(3), 0);
        let s = &p["status"];
        assert_eq!(s["observedGeneration"], 3);
        let ready = &s["conditions"][0];
        assert_eq!(ready["type"], "Ready");
        assert_eq!(ready["status"], "False");
        assert_eq!(ready["reason"], "InvalidSpec");
        assert_eq!(ready["observedGeneration"], 3);
        let msg = ready["message"].as_str().unwrap();
        assert!(
            msg.contains("cannot read this InferencePool: spec.scaling.interval: invalid duration"),
            "{msg}"
        );
    }

    #[test]
    fn keeps_other_conditions_and_a_false_ready_transition_time() {
        let previous = vec![
            condition("Ready", "False", "2026-01-01T00:00:00Z"),
            condition("MetricsAvailable", "True", "2026-01-02T00:00:00Z"),
        ];
        let p = unreadable_patch("InferencePool", &bad(previous), POOL_REASON, Some(3), 0);
        let conditions = p["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 2);
        let ready = conditions.iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!(ready["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(ready["reason"], "InvalidSpec");
    }
}
