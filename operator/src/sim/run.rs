//! The discrete-event loop of one (trace, policy) run.
//!
//! Events, in time order (ties in insertion order): for an analytic trace, a per-second tick
//! that draws that second's arrivals (Poisson, spread uniformly in the second) and new
//! tenants, the arrivals, and follow-up turns of returning sessions; for a trace file, its
//! lines one after the other (each schedules the next); pod completions (exact, from the
//! pod's virtual token clock); pods becoming ready; Prometheus scrapes; control ticks.
//!
//! The run starts with a warm-up (`SimConfig::warmup_s`) at the trace's initial rate with
//! a warm pool: control starts 5 minutes before the trace (so stabilization windows have
//! history), and nothing that happens before the trace's t = 0 is counted. A trace file has
//! no warm-up (`warmup_s` 0): the pool starts warm, sized for the file's first minute.
//!
//! A trace file's request reuses KV when its session's last completed request finished
//! within the tier's idle TTL: it then prefills only the prompt tokens beyond that request's
//! prompt and output. Lines without a session, and the first request of each, prefill all.
//!
//! Invariants: time never goes backwards; a stale completion (its pod changed since it was
//! scheduled) is ignored; the run stops at the trace's end and accounts for what is left.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use tidegate_api::InferencePoolSpec;

use super::arrivals::{FileSource, Source};
use super::dynamics::{self, TimePoint};
use super::metrics::Pipeline;
use super::policy::{Action, Controller, Ctx, PolicyKind};
use super::pool::{Pool, Req, Routed, Started};
use super::report::{RunResult, Stats};
use super::rng::Rng;

/// Retries of a request refused for overload (queue full or queue timeout): the OpenAI
/// clients' default `max_retries`.
const CLIENT_RETRIES: u8 = 2;
/// The engines' Retry-After on an overload refusal (their default), which the clients honour.
const RETRY_AFTER_US: u64 = 1_000_000;
use super::tenants::{NTIERS, Refusal, Tenants, TierParams};
use super::tiers::TierTable;
use super::trace::Trace;
use super::trace_file::{Arrival, NO_SESSION};
use super::{SimConfig, pool_spec};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Second,
    Arrival {
        new_tenant: bool,
    },
    /// The next line of a trace file.
    Line,
    FollowUp {
        req: Req,
        left_us: u64,
    },
    /// A client sends a refused request again.
    Retry {
        req: Req,
    },
    Complete {
        pod: u32,
        ver: u32,
    },
    Ready {
        pod: u32,
    },
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

/// A run's summary and its timeline.
#[derive(Debug)]
pub struct RunOutput {
    pub result: RunResult,
    pub timeline: Vec<TimePoint>,
    /// What tidegate's planner carries into the next day.
    pub memory: Option<super::policy::PlanMemory>,
}

/// What drives the replica count: one of the compared policies, or a fixed count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    Policy(PolicyKind),
    /// This many replicas, ready from the start, whatever the pool's bounds.
    Static(i32),
}

impl Driver {
    pub fn name(self) -> &'static str {
        match self {
            Driver::Policy(p) => p.name(),
            Driver::Static(_) => "static",
        }
    }
}

/// A run's setting: its arrivals, the pool they go through and the tiers.
pub struct Scenario<'a> {
    pub source: Source<'a>,
    pub spec: InferencePoolSpec,
    pub tiers: TierTable,
    /// Trace files: every tenant counts as admitted just before the start.
    pub known_tenants: bool,
}

impl<'a> Scenario<'a> {
    /// A built-in trace on the simulator's own pool and tiers.
    pub fn analytic(trace: &'a Trace, cfg: &SimConfig) -> anyhow::Result<Self> {
        Ok(Scenario {
            source: Source::Analytic(trace),
            spec: pool_spec(trace, cfg)?,
            tiers: TierTable::builtin()?,
            known_tenants: false,
        })
    }
}

/// KV a trace file's session left on the pool.
#[derive(Clone, Copy, Debug, Default)]
struct SessionKv {
    /// Prompt and output tokens of its last completed request (0: none completed yet).
    cached: u32,
    left_us: u64,
}

