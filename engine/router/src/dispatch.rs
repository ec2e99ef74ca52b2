//! The dispatcher: which engine a request goes to, and waiting when none has room.
//!
//! One mutex guards the engines (membership, health, in-flight counts), the affinity ring
//! and the tier queue, so a slot freed by a finished request is handed straight to the
//! best waiter (no thundering herd, no lost wake-up). A request with a key (session or
//! prompt prefix) is placed on the ring with bounded load; one without goes to the engine
//! with the fewest requests in flight. An engine is eligible while it is ready (its last
//! health probe answered 200), accepting (not being drained) and under its slot count.
//!
//! Invariants: an engine's in-flight count equals the [`Lease`]s alive on it; a lease is
//! handed out only for an eligible engine; every queued request leaves the queue exactly
//! once (handed a lease, timed out, or given up by its waiter), and a lease sent to a waiter
//! that has gone is returned at once. Never call back into the dispatcher while holding
//! its lock (a lease's drop takes it).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tidegate_api::router::RouterEndpoint;
use tokio::sync::oneshot;

use super::queue::{Entry, TierQueue};
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

#[derive(Debug)]
struct EngineSlot {
    id: u64,
    name: String,
    url: String,
    accepting: bool,
    health: Health,
    in_flight: u64,
    /// Left the pushed set; kept until its last lease ends.
    removed: bool,
}

impl EngineSlot {
    fn live(&self) -> bool {
        !self.removed && self.accepting && self.health == Health::Ready
    }

    /// The `endpoints` gauge's state.
    fn state(&self) -> &'static str {
        match (self.accepting, self.health) {
            (false, _) => "draining",
            (true, Health::Ready) => "ready",
            (true, Health::NotReady) => "not_ready",
            (true, Health::Down) => "down",
        }
    }
}

/// Dispatcher settings.
#[derive(Clone, Debug)]
pub struct DispatchConfig {
    /// Requests one engine holds at most (its batch plus its own queue).
    pub engine_slots: u64,
    /// Router queue bound (waiting for room).
    pub max_queued: usize,
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
    /// No engine had room within the tier's queue-wait target (503).
    QueueTimeout,
    /// The pool had no ready engine within the hold timeout, or the hold is full (503).
    NoEngine,
}

struct Waiter {
    key: Option<Key>,
    exclude: Option<u64>,
    tx: oneshot::Sender<Lease>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").field("key", &self.key).finish()
    }
}

#[derive(Debug)]
struct Inner {
    engines: Vec<EngineSlot>,
    /// Ring over the members (not removed), and the engines index of each ring index.
    ring: Ring,
    ring_members: Vec<usize>,
    queue: TierQueue<Waiter>,
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
}

impl Lease {
    pub fn engine_id(&self) -> u64 {
        self.engine_id
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
        let queue = TierQueue::new(cfg.max_queued + cfg.max_held, cfg.aging_per_second);
        Arc::new(Dispatcher {
            inner: Mutex::new(Inner {
                engines: Vec::new(),
                ring: Ring::default(),
                ring_members: Vec::new(),
                queue,
                next_id: 1,
                rr: 0,
            }),
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
                g.engines.push(EngineSlot {
                    id,
                    name: w.name.clone(),
                    url: w.url.clone(),
                    accepting: w.accepting,
                    health: Health::NotReady,
                    in_flight: 0,
                    removed: false,
                });
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

    /// Records a probe result (or a failed connect) for engine `id`.
    pub fn set_health(self: &Arc<Self>, id: u64, health: Health) {
        let mut g = self.lock();
        let Some(e) = g.engines.iter_mut().find(|e| e.id == id) else {
            return;
        };
        if e.health == health {
            return;
        }
        tracing::info!(engine = %e.name, from = ?e.health, to = ?health, "engine health changed");
        e.health = health;
        self.pump(g);
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

    /// A lease on an engine for a request of `priority`, waiting at most `wait` for room
    /// (or the hold timeout while no engine is ready). `exclude` skips one engine (the one
    /// a connect just failed on).
    pub async fn acquire(
        self: &Arc<Self>,
        key: Option<Key>,
        priority: i64,
        wait: Duration,
        exclude: Option<u64>,
    ) -> Result<Lease, Refusal> {
        let (id, held, rx, deadline) = {
            let mut g = self.lock();
            if let Some(lease) = self.try_place(&mut g, key, exclude) {
                return Ok(lease);
            }
            let now = Instant::now();
            let held = !g.engines.iter().any(EngineSlot::live);
            let (deadline, bound) = if held {
                (now + self.cfg.hold_timeout, self.cfg.max_held)
            } else {
                (now + wait, self.cfg.max_queued)
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
                priority,
                arrived: now,
                deadline,
                held,
                item: Waiter { key, exclude, tx },
            };
            if g.queue.push(entry).is_err() {
                return Err(Refusal::QueueFull);
            }
            self.publish(&g);
            (id, held, rx, deadline)
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

    /// Places a request now, or None when no eligible engine has room.
    fn try_place(
        self: &Arc<Self>,
        g: &mut Inner,
        key: Option<Key>,
        exclude: Option<u64>,
    ) -> Option<Lease> {
        let slots = self.cfg.engine_slots.max(1);
        let ok = |e: &EngineSlot| e.live() && e.in_flight < slots && Some(e.id) != exclude;
        let (idx, affinity) = match key {
            Some(k) => {
                let loads: Vec<u64> = g
                    .ring_members
                    .iter()
                    .map(|&i| g.engines[i].in_flight)
                    .collect();
                let p = g.ring.place(k.hash, &loads, self.cfg.load_factor, |r| {
                    ok(&g.engines[g.ring_members[r]])
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
                    .filter(|&i| ok(&g.engines[i]))
                    .min_by_key(|&i| g.engines[i].in_flight)?;
                (idx, None)
            }
        };
        let e = &mut g.engines[idx];
        e.in_flight += 1;
        self.observer.placed(key, affinity);
        Some(Lease {
            disp: Some(Arc::clone(self)),
            engine_id: e.id,
            name: e.name.clone(),
            url: e.url.clone(),
        })
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
        while !g.queue.is_empty() {
            let Some(entry) = g.queue.pop(now, |_| true) else {
                break;
            };
            let w = entry.item;
            match self.try_place(&mut g, w.key, w.exclude) {
                Some(lease) => {
                    if let Err(mut lease) = w.tx.send(lease) {
                        // The waiter has gone: return its slot without re-entering.
                        lease.disp = None;
                        if let Some(e) = g.engines.iter_mut().find(|e| e.id == lease.engine_id) {
                            e.in_flight = e.in_flight.saturating_sub(1);
                        }
                    }
                }
                None => {
                    // No room anywhere (placement spills across the ring): put it back.
                    let back = Entry {
                        id: entry.id,
                        priority: entry.priority,
                        arrived: entry.arrived,
                        deadline: entry.deadline,
                        held: entry.held,
                        item: w,
                    };
                    let _ = g.queue.push(back);
                    break;
                }
            }
        }
        self.publish(&g);
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
