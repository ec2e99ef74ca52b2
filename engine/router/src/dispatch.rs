//! The dispatcher: which engine a request goes to, and waiting when none has room.
//!
//! One mutex guards the engines (membership, health, in-flight counts, load reports), the
//! affinity ring and the fair queue, so a slot freed by a finished request is handed
//! straight to the best waiter (no thundering herd, no lost wake-up). A request with a key
//! (session or prompt prefix) is placed on the ring with bounded load; one without goes to
//! the least loaded engine (the engine's own figures plus this router's leases since, then
//! the most KV free). An engine is eligible while it is ready (its last health probe
//! answered 200), accepting (not being drained) and has room ([`crate::engine_slot`]: this
//! router's share of its slots, and its own fresh figures below them).
//!
//! Every lease charges its tenant's service (the fair queue's measure) with the request's
//! estimated tokens; [`Lease::settle`] corrects it with what the engine reported.
//!
//! Invariants: an engine's in-flight count equals the [`Lease`]s alive on it; a lease is
//! handed out only for an eligible engine; every queued request leaves the queue exactly
//! once (handed a lease, timed out, or given up by its waiter), and a lease sent to a waiter
//! that has gone is returned at once (and its charge refunded). Never call back into the
//! dispatcher while holding its lock (a lease's drop takes it).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tidegate_api::router::{EngineLoad, RouterEndpoint};
use tokio::sync::oneshot;

pub use super::engine_slot::Health;
use super::engine_slot::{Capacity, EngineSlot};
use super::queue::{Entry, FairQueue, Refused};
use super::ring::Ring;

/// What a placement keys on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Session,
    Prefix,
}

impl KeyKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            KeyKind::Session => "session",
            KeyKind::Prefix => "prefix",
        }
    }
}

/// A request's affinity key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub kind: KeyKind,
    pub hash: u64,
}

/// How a keyed placement went (the affinity counter's `result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Affinity {
    /// The key's own engine.
    Hit,
    /// Its own engine was ready but at its load bound or slots: the next on the ring.
    Spill,
    /// Its own engine was not ready or not accepting.
    Miss,
}

impl Affinity {
    pub fn as_str(&self) -> &'static str {
        match self {
            Affinity::Hit => "hit",
            Affinity::Spill => "spill",
            Affinity::Miss => "miss",
        }
    }
}

/// Dispatcher settings.
#[derive(Clone, Debug)]
pub struct DispatchConfig {
    /// Requests one engine holds at most (its batch plus its own queue).
    pub engine_slots: u64,
    /// Routers sharing every engine's slots (this one takes `⌊slots / share⌋`).
    pub slot_share: u32,
    /// Engine load figures older than this count as full.
    pub load_stale_after: Duration,
    /// Router queue bound (waiting for room).
    pub max_queued: usize,
    /// Requests one tenant may have waiting (held ones included).
    pub max_queued_per_tenant: usize,
    /// Requests held at most while no engine is ready.
    pub max_held: usize,
    pub hold_timeout: Duration,
    pub load_factor: f64,
    /// Priority points a waiting request gains per second.
    pub aging_per_second: f64,
}

/// Why no engine was leased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The router queue is at its bound (429).
    QueueFull,
    /// This tenant has its bound waiting already (429, to that tenant only).
    TenantQueueFull,
    /// No engine had room within the tier's queue-wait target (503).
    QueueTimeout,
    /// The pool had no ready engine within the hold timeout, or the hold is full (503).
    NoEngine,
}

/// What a request asks the dispatcher for.
#[derive(Clone, Debug)]
pub struct Ask {
    pub key: Option<Key>,
    pub priority: i64,
    pub tier: String,
    pub tenant: String,
    /// Tokens charged to the tenant's service when it is placed (the router's estimate).
    pub cost: u64,
    /// How long it may wait for room (the tier's queue-wait target), counted from `since`.
    pub wait: Duration,
    /// When it first asked: a request put back (its engine refused it for room) keeps its
    /// place and its deadline.
    pub since: Instant,
    /// An engine to skip (the one a connect just failed on).
    pub exclude: Option<u64>,
}