struct Sim<'a> {
    cfg: &'a SimConfig,
    /// Simulation time (µs) of the trace's t = 0.
    warm: u64,
    source: Source<'a>,
    /// Limits and TTLs per tier slot.
    params: [TierParams; NTIERS],
    /// Next line of a trace file.
    next_line: usize,
    sessions: Vec<SessionKv>,
    heap: BinaryHeap<Reverse<Ev>>,
    seq: u64,
    rng: Rng,
    /// Draws tenants (an analytic trace's population).
    tenant_rng: Rng,
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
            session: NO_SESSION,
            retries: 0,
        }
    }

    fn output_tokens(&mut self, tier: usize) -> u32 {
        self.rng
            .lognormal(self.cfg.output_median, self.cfg.output_sigma)
            .clamp(16.0, f64::from(self.params[tier].max_output_tokens)) as u32
    }

    /// A trace file's next line arrives; the one after it is scheduled.
    fn line(&mut self, now: u64) {
        let Source::File(f) = self.source else {
            return;
        };
        let Some(a) = f.trace.arrivals.get(self.next_line).copied() else {
            return;
        };
        self.next_line += 1;
        if let Some(next) = f.trace.arrivals.get(self.next_line) {
            self.push(self.warm + next.t_us, Kind::Line);
        }
        let req = self.file_request(&a, now);
        self.arrive(req, now);
    }

    fn file_request(&mut self, a: &Arrival, now: u64) -> Req {
        let tier = usize::from(a.tier);
        let out = a.output_tokens.min(self.params[tier].max_output_tokens);
        let prefill = self.file_prefill(a, now);
        Req {
            arrival_us: now,
            tenant: a.tenant,
            tier: a.tier,
            existing: self.tenants.existing(a.tenant, (now / 1_000_000) as u32),
            turn: 0,
            out,
            context: a.prompt_tokens,
            work: (f64::from(out) + f64::from(prefill) * self.pool.model.prefill_cost) as f32,
            session: a.session,
            retries: 0,
        }
    }

    /// Prompt tokens to prefill: those beyond the session's cached KV when it is still
    /// within the tier's idle TTL, else all of them.
    fn file_prefill(&mut self, a: &Arrival, now: u64) -> u32 {
        let Some(s) = self.sessions.get(a.session as usize).copied() else {
            return a.prompt_tokens;
        };
        if s.cached == 0 {
            return a.prompt_tokens;
        }
        let idle_s = now.saturating_sub(s.left_us) as f64 / 1e6;
        if idle_s <= self.params[usize::from(a.tier)].kv_idle_ttl_s {
            self.kv_hits += 1;
            a.prompt_tokens.saturating_sub(s.cached)
        } else {
            self.kv_misses += 1;
            self.pipeline.evictions_total += 1;
            a.prompt_tokens
        }
    }

    /// Whether the request's outcome counts: it arrived after the warm-up and is not a
    /// client's retry (a refused request is one miss, whatever its retries meet).
    fn counted(&self, req: &Req) -> bool {
        req.arrival_us >= self.warm && req.retries == 0
    }

    /// The client of a request refused for overload sends it again after the engine's
    /// Retry-After, as the OpenAI clients do (twice at most): the load does not vanish with
    /// the refusal, and the session goes on if a retry is served.
    fn retry(&mut self, req: Req, now: u64) {
        if req.retries < CLIENT_RETRIES {
            let t = now + RETRY_AFTER_US;
            let again = Req {
                arrival_us: t,
                retries: req.retries + 1,
                ..req
            };
            self.push(t, Kind::Retry { req: again });
        }
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
            Routed::Full => self.refuse_for_overload(req, Refusal::Overload, now),
        }
        self.refuse_timed_out(now);
    }

    /// Answers the requests the pods dropped for waiting past their tier's target.
    fn refuse_timed_out(&mut self, now: u64) {
        let mut timed_out = std::mem::take(&mut self.pool.timed_out);
        for &r in &timed_out {
            self.refuse_for_overload(r, Refusal::QueueTimeout, now);
        }
        timed_out.clear();
        self.pool.timed_out = timed_out;
    }

    /// A refusal for want of room (every queue full, or a queue timeout): a miss when
    /// counted, an overload refusal in the engines' counter the planner reads (first
    /// attempts only, as the operator reads them), and the client retries.
    fn refuse_for_overload(&mut self, req: Req, why: Refusal, now: u64) {
        if self.counted(&req) {
            self.stats.refused(usize::from(req.tier), req.existing, why);
        }
        if req.retries == 0 {
            // The engines count a refused retry apart (the clients' retry header) and the
            // planner leaves it out: one request's demand, however often it is sent.
            self.pipeline.overload_total += 1;
        }
        self.retry(req, now);
    }

    fn on_complete(&mut self, pod: u32, ver: u32, now: u64) {
        let mut done = std::mem::take(&mut self.done);
        let mut started = std::mem::take(&mut self.started);
        done.clear();
        started.clear();
        if self.pool.complete(pod, ver, now, &mut done, &mut started) {
            self.pipeline.finished_total += done.len() as u64;
            for s in &started {
                if self.counted(&s.req) {
                    self.stats
                        .started(usize::from(s.req.tier), s.req.existing, s.wait_s);
                }
                self.pipeline.observe_wait(s.wait_s);
            }
            for r in &done {
                if let Source::File(_) = self.source {
                    if let Some(s) = self.sessions.get_mut(r.session as usize) {
                        *s = SessionKv {
                            cached: r.context.saturating_add(r.out),
                            left_us: now,
                        };
                    }
                    continue;
                }
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
        self.refuse_timed_out(now);
        self.done = done;
        self.started = started;
    }

    fn follow_up(&mut self, prev: Req, left_us: u64, now: u64) {
        let tier = usize::from(prev.tier);
        let turn_prompt = 150u32;
        let hit = (now - left_us) as f64 / 1e6 <= self.params[tier].kv_idle_ttl_s;
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
            session: NO_SESSION,
            retries: 0,
        };
        self.arrive(req, now);
    }

    fn second(&mut self, now: u64) {
        let Source::Analytic(trace) = self.source else {
            return;
        };
        let t = now.saturating_sub(self.warm) as f64 / 1e6;
        let lambda = trace.base_rate(t, self.tenants.count() as f64);
        let n = self.rng.poisson(lambda);
        for _ in 0..n {
            let at = now + self.rng.below(1_000_000);
            self.push(at, Kind::Arrival { new_tenant: false });
        }
        let m = self.rng.poisson(trace.new_tenant_rate(t));
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

/// Mean work per request of a trace file (decode-step equivalents, every prompt prefilled).
fn file_work(f: &FileSource, tiers: &TierTable, prefill_cost: f64) -> f64 {
    let sum: f64 = f
        .trace
        .arrivals
        .iter()
        .map(|a| {
            let out = a
                .output_tokens
                .min(tiers.params[usize::from(a.tier)].max_output_tokens);
            f64::from(out) + f64::from(a.prompt_tokens) * prefill_cost
        })
        .sum();
    sum / f.trace.arrivals.len().max(1) as f64
}

/// Runs one policy on one built-in trace.
pub fn run(trace: &Trace, policy: PolicyKind, cfg: &SimConfig) -> anyhow::Result<RunOutput> {
    run_scenario(
        &Scenario::analytic(trace, cfg)?,
        Driver::Policy(policy),
        cfg,
    )
}

/// What the control ticks tally over a run.
#[derive(Default)]
struct Tally {
    timeline: Vec<TimePoint>,
    react_s: Option<f64>,
    scale_events: u64,
    peak: i32,
    pause_transitions: u64,
    hours_at_warm: Option<f64>,
}

/// The replica count's driver with its state.
enum Control {
    Policy(Box<Controller>),
    Static(i32),
}

/// What a control tick reads besides the pool.
struct Plan {
    seed_work: f64,
    turns: f64,
    min: i32,
    max: i32,
    step_us: Option<u64>,
    control_us: u64,
}

/// Runs one driver on one scenario.
pub fn run_scenario(
    scn: &Scenario<'_>,
    driver: Driver,
    cfg: &SimConfig,
) -> anyhow::Result<RunOutput> {
    let wall = std::time::Instant::now();
    let spec = &scn.spec;
    let rng = Rng::new(cfg.seed).fork(scn.source.stream());
    let mut tenant_rng = rng.fork(17);
    let memory_s = spec.admission.tenant_memory.as_std().as_secs() as u32;
    let tenants = match scn.source {
        Source::Analytic(t) => Tenants::new(t.initial_tenants, memory_s, &mut tenant_rng),
        Source::File(f) => Tenants::of_tiers(
            &f.trace.tenant_tiers,
            memory_s,
            scn.tiers.params,
            scn.known_tenants,
        ),
    };
    let pool = Pool::new(cfg.model).with_queue_timeouts(scn.tiers.targets());
    let (seed_work, turns) = match scn.source {
        Source::Analytic(_) => service_estimates(cfg, &pool),
        Source::File(f) => (file_work(f, &scn.tiers, cfg.model.prefill_cost), 1.0),
    };
    let warm = (cfg.warmup_s * 1e6) as u64;
    let rngs = (rng.fork(99), tenant_rng);
    let mut sim = new_sim(scn, cfg, pool, tenants, rngs, warm);
    let plan = Plan {
        seed_work,
        turns,
        min: spec.replicas.min,
        max: crate::plan::ceiling(spec),
        step_us: scn.source.step_at().map(|s| warm + s * 1_000_000),
        control_us: (cfg.control_interval_s * 1e6) as u64,
    };
    let mut control = match driver {
        Driver::Policy(p) => {
            warm_pool(&mut sim, scn, &plan);
            Control::Policy(Box::new(Controller::new(
                p,
                spec,
                &scn.tiers.planner,
                &sim.pool,
                cfg.baselines,
                cfg.startup_max_s,
                cfg.planner_memory.as_ref(),
            )))
        }
        Driver::Static(n) => {
            for _ in 0..n.max(0) {
                sim.pool.add_ready(0);
            }
            Control::Static(n)
        }
    };
    let tally = event_loop(&mut sim, &mut control, scn, &plan);
    let memory = match &control {
        Control::Policy(c) => c.memory(),
        Control::Static(_) => None,
    };
    let mut out = finish(sim, tally, scn, driver, wall);
    out.memory = memory;
    Ok(out)
}

fn new_sim<'a>(
    scn: &Scenario<'a>,
    cfg: &'a SimConfig,
    pool: Pool,
    tenants: Tenants,
    (rng, tenant_rng): (Rng, Rng),
    warm: u64,
) -> Sim<'a> {
    let sessions = match scn.source {
        Source::File(f) => vec![SessionKv::default(); f.trace.sessions as usize],
        Source::Analytic(_) => Vec::new(),
    };
    Sim {
        cfg,
        warm,
        source: scn.source,
        params: scn.tiers.params,
        next_line: 0,
        sessions,
        heap: BinaryHeap::new(),
        seq: 0,
        rng,
        tenant_rng,
        pool,
        pipeline: Pipeline::new(
            (cfg.scrape_interval_s * 1e6) as u64,
            (cfg.rate_window_s * 1e6) as u64,
            cfg.outage_s
                .map(|(a, b)| (warm + (a * 1e6) as u64, warm + (b * 1e6) as u64)),
        ),
        tenants,
        stats: Stats::with_targets(scn.tiers.targets()),
        paused: [false; NTIERS],
        done: Vec::new(),
        started: Vec::new(),
        created: Vec::new(),
        kv_hits: 0,
        kv_misses: 0,
        work_sum: 0.0,
        work_n: 0,
    }
}

