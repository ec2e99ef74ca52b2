//! The pool model: engine pods with continuous batching, bounded tier-priority queues, a
//! least-loaded router, start-up delay and draining.
//!
//! Service model: a pod decoding `b` sequences advances each of them by one token every
//! `itl(b) = itl_base + itl_per_seq × b` seconds, so its throughput is `b / itl(b)`, which
//! saturates at `T = max_batch / itl(max_batch)`. All sequences on a pod advance together, so
//! a pod keeps one "virtual token clock" `v` and each running request finishes when `v`
//! reaches `v_at_start + work`; completions are exact (event-driven), not time-stepped.
//! `work` is output tokens plus prefill expressed in decode-step equivalents.
//!
//! Invariants: a pod is in exactly one state; only Ready pods receive requests; a Draining
//! pod finishes its running and queued requests, then goes; GPU time is counted from
//! creation (start-up included) until a pod is gone; `running ≤ max_batch` and
//! `queued ≤ max_queue` on every pod.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use super::tenants::NTIERS;

/// Engine behaviour of one pod.
#[derive(Clone, Copy, Debug)]
pub struct PodModel {
    pub max_batch: u32,
    pub max_queue: u32,
    pub itl_base_s: f64,
    pub itl_per_seq_s: f64,
    /// Decode-step equivalents per prompt token that must be prefilled.
    pub prefill_cost: f64,
}

impl PodModel {
    pub fn itl(&self, b: u32) -> f64 {
        self.itl_at(f64::from(b))
    }

    /// Step time at an average (fractional) batch.
    pub fn itl_at(&self, b: f64) -> f64 {
        self.itl_base_s + self.itl_per_seq_s * b
    }

    /// Tokens/s of one pod decoding `b` sequences on average.
    pub fn tokens_per_second_at(&self, b: f64) -> f64 {
        b / self.itl_at(b)
    }

    /// Tokens/s of one pod at saturation (the T of the resource model).
    pub fn saturated_tokens_per_second(&self) -> f64 {
        self.tokens_per_second_at(f64::from(self.max_batch))
    }
}

/// A request inside the pool.
#[derive(Clone, Copy, Debug)]
pub struct Req {
    pub arrival_us: u64,
    pub tenant: u32,
    pub tier: u8,
    pub existing: bool,
    pub turn: u8,
    /// Output tokens.
    pub out: u32,
    /// Conversation tokens after this turn's prompt (before its output).
    pub context: u32,
    /// Decode-step equivalents (output + prefill cost).
    pub work: f32,
    /// A trace file's session number (`trace_file::NO_SESSION`: none).
    pub session: u32,
    /// How many times the client has sent this request again after an overload refusal
    /// (0: the request as first sent, the one the outcome is counted for).
    pub retries: u8,
}

#[derive(Clone, Copy, Debug)]
struct Running {
    finish_v: f64,
    req: Req,
}

impl PartialEq for Running {
    fn eq(&self, other: &Self) -> bool {
        self.finish_v.total_cmp(&other.finish_v) == Ordering::Equal
    }
}
impl Eq for Running {}
impl PartialOrd for Running {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Running {
    // Reversed: BinaryHeap pops the smallest finish first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.finish_v.total_cmp(&self.finish_v)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    Starting,
    Ready,
    Draining,
    Gone,
}

/// One scrape of one pod: time, decode tokens counter, waiting gauge.
#[derive(Clone, Copy, Debug)]
pub struct PodSample {
    pub t_us: u64,
    pub tokens: f64,
    pub itl_sum: f64,
    pub running: u32,
}

#[derive(Debug)]
pub struct Pod {
    pub state: PodState,
    v: f64,
    last_us: u64,
    running: BinaryHeap<Running>,
    queues: [VecDeque<Req>; NTIERS],
    queued: u32,
    pub ver: u32,
    tokens: f64,
    /// Inter-token latency summed over every token made (seconds): with `tokens`, what the
    /// engine's histogram `_sum` and `_count` hold.
    itl_sum: f64,
    pub samples: VecDeque<PodSample>,
}

impl Pod {
    fn new(now: u64) -> Self {
        Pod {
            state: PodState::Starting,
            v: 0.0,
            last_us: now,
            running: BinaryHeap::new(),
            queues: Default::default(),
            queued: 0,
            ver: 0,
            tokens: 0.0,
            itl_sum: 0.0,
            samples: VecDeque::new(),
        }
    }

