//! The discrete-event loop of one (trace, policy) run.
//!
//! Events, in time order (ties in insertion order): a per-second tick that draws that
//! second's arrivals (Poisson, spread uniformly in the second) and new tenants; arrivals;
//! follow-up turns of returning sessions; pod completions (exact, from the pod's virtual
//! token clock); pods becoming ready; Prometheus scrapes; control ticks.
//!
//! The run starts with a warm-up (`SimConfig::warmup_s`) at the trace's initial rate with
//! a warm pool: control starts 5 minutes before the trace (so stabilization windows have
//! history), and nothing that happens before the trace's t = 0 is counted.
//!
//! Invariants: time never goes backwards; a stale completion (its pod changed since it was
//! scheduled) is ignored; the run stops at the trace's end and accounts for what is left.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::dynamics;
use super::metrics::Pipeline;
use super::policy::{Controller, Ctx, PolicyKind};
use super::pool::{Pool, Req, Routed, Started};
use super::report::{RunResult, Stats};
use super::rng::Rng;
use super::tenants::{NTIERS, Refusal, TIER_PARAMS, Tenants};
use super::trace::Trace;
use super::{SimConfig, pool_spec, tier_policy};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Second,
    Arrival { new_tenant: bool },
    FollowUp { req: Req, left_us: u64 },
    Complete { pod: u32, ver: u32 },
    Ready { pod: u32 },
    Scrape,
    Control,
}

#[derive(Clone, Copy, Debug)]
struct Ev {
    t: u64,
    seq: u64,
    kind: Kind,
}

impl PartialEq for Ev {
    fn eq(&self, o: &Self) -> bool {
        (self.t, self.seq) == (o.t, o.seq)
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.t, self.seq).cmp(&(o.t, o.seq))
    }
}

/// A point of the replica/admission timeline (one per control tick).
#[derive(Clone, Copy, Debug)]
pub struct TimePoint {
    pub t_s: f64,
    pub current: i32,
    pub ready: i32,
    pub paused: [bool; NTIERS],
}

/// A run's summary and its timeline.
#[derive(Debug)]
pub struct RunOutput {
    pub result: RunResult,
    pub timeline: Vec<TimePoint>,
}

struct Sim<'a> {
    cfg: &'a SimConfig,
    /// Simulation time (µs) of the trace's t = 0.
    warm: u64,
    trace: &'a Trace,
    heap: BinaryHeap<Reverse<Ev>>,
    seq: u64,
    rng: Rng,
    pool: Pool,
    pipeline: Pipeline,
    tenants: Tenants,
    stats: Stats,
    paused: [bool; NTIERS],
    done: Vec<Req>,
    started: Vec<Started>,
    created: Vec<u32>,
    kv_hits: u64,
    kv_misses: u64,
    work_sum: f64,
    work_n: u64,
}

