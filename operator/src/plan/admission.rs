//! The admission state machine: Open ⇄ PausedNewTenants, with hysteresis.
//!
//! Open → PausedNewTenants when the pool cannot add what it needs (a [`Constraint`]) and
//! utilization or queue wait is over the pause threshold:
//! - at its ceiling, once that has lasted `pauseAfter`;
//! - while capacity it ordered is still starting (`admission.pauseWhileScaling`), at once:
//!   the pool has already decided it is short, and new tenants' first requests would only
//!   wait in the queue for the minutes a replica takes to start.
//!
//! While still over, one more pausable tier is added every `pauseAfter`, lowest priority
//! first. Back to Open only after utilization and queue wait have stayed under the resume
//! threshold for `holdTime` (or, with no constraint left, under the pause threshold). Non-
//! pausable tiers are never paused. Missing metrics reset both timers and change nothing
//! (fail static).

use tidegate_api::{AdmissionState, Duration, InferencePoolSpec, TierPolicySpec};

use super::{AdmissionPlan, EventKind, EventPlan, MeasuredPlan, Millis, Observation};

/// How loaded the pool is, against the admission thresholds.
#[derive(Clone, Debug, PartialEq)]
pub struct Pressure {
    pub utilization: f64,
    pub queue_wait_p99: f64,
    pub queue_target: f64,
}

impl Pressure {
    pub fn of(spec: &InferencePoolSpec, m: &MeasuredPlan) -> Self {
        Pressure {
            utilization: m.utilization,
            queue_wait_p99: m.queue_wait_p99.as_secs_f64(),
            queue_target: spec.slo.queue_wait_p99.as_secs_f64(),
        }
    }

    /// Over the pause threshold: utilization at or above it, or queue wait over target.
    pub fn over_pause(&self, spec: &InferencePoolSpec) -> bool {
        self.utilization >= spec.admission.pause_threshold
            || self.queue_wait_p99 > self.queue_target
    }

    /// Under the resume threshold: utilization below it and queue wait within target.
    pub fn under_resume(&self, spec: &InferencePoolSpec) -> bool {
        self.utilization < spec.admission.resume_threshold
            && self.queue_wait_p99 <= self.queue_target
    }

    fn words(&self, spec: &InferencePoolSpec) -> String {
        format!(
            "utilization {:.2} (pause ≥ {:.2}, resume < {:.2}), queue p99 {:.2}s (target {:.2}s)",
            self.utilization,
            spec.admission.pause_threshold,
            spec.admission.resume_threshold,
            self.queue_wait_p99,
            self.queue_target
        )
    }
}

/// What keeps the pool from adding the capacity it needs right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Constraint {
    /// Nothing: the pool can scale.
    None,
    /// At its ceiling (replicas.max or the GPU budget), every replica ready.
    Ceiling,
    /// It ordered replicas that are still starting.
    Arriving,
}

impl Constraint {
    fn words(self) -> &'static str {
        match self {
            Constraint::None => "with headroom",
            Constraint::Ceiling => "at the ceiling",
            Constraint::Arriving => "while ordered replicas are still starting",
        }
    }
}

/// What the pause depends on besides the pressure: whether capacity is constrained (at the
/// ceiling, or ordered replicas still arriving), and since when.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CapacityWatch {
    /// Since when the pool has been constrained and over its pause threshold.
    pub exhausted_since: Option<Millis>,
    /// Since when the ceiling's replicas have been requested while some are not ready.
    pub ceiling_not_ready_since: Option<Millis>,
    /// Whether the ReplicasNotReady warning was emitted for that stretch.
    pub ceiling_not_ready_warned: bool,
    /// Since when fewer replicas are ready than the planner wants.
    pub short_of_ready_since: Option<Millis>,
}

/// State carried between ticks: the admission state and everything its next step depends on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdmissionMachine {
    /// Whether, and since when, capacity is constrained.
    pub capacity: CapacityWatch,
    state: AdmissionState,
    since: Option<Millis>,
    reason: String,
    /// Pausable tiers paused so far, lowest priority first.
    paused: Vec<String>,
    over_since: Option<Millis>,
    under_since: Option<Millis>,
    last_escalation: Option<Millis>,
}