    fn load(&self) -> u32 {
        self.running.len() as u32 + self.queued
    }

    pub fn running(&self) -> u32 {
        self.running.len() as u32
    }

    pub fn queued(&self) -> u32 {
        self.queued
    }
}

/// Ready pods bucketed by load, for O(1) least-loaded routing.
#[derive(Debug, Default)]
struct Levels {
    levels: Vec<Vec<u32>>,
    pos: Vec<(u32, u32)>,
    min_hint: usize,
}

impl Levels {
    fn ensure(&mut self, pods: usize, levels: usize) {
        if self.levels.len() < levels {
            self.levels.resize_with(levels, Vec::new);
        }
        if self.pos.len() < pods {
            self.pos.resize(pods, (u32::MAX, 0));
        }
    }

    fn insert(&mut self, pod: u32, load: u32) {
        let l = load as usize;
        self.pos[pod as usize] = (load, self.levels[l].len() as u32);
        self.levels[l].push(pod);
        self.min_hint = self.min_hint.min(l);
    }

    fn remove(&mut self, pod: u32) {
        let (l, i) = self.pos[pod as usize];
        if l == u32::MAX {
            return;
        }
        let level = &mut self.levels[l as usize];
        level.swap_remove(i as usize);
        if let Some(&moved) = level.get(i as usize) {
            self.pos[moved as usize].1 = i;
        }
        self.pos[pod as usize] = (u32::MAX, 0);
    }

    fn least_loaded(&mut self) -> Option<u32> {
        while self.min_hint < self.levels.len() {
            if let Some(&p) = self.levels[self.min_hint].last() {
                return Some(p);
            }
            self.min_hint += 1;
        }
        None
    }
}

/// Where an arriving request went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routed {
    Started(u32),
    Queued(u32),
    /// Every ready pod's queue is full, or no pod is ready.
    Full,
}

/// A request that left a queue and started decoding.
#[derive(Clone, Copy, Debug)]
pub struct Started {
    pub req: Req,
    pub wait_s: f64,
}

#[derive(Debug)]
pub struct Pool {
    pub model: PodModel,
    pub pods: Vec<Pod>,
    free: Vec<u32>,
    levels: Levels,
    pub starting: u32,
    pub ready: u32,
    pub draining: u32,
    /// Decode tokens produced by all pods, gone ones included.
    pub tokens_total: f64,
    gpu_pod_us: u128,
    last_account_us: u64,
    /// Per tier slot: how long a request may wait in a queue before the engine drops it
    /// (the tier's queue-wait target, as the engine's scheduler does; `u64::MAX`: never).
    queue_timeout_us: [u64; NTIERS],
    /// Requests dropped for waiting past their tier's target since the caller last drained
    /// this (the engine answers them `queue_timeout`).
    pub timed_out: Vec<Req>,
}

impl Pool {
    pub fn new(model: PodModel) -> Self {
        Pool {
            model,
            pods: Vec::new(),
            free: Vec::new(),
            levels: Levels::default(),
            starting: 0,
            ready: 0,
            draining: 0,
            tokens_total: 0.0,
            gpu_pod_us: 0,
            last_account_us: 0,
            queue_timeout_us: [u64::MAX; NTIERS],
            timed_out: Vec::new(),
        }
    }

    /// Queued requests time out after their tier's queue-wait target (seconds per tier
    /// slot), as in the engine, whose scheduler drops a request that was never admitted once
    /// it has waited past its tier's target. Without this, nothing times out.
    pub fn with_queue_timeouts(mut self, targets_s: [f64; NTIERS]) -> Self {
        self.queue_timeout_us = targets_s.map(|t| (t * 1e6) as u64);
        self
    }

    /// Moves pod `p`'s queued requests that waited past their tier's target to `timed_out`.
    /// Each tier queue is in arrival order, so the expired ones are a prefix of it.
    fn expire(&mut self, p: u32, now: u64) {
        let pod = &mut self.pods[p as usize];
        for (queue, &timeout) in pod.queues.iter_mut().zip(&self.queue_timeout_us) {
            while let Some(r) = queue.front() {
                if now.saturating_sub(r.arrival_us) <= timeout {
                    break;
                }
                self.timed_out.extend(queue.pop_front());
                pod.queued -= 1;
            }
        }
    }

