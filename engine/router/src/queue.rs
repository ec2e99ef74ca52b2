//! The router's fair queue: requests waiting for an engine with room.
//!
//! Order, when a slot frees:
//! 1. **Tier**: the tier whose oldest waiting request has the highest aged priority, the
//!    tier's priority plus `aging_per_second` for every second that request has waited.
//! 2. **Tenant**, within that tier: the one with the least service lately (decayed tokens,
//!    [`crate::service`]), so a tenant running 48 streams does not make a tenant running one
//!    wait behind all of them; ties go to the tenant whose oldest request is older.
//! 3. **FIFO** within a tenant.
//!
//! Worst-case wait of a low tier (why aging bounds starvation): a tier's oldest request of
//! priority `p` that has waited `w` outranks the oldest request of a tier of priority
//! `q > p` that has waited `v` once `p + a·w > q + a·v`, with `a = aging_per_second`. A
//! request of the higher tier waits at most its tier's queue-wait target `T_q` (it is refused
//! past it), so `v ≤ T_q`; hence once `w > (q − p)/a + T_q` for every higher tier `q`, the low
//! tier is handed the next slot that frees, however saturated the higher tiers are. The
//! bound is `max over higher tiers of ((q − p)/a + T_q)` plus the time until a slot frees
//! (e.g. enterprise 100 with target 500 ms above free 10 at the default 20 points/s:
//! 4.5 s + 0.5 s = 5 s). A request whose own target is shorter times out first (503).
//! Within the low tier the slot then goes by tenant fairness (step 2).
//!
//! Bounds: the queue as a whole, and each tenant within it (one tenant cannot fill it).
//!
//! Invariants: an entry leaves exactly once — popped for dispatch, expired, or removed by
//! its waiter; `len()` counts only entries still waiting; no tenant has more than the
//! tenant bound waiting (an entry put back after a failed placement excepted: it was
//! counted when it came). Time is passed in (no clock here), so ordering, service and expiry
//! are tested without sleeping.

use std::collections::VecDeque;
use std::time::Instant;

use super::service::Ledger;

/// One waiting request.
#[derive(Debug)]
pub struct Entry<T> {
    pub id: u64,
    pub priority: i64,
    pub tier: String,
    pub tenant: String,
    /// Tokens it will be charged when it is handed a slot (the router's estimate).
    pub cost: u64,
    pub arrived: Instant,
    pub deadline: Instant,
    /// True for a request held because no engine was ready (scale from zero).
    pub held: bool,
    pub item: T,
}

/// Why an entry was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The queue is at its bound.
    Full,
    /// This tenant has its bound waiting already.
    TenantFull,
}

/// One tenant's waiting requests, in arrival order.
#[derive(Debug)]
struct Lane<T> {
    tier: String,
    tenant: String,
    entries: VecDeque<Entry<T>>,
}

/// The bounded fair queue (linear scans over tenants: it holds at most a few hundred
/// entries, and a pop is once per finished request).
#[derive(Debug)]
pub struct FairQueue<T> {
    lanes: Vec<Lane<T>>,
    ledger: Ledger,
    len: usize,
    bound: usize,
    tenant_bound: usize,
    aging_per_second: f64,
}