/// The same warm pool for every policy: the first minute's load at 70% occupancy.
fn warm_pool(sim: &mut Sim<'_>, scn: &Scenario<'_>, plan: &Plan) {
    let m = sim.pool.model;
    let occupied_itl = m.itl((m.max_batch * 7).div_ceil(10));
    let initial_need =
        scn.source.foresight().expected_base_rate(0.0) * plan.turns * plan.seed_work * occupied_itl
            / (f64::from(m.max_batch) * 0.7);
    for _ in 0..(initial_need.ceil() as i32).clamp(plan.min, plan.max) {
        sim.pool.add_ready(0);
    }
}

fn event_loop(sim: &mut Sim<'_>, control: &mut Control, scn: &Scenario<'_>, plan: &Plan) -> Tally {
    let warm = sim.warm;
    let scrape_us = (sim.cfg.scrape_interval_s * 1e6) as u64;
    let end = warm + scn.source.duration_s() * 1_000_000;
    match scn.source {
        Source::Analytic(_) => sim.push(0, Kind::Second),
        Source::File(f) => {
            if let Some(a) = f.trace.arrivals.first() {
                sim.push(warm + a.t_us, Kind::Line);
            }
        }
    }
    sim.push(0, Kind::Scrape);
    sim.push(
        warm.saturating_sub(300_000_000) + plan.control_us / 2,
        Kind::Control,
    );
    let mut tally = Tally::default();
    while let Some(Reverse(ev)) = sim.heap.pop() {
        let now = ev.t;
        if now >= end {
            break;
        }
        if now >= warm && tally.hours_at_warm.is_none() {
            tally.hours_at_warm = Some(sim.pool.pod_hours(warm));
        }
        match ev.kind {
            Kind::Second => {
                sim.second(now);
                sim.push(now + 1_000_000, Kind::Second);
            }
            Kind::Arrival { new_tenant } => {
                let tenant = if new_tenant {
                    sim.tenants.add(&mut sim.tenant_rng)
                } else {
                    sim.tenants.pick(&mut sim.tenant_rng)
                };
                let req = sim.new_request(tenant, now);
                sim.arrive(req, now);
            }
            Kind::Line => sim.line(now),
            Kind::FollowUp { req, left_us } => sim.follow_up(req, left_us, now),
            Kind::Retry { req } => sim.arrive(req, now),
            Kind::Complete { pod, ver } => sim.on_complete(pod, ver, now),
            Kind::Ready { pod } => sim.pool.pod_ready(pod, now),
            Kind::Scrape => {
                sim.pipeline.scrape(&mut sim.pool, now);
                sim.push(now + scrape_us, Kind::Scrape);
            }
            Kind::Control => {
                control_tick(sim, control, scn, plan, &mut tally, now);
                sim.push(now + plan.control_us, Kind::Control);
            }
        }
    }
    tally.hours_at_warm.get_or_insert(0.0);
    tally
}

