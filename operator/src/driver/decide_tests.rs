//! The driver's rules as pure decisions: scale-up and first apply, victims chosen once and
//! kept, a drain asked once then polled, removal only when drained or out of grace, a
//! called-off scale-down, the spec re-applied once per generation, the registry merge (the
//! engines' admissions and the routers' acceptances) and the push schedule, and the count
//! of live routers each router shares the rate limits by.

use tidegate_api::AdmissionState;
use tidegate_api::engine_admin::AdmittedTenant;

use super::*;

const T0: Millis = 1_700_000_000_000;
/// The spec's drainGracePeriod.
const GRACE_MS: Millis = 600_000;

fn spec() -> InferencePoolSpec {
    serde_saphyr::from_str(
        r#"
model: {name: m, uri: "file:///m"}
engine: {image: e, drainGracePeriod: 10m}
replicas: {min: 1, max: 5}
admission: {tenantMemory: 1h, retryAfter: 7s}
"#,
    )
    .expect("spec")
}

fn endpoint(name: &str, ready: bool) -> Endpoint {
    Endpoint {
        name: name.into(),
        api_url: format!("http://{name}"),
        admin_url: format!("http://{name}-admin"),
        ready,
    }
}

/// A workload running `replicas`, with these endpoints (name, ready).
fn workload(replicas: Option<i32>, endpoints: &[(&str, bool)]) -> WorkloadState {
    let endpoints: Vec<Endpoint> = endpoints.iter().map(|(n, r)| endpoint(n, *r)).collect();
    WorkloadState {
        replicas,
        ready_replicas: endpoints.iter().filter(|e| e.ready).count() as i32,
        endpoints,
        selector: "pool=p".into(),
        routers: Vec::new(),
        model_problem: None,
    }
}

fn three() -> WorkloadState {
    workload(Some(3), &[("e0", true), ("e1", true), ("e2", true)])
}

/// Memory of a pool whose spec of generation 1 was applied.
fn applied() -> ActionMemory {
    ActionMemory {
        applied_generation: Some(1),
        ..ActionMemory::default()
    }
}

fn decide_at(target: i32, w: &WorkloadState, memory: &ActionMemory, now: Millis) -> Actions {
    decide(&DecideInput {
        spec: &spec(),
        target,
        workload: w,
        memory,
        generation: Some(1),
        now,
    })
}

fn victims(a: &Actions) -> Vec<(&str, DrainCall, bool)> {
    match &a.replicas {
        ReplicaAction::RemoveWhenDrained { victims, .. } => victims
            .iter()
            .map(|v| (v.endpoint.name.as_str(), v.call, v.expired))
            .collect(),
        other => panic!("expected a removal, got {other:?}"),
    }
}

/// The memory after carrying out `a` without a removal.
fn after(a: &Actions, memory: &ActionMemory) -> ActionMemory {
    ActionMemory {
        draining: a.draining.clone(),
        ..memory.clone()
    }
}

#[test]
fn a_scale_up_applies_the_target_at_once() {
    let a = decide_at(4, &three(), &applied(), T0);
    assert_eq!(a.replicas, ReplicaAction::Apply { replicas: 4 });
    assert!(a.draining.is_empty());
    assert_eq!(a.reapply_at, None);
}

#[test]
fn a_pool_with_no_workload_yet_gets_one_even_at_its_target() {
    let a = decide_at(0, &workload(None, &[]), &ActionMemory::default(), T0);
    assert_eq!(a.replicas, ReplicaAction::Apply { replicas: 0 });
    assert_eq!(a.reapply_at, None, "nothing runs yet: nothing to re-apply");
}

#[test]
fn a_steady_pool_does_nothing() {
    let a = decide_at(3, &three(), &applied(), T0);
    assert_eq!(a.replicas, ReplicaAction::Hold);
    assert_eq!(a.reapply_at, None);
    assert_eq!(a.ended_drains, None);
}

#[test]
fn a_new_generation_or_a_new_operator_reapplies_the_spec_at_the_current_count() {
    let changed = ActionMemory {
        applied_generation: Some(0),
        ..ActionMemory::default()
    };
    assert_eq!(decide_at(3, &three(), &changed, T0).reapply_at, Some(3));
    // A restarted operator has applied nothing yet.
    let fresh = ActionMemory::default();
    assert_eq!(decide_at(3, &three(), &fresh, T0).reapply_at, Some(3));
    // Even while a scale-down waits for its drain (the removal applies it otherwise).
    assert_eq!(decide_at(2, &three(), &fresh, T0).reapply_at, Some(3));
}