/// What a placement needs of a request.
#[derive(Clone, Debug)]
struct Want {
    key: Option<Key>,
    exclude: Option<u64>,
    tenant: String,
    cost: u64,
}

struct Waiter {
    want: Want,
    tx: oneshot::Sender<Lease>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").field("want", &self.want).finish()
    }
}

#[derive(Debug)]
struct Inner {
    engines: Vec<EngineSlot>,
    /// Ring over the members (not removed), and the engines index of each ring index.
    ring: Ring,
    ring_members: Vec<usize>,
    queue: FairQueue<Waiter>,
    next_id: u64,
    rr: usize,
}

impl Inner {
    /// Drops engines that left the pushed set and hold no lease, and re-indexes the ring's
    /// members (their positions in `engines` may have shifted; the ring itself, built from
    /// names, does not change).
    fn prune(&mut self) {
        self.engines.retain(|e| !e.removed || e.in_flight > 0);
        self.ring_members = (0..self.engines.len())
            .filter(|&i| !self.engines[i].removed)
            .collect();
    }
}

/// The shared dispatcher.
#[derive(Debug)]
pub struct Dispatcher {
    inner: Mutex<Inner>,
    cfg: DispatchConfig,
    /// Routers sharing the engines' slots; replaceable (the pushed count of live routers).
    share: AtomicU32,
    /// Placement outcomes, counted by the caller's metrics hook.
    observer: Box<dyn DispatchObserver>,
}

