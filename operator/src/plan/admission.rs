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

use super::{AdmissionPlan, EventKind, EventPlan, MeasuredPlan, Millis};

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

/// State carried between ticks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdmissionMachine {
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
        let pausable: Vec<String> = tiers
            .map(|t| {
                t.pause_order()
                    .into_iter()
                    .filter(|tier| tier.admission.pausable)
                    .map(|tier| tier.name.clone())
                    .collect()
            })
            .unwrap_or_default();
        let pause_after = spec.admission.pause_after.as_std().as_millis() as u64;
        let hold = spec.admission.hold_time.as_std().as_millis() as u64;

        if !may_act || pausable.is_empty() {
            if self.state != AdmissionState::Open {
                self.open(
                    now,
                    if pausable.is_empty() {
                        "no pausable tier"
                    } else {
                        "admission control is off"
                    },
                );
            }
            self.over_since = None;
            self.under_since = None;
            return self.plan();
        }

        let Some(p) = pressure else {
            // Fail static: no timers run on missing data, nothing changes.
            self.over_since = None;
            self.under_since = None;
            return self.plan();
        };
        // Drop tiers that no longer exist or are no longer pausable.
        self.paused.retain(|t| pausable.contains(t));

        let constrained = constraint != Constraint::None;
        let over = constrained && p.over_pause(spec);
        let under = p.under_resume(spec) || !constrained && !p.over_pause(spec);
        self.over_since = if over {
            Some(self.over_since.unwrap_or(now))
        } else {
            None
        };
        self.under_since = if under {
            Some(self.under_since.unwrap_or(now))
        } else {
            None
        };

        match self.state {
            AdmissionState::Open => {
                let waited = match constraint {
                    Constraint::Arriving => Duration::ZERO,
                    _ => spec.admission.pause_after,
                };
                if let Some(since) = self.over_since
                    && now.saturating_sub(since) >= waited.as_std().as_millis() as u64
                {
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
            }
            AdmissionState::PausedNewTenants => {
                if let Some(since) = self.under_since
                    && now.saturating_sub(since) >= hold
                {
                    let why = format!(
                        "under the resume threshold for {}: {}",
                        spec.admission.hold_time,
                        p.words(spec)
                    );
                    self.open(now, &why);
                    return self.plan();
                }
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
        }
        self.plan()
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