#[test]
fn a_scale_down_drains_the_newest_ready_replica_first_and_removes_nothing_yet() {
    let a = decide_at(2, &three(), &applied(), T0);
    assert_eq!(victims(&a), [("e2", DrainCall::Start, false)]);
    assert_eq!(a.draining.get("e2"), Some(&T0));
    match &a.replicas {
        ReplicaAction::RemoveWhenDrained { to, .. } => assert_eq!(*to, 2),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_replica_that_is_not_ready_is_the_first_victim() {
    let w = workload(Some(3), &[("e0", true), ("e1", false), ("e2", true)]);
    let a = decide_at(1, &w, &applied(), T0);
    assert_eq!(
        victims(&a),
        [
            ("e1", DrainCall::Start, false),
            ("e2", DrainCall::Start, false)
        ]
    );
}

#[test]
fn a_victim_is_kept_and_polled_though_its_readiness_changed() {
    let first = decide_at(2, &three(), &applied(), T0);
    // Draining made e2 unready, and e0 became unready too: e2 stays the victim.
    let w = workload(Some(3), &[("e0", false), ("e1", true), ("e2", false)]);
    let second = decide_at(2, &w, &after(&first, &applied()), T0 + 2_000);
    assert_eq!(victims(&second), [("e2", DrainCall::Poll, false)]);
    assert_eq!(
        second.draining.get("e2"),
        Some(&T0),
        "the drain keeps its start"
    );
}

#[test]
fn a_victim_that_left_is_forgotten_and_another_is_chosen() {
    let first = decide_at(2, &three(), &applied(), T0);
    // e2 crashed and was replaced by e3.
    let w = workload(Some(3), &[("e0", true), ("e1", true), ("e3", true)]);
    let second = decide_at(2, &w, &after(&first, &applied()), T0 + 2_000);
    assert_eq!(victims(&second), [("e3", DrainCall::Start, false)]);
    assert!(!second.draining.contains_key("e2"));
}

#[test]
fn a_victim_out_of_grace_is_expired() {
    let first = decide_at(2, &three(), &applied(), T0);
    let late = decide_at(2, &three(), &after(&first, &applied()), T0 + GRACE_MS);
    assert_eq!(victims(&late), [("e2", DrainCall::Poll, true)]);
}

#[test]
fn a_called_off_scale_down_ends_the_drains_and_keeps_the_count() {
    let first = decide_at(2, &three(), &applied(), T0);
    let again = decide_at(3, &three(), &after(&first, &applied()), T0 + 2_000);
    assert_eq!(again.replicas, ReplicaAction::Hold);
    assert!(again.draining.is_empty());
    let ended = again.ended_drains.expect("ended drains");
    assert_eq!(ended.names, ["e2"]);
    assert!(ended.still_running, "a started drain runs to its end");
}

#[test]
fn victims_that_drained_and_left_by_themselves_end_the_scale_down() {
    let first = decide_at(2, &three(), &applied(), T0);
    // The runtime retired e2 once it exited: it now runs 2.
    let w = workload(Some(2), &[("e0", true), ("e1", true)]);
    let next = decide_at(2, &w, &after(&first, &applied()), T0 + 2_000);
    assert_eq!(next.replicas, ReplicaAction::Hold);
    let ended = next.ended_drains.expect("ended drains");
    assert_eq!(
        (ended.names.as_slice(), ended.to),
        (&["e2".to_string()][..], 2)
    );
    assert!(!ended.still_running);
}

fn victim(call: DrainCall, ready: bool, expired: bool) -> Victim {
    Victim {
        endpoint: endpoint("v", ready),
        call,
        expired,
    }
}

#[test]
fn removal_is_due_only_when_every_victim_drained_or_ran_out_of_grace() {
    use DrainAnswer::{Answered, Failed};
    let drained = Answered(DrainState::Drained);
    let draining = Answered(DrainState::Draining);
    let due = |v: Victim, a: DrainAnswer| removal_due(&[v], &[a]);
    let start = || victim(DrainCall::Start, true, false);
    let gone_quiet = || victim(DrainCall::Poll, false, false);
    assert!(due(start(), drained));
    assert!(!due(start(), draining));
    assert!(
        due(victim(DrainCall::Poll, true, true), draining),
        "out of grace"
    );
    assert!(!due(start(), Failed), "a failed start waits for the grace");
    assert!(due(gone_quiet(), Failed), "quiet and unready: it left");
    assert!(!due(victim(DrainCall::Poll, true, false), Failed));
    let both = [start(), gone_quiet()];
    assert!(!removal_due(&both, &[drained, draining]));
    assert!(removal_due(&both, &[drained, Failed]));
    assert!(
        !removal_due(&both, &[drained]),
        "every victim needs an answer"
    );
}

fn report(now_ms: u64, tenants: &[(&str, &str, u64)]) -> AdmittedTenants {
    AdmittedTenants {
        now_ms,
        tenants: tenants
            .iter()
            .map(|(t, tier, at)| AdmittedTenant {
                tenant: t.to_string(),
                tier: tier.to_string(),
                first_admitted_ms: *at,
            })
            .collect(),
    }
}

#[test]
fn the_ready_engines_are_asked_for_tenants_since_their_last_answer() {
    let mut registry = Registry::default();
    registry.watermarks.insert("e0".into(), 42);
    let w = workload(Some(3), &[("e0", true), ("e1", false), ("e2", true)]);
    let asks: Vec<(String, u64)> = collect_from(&w, &registry)
        .into_iter()
        .map(|(e, since)| (e.name, since))
        .collect();
    assert_eq!(asks, [("e0".to_string(), 42), ("e2".to_string(), 0)]);
}

#[test]
fn a_merge_adds_new_tenants_prunes_old_ones_and_forgets_gone_engines() {
    let mut registry = Registry::default();
    let old = T0 - 2 * 3_600_000;
    registry.merge("gone", &report(old, &[("stale", "free", old)]));
    let reports = [
        (
            "e0".to_string(),
            report(T0, &[("a", "free", T0), ("b", "standard", T0)]),
        ),
        ("e1".to_string(), report(T0, &[("a", "free", T0)])),
    ];
    let merged = merge_reports(&mut registry, &reports, &three(), &spec(), T0);
    assert_eq!(merged.added, [("e0".to_string(), 2)]);
    assert!(merged.changed);
    assert_eq!(
        registry.tenant_ids(),
        ["a", "b"],
        "stale is past tenantMemory"
    );
    assert_eq!(registry.watermarks.keys().collect::<Vec<_>>(), ["e0", "e1"]);

    let again = merge_reports(&mut registry, &reports, &three(), &spec(), T0);
    assert_eq!(again, Merged::default(), "nothing new: nothing to save");
}

#[test]
fn watermarks_alone_are_saved_now_and_then_tenants_at_once() {
    let mut registry = Registry::default();
    let first = [("e0".to_string(), report(T0, &[("a", "free", T0)]))];
    let merged = merge_reports(&mut registry, &first, &three(), &spec(), T0);
    assert!(merged.changed && registry_save_due(&merged, Some(T0), T0));
    // The next answers only move e0's watermark.
    let later = [("e0".to_string(), report(T0 + 15_000, &[]))];
    let moved = merge_reports(&mut registry, &later, &three(), &spec(), T0 + 15_000);
    assert!(!moved.changed && moved.watermarks_moved);
    assert!(!registry_save_due(&moved, Some(T0), T0 + 15_000));
    assert!(registry_save_due(&moved, Some(T0), T0 + WATERMARK_SAVE_MS));
    assert!(
        registry_save_due(&moved, None, T0 + 15_000),
        "a restarted operator saves once"
    );
}

#[test]
fn the_policy_carries_admission_and_the_registry() {
    let mut registry = Registry::default();
    registry.merge("e0", &report(T0, &[("a", "free", T0)]));
    let admission = AdmissionPlan {
        state: AdmissionState::PausedNewTenants,
        since: Some(T0),
        reason: "at the ceiling".into(),
        paused_tiers: vec!["free".into()],
    };
    let p = policy_for(&spec(), None, &[], &admission, &registry);
    assert_eq!(p.admission.state, AdmissionState::PausedNewTenants);
    assert_eq!(p.admission.paused_tiers, ["free"]);
    assert_eq!(p.admission.retry_after_seconds, 7);
    assert_eq!(p.admitted_tenants, ["a"]);
}

#[test]
fn a_policy_is_pushed_when_new_changed_or_due_again() {
    let policy = EnginePolicy::default();
    assert!(push_due(None, &policy, T0), "never pushed");
    let last = (policy.clone(), T0);
    assert!(!push_due(Some(&last), &policy, T0 + PUSH_EVERY_MS - 1));
    assert!(push_due(Some(&last), &policy, T0 + PUSH_EVERY_MS));
    let mut changed = policy.clone();
    changed.admitted_tenants.push("a".into());
    assert!(push_due(Some(&last), &changed, T0 + 1));
}

/// Three engines and these routers (name, ready).
fn with_routers(routers: &[(&str, bool)]) -> WorkloadState {
    WorkloadState {
        routers: routers.iter().map(|(n, r)| endpoint(n, *r)).collect(),
        ..three()
    }
}

#[test]
fn every_router_is_asked_for_the_tenants_it_accepted_ready_or_not() {
    let mut registry = Registry::default();
    registry.watermarks.insert("r1".into(), 7);
    let w = with_routers(&[("r0", true), ("r1", false)]);
    let asks: Vec<(String, u64)> = collect_from(&w, &registry)
        .into_iter()
        .map(|(e, since)| (e.name, since))
        .collect();
    // A router that stopped being ready (it is stopping) may still hold acceptances.
    let names: Vec<&str> = asks.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["e0", "e1", "e2", "r0", "r1"]);
    assert_eq!(asks[4], ("r1".to_string(), 7), "since its last answer");
}

#[test]
fn a_tenant_a_router_accepted_is_in_the_registry_the_same_tick_before_any_engine_saw_it() {
    let mut registry = Registry::default();
    registry.merge("e0", &report(T0 - 10, &[("old", "free", T0 - 10)]));
    let w = with_routers(&[("r0", true), ("r1", true)]);
    // "queued" waits in r0's queue behind higher tiers: no engine has admitted it yet.
    let reports = [
        ("e0".to_string(), report(T0, &[])),
        ("r0".to_string(), report(T0, &[("queued", "free", T0 - 5)])),
        ("r1".to_string(), report(T0, &[("old", "free", T0 - 3)])),
    ];
    let merged = merge_reports(&mut registry, &reports, &w, &spec(), T0);
    assert_eq!(merged.added, [("r0".to_string(), 1)]);
    assert!(merged.changed && registry_save_due(&merged, Some(T0), T0));
    assert_eq!(registry.tenant_ids(), ["old", "queued"]);
    assert_eq!(
        registry.tenants["old"].last_seen_ms,
        T0 - 3,
        "re-seen at r1"
    );
    // The pause pushed this tick carries it to every router and engine.
    let admission = AdmissionPlan {
        state: AdmissionState::PausedNewTenants,
        since: Some(T0),
        reason: "at the ceiling".into(),
        paused_tiers: vec!["free".into()],
    };
    let p = policy_for(&spec(), None, &[], &admission, &registry);
    assert_eq!(p.admitted_tenants, ["old", "queued"]);
    assert!(push_due(Some(&(EnginePolicy::default(), T0)), &p, T0));
}

#[test]
fn router_watermarks_are_kept_while_the_router_runs_and_forgotten_once_it_is_gone() {
    let mut registry = Registry::default();
    let reports = [("r0".to_string(), report(T0, &[("a", "free", T0)]))];
    merge_reports(
        &mut registry,
        &reports,
        &with_routers(&[("r0", false)]),
        &spec(),
        T0,
    );
    assert_eq!(registry.watermarks.get("r0"), Some(&T0));
    let gone = merge_reports(&mut registry, &[], &three(), &spec(), T0 + 1);
    assert!(gone.watermarks_moved && !registry.watermarks.contains_key("r0"));
    assert!(
        registry.contains("a"),
        "its tenants stay: they are the pool's"
    );
}

#[test]
fn each_router_is_told_how_many_routers_are_ready_now() {
    let share = |routers: &[(&str, bool)]| {
        router_endpoints(&with_routers(routers), |_| false).ready_routers
    };
    assert_eq!(share(&[("r0", true), ("r1", true)]), Some(2));
    // One of two died (or is not ready): the survivor enforces the whole limit.
    assert_eq!(share(&[("r0", true), ("r1", false)]), Some(1));
    assert_eq!(share(&[("r0", true)]), Some(1));
    // A third is added: every router enforces a third once it is ready, not before.
    assert_eq!(share(&[("r0", true), ("r1", true), ("r2", false)]), Some(2));
    assert_eq!(share(&[("r0", true), ("r1", true), ("r2", true)]), Some(3));
    assert_eq!(
        share(&[("r0", false), ("r1", false)]),
        None,
        "none ready: kept"
    );
    assert_eq!(share(&[]), None);
    let set = router_endpoints(&with_routers(&[("r0", true)]), |n| n == "e1");
    let accepting: Vec<bool> = set.endpoints.iter().map(|e| e.accepting).collect();
    assert_eq!(accepting, [true, false, true]);
}

#[test]
fn a_router_without_a_policy_gets_it_whether_or_not_the_push_is_due() {
    let w = WorkloadState {
        endpoints: vec![endpoint("e0", true), endpoint("e1", false)],
        routers: vec![endpoint("r0", true), endpoint("r1", false)],
        ..three()
    };
    let names = |due: bool, without: &[&str]| -> Vec<String> {
        let without: Vec<String> = without.iter().map(|s| s.to_string()).collect();
        policy_targets(&w, due, &without)
            .into_iter()
            .map(|e| e.name.clone())
            .collect()
    };
    assert_eq!(names(true, &[]), ["e0", "r0"], "due: the ready ones");
    assert!(names(false, &[]).is_empty(), "not due: nobody");
    // r1 just started: not ready until it has a policy, so it gets one now.
    assert_eq!(names(false, &["r1"]), ["r1"]);
    assert_eq!(names(true, &["r1"]), ["e0", "r0", "r1"]);
}