impl Sim<'_> {
    fn push(&mut self, t: u64, kind: Kind) {
        self.seq += 1;
        self.heap.push(Reverse(Ev {
            t,
            seq: self.seq,
            kind,
        }));
    }

    fn reschedule(&mut self, pod: u32) {
        if let Some(t) = self.pool.next_completion(pod) {
            let ver = self.pool.pods[pod as usize].ver;
            self.push(t, Kind::Complete { pod, ver });
        }
    }

    fn startup_us(&mut self) -> u64 {
        let (a, b) = (self.cfg.startup_min_s, self.cfg.startup_max_s);
        ((a + (b - a) * self.rng.f64()) * 1e6) as u64
    }

    fn scale_to(&mut self, n: i32, now: u64) {
        let mut created = std::mem::take(&mut self.created);
        created.clear();
        self.pool.scale_to(n, now, &mut created);
        for &p in &created {
            let at = now + self.startup_us();
            self.push(at, Kind::Ready { pod: p });
        }
        self.created = created;
    }

    fn new_request(&mut self, tenant: u32, now: u64) -> Req {
        let tier = self.tenants.tier(tenant);
        let c = self.cfg;
        let prompt = self
            .rng
            .lognormal(c.prompt_median, c.prompt_sigma)
            .clamp(16.0, 16_000.0) as u32;
        let out = self.output_tokens(tier);
        Req {
            arrival_us: now,
            tenant,
            tier: tier as u8,
            existing: self.tenants.existing(tenant, (now / 1_000_000) as u32),
            turn: 0,
            out,
            context: prompt,
            work: (f64::from(out) + f64::from(prompt) * self.pool.model.prefill_cost) as f32,
        }
    }

    fn output_tokens(&mut self, tier: usize) -> u32 {
        self.rng
            .lognormal(self.cfg.output_median, self.cfg.output_sigma)
            .clamp(16.0, f64::from(TIER_PARAMS[tier].max_output_tokens)) as u32
    }

    fn counted(&self, req: &Req) -> bool {
        req.arrival_us >= self.warm
    }

    fn arrive(&mut self, req: Req, now: u64) {
        let tier = usize::from(req.tier);
        let counted = self.counted(&req);
        self.work_sum += f64::from(req.work);
        self.work_n += 1;
        if counted {
            self.stats.arrived(tier, req.existing);
        }
        let now_s = (now / 1_000_000) as u32;
        let tokens = req.context + req.out;
        if let Err(why) = self.tenants.gate(req.tenant, tokens, now_s, &self.paused) {
            if counted {
                self.stats.refused(tier, req.existing, why);
            }
            return;
        }
        match self.pool.route(req, now) {
            Routed::Started(p) => {
                self.tenants.admitted(req.tenant, now_s);
                if counted {
                    self.stats.started(tier, req.existing, 0.0);
                }
                self.pipeline.observe_wait(0.0);
                self.reschedule(p);
            }
            Routed::Queued(_) => self.tenants.admitted(req.tenant, now_s),
            Routed::Full => {
                if counted {
                    self.stats.refused(tier, req.existing, Refusal::Overload);
                }
                self.pipeline.overload_total += 1;
            }
        }
    }

    fn on_complete(&mut self, pod: u32, ver: u32, now: u64) {
        let mut done = std::mem::take(&mut self.done);
        let mut started = std::mem::take(&mut self.started);
        done.clear();
        started.clear();
        if self.pool.complete(pod, ver, now, &mut done, &mut started) {
            self.pipeline.finished_total += done.len() as u64;
            for s in &started {
                if s.req.arrival_us >= self.warm {
                    self.stats
                        .started(usize::from(s.req.tier), s.req.existing, s.wait_s);
                }
                self.pipeline.observe_wait(s.wait_s);
            }
            for r in &done {
                if r.turn + 1 < self.cfg.max_turns && self.rng.chance(self.cfg.p_return) {
                    let think = (self.rng.exp(self.cfg.think_mean_s) * 1e6) as u64;
                    self.push(
                        now + think,
                        Kind::FollowUp {
                            req: *r,
                            left_us: now,
                        },
                    );
                }
            }
            self.reschedule(pod);
        }
        self.done = done;
        self.started = started;
    }

    fn follow_up(&mut self, prev: Req, left_us: u64, now: u64) {
        let tier = usize::from(prev.tier);
        let turn_prompt = 150u32;
        let hit = (now - left_us) as f64 / 1e6 <= TIER_PARAMS[tier].kv_idle_ttl_s;
        let prefill = if hit {
            self.kv_hits += 1;
            turn_prompt
        } else {
            self.kv_misses += 1;
            self.pipeline.evictions_total += 1;
            prev.context + prev.out + turn_prompt
        };
        let out = self.output_tokens(tier);
        let req = Req {
            arrival_us: now,
            tenant: prev.tenant,
            tier: prev.tier,
            existing: self.tenants.existing(prev.tenant, (now / 1_000_000) as u32),
            turn: prev.turn + 1,
            out,
            context: (prev.context + prev.out + turn_prompt).min(16_000),
            work: (f64::from(out) + f64::from(prefill) * self.pool.model.prefill_cost) as f32,
        };
        self.arrive(req, now);
    }

    fn second(&mut self, now: u64) {
        let t = now.saturating_sub(self.warm) as f64 / 1e6;
        let lambda = self.trace.base_rate(t, self.tenants.count() as f64);
        let n = self.rng.poisson(lambda);
        for _ in 0..n {
            let at = now + self.rng.below(1_000_000);
            self.push(at, Kind::Arrival { new_tenant: false });
        }
        let m = self.rng.poisson(self.trace.new_tenant_rate(t));
        for _ in 0..m {
            let at = now + self.rng.below(1_000_000);
            self.push(at, Kind::Arrival { new_tenant: true });
        }
    }
}

