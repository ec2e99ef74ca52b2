//! The scheduler's state and its non-step operations: admitting requests into the queue,
//! cancelling, finishing, expiring requests queued past their tier's target, and folding a
//! step's sampled tokens back in.
//!
//! Invariants:
//! - every live request is in exactly one of `waiting` or `running`, matching its state;
//! - a running request has a block table in the KV cache manager; a waiting one has none;
//! - `waiting.len() ≤ max_waiting + the batch seats free when the last one came` (so at most
//!   `max_waiting + max_num_seqs`): a request is refused as full only when running plus
//!   waiting already hold `max_num_seqs + max_waiting`. A seat freed by a finished request
//!   is filled at the next step; a request that arrives in between is not refused for it
//!   (the router counts the engine's slots as batch plus queue, and sends the next request
//!   the moment an answer ends);
//! - a request's tokens never need more KV than the pool holds (`limit`), so the highest
//!   priority running sequence can always get its blocks and the system cannot deadlock.

use std::collections::HashMap;

use thiserror::Error;

use crate::kv_cache::TransferPlan;
use crate::kv_cache::{KvCacheManager, SeqId, Tiers};

use super::config::SchedulerConfig;
use super::output::{Expired, Finished, SchedStats};
use super::request::{FinishReason, NewRequest, Request, State};

/// Why a request was not queued.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum AddError {
    /// The waiting queue is full: retry later.
    #[error("queue full ({0} waiting)")]
    QueueFull(usize),
    /// A live request already has this id.
    #[error("request id {0} is already live")]
    DuplicateId(SeqId),
    /// The prompt has no tokens.
    #[error("empty prompt")]
    EmptyPrompt,
    /// The prompt leaves no room for output within the longest sequence allowed.
    #[error("prompt of {prompt} tokens leaves no room for output (limit {limit})")]
    TooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Longest sequence allowed (model limit and KV pool size).
        limit: usize,
    },
}

/// Continuous-batching scheduler over a KV cache manager. Single owner; no tensors.
#[derive(Debug)]
pub struct Scheduler {
    pub(super) cfg: SchedulerConfig,
    pub(super) kv: KvCacheManager,
    pub(super) reqs: HashMap<SeqId, Request>,
    pub(super) waiting: Vec<SeqId>,
    pub(super) running: Vec<SeqId>,
    pub(super) finished_since_step: Vec<SeqId>,
    pub(super) stats: SchedStats,
}

impl Scheduler {
    /// A scheduler over `kv`.
    pub fn new(cfg: SchedulerConfig, kv: KvCacheManager) -> Self {
        Scheduler {
            cfg: cfg.normalized(),
            kv,
            reqs: HashMap::new(),
            waiting: Vec::new(),
            running: Vec::new(),
            finished_since_step: Vec::new(),
            stats: SchedStats::default(),
        }
    }

    /// The KV cache manager (for its counters and gauges).
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Replaces the KV cost model (calibration from measurements).
    pub fn set_cost_model(&mut self, cost: crate::kv_cache::CostModel) {
        self.kv.set_cost_model(cost);
    }

    /// The tier table in force.
    pub fn tiers(&self) -> &Tiers {
        self.kv.tiers()
    }

    /// Replaces the tier table (a pushed TierPolicy). Live requests keep their tier by name;
    /// one whose tier disappeared moves to the new default tier. From here on every request
    /// of a tier — queued ones included — is ordered, expired and retained by the new entry.
    pub fn set_tiers(&mut self, tiers: Tiers) {
        let default = tiers.default_id();
        let map = self.kv.set_tiers(tiers);
        for r in self.reqs.values_mut() {
            r.tier = map.get(r.tier).copied().unwrap_or(default);
        }
    }