impl AdmissionMachine {
    /// Restores the machine from what status recorded (operator restart).
    pub fn restored(
        state: AdmissionState,
        since: Option<Millis>,
        reason: String,
        paused: Vec<String>,
    ) -> Self {
        AdmissionMachine {
            capacity: CapacityWatch::default(),
            state,
            since,
            reason,
            last_escalation: since,
            paused,
            over_since: None,
            under_since: None,
        }
    }

    pub fn state(&self) -> AdmissionState {
        self.state
    }

    /// Advances one tick. `may_act` is false in Advisory mode or with admission disabled:
    /// the machine then stays (or returns to) Open.
    pub fn step(
        &mut self,
        spec: &InferencePoolSpec,
        tiers: Option<&TierPolicySpec>,
        now: Millis,
        constraint: Constraint,
        pressure: Option<&Pressure>,
        may_act: bool,
    ) -> AdmissionPlan {
        let pausable = pausable_tiers(tiers);
        if !may_act || pausable.is_empty() {
            if self.state != AdmissionState::Open {
                let why = if pausable.is_empty() {
                    "no pausable tier"
                } else {
                    "admission control is off"
                };
                self.open(now, why);
            }
            self.stop_timers();
            return self.plan();
        }
        let Some(p) = pressure else {
            // Fail static: no timers run on missing data, nothing changes.
            self.stop_timers();
            return self.plan();
        };
        // Drop tiers that no longer exist or are no longer pausable.
        self.paused.retain(|t| pausable.contains(t));
        let over = self.run_timers(spec, now, constraint, p);
        match self.state {
            AdmissionState::Open => self.maybe_pause(spec, now, constraint, p, &pausable),
            AdmissionState::PausedNewTenants => {
                self.maybe_resume_or_escalate(spec, now, constraint, p, &pausable, over)
            }
        }
        self.plan()
    }

    fn stop_timers(&mut self) {
        self.over_since = None;
        self.under_since = None;
    }

    /// Starts or stops the "over the pause threshold" and "under the resume threshold"
    /// timers from this tick's pressure; returns whether the pool is over now.
    fn run_timers(
        &mut self,
        spec: &InferencePoolSpec,
        now: Millis,
        constraint: Constraint,
        p: &Pressure,
    ) -> bool {
        let constrained = constraint != Constraint::None;
        let over = constrained && p.over_pause(spec);
        let under = p.under_resume(spec) || !constrained && !p.over_pause(spec);
        self.over_since = over.then(|| self.over_since.unwrap_or(now));
        self.under_since = under.then(|| self.under_since.unwrap_or(now));
        over
    }

    /// Open: pause the first pausable tier once the pool has been over for `pauseAfter`
    /// (at once when the constraint is arriving demand the pool cannot grow into).
    fn maybe_pause(
        &mut self,
        spec: &InferencePoolSpec,
        now: Millis,
        constraint: Constraint,
        p: &Pressure,
        pausable: &[String],
    ) {
        let waited = match constraint {
            Constraint::Arriving => Duration::ZERO,
            _ => spec.admission.pause_after,
        };
        let Some(since) = self.over_since else {
            return;
        };
        if now.saturating_sub(since) < waited.as_std().as_millis() as u64 {
            return;
        }
        self.state = AdmissionState::PausedNewTenants;
        self.since = Some(now);
        self.last_escalation = Some(now);
        self.paused = vec![pausable[0].clone()];
        let lasted = match constraint {
            Constraint::Arriving => String::new(),
            _ => format!(" for {waited}"),
        };
        self.reason = format!(
            "over the SLO {}{lasted}: {}; pausing new tenants of tier {}",
            constraint.words(),
            p.words(spec),
            pausable[0]
        );
    }

    /// Paused: reopen after `holdTime` under the resume threshold; while still over, pause
    /// the next pausable tier at most once per `pauseAfter`.
    fn maybe_resume_or_escalate(
        &mut self,
        spec: &InferencePoolSpec,
        now: Millis,
        constraint: Constraint,
        p: &Pressure,
        pausable: &[String],
        over: bool,
    ) {
        let hold = spec.admission.hold_time.as_std().as_millis() as u64;
        if let Some(since) = self.under_since
            && now.saturating_sub(since) >= hold
        {
            let why = format!(
                "under the resume threshold for {}: {}",
                spec.admission.hold_time,
                p.words(spec)
            );
            self.open(now, &why);
            return;
        }
        let pause_after = spec.admission.pause_after.as_std().as_millis() as u64;
        let escalate_due = self
            .last_escalation
            .is_none_or(|t| now.saturating_sub(t) >= pause_after);
        if over && escalate_due && self.paused.len() < pausable.len() {
            let next = pausable[self.paused.len()].clone();
            self.paused.push(next.clone());
            self.last_escalation = Some(now);
            self.reason = format!(
                "still over the SLO {}: {}; also pausing new tenants of tier {next}",
                constraint.words(),
                p.words(spec)
            );
        }
        if self.paused.is_empty() {
            self.paused.push(pausable[0].clone());
        }
    }

