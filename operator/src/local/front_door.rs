//! What local mode's summary says about the pool's router: affinity hits, spills and misses,
//! the KV restores affinity avoided, and requests held while the pool had no engine.
//!
//! "Restores avoided" is counted against round-robin, the plain Service the router
//! replaces: a session request that hit its own engine while `r` replicas were ready would,
//! under round-robin, have landed elsewhere with probability `(r - 1) / r`, and there it
//! restores its KV (from host, disk or by recompute) instead of finding it resident. The
//! router's counters are read once per tick, so each tick's hits are weighed by that tick's
//! ready count.

use tidegate_api::exposition::samples;
use tidegate_api::router::{AFFINITY, HELD, REQUESTS};

/// The router's counters as of one scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Counters {
    session_hits: f64,
    spills: f64,
    misses: f64,
    prefix_hits: f64,
    held: f64,
    hold_timeouts: f64,
}

fn parse(text: &str) -> Counters {
    let mut c = Counters::default();
    for s in samples(text) {
        if s.name == AFFINITY.series {
            match (s.label("key"), s.label("result")) {
                (Some("session"), Some("hit")) => c.session_hits += s.value,
                (Some("prefix"), Some("hit")) => c.prefix_hits += s.value,
                (_, Some("spill")) => c.spills += s.value,
                (_, Some("miss")) => c.misses += s.value,
                _ => {}
            }
        } else if s.name == HELD.series {
            c.held += s.value;
        } else if s.name == REQUESTS.series && s.label("outcome") == Some("hold_timeout") {
            c.hold_timeouts += s.value;
        }
    }
    c
}

/// Accumulates the router's figures over a run.
#[derive(Debug, Default)]
pub struct FrontDoor {
    last: Counters,
    restores_avoided: f64,
    peak_held: f64,
}

impl FrontDoor {
    /// Reads the router's /metrics after a tick at which `ready` engines served.
    pub async fn sample(&mut self, http: &reqwest::Client, router: &str, ready: i32) {
        let Ok(resp) = http.get(format!("{router}/metrics")).send().await else {
            return;
        };
        let Ok(text) = resp.text().await else {
            return;
        };
        self.observe(parse(&text), ready);
    }

    fn observe(&mut self, now: Counters, ready: i32) {
        let new_hits = (now.session_hits - self.last.session_hits).max(0.0);
        if ready > 1 {
            let r = f64::from(ready);
            self.restores_avoided += new_hits * (r - 1.0) / r;
        }
        self.peak_held = self.peak_held.max(now.held);
        self.last = now;
    }

    /// The summary lines.
    pub fn lines(&self) -> Vec<String> {
        let c = &self.last;
        vec![
            format!(
                "router affinity:         {:.0} session hits, {:.0} prefix hits, {:.0} spills, {:.0} misses",
                c.session_hits, c.prefix_hits, c.spills, c.misses
            ),
            format!(
                "KV restores avoided:     {:.0} (session requests round-robin would have sent away from their KV)",
                self.restores_avoided
            ),
            format!(
                "held requests:           peak {:.0} held while no engine was ready, {:.0} timed out",
                self.peak_held, c.hold_timeouts
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_are_weighed_by_the_ready_count_of_their_tick() {
        let text = |hits: u32| {
            format!(
                "tidegate_router_affinity_total{{key=\"session\",result=\"hit\"}} {hits}\n\
                 tidegate_router_affinity_total{{key=\"session\",result=\"spill\"}} 2\n\
                 tidegate_router_held 3\n\
                 tidegate_router_requests_total{{tier=\"free\",outcome=\"hold_timeout\"}} 1\n"
            )
        };
        let mut f = FrontDoor::default();
        f.observe(parse(&text(10)), 1);
        f.observe(parse(&text(40)), 3);
        assert!(
            (f.restores_avoided - 20.0).abs() < 1e-9,
            "{}",
            f.restores_avoided
        );
        assert_eq!(f.peak_held, 3.0);
        let lines = f.lines().join("\n");
        assert!(lines.contains("40 session hits"), "{lines}");
        assert!(lines.contains("2 spills"));
        assert!(lines.contains("1 timed out"));
    }
}
