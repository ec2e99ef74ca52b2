//! One engine as the dispatcher sees it, and whether it has room for one more request.
//!
//! Room is decided on two counts, both of which must allow it:
//! - **this router's share**: each of the R routers in front of a pool (`--limit-share`)
//!   holds at most `⌊slots / R⌋` (at least 1) requests on one engine, so R routers together
//!   never send an engine more than its slots (batch plus queue), whatever the others do —
//!   exact while `R ≤ slots`; the price is that a router with all the traffic uses 1/R of
//!   each engine;
//! - **the engine's own figures**: the load it reported last (running + waiting, on every
//!   answer and on every readiness probe) plus the leases this router handed out since that
//!   report, below its slots. This sees what the share cannot: requests from outside the
//!   routers, and an engine still holding a request the router has finished with. Figures
//!   older than the staleness bound count as full (the engine may be anywhere by now); an
//!   engine that never reported any (an older engine, mid-rollout) is placed on this
//!   router's leases alone.
//!
//! Invariants: `in_flight` equals the leases alive on the engine; `since_report` counts the
//! leases handed out since the report it is reset with; no clock here (time is passed in).

use std::time::{Duration, Instant};

use tidegate_api::router::EngineLoad;

/// Health as the last probe saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Answered 200 on its readiness path.
    Ready,
    /// Answered, but not ready (loading or draining).
    NotReady,
    /// Did not answer (connection refused or timed out).
    Down,
}

/// How much an engine may hold, from this router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Requests the engine holds at most (its batch plus its own queue).
    pub slots: u64,
    /// Routers sharing the engine's slots.
    pub share: u32,
    /// Engine figures older than this count as full.
    pub stale_after: Duration,
}

impl Capacity {
    /// This router's share of one engine: `⌊slots / share⌋`, at least 1.
    pub fn own(&self) -> u64 {
        (self.slots / u64::from(self.share.max(1))).max(1)
    }
}

#[derive(Debug)]
pub struct EngineSlot {
    pub id: u64,
    pub name: String,
    pub url: String,
    pub accepting: bool,
    pub health: Health,
    pub in_flight: u64,
    /// Left the pushed set; kept until its last lease ends.
    pub removed: bool,
    /// The engine's last load report, and when it came.
    pub report: Option<(EngineLoad, Instant)>,
    /// Leases handed out since that report.
    pub since_report: u64,
    /// The most the engine says it holds (its batch plus queue), from its latest report
    /// that said; it bounds the configured slots, so a wrong flag cannot overfill it.
    pub reported_slots: Option<u64>,
    /// When the engine last refused a request for room (`queue_full`): full until it reports
    /// again (an engine that sends no figures: until its next probe), and for at most the
    /// staleness bound, so a refusal never bars an engine for good.
    pub refused_at: Option<Instant>,
}

impl EngineSlot {
    pub fn new(id: u64, name: String, url: String, accepting: bool) -> Self {
        EngineSlot {
            id,
            name,
            url,
            accepting,
            health: Health::NotReady,
            in_flight: 0,
            removed: false,
            report: None,
            since_report: 0,
            reported_slots: None,
            refused_at: None,
        }
    }

    pub fn live(&self) -> bool {
        !self.removed && self.accepting && self.health == Health::Ready
    }