fn control_tick(
    sim: &mut Sim<'_>,
    control: &mut Control,
    scn: &Scenario<'_>,
    plan: &Plan,
    tally: &mut Tally,
    now: u64,
) {
    let warm = sim.warm;
    let action = match control {
        Control::Policy(c) => c.tick(&Ctx {
            now_us: now,
            trace_now_s: now.saturating_sub(warm) as f64 / 1e6,
            pool: &sim.pool,
            pipeline: &sim.pipeline,
            trace: scn.source.foresight(),
            work_per_request: if sim.work_n > 100 {
                sim.work_sum / sim.work_n as f64
            } else {
                plan.seed_work
            },
            requests_per_session: plan.turns,
            min: plan.min,
            max: plan.max,
        }),
        Control::Static(n) => Action {
            replicas: *n,
            paused: [false; NTIERS],
        },
    };
    let current = sim.pool.current();
    let counted = now >= warm;
    if action.replicas != current {
        tally.scale_events += u64::from(counted);
        if tally.react_s.is_none()
            && action.replicas > current
            && let Some(step) = plan.step_us
            && now >= step
        {
            tally.react_s = Some((now - step) as f64 / 1e6);
        }
        sim.scale_to(action.replicas, now);
    }
    if action.paused != sim.paused {
        tally.pause_transitions += 1;
        sim.paused = action.paused;
    }
    if counted {
        tally.peak = tally.peak.max(sim.pool.current());
        tally.timeline.push(TimePoint {
            t_s: (now - warm) as f64 / 1e6,
            current: sim.pool.current(),
            ready: sim.pool.ready(),
            paused: sim.paused,
            missed: sim.stats.missed,
        });
    }
}