/// Work per request (decode-step equivalents) before any is drawn, and requests per
/// session start.
fn service_estimates(cfg: &SimConfig, pool: &Pool) -> (f64, f64) {
    // Mean of a log-normal, roughly clamped by the tier mix's output caps.
    let out = cfg.output_median * (cfg.output_sigma * cfg.output_sigma / 2.0).exp() * 0.85;
    let work = out + cfg.prompt_median * pool.model.prefill_cost;
    let p = cfg.p_return;
    let turns = (1.0 - p.powi(i32::from(cfg.max_turns))) / (1.0 - p);
    (work, turns)
}

/// Runs one policy on one trace.
pub fn run(trace: &Trace, policy: PolicyKind, cfg: &SimConfig) -> anyhow::Result<RunOutput> {
    let wall = std::time::Instant::now();
    let spec = pool_spec(trace, cfg)?;
    let tiers = tier_policy()?;
    let rng = Rng::new(cfg.seed).fork(trace.kind as u64 + 1);
    let mut tenant_rng = rng.fork(17);
    let tenants = Tenants::new(
        trace.initial_tenants,
        spec.admission.tenant_memory.as_std().as_secs() as u32,
        &mut tenant_rng,
    );
    let pool = Pool::new(cfg.model);
    let (seed_work, turns) = service_estimates(cfg, &pool);
    let warm = (cfg.warmup_s * 1e6) as u64;
    let scrape_us = (cfg.scrape_interval_s * 1e6) as u64;
    let control_us = (cfg.control_interval_s * 1e6) as u64;
    let mut sim = Sim {
        cfg,
        warm,
        trace,
        heap: BinaryHeap::new(),
        seq: 0,
        rng: rng.fork(99),
        pool,
        pipeline: Pipeline::new(
            scrape_us,
            (cfg.rate_window_s * 1e6) as u64,
            cfg.outage_s
                .map(|(a, b)| (warm + (a * 1e6) as u64, warm + (b * 1e6) as u64)),
        ),
        tenants,
        stats: Stats::default(),
        paused: [false; NTIERS],
        done: Vec::new(),
        started: Vec::new(),
        created: Vec::new(),
        kv_hits: 0,
        kv_misses: 0,
        work_sum: 0.0,
        work_n: 0,
    };
    let (min, max) = (spec.replicas.min, crate::plan::ceiling(&spec));
    // The same warm pool for every policy: the first minute's load at 70% occupancy.
    let occupied_itl = cfg.model.itl((cfg.model.max_batch * 7).div_ceil(10));
    let initial_need = trace.expected_base_rate(0.0) * turns * seed_work * occupied_itl
        / (f64::from(cfg.model.max_batch) * 0.7);
    for _ in 0..(initial_need.ceil() as i32).clamp(min, max) {
        sim.pool.add_ready(0);
    }
    let mut controller = Controller::new(
        policy,
        &spec,
        &tiers,
        &sim.pool,
        cfg.baselines,
        cfg.startup_max_s,
    );
    let end = warm + trace.duration_s * 1_000_000;
    let step_us = trace.step_at.map(|s| warm + s * 1_000_000);
    sim.push(0, Kind::Second);
    sim.push(0, Kind::Scrape);
    sim.push(
        warm.saturating_sub(300_000_000) + control_us / 2,
        Kind::Control,
    );
    let mut hours_at_warm = None;

    let mut timeline = Vec::new();
    let (mut react_s, mut scale_events, mut peak, mut pause_transitions) = (None, 0u64, 0, 0u64);
    while let Some(Reverse(ev)) = sim.heap.pop() {
        let now = ev.t;
        if now >= end {
            break;
        }
        if now >= warm && hours_at_warm.is_none() {
            hours_at_warm = Some(sim.pool.pod_hours(warm));
        }
        match ev.kind {
            Kind::Second => {
                sim.second(now);
                sim.push(now + 1_000_000, Kind::Second);
            }
            Kind::Arrival { new_tenant } => {
                let tenant = if new_tenant {
                    sim.tenants.add(&mut tenant_rng)
                } else {
                    sim.tenants.pick(&mut tenant_rng)
                };
                let req = sim.new_request(tenant, now);
                sim.arrive(req, now);
            }
            Kind::FollowUp { req, left_us } => sim.follow_up(req, left_us, now),
            Kind::Complete { pod, ver } => sim.on_complete(pod, ver, now),
            Kind::Ready { pod } => sim.pool.pod_ready(pod, now),
            Kind::Scrape => {
                sim.pipeline.scrape(&mut sim.pool, now);
                sim.push(now + scrape_us, Kind::Scrape);
            }
            Kind::Control => {
                let action = controller.tick(&Ctx {
                    now_us: now,
                    trace_now_s: now.saturating_sub(warm) as f64 / 1e6,
                    pool: &sim.pool,
                    pipeline: &sim.pipeline,
                    trace,
                    work_per_request: if sim.work_n > 100 {
                        sim.work_sum / sim.work_n as f64
                    } else {
                        seed_work
                    },
                    requests_per_session: turns,
                    min,
                    max,
                });
                let current = sim.pool.current();
                let counted = now >= warm;
                if action.replicas != current {
                    scale_events += u64::from(counted);
                    if react_s.is_none()
                        && action.replicas > current
                        && let Some(step) = step_us
                        && now >= step
                    {
                        react_s = Some((now - step) as f64 / 1e6);
                    }
                    sim.scale_to(action.replicas, now);
                }
                if action.paused != sim.paused {
                    pause_transitions += 1;
                    sim.paused = action.paused;
                }
                if counted {
                    peak = peak.max(sim.pool.current());
                    timeline.push(TimePoint {
                        t_s: (now - warm) as f64 / 1e6,
                        current: sim.pool.current(),
                        ready: sim.pool.ready(),
                        paused: sim.paused,
                    });
                }
                sim.push(now + control_us, Kind::Control);
            }
        }
    }
    // What is still queued counts with the wait it had so far.
    let left: Vec<Req> = sim.pool.queued_requests().copied().collect();
    for r in left.into_iter().filter(|r| r.arrival_us >= warm) {
        let wait = end.saturating_sub(r.arrival_us) as f64 / 1e6;
        sim.stats.started(usize::from(r.tier), r.existing, wait);
    }
    let pod_hours = sim.pool.pod_hours(end) - hours_at_warm.unwrap_or(0.0);
    let gpu_hours = pod_hours * f64::from(spec.engine.resources.gpus.max(1));
    let mut result = RunResult::from_stats(
        trace.kind.name(),
        policy.name(),
        &sim.stats,
        gpu_hours,
        react_s,
        scale_events,
        peak,
        pause_transitions,
        (sim.kv_hits, sim.kv_misses),
        wall.elapsed().as_secs_f64(),
    );
    result.reversals = dynamics::reversals(&timeline);
    result.worst_overshoot = dynamics::worst_overshoot(&timeline);
    result.max_step = spec.scaling.max_scale_up_step;
    Ok(RunOutput { result, timeline })
}