    /// The limits in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> SchedStats {
        self.stats
    }

    /// Requests waiting.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Whether `id` is live (waiting or running).
    pub fn contains(&self, id: SeqId) -> bool {
        self.reqs.contains_key(&id)
    }

    /// Longest sequence (prompt + output) any request may reach.
    pub fn limit(&self) -> usize {
        self.cfg
            .max_model_len
            .min(self.kv.blocks_total() * self.kv.block_size())
    }

    /// Queues a request (queue full → `QueueFull`: reject with Retry-After). `now` is when it
    /// arrived, in the caller's monotonic milliseconds: its queue wait (aging, expiry) counts
    /// from there.
    pub fn add_request(&mut self, req: NewRequest, now: u64) -> Result<(), AddError> {
        let free_seats = self.cfg.max_num_seqs.saturating_sub(self.running.len());
        if self.waiting.len() >= self.cfg.max_waiting + free_seats {
            return Err(AddError::QueueFull(self.waiting.len()));
        }
        if self.reqs.contains_key(&req.id) {
            return Err(AddError::DuplicateId(req.id));
        }
        if req.prompt.is_empty() {
            return Err(AddError::EmptyPrompt);
        }
        let limit = self.limit();
        if req.prompt.len() >= limit {
            return Err(AddError::TooLong {
                prompt: req.prompt.len(),
                limit,
            });
        }
        let id = req.id;
        if let Some(session) = &req.session {
            self.kv.touch_session(session, now);
        }
        self.reqs.insert(id, Request::new(req, now));
        self.waiting.push(id);
        Ok(())
    }

    /// Cancels a request now: its blocks are freed at once (no session retention). Returns
    /// whether it was live.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        if self.reqs.remove(&id).is_none() {
            return false;
        }
        self.waiting.retain(|&w| w != id);
        self.running.retain(|&r| r != id);
        self.kv.free_seq(id);
        self.finished_since_step.push(id);
        self.stats.cancelled += 1;
        true
    }

    /// Ends a request at the caller's word (e.g. a stop string matched after detokenizing);
    /// its KV stays with its session like a normal finish.
    pub fn finish(&mut self, id: SeqId, now: u64) -> Option<Finished> {
        self.end(id, FinishReason::Stop, now)
    }

    /// Folds a step's results in: the scheduled chunks are now computed, and each
    /// `(id, token)` in `sampled` (for chunks with `want_logits`) is appended. Returns the
    /// requests that finished; their KV went to their session (or was freed).
    pub fn update(
        &mut self,
        out: &super::output::SchedulerOutput,
        sampled: &[(SeqId, u32)],
        now: u64,
    ) -> Vec<Finished> {
        for s in &out.scheduled {
            let Some(req) = self.reqs.get_mut(&s.seq_id) else {
                continue;
            };
            if req.state != State::Running {
                continue;
            }
            req.computed = (s.start_pos + s.tokens.len()).min(req.tokens.len());
            self.kv
                .cache_full_blocks(s.seq_id, &req.tokens[..req.computed]);
        }
        let limit = self.limit();
        let mut finished = Vec::new();
        for &(id, token) in sampled {
            let Some(req) = self.reqs.get_mut(&id) else {
                continue;
            };
            if req.state != State::Running || req.computed != req.tokens.len() {
                continue;
            }
            req.tokens.push(token);
            let reason = if req.stop_tokens.contains(&token) {
                Some(FinishReason::Stop)
            } else if req.generated() >= req.max_new_tokens || req.tokens.len() >= limit {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                finished.extend(self.end(id, reason, now));
            }
        }
        finished
    }

    /// Removes a live request, handing its computed KV to its session.
    fn end(&mut self, id: SeqId, reason: FinishReason, now: u64) -> Option<Finished> {
        let req = self.reqs.remove(&id)?;
        self.waiting.retain(|&w| w != id);
        self.running.retain(|&r| r != id);
        if req.state == State::Running {
            self.kv
                .finish_seq(id, req.session.as_deref(), &req.tokens[..req.computed], now);
        } else {
            self.kv.free_seq(id);
        }
        self.finished_since_step.push(id);
        self.stats.finished += 1;
        Some(Finished {
            seq_id: id,
            reason,
            prompt_tokens: req.prompt_len,
            output_tokens: req.generated(),
        })
    }

    /// Drops the waiting requests that were never admitted and have waited longer than their
    /// tier's queue-wait target at `now`. A preempted request (admitted once) never expires.
    pub fn expire_waiting(&mut self, now: u64) -> Vec<Expired> {
        let tiers = self.kv.tiers();
        let expired: Vec<Expired> = self
            .waiting
            .iter()
            .filter_map(|&id| {
                let r = self.reqs.get(&id)?;
                let waited_ms = now.saturating_sub(r.arrived);
                let target_ms = tiers.get(r.tier).queue_wait_ms;
                (r.first_scheduled.is_none() && waited_ms > target_ms).then_some(Expired {
                    seq_id: id,
                    waited_ms,
                    target_ms,
                })
            })
            .collect();
        for e in &expired {
            // Never admitted, so it holds no blocks; dropped like a cancel.
            self.reqs.remove(&e.seq_id);
            self.kv.free_seq(e.seq_id);
            self.finished_since_step.push(e.seq_id);
        }
        self.waiting.retain(|id| self.reqs.contains_key(id));
        self.stats.expired += expired.len() as u64;
        expired
    }

    /// Forgets a chat session's idle KV now (e.g. the conversation was deleted).
    pub fn forget_session(&mut self, session: &str) {
        self.kv.forget_session(session);
    }

    /// Applies idle-session TTLs without scheduling (for an engine with nothing to run); the
    /// offloads it decides are returned, to be executed and answered like a step's.
    pub fn tick(&mut self, now: u64) -> TransferPlan {
        self.kv.evict_expired(now);
        self.kv.take_transfers()
    }

    /// Verifies the invariants in the module note and the KV cache's.
    pub fn check(&self) -> Result<(), String> {
        self.kv.check()?;
        if self.waiting.len() + self.running.len() != self.reqs.len() {
            return Err("live requests not in exactly one queue".into());
        }
        for id in &self.running {
            match self.reqs.get(id) {
                Some(r) if r.state == State::Running && self.kv.has_seq(*id) => {}
                _ => return Err(format!("running {id} inconsistent")),
            }
        }
        for id in &self.waiting {
            match self.reqs.get(id) {
                Some(r) if r.state == State::Waiting && !self.kv.has_seq(*id) => {}
                _ => return Err(format!("waiting {id} inconsistent")),
            }
        }
        Ok(())
    }
}