fn finish(
    mut sim: Sim<'_>,
    tally: Tally,
    scn: &Scenario<'_>,
    driver: Driver,
    wall: std::time::Instant,
) -> RunOutput {
    let warm = sim.warm;
    let end = warm + scn.source.duration_s() * 1_000_000;
    // What is still queued counts with the wait it had so far.
    let left: Vec<Req> = (sim.pool.queued_requests().copied())
        .filter(|r| sim.counted(r))
        .collect();
    for r in left {
        let wait = end.saturating_sub(r.arrival_us) as f64 / 1e6;
        sim.stats.started(usize::from(r.tier), r.existing, wait);
    }
    let pod_hours = sim.pool.pod_hours(end) - tally.hours_at_warm.unwrap_or(0.0);
    let gpu_hours = pod_hours * f64::from(scn.spec.engine.resources.gpus.max(1));
    let mut result = RunResult::from_stats(
        scn.source.name(),
        driver.name(),
        &sim.stats,
        gpu_hours,
        tally.react_s,
        tally.scale_events,
        tally.peak,
        tally.pause_transitions,
        (sim.kv_hits, sim.kv_misses),
        wall.elapsed().as_secs_f64(),
    );
    result.reversals = dynamics::reversals(&tally.timeline);
    result.worst_overshoot = dynamics::worst_overshoot(&tally.timeline);
    result.max_step = scn.spec.scaling.max_scale_up_step;
    RunOutput {
        result,
        timeline: tally.timeline,
        memory: None,
    }
}