    fn open(&mut self, now: Millis, why: &str) {
        self.state = AdmissionState::Open;
        self.since = Some(now);
        self.reason = why.to_string();
        self.paused.clear();
        self.last_escalation = None;
    }

    fn plan(&self) -> AdmissionPlan {
        AdmissionPlan {
            state: self.state,
            since: self.since,
            reason: self.reason.clone(),
            paused_tiers: self.paused.clone(),
        }
    }
}

/// The event announcing an admission change.
pub fn transition_event(a: &AdmissionPlan) -> EventPlan {
    match a.state {
        AdmissionState::PausedNewTenants => EventPlan {
            kind: EventKind::Warning,
            reason: "NewTenantsPaused",
            note: a.reason.clone(),
        },
        AdmissionState::Open => EventPlan {
            kind: EventKind::Normal,
            reason: "AdmissionReopened",
            note: a.reason.clone(),
        },
    }
}

/// Whether the pool is at its ceiling, for admission. At the ceiling means the ceiling's
/// replicas are running *and ready*: while some are still starting, the queue they will
/// drain is no reason to pause new tenants. Unless they have been starting for longer than
/// a start-up may take (`engine.startupGracePeriod`, which the startup probe allows too):
/// a pod not ready by then is most likely unschedulable or crashing, the ready ones are all
/// the pool has, and a ReplicasNotReady warning says so once.
pub(super) fn at_ceiling(
    spec: &InferencePoolSpec,
    obs: &Observation,
    desired: i32,
    ceil: i32,
    watch: &mut CapacityWatch,
    events: &mut Vec<EventPlan>,
) -> bool {
    let requested = desired >= ceil && obs.current_replicas >= ceil;
    if !requested || obs.ready_replicas >= ceil {
        watch.ceiling_not_ready_since = None;
        watch.ceiling_not_ready_warned = false;
        return requested;
    }
    let since = *watch.ceiling_not_ready_since.get_or_insert(obs.now);
    let grace = spec.engine.startup_grace_period.as_std();
    let overdue = u128::from(obs.now.saturating_sub(since)) >= grace.as_millis();
    if overdue && !watch.ceiling_not_ready_warned {
        watch.ceiling_not_ready_warned = true;
        events.push(EventPlan {
            kind: EventKind::Warning,
            reason: "ReplicasNotReady",
            note: format!(
                "{} of {ceil} replicas not ready after {} at the ceiling: admission counts \
                 the {} ready ones as the pool's capacity",
                ceil - obs.ready_replicas,
                spec.engine.startup_grace_period,
                obs.ready_replicas
            ),
        });
    }
    overdue
}

/// Whether capacity the pool ordered is on its way: fewer replicas ready than it wants, for
/// less than a start-up may take (`engine.startupGracePeriod`); a replica not ready after
/// that is most likely unschedulable or crashing, not arriving. Only with
/// `admission.pauseWhileScaling`.
pub(super) fn capacity_arriving(
    spec: &InferencePoolSpec,
    obs: &Observation,
    desired: i32,
    watch: &mut CapacityWatch,
) -> bool {
    if desired <= obs.ready_replicas {
        watch.short_of_ready_since = None;
        return false;
    }
    let since = *watch.short_of_ready_since.get_or_insert(obs.now);
    let grace = spec.engine.startup_grace_period.as_std().as_millis();
    spec.admission.pause_while_scaling && u128::from(obs.now.saturating_sub(since)) < grace
}

/// The tiers that may be paused, in the order they are paused (lowest first).
fn pausable_tiers(tiers: Option<&TierPolicySpec>) -> Vec<String> {
    tiers
        .map(|t| {
            t.pause_order()
                .into_iter()
                .filter(|tier| tier.admission.pausable)
                .map(|tier| tier.name.clone())
                .collect()
        })
        .unwrap_or_default()
}