impl<T> FairQueue<T> {
    pub fn new(bound: usize, tenant_bound: usize, aging_per_second: f64) -> Self {
        FairQueue {
            lanes: Vec::new(),
            ledger: Ledger::default(),
            len: 0,
            bound,
            tenant_bound: tenant_bound.max(1),
            aging_per_second,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn held(&self) -> usize {
        self.lanes
            .iter()
            .flat_map(|l| l.entries.iter())
            .filter(|e| e.held)
            .count()
    }

    /// Requests of `tenant` waiting.
    pub fn waiting_of(&self, tenant: &str) -> usize {
        self.lanes
            .iter()
            .filter(|l| l.tenant == tenant)
            .map(|l| l.entries.len())
            .sum()
    }

    /// The service ledger (the dispatcher charges placements that never waited here too).
    pub fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    /// Queues `entry` unless the queue or its tenant is at its bound.
    pub fn push(&mut self, entry: Entry<T>) -> Result<(), (Refused, Entry<T>)> {
        if self.len >= self.bound {
            return Err((Refused::Full, entry));
        }
        if self.waiting_of(&entry.tenant) >= self.tenant_bound {
            return Err((Refused::TenantFull, entry));
        }
        self.enqueue(entry, false);
        Ok(())
    }

    /// Puts back an entry just popped that could not be placed: at the front of its
    /// tenant's lane, where it was, whatever the bounds (it was counted when it came).
    pub fn put_back(&mut self, entry: Entry<T>) {
        self.enqueue(entry, true);
    }

    fn enqueue(&mut self, entry: Entry<T>, front: bool) {
        self.len += 1;
        let lane = self
            .lanes
            .iter_mut()
            .find(|l| l.tenant == entry.tenant && l.tier == entry.tier);
        match lane {
            Some(l) if front => l.entries.push_front(entry),
            Some(l) => l.entries.push_back(entry),
            None => self.lanes.push(Lane {
                tier: entry.tier.clone(),
                tenant: entry.tenant.clone(),
                entries: VecDeque::from([entry]),
            }),
        }
    }

    fn rank(&self, e: &Entry<T>, now: Instant) -> f64 {
        let waited = now.saturating_duration_since(e.arrived).as_secs_f64();
        e.priority as f64 + self.aging_per_second * waited
    }

    /// The tier to serve: the one whose oldest live request ranks highest (ties: the older).
    fn best_tier(&self, now: Instant) -> Option<&str> {
        let mut best: Option<(&Entry<T>, f64)> = None;
        for head in self.lanes.iter().filter_map(|l| l.entries.front()) {
            if head.deadline <= now {
                continue;
            }
            let r = self.rank(head, now);
            let better = match best {
                None => true,
                Some((b, rb)) => r > rb || (r == rb && head.arrived < b.arrived),
            };
            if better {
                best = Some((head, r));
            }
        }
        best.map(|(e, _)| e.tier.as_str())
    }

    /// Index of the lane to serve in `tier`: least service lately, ties the older head.
    fn best_lane(&self, tier: &str, now: Instant) -> Option<usize> {
        let mut best: Option<(usize, f64, Instant)> = None;
        for (i, lane) in self.lanes.iter().enumerate() {
            let Some(head) = lane.entries.front() else {
                continue;
            };
            if lane.tier != tier || head.deadline <= now {
                continue;
            }
            let s = self.ledger.service(&lane.tenant, now);
            let better = match best {
                None => true,
                Some((_, sb, ab)) => s < sb || (s == sb && head.arrived < ab),
            };
            if better {
                best = Some((i, s, head.arrived));
            }
        }
        best.map(|(i, _, _)| i)
    }

    /// Removes and returns the next entry to serve (expired ones are never returned; see
    /// [`FairQueue::expire`]). Charging its tenant is the caller's, once it is placed.
    pub fn pop(&mut self, now: Instant) -> Option<Entry<T>> {
        let tier = self.best_tier(now)?.to_string();
        let i = self.best_lane(&tier, now)?;
        let entry = self.lanes[i].entries.pop_front()?;
        if self.lanes[i].entries.is_empty() {
            self.lanes.swap_remove(i);
        }
        self.len -= 1;
        Some(entry)
    }

    /// Removes the entry `id` (its waiter gave up); None when it already left.
    pub fn remove(&mut self, id: u64) -> Option<Entry<T>> {
        let (li, ei) = self
            .lanes
            .iter()
            .enumerate()
            .find_map(|(li, l)| l.entries.iter().position(|e| e.id == id).map(|ei| (li, ei)))?;
        let entry = self.lanes[li].entries.remove(ei)?;
        if self.lanes[li].entries.is_empty() {
            self.lanes.swap_remove(li);
        }
        self.len -= 1;
        Some(entry)
    }

    /// Removes and returns every entry past its deadline.
    pub fn expire(&mut self, now: Instant) -> Vec<Entry<T>> {
        let mut gone = Vec::new();
        for lane in &mut self.lanes {
            if lane.entries.iter().all(|e| e.deadline > now) {
                continue;
            }
            let (keep, out): (VecDeque<_>, VecDeque<_>) =
                lane.entries.drain(..).partition(|e| e.deadline > now);
            lane.entries = keep;
            gone.extend(out);
        }
        if !gone.is_empty() {
            self.lanes.retain(|l| !l.entries.is_empty());
        }
        self.len -= gone.len();
        gone
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
