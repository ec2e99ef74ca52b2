use super::*;

#[derive(Debug)]
struct Quiet;

impl DispatchObserver for Quiet {
    fn placed(&self, _: Option<Key>, _: Option<Affinity>) {}
    fn gauges(&self, _: usize, _: usize, _: &[(&'static str, u64)]) {}
}

fn config(slots: u64, share: u32) -> DispatchConfig {
    DispatchConfig {
        engine_slots: slots,
        slot_share: share,
        load_stale_after: Duration::from_secs(2),
        max_queued: 16,
        max_queued_per_tenant: 2,
        max_held: 4,
        hold_timeout: Duration::from_millis(50),
        load_factor: 1.25,
        aging_per_second: 20.0,
    }
}

/// A dispatcher with ready engines `a` and `b` (ids 1 and 2).
fn two_engines(slots: u64, share: u32) -> Arc<Dispatcher> {
    let d = Dispatcher::new(config(slots, share), Box::new(Quiet));
    let eps: Vec<RouterEndpoint> = ["a", "b"]
        .iter()
        .map(|n| RouterEndpoint {
            name: n.to_string(),
            url: format!("http://{n}"),
            accepting: true,
        })
        .collect();
    d.set_endpoints(&eps);
    for id in [1, 2] {
        d.set_health(id, Health::Ready);
    }
    d
}

fn ask(tenant: &str, wait_ms: u64) -> Ask {
    Ask {
        key: None,
        priority: 1,
        tier: "free".into(),
        tenant: tenant.into(),
        cost: 10,
        wait: Duration::from_millis(wait_ms),
        since: Instant::now(),
        exclude: None,
    }
}

fn load(held: u64) -> EngineLoad {
    EngineLoad {
        running: held,
        waiting: 0,
        kv_free: 0,
        kv_total: 0,
        slots: None,
    }
}

#[tokio::test]
async fn places_on_engine_reported_load() {
    let d = two_engines(8, 1);
    let now = Instant::now();
    // Engine a reports 7 of 8 held (other routers' requests), b reports 2.
    d.report(1, load(7), now);
    d.report(2, load(2), now);
    let l = d.acquire(ask("t", 0)).await.expect("room on b");
    assert_eq!(
        l.name, "b",
        "the engine's own figures, not this router's zero leases"
    );
    // b now counts 2 + 1 lease since, a still 7: b again.
    let l2 = d.acquire(ask("t", 0)).await.expect("room");
    assert_eq!(l2.name, "b");
    // a full by its figures, b full by figures plus leases since: nothing has room.
    d.report(2, load(8), now);
    d.report(1, load(8), now);
    assert_eq!(
        d.acquire(ask("t", 0)).await.err(),
        Some(Refusal::QueueTimeout)
    );
}

#[tokio::test]
async fn stale_figures_count_as_full() {
    let d = two_engines(8, 1);
    let old = Instant::now() - Duration::from_secs(3);
    d.report(1, load(0), old);
    d.report(2, load(0), old);
    assert_eq!(
        d.acquire(ask("t", 0)).await.err(),
        Some(Refusal::QueueTimeout),
        "both engines' figures are stale"
    );
    // A fresh probe with figures makes b placeable again.
    d.set_probe(2, Health::Ready, Some(load(1)), Instant::now());
    assert_eq!(
        d.acquire(ask("t", 0)).await.map(|l| l.name.clone()).ok(),
        Some("b".into())
    );
}

#[tokio::test]
async fn a_refusal_for_room_marks_the_engine_full_until_it_reports() {
    let d = two_engines(8, 1);
    d.refused_for_room(1);
    d.refused_for_room(2);
    assert_eq!(
        d.acquire(ask("t", 0)).await.err(),
        Some(Refusal::QueueTimeout)
    );
    d.report(1, load(3), Instant::now());
    assert_eq!(
        d.acquire(ask("t", 0)).await.map(|l| l.name.clone()).ok(),
        Some("a".into())
    );
}

#[tokio::test]
async fn each_router_takes_its_share_of_the_slots() {
    // Two routers in front of engines of 4 slots each: this one holds at most 2 per engine.
    let d = two_engines(4, 2);
    let mut leases = Vec::new();
    for _ in 0..4 {
        leases.push(d.acquire(ask("t", 0)).await.expect("within the share"));
    }
    assert_eq!(
        d.acquire(ask("t", 0)).await.err(),
        Some(Refusal::QueueTimeout),
        "2 + 2 held: the other router's halves are not ours"
    );
    leases.pop();
    assert!(d.acquire(ask("t", 0)).await.is_ok());
}

#[tokio::test]
async fn tenant_bound_and_freed_slots_go_to_the_least_served_tenant() {
    let d = two_engines(1, 1);
    let first = d.acquire(ask("heavy", 0)).await.expect("a");
    let second = d.acquire(ask("heavy", 0)).await.expect("b");
    // Both engines busy; heavy may queue 2, not 3.
    let d1 = Arc::clone(&d);
    let w1 = tokio::spawn(async move { d1.acquire(ask("heavy", 5_000)).await });
    let d2 = Arc::clone(&d);
    let w2 = tokio::spawn(async move { d2.acquire(ask("heavy", 5_000)).await });
    tokio::task::yield_now().await;
    while d.view().2 < 2 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        d.acquire(ask("heavy", 5_000)).await.err(),
        Some(Refusal::TenantQueueFull)
    );
    // A light tenant still gets in, and the next freed slot is its.
    let d3 = Arc::clone(&d);
    let light = tokio::spawn(async move { d3.acquire(ask("light", 5_000)).await });
    while d.view().2 < 3 {
        tokio::task::yield_now().await;
    }
    let freed = first.name.clone();
    drop(first);
    let got = light
        .await
        .expect("task")
        .expect("the light tenant is served first");
    assert_eq!(got.name, freed);
    assert!(!w1.is_finished() && !w2.is_finished());
    w1.abort();
    w2.abort();
    drop(second);
}

#[tokio::test]
async fn settle_corrects_the_tenants_service() {
    let d = two_engines(8, 1);
    let mut l = d.acquire(ask("t", 0)).await.expect("room");
    let charged = d.lock().queue.ledger().service("t", Instant::now());
    assert!((charged - 10.0).abs() < 0.01);
    l.settle(400);
    l.settle(0); // once only
    let now = d.lock().queue.ledger().service("t", Instant::now());
    assert!((now - 400.0).abs() < 0.1, "{now}");
}