/// Where dispatch events go (the router's metrics).
pub trait DispatchObserver: Send + Sync + std::fmt::Debug {
    fn placed(&self, key: Option<Key>, affinity: Option<Affinity>);
    fn gauges(&self, queued: usize, held: usize, states: &[(&'static str, u64)]);
}

/// A slot on one engine: alive as long as the request it carries.
#[derive(Debug)]
pub struct Lease {
    disp: Option<Arc<Dispatcher>>,
    engine_id: u64,
    pub name: String,
    pub url: String,
    tenant: String,
    /// Tokens charged to the tenant for this request; None once settled.
    charged: Option<u64>,
}

impl Lease {
    pub fn engine_id(&self) -> u64 {
        self.engine_id
    }

    /// Replaces the estimate this lease charged its tenant by `actual` tokens (the engine's
    /// `usage`; 0 when the engine refused the request). Once per lease; later calls do
    /// nothing, and a lease never settled keeps its estimate.
    pub fn settle(&mut self, actual: u64) {
        if let (Some(d), Some(charged)) = (&self.disp, self.charged.take()) {
            let mut g = d.lock();
            g.queue
                .ledger()
                .correct(&self.tenant, charged, actual, Instant::now());
        }
    }

    /// Records a load report the engine sent with its answer.
    pub fn report(&self, load: EngineLoad) {
        if let Some(d) = &self.disp {
            d.report(self.engine_id, load, Instant::now());
        }
    }

    /// The engine refused this request for room (`queue_full`): see
    /// [`Dispatcher::refused_for_room`].
    pub fn refused_for_room(&self) {
        if let Some(d) = &self.disp {
            d.refused_for_room(self.engine_id);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(d) = self.disp.take() {
            d.release(self.engine_id);
        }
    }
}

/// Engines and queue as the admin API and the gauges show them.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineView {
    pub name: String,
    pub url: String,
    pub state: &'static str,
    pub in_flight: u64,
}

impl Dispatcher {
    pub fn new(cfg: DispatchConfig, observer: Box<dyn DispatchObserver>) -> Arc<Self> {
        let queue = FairQueue::new(
            cfg.max_queued + cfg.max_held,
            cfg.max_queued_per_tenant,
            cfg.aging_per_second,
        );
        Arc::new(Dispatcher {
            inner: Mutex::new(Inner {
                engines: Vec::new(),
                ring: Ring::default(),
                ring_members: Vec::new(),
                queue,
                next_id: 1,
                rr: 0,
            }),
            share: AtomicU32::new(cfg.slot_share.max(1)),
            cfg,
            observer,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn capacity(&self) -> Capacity {
        Capacity {
            slots: self.cfg.engine_slots.max(1),
            share: self.share.load(Ordering::Relaxed).max(1),
            stale_after: self.cfg.load_stale_after,
        }
    }

    /// Sets how many routers share the engines' slots (each takes `⌊slots / share⌋`).
    pub fn set_slot_share(self: &Arc<Self>, share: u32) {
        self.share.store(share.max(1), Ordering::Relaxed);
        self.pump(self.lock());
    }

    /// Replaces the engine set (operator push or static flags). Engines are matched by
    /// name; a new one starts `NotReady` until its first probe.
    pub fn set_endpoints(self: &Arc<Self>, want: &[RouterEndpoint]) {
        let mut g = self.lock();
        let mut change = SetChange::default();
        for e in g.engines.iter_mut() {
            let removed = !want.iter().any(|w| w.name == e.name && w.url == e.url);
            if removed && !e.removed {
                change.removed.push(e.name.clone());
            }
            e.removed = removed;
        }
        for w in want {
            if let Some(e) = g
                .engines
                .iter_mut()
                .find(|e| e.name == w.name && e.url == w.url)
            {
                if e.accepting && !w.accepting {
                    change.draining.push(e.name.clone());
                }
                e.accepting = w.accepting;
            } else {
                change.added.push(w.name.clone());
                let id = g.next_id;
                g.next_id += 1;
                let slot = EngineSlot::new(id, w.name.clone(), w.url.clone(), w.accepting);
                g.engines.push(slot);
            }
        }
        change.log();
        g.prune();
        let names: Vec<&str> = g
            .ring_members
            .iter()
            .map(|&i| g.engines[i].name.as_str())
            .collect();
        g.ring = Ring::new(&names);
        self.pump(g);
    }

    /// Records a probe result (or a failed connect) for engine `id`, with the load figures
    /// the probe's answer carried.
    pub fn set_health(self: &Arc<Self>, id: u64, health: Health) {
        self.set_probe(id, health, None, Instant::now());
    }

    /// Records a probe: its health and, when its answer carried them, the engine's figures.
    pub fn set_probe(
        self: &Arc<Self>,
        id: u64,
        health: Health,
        load: Option<EngineLoad>,
        at: Instant,
    ) {
        let mut g = self.lock();
        let Some(e) = g.engines.iter_mut().find(|e| e.id == id) else {
            return;
        };
        match load {
            Some(l) => e.record(l, at),
            // An engine that sends no figures (an older one) has nothing else to say.
            None => e.refused_at = None,
        }
        if e.health != health {
            tracing::info!(engine = %e.name, from = ?e.health, to = ?health, "engine health changed");
            e.health = health;
        }
        self.pump(g);
    }

    /// Records engine `id`'s load figures as of `at` (an answer's header).
    pub fn report(self: &Arc<Self>, id: u64, load: EngineLoad, at: Instant) {
        let mut g = self.lock();
        if let Some(e) = g.engines.iter_mut().find(|e| e.id == id) {
            e.record(load, at);
        }
        self.pump(g);
    }

    /// Engine `id` refused a request for room: it is full until its next report says not
    /// (see [`EngineSlot::refused_at`]).
    pub fn refused_for_room(self: &Arc<Self>, id: u64) {
        let mut g = self.lock();
        if let Some(e) = g.engines.iter_mut().find(|e| e.id == id) {
            e.refused_at = Some(Instant::now());
        }
    }

    /// `(id, url)` of every engine to probe.
    pub fn probe_targets(&self) -> Vec<(u64, String)> {
        self.lock()
            .engines
            .iter()
            .filter(|e| !e.removed)
            .map(|e| (e.id, e.url.clone()))
            .collect()
    }

    /// The engines, and the requests held (no ready engine) and queued (no room) here.
    pub fn view(&self) -> (Vec<EngineView>, usize, usize) {
        let g = self.lock();
        let engines = g
            .engines
            .iter()
            .filter(|e| !e.removed)
            .map(|e| EngineView {
                name: e.name.clone(),
                url: e.url.clone(),
                state: e.state(),
                in_flight: e.in_flight,
            })
            .collect();
        let held = g.queue.held();
        (engines, held, g.queue.len() - held)
    }

    /// A lease on an engine for `ask`, waiting in the fair queue at most until `ask.since +
    /// ask.wait` for room (or the hold timeout while no engine is ready).
    pub async fn acquire(self: &Arc<Self>, ask: Ask) -> Result<Lease, Refusal> {
        let (id, held, rx, deadline) = match self.enqueue(ask) {
            Ok(Queued::Placed(lease)) => return Ok(lease),
            Ok(Queued::Waiting(w)) => w,
            Err(r) => return Err(r),
        };
        // Bound first, so a lease that arrived with the deadline is dropped (and its slot
        // returned) before the lock is taken below.
        let got = tokio::time::timeout_at(deadline.into(), rx).await;
        match got {
            Ok(Ok(lease)) => Ok(lease),
            _ => {
                let mut g = self.lock();
                let gone = g.queue.remove(id);
                self.publish(&g);
                drop(g);
                if gone.is_some() {
                    return Err(if held {
                        Refusal::NoEngine
                    } else {
                        Refusal::QueueTimeout
                    });
                }
                // Handed a lease just as the wait ended: it was sent, so it is ours.
                Err(Refusal::QueueTimeout)
            }
        }
    }

    /// Places `ask` now, or queues it (its id, whether held, its lease's receiver and its
    /// deadline), or refuses it.
    fn enqueue(self: &Arc<Self>, ask: Ask) -> Result<Queued, Refusal> {
        let mut g = self.lock();
        let want = Want {
            key: ask.key,
            exclude: ask.exclude,
            tenant: ask.tenant.clone(),
            cost: ask.cost,
        };
        // Place at once only when no one of this tier or above waits for room: a newcomer
        // does not overtake the queue (the queue decides who is next).
        if g.queue.is_empty()
            && let Some(lease) = self.try_place(&mut g, &want)
        {
            return Ok(Queued::Placed(lease));
        }
        let now = Instant::now();
        let held = !g.engines.iter().any(EngineSlot::live);
        let (deadline, bound) = if held {
            (now + self.cfg.hold_timeout, self.cfg.max_held)
        } else {
            (ask.since + ask.wait, self.cfg.max_queued)
        };
        let in_class = if held {
            g.queue.held()
        } else {
            g.queue.len() - g.queue.held()
        };
        if in_class >= bound {
            return Err(if held {
                Refusal::NoEngine
            } else {
                Refusal::QueueFull
            });
        }
        let (tx, rx) = oneshot::channel();
        let id = g.next_id;
        g.next_id += 1;
        let entry = Entry {
            id,
            priority: ask.priority,
            tier: ask.tier,
            tenant: ask.tenant,
            cost: ask.cost,
            arrived: ask.since,
            deadline,
            held,
            item: Waiter { want, tx },
        };
        match g.queue.push(entry) {
            Ok(()) => {}
            Err((Refused::TenantFull, _)) => return Err(Refusal::TenantQueueFull),
            Err((Refused::Full, _)) => return Err(Refusal::QueueFull),
        }
        // Someone may be placeable now (the queue was not empty, or room just appeared).
        self.pump(g);
        Ok(Queued::Waiting((id, held, rx, deadline)))
    }

    /// Places a request now, or None when no eligible engine has room.
    fn try_place(self: &Arc<Self>, g: &mut Inner, want: &Want) -> Option<Lease> {
        let now = Instant::now();
        let cap = self.capacity();
        let room = |e: &EngineSlot| {
            if Some(e.id) == want.exclude {
                None
            } else {
                e.room(now, &cap)
            }
        };
        let (idx, affinity) = match want.key {
            Some(k) => {
                let loads: Vec<u64> = g
                    .ring_members
                    .iter()
                    .map(|&i| g.engines[i].in_flight)
                    .collect();
                let p = g.ring.place(k.hash, &loads, self.cfg.load_factor, |r| {
                    room(&g.engines[g.ring_members[r]]).is_some()
                })?;
                let affinity = if p.first {
                    Affinity::Hit
                } else {
                    let own = g.ring.walk(k.hash).next().map(|r| g.ring_members[r]);
                    match own {
                        Some(i) if g.engines[i].live() => Affinity::Spill,
                        _ => Affinity::Miss,
                    }
                };
                (g.ring_members[p.engine], Some(affinity))
            }
            None => {
                let n = g.engines.len();
                let start = g.rr;
                g.rr = g.rr.wrapping_add(1);
                let idx = (0..n)
                    .map(|j| (start + j) % n)
                    .filter_map(|i| room(&g.engines[i]).map(|load| (i, load)))
                    // Least loaded; among equals, the most KV free; then round robin.
                    .min_by_key(|&(i, load)| (load, std::cmp::Reverse(g.engines[i].kv_free())))?
                    .0;
                (idx, None)
            }
        };
        let e = &mut g.engines[idx];
        e.in_flight += 1;
        e.since_report += 1;
        let lease = Lease {
            disp: Some(Arc::clone(self)),
            engine_id: e.id,
            name: e.name.clone(),
            url: e.url.clone(),
            tenant: want.tenant.clone(),
            charged: Some(want.cost),
        };
        g.queue.ledger().add(&want.tenant, want.cost as f64, now);
        self.observer.placed(want.key, affinity);
        Some(lease)
    }

    fn release(self: &Arc<Self>, engine_id: u64) {
        let mut g = self.lock();
        let mut gone = false;
        if let Some(e) = g.engines.iter_mut().find(|e| e.id == engine_id) {
            e.in_flight = e.in_flight.saturating_sub(1);
            gone = e.removed && e.in_flight == 0;
        }
        if gone {
            // The last lease on an engine that left the pushed set: forget it.
            g.prune();
        }
        self.pump(g);
    }

    /// Hands free slots to waiters, best first, until no engine has room or no one waits.
    fn pump(self: &Arc<Self>, mut g: MutexGuard<'_, Inner>) {
        let now = Instant::now();
        g.queue.expire(now);
        while let Some(entry) = g.queue.pop(now) {
            match self.try_place(&mut g, &entry.item.want) {
                Some(lease) => {
                    if let Err(lease) = entry.item.tx.send(lease) {
                        self.take_back(&mut g, lease);
                    }
                }
                None => {
                    // No room anywhere (placement spills across the ring): put it back.
                    g.queue.put_back(entry);
                    break;
                }
            }
        }
        self.publish(&g);
    }

    /// A lease whose waiter had gone: its slot and its charge return, without re-entering
    /// the lock.
    fn take_back(&self, g: &mut Inner, mut lease: Lease) {
        lease.disp = None;
        if let Some(e) = g.engines.iter_mut().find(|e| e.id == lease.engine_id) {
            e.in_flight = e.in_flight.saturating_sub(1);
        }
        if let Some(charged) = lease.charged.take() {
            g.queue
                .ledger()
                .correct(&lease.tenant, charged, 0, Instant::now());
        }
    }

    fn publish(&self, g: &Inner) {
        let mut states: Vec<(&'static str, u64)> = tidegate_api::router::ENDPOINT_STATES
            .iter()
            .map(|s| (*s, 0))
            .collect();
        for e in g.engines.iter().filter(|e| !e.removed) {
            if let Some(s) = states.iter_mut().find(|(n, _)| *n == e.state()) {
                s.1 += 1;
            }
        }
        let held = g.queue.held();
        self.observer.gauges(g.queue.len() - held, held, &states);
    }
}

/// What [`Dispatcher::enqueue`] did with a request.
enum Queued {
    Placed(Lease),
    Waiting((u64, bool, oneshot::Receiver<Lease>, Instant)),
}

/// What an endpoint push changed, logged so that the router's log tells when an engine
/// joined, left (its pod deleted) or began to drain.
#[derive(Debug, Default)]
struct SetChange {
    added: Vec<String>,
    removed: Vec<String>,
    draining: Vec<String>,
}

impl SetChange {
    fn log(&self) {
        if self.added.is_empty() && self.removed.is_empty() && self.draining.is_empty() {
            return;
        }
        tracing::info!(added = ?self.added, removed = ?self.removed, draining = ?self.draining, "engine set changed");
    }
}

#[cfg(test)]
#[path = "dispatch_tests.rs"]
mod tests;