    /// The `endpoints` gauge's state.
    pub fn state(&self) -> &'static str {
        match (self.accepting, self.health) {
            (false, _) => "draining",
            (true, Health::Ready) => "ready",
            (true, Health::NotReady) => "not_ready",
            (true, Health::Down) => "down",
        }
    }

    /// Records a load report made at `at`.
    pub fn record(&mut self, load: EngineLoad, at: Instant) {
        // A report older than the one held (an answer that was slow to arrive) is no news.
        if self.report.is_some_and(|(_, seen)| seen > at) {
            return;
        }
        self.report = Some((load, at));
        self.since_report = 0;
        if self.refused_at.is_some_and(|r| r <= at) {
            self.refused_at = None;
        }
        if load.slots.is_some() {
            self.reported_slots = load.slots;
        }
    }

    /// The router's capacity for this engine: the configured slots, at most what the engine
    /// reported it holds.
    pub fn capacity(&self, cap: &Capacity) -> Capacity {
        let slots = self
            .reported_slots
            .map_or(cap.slots, |s| s.clamp(1, cap.slots.max(1)));
        Capacity { slots, ..*cap }
    }

    /// What the engine holds, as best known at `now`: its figures plus this router's leases
    /// since, never less than this router's own leases. None: figures stale (full).
    pub fn load(&self, now: Instant, cap: &Capacity) -> Option<u64> {
        match self.report {
            None => Some(self.in_flight),
            Some((_, at)) if now.saturating_duration_since(at) > cap.stale_after => None,
            Some((l, _)) => Some(
                l.held()
                    .saturating_add(self.since_report)
                    .max(self.in_flight),
            ),
        }
    }

    /// The engine's load when it can take one more request from this router, else None.
    pub fn room(&self, now: Instant, cap: &Capacity) -> Option<u64> {
        let cap = &self.capacity(cap);
        if !self.live() || self.in_flight >= cap.own() {
            return None;
        }
        let refused_lately = self
            .refused_at
            .is_some_and(|r| now.saturating_duration_since(r) < cap.stale_after);
        if refused_lately {
            return None;
        }
        self.load(now, cap).filter(|&l| l < cap.slots.max(1))
    }

    /// KV blocks free as last reported (0 when unknown): the tie-breaker between engines
    /// equally loaded.
    pub fn kv_free(&self) -> u64 {
        self.report.map_or(0, |(l, _)| l.kv_free)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Capacity = Capacity {
        slots: 8,
        share: 1,
        stale_after: Duration::from_secs(2),
    };

    fn ready() -> EngineSlot {
        let mut e = EngineSlot::new(1, "e".into(), "http://e".into(), true);
        e.health = Health::Ready;
        e
    }

    fn load(running: u64, waiting: u64) -> EngineLoad {
        EngineLoad {
            running,
            waiting,
            kv_free: 10,
            kv_total: 20,
            slots: None,
        }
    }

    #[test]
    fn a_refusal_for_room_holds_until_a_report_and_at_most_the_staleness_bound() {
        let (mut e, t0) = (ready(), Instant::now());
        e.refused_at = Some(t0);
        assert_eq!(e.room(t0, &CAP), None);
        assert_eq!(
            e.room(t0 + Duration::from_secs(2), &CAP),
            Some(0),
            "not for good"
        );
        e.record(load(1, 0), t0 + Duration::from_millis(10));
        assert_eq!(
            e.room(t0 + Duration::from_millis(10), &CAP),
            Some(1),
            "it reported"
        );
        e.refused_at = Some(t0 + Duration::from_millis(20));
        e.record(load(0, 0), t0 + Duration::from_millis(15));
        assert!(
            e.refused_at.is_some(),
            "a report from before the refusal is no news"
        );
    }

    #[test]
    fn the_engines_own_slots_bound_the_configured_ones() {
        let (mut e, t0) = (ready(), Instant::now());
        e.record(
            EngineLoad {
                slots: Some(2),
                ..load(1, 0)
            },
            t0,
        );
        assert_eq!(e.room(t0, &CAP), Some(1), "2 slots reported, 1 held");
        e.since_report = 1;
        assert_eq!(
            e.room(t0, &CAP),
            None,
            "full at the engine's 2, not the flag's 8"
        );
        // A report without the figure keeps the last one; one above the flag is capped by it.
        e.record(load(0, 0), t0);
        assert_eq!(e.capacity(&CAP).slots, 2);
        e.record(
            EngineLoad {
                slots: Some(100),
                ..load(0, 0)
            },
            t0,
        );
        assert_eq!(e.capacity(&CAP).slots, 8);
    }

    #[test]
    fn places_on_the_engines_figures_plus_leases_since() {
        let t0 = Instant::now();
        let mut e = ready();
        // The engine holds 6 (another router's, say); this router has none of them.
        e.record(load(4, 2), t0);
        assert_eq!(e.room(t0, &CAP), Some(6));
        // Two leases since the report fill it.
        e.in_flight = 2;
        e.since_report = 2;
        assert_eq!(e.room(t0, &CAP), None);
        // A newer report that has seen one of them finish frees a slot.
        e.record(load(4, 3), t0 + Duration::from_millis(10));
        assert_eq!(e.since_report, 0);
        assert_eq!(e.room(t0, &CAP), Some(7));
        // An older report arriving late changes nothing.
        e.record(load(0, 0), t0);
        assert_eq!(e.room(t0, &CAP), Some(7));
    }

    #[test]
    fn stale_figures_count_as_full() {
        let t0 = Instant::now();
        let mut e = ready();
        e.record(load(0, 0), t0);
        assert_eq!(e.room(t0 + Duration::from_secs(2), &CAP), Some(0));
        let later = t0 + Duration::from_millis(2001);
        assert_eq!(e.load(later, &CAP), None);
        assert_eq!(e.room(later, &CAP), None, "stale: full");
        e.record(load(1, 0), later);
        assert_eq!(e.room(later, &CAP), Some(1), "fresh again");
    }

    #[test]
    fn never_reported_is_placed_on_own_leases_and_share_bounds_each_router() {
        let t0 = Instant::now();
        let mut e = ready();
        e.in_flight = 7;
        assert_eq!(e.room(t0, &CAP), Some(7));
        e.in_flight = 8;
        assert_eq!(e.room(t0, &CAP), None);
        // Two routers: each holds at most 4 of the engine's 8, even when it reports idle.
        let two = Capacity { share: 2, ..CAP };
        e.record(load(0, 0), t0);
        e.in_flight = 3;
        assert!(e.room(t0, &two).is_some());
        e.in_flight = 4;
        assert_eq!(e.room(t0, &two), None);
        // More routers than slots: one each (the only case the shares can overshoot).
        let many = Capacity { share: 16, ..CAP };
        assert_eq!(many.own(), 1);
        // Not ready: no room, whatever the figures.
        e.in_flight = 0;
        e.health = Health::Down;
        assert_eq!(e.room(t0, &CAP), None);
    }
}