    /// Pods the workload runtime runs (spec.replicas): starting and ready, not draining.
    pub fn current(&self) -> i32 {
        (self.starting + self.ready) as i32
    }

    pub fn ready(&self) -> i32 {
        self.ready as i32
    }

    fn allocated(&self) -> u32 {
        self.starting + self.ready + self.draining
    }

    fn account(&mut self, now: u64) {
        let dt = now.saturating_sub(self.last_account_us);
        self.gpu_pod_us += u128::from(dt) * u128::from(self.allocated());
        self.last_account_us = now;
    }

    /// Pod-hours allocated so far (start-up and draining included).
    pub fn pod_hours(&mut self, now: u64) -> f64 {
        self.account(now);
        self.gpu_pod_us as f64 / 3.6e9
    }

    fn advance(&mut self, p: u32, now: u64) {
        let model = self.model;
        let pod = &mut self.pods[p as usize];
        if now > pod.last_us {
            let b = pod.running.len() as u32;
            if b > 0 {
                let dt = (now - pod.last_us) as f64 / 1e6;
                let dv = dt / model.itl(b);
                pod.v += dv;
                pod.tokens += dv * f64::from(b);
                // Each of the dv × b tokens came itl(b) after the one before it.
                pod.itl_sum += dt * f64::from(b);
                self.tokens_total += dv * f64::from(b);
            }
            pod.last_us = now;
        }
    }

    /// When pod `p` next completes a request, if it is decoding anything.
    pub fn next_completion(&self, p: u32) -> Option<u64> {
        let pod = &self.pods[p as usize];
        let first = pod.running.peek()?;
        let b = pod.running.len() as u32;
        let dt = ((first.finish_v - pod.v).max(0.0) * self.model.itl(b) * 1e6).ceil() as u64;
        Some(pod.last_us + dt.max(1))
    }

    fn relevel(&mut self, p: u32) {
        self.levels.remove(p);
        if self.pods[p as usize].state == PodState::Ready {
            let load = self.pods[p as usize].load();
            self.levels.insert(p, load);
        }
    }

    fn start(&mut self, p: u32, req: Req) {
        let pod = &mut self.pods[p as usize];
        let finish_v = pod.v + f64::from(req.work);
        pod.running.push(Running { finish_v, req });
    }

    /// Routes an arriving request to the least-loaded ready pod. The caller reschedules
    /// the pod's completion when the request started.
    pub fn route(&mut self, req: Req, now: u64) -> Routed {
        let Some(mut p) = self.levels.least_loaded() else {
            return Routed::Full;
        };
        if self.pods[p as usize].queued >= self.model.max_queue {
            // Every ready pod's queue is full: what timed out there leaves first.
            self.expire(p, now);
            self.relevel(p);
            let Some(q) = self.levels.least_loaded() else {
                return Routed::Full;
            };
            p = q;
        }
        let (running, queued) = {
            let pod = &self.pods[p as usize];
            (pod.running.len() as u32, pod.queued)
        };
        if running < self.model.max_batch {
            self.advance(p, now);
            self.start(p, req);
            self.pods[p as usize].ver += 1;
            self.relevel(p);
            Routed::Started(p)
        } else if queued < self.model.max_queue {
            let pod = &mut self.pods[p as usize];
            pod.queues[usize::from(req.tier)].push_back(req);
            pod.queued += 1;
            self.relevel(p);
            Routed::Queued(p)
        } else {
            Routed::Full
        }
    }

    /// Handles pod `p`'s completion event. Returns false for a stale event. Finished
    /// requests go to `done`; requests pulled from the queue go to `started`.
    pub fn complete(
        &mut self,
        p: u32,
        ver: u32,
        now: u64,
        done: &mut Vec<Req>,
        started: &mut Vec<Started>,
    ) -> bool {
        {
            let pod = &self.pods[p as usize];
            if pod.ver != ver || matches!(pod.state, PodState::Gone | PodState::Starting) {
                return false;
            }
        }
        self.advance(p, now);
        let max_batch = self.model.max_batch as usize;
        let pod = &mut self.pods[p as usize];
        while let Some(r) = pod.running.peek() {
            if r.finish_v <= pod.v + 1e-6 {
                done.push(r.req);
                pod.running.pop();
            } else {
                break;
            }
        }
        self.expire(p, now);
        let pod = &mut self.pods[p as usize];
        while pod.running.len() < max_batch && pod.queued > 0 {
            let Some(req) = pod.queues.iter_mut().find_map(|q| q.pop_front()) else {
                break;
            };
            pod.queued -= 1;
            let finish_v = pod.v + f64::from(req.work);
            pod.running.push(Running { finish_v, req });
            started.push(Started {
                req,
                wait_s: now.saturating_sub(req.arrival_us) as f64 / 1e6,
            });
        }
        pod.ver += 1;
        if pod.state == PodState::Draining && pod.running.is_empty() && pod.queued == 0 {
            self.account(now);
            self.pods[p as usize].state = PodState::Gone;
            self.draining -= 1;
            self.free.push(p);
        } else {
            self.relevel(p);
        }
        true
    }

    /// A starting pod became ready.
    pub fn pod_ready(&mut self, p: u32, now: u64) {
        if self.pods[p as usize].state != PodState::Starting {
            return;
        }
        self.account(now);
        let pod = &mut self.pods[p as usize];
        pod.state = PodState::Ready;
        pod.last_us = now;
        self.starting -= 1;
        self.ready += 1;
        self.relevel(p);
    }

    /// Creates a pod that is ready at once (the warm pool at the start of a run).
    pub fn add_ready(&mut self, now: u64) -> u32 {
        let p = self.create(now);
        self.pod_ready(p, now);
        p
    }

    fn create(&mut self, now: u64) -> u32 {
        self.account(now);
        let p = if let Some(p) = self.free.pop() {
            // Versions continue across reuse, so a stale event of the old pod never matches.
            let ver = self.pods[p as usize].ver.wrapping_add(1);
            self.pods[p as usize] = Pod::new(now);
            self.pods[p as usize].ver = ver;
            p
        } else {
            self.pods.push(Pod::new(now));
            (self.pods.len() - 1) as u32
        };
        let levels = (self.model.max_batch + self.model.max_queue + 1) as usize;
        self.levels.ensure(self.pods.len(), levels);
        self.starting += 1;
        p
    }

    /// Scales to `n` pods (starting + ready). New pods are returned so the caller can
    /// schedule their readiness; removed pods start starting ones first, then drain the
    /// least-loaded ready ones.
    pub fn scale_to(&mut self, n: i32, now: u64, created: &mut Vec<u32>) {
        let n = n.max(0);
        while self.current() < n {
            created.push(self.create(now));
        }
        while self.current() > n {
            self.account(now);
            // Newest starting pod first.
            if self.starting > 0
                && let Some(p) = (0..self.pods.len() as u32)
                    .rev()
                    .find(|&p| self.pods[p as usize].state == PodState::Starting)
            {
                self.pods[p as usize].state = PodState::Gone;
                self.starting -= 1;
                self.free.push(p);
                continue;
            }
            let Some(p) = self.levels.least_loaded() else {
                break;
            };
            self.levels.remove(p);
            self.ready -= 1;
            let pod = &mut self.pods[p as usize];
            if pod.running.is_empty() && pod.queued == 0 {
                pod.state = PodState::Gone;
                self.free.push(p);
            } else {
                pod.state = PodState::Draining;
                self.draining += 1;
            }
        }
    }

    /// Brings every ready pod's token counter up to `now` (before a scrape).
    pub fn advance_all(&mut self, now: u64) {
        for p in 0..self.pods.len() as u32 {
            if matches!(
                self.pods[p as usize].state,
                PodState::Ready | PodState::Draining
            ) {
                self.advance(p, now);
            }
        }
    }

    pub fn pod_tokens(&self, p: usize) -> f64 {
        self.pods[p].tokens
    }

    pub fn pod_itl_sum(&self, p: usize) -> f64 {
        self.pods[p].itl_sum
    }

    /// Requests still queued (for end-of-run accounting).
    pub fn queued_requests(&self) -> impl Iterator<Item = &Req> {
        self.pods
            .iter()
            .filter(|p| p.state != PodState::Gone)
            .flat_map(|p| p.queues.iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> PodModel {
        PodModel {
            max_batch: 2,
            max_queue: 1,
            itl_base_s: 0.02,
            itl_per_seq_s: 0.01,
            prefill_cost: 0.0,
        }
    }

    fn req(work: f32) -> Req {
        Req {
            arrival_us: 0,
            tenant: 0,
            tier: 0,
            existing: true,
            turn: 0,
            out: work as u32,
            context: 0,
            work,
            session: u32::MAX,
            retries: 0,
        }
    }

    #[test]
    fn batching_queueing_and_completion_are_exact() {
        let mut pool = Pool::new(model());
        pool.add_ready(0);
        assert_eq!(pool.route(req(10.0), 0), Routed::Started(0));
        assert_eq!(pool.route(req(20.0), 0), Routed::Started(0));
        assert_eq!(pool.route(req(5.0), 0), Routed::Queued(0));
        assert_eq!(pool.route(req(5.0), 0), Routed::Full);
        // Two running: itl = 0.04 s; the first finishes after 10 tokens = 0.4 s.
        let t = pool.next_completion(0).expect("busy");
        assert!((t as i64 - 400_000).abs() <= 1, "{t}");
        let (mut done, mut started) = (Vec::new(), Vec::new());
        assert!(pool.complete(0, pool.pods[0].ver, t, &mut done, &mut started));
        assert_eq!(done.len(), 1);
        assert_eq!(started.len(), 1);
        assert!((started[0].wait_s - 0.4).abs() < 1e-3);
        assert!((pool.tokens_total - 20.0).abs() < 1e-3);
        // Scaling to zero drains the busy pod instead of killing it.
        pool.scale_to(0, t, &mut Vec::new());
        assert_eq!(pool.pods[0].state, PodState::Draining);
        assert_eq!(pool.current(), 0);
    }

    /// As the engine's scheduler does: a request that waited past its tier's target leaves
    /// the queue unserved, and the place it held goes to the requests behind it.
    #[test]
    fn a_request_queued_past_its_tiers_target_times_out_and_frees_its_place() {
        let model = PodModel {
            max_queue: 2,
            ..model()
        };
        let at = |arrival_us: u64| Req {
            arrival_us,
            ..req(5.0)
        };
        let mut pool = Pool::new(model).with_queue_timeouts([0.5; NTIERS]);
        pool.add_ready(0);
        // Two running, each 25 tokens at itl 0.04 s: both finish at 1.0 s.
        for _ in 0..2 {
            assert_eq!(pool.route(req(25.0), 0), Routed::Started(0));
        }
        assert_eq!(pool.route(at(0), 0), Routed::Queued(0));
        assert_eq!(pool.route(at(800_000), 800_000), Routed::Queued(0));
        // The queue is full; at 0.9 s the first waiter is past its 0.5 s and leaves, and
        // the newcomer takes its place.
        assert_eq!(pool.route(at(900_000), 900_000), Routed::Queued(0));
        assert_eq!(pool.timed_out.len(), 1);
        assert_eq!(pool.timed_out[0].arrival_us, 0);
        pool.timed_out.clear();
        let t = pool.next_completion(0).expect("busy");
        assert!((t as i64 - 1_000_000).abs() <= 1, "{t}");
        let (mut done, mut started) = (Vec::new(), Vec::new());
        assert!(pool.complete(0, pool.pods[0].ver, t, &mut done, &mut started));
        assert_eq!(done.len(), 2);
        let waits: Vec<f64> = started.iter().map(|s| s.wait_s).collect();
        assert_eq!(waits.len(), 2, "{waits:?}");
        assert!(waits.iter().all(|&w| w <= 0.5), "{waits:?}");
        assert!(pool.timed_out.is_empty());
        // Without timeouts (the default) nothing leaves a queue unserved.
        let mut patient = Pool::new(model);
        patient.add_ready(0);
        for _ in 0..2 {
            patient.route(req(25.0), 0);
        }
        patient.route(at(0), 0);
        patient.route(at(0), 0);
        assert_eq!(patient.route(at(9_000_000), 9_000_000), Routed::Full);
        assert!(patient.timed_out.is_empty());
    }
}
