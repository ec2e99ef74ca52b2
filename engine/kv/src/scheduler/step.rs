//! One scheduling step: fit running sequences' next tokens (decode or prefill chunks) and then
//! waiting requests into the token budget and batch size, preempting the lowest-priority
//! running sequence when blocks run out.
//!
//! Queue wait: a step first refuses the waiting requests that were never admitted and have
//! waited longer than their tier's queue-wait target (`SchedulerOutput::expired`), on the
//! same clock and the same tier table as everything below.
//!
//! Order and fairness:
//! - every request has an effective priority: its tier priority plus one level per
//!   `aging_ms_per_level` since it arrived (aging). Requests age at the same rate, so the
//!   order between two requests never flips back, and any request eventually outranks every
//!   newer one: a lower tier never starves;
//! - running sequences go first: their decode tokens, then their prefill chunks, each in
//!   order of effective priority, then earliest arrival. When one cannot get blocks, the
//!   lowest-priority running sequence is preempted (possibly itself, possibly one already
//!   given a chunk this step, which then loses it). The top sequence always fits (no request
//!   may outgrow the pool);
//! - waiting requests are taken in the same order (FIFO within a tier). The head of the queue
//!   is never overtaken: if it cannot start, nobody behind it does (no starvation by smaller
//!   requests). It may preempt running sequences of strictly lower effective priority;
//! - no waiting request is admitted in a step that preempted (memory is tight), and a request
//!   preempted in this step is not re-admitted in the same step.
//!
//! Offload, restore and copy-on-write are decided here and returned as data
//! (`SchedulerOutput::transfers`): the engine loop executes them in batches before the forward
//! pass and hands the answers to [`Scheduler::apply_transfers`] (`transfers.rs`).

use std::cmp::Reverse;

use crate::kv_cache::{KvSource, SeqId, SeqStart};

use super::core::Scheduler;
use super::output::{ScheduledSeq, SchedulerOutput};
use super::request::State;

/// A chunk chosen for this step, before its output record is built.
struct Chunk {
    id: SeqId,
    start: usize,
    len: usize,
    source: Option<KvSource>,
}

impl Scheduler {
    /// Plans one step at time `now` (monotonic ms). The KV block moves it decides (offload on
    /// eviction or preemption, restore, copy-on-write) are in `transfers`, to be executed
    /// before the forward pass and answered ([`Scheduler::apply_transfers`]).
    pub fn schedule(&mut self, now: u64) -> SchedulerOutput {
        self.kv.evict_expired(now);
        // Before admission: a request already past its target is refused, not started late.
        let expired = self.expire_waiting(now);
        let mut out = SchedulerOutput {
            finished: std::mem::take(&mut self.finished_since_step),
            expired,
            ..SchedulerOutput::default()
        };
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut budget = self.cfg.max_num_tokens;
        self.sort_running(now);
        self.schedule_running(now, &mut chunks, &mut budget, &mut out);
        if out.preempted.is_empty() {
            self.schedule_waiting(now, &mut chunks, &mut budget, &mut out);
        }
        for &id in &out.preempted {
            if self
                .reqs
                .get(&id)
                .is_some_and(|r| r.state == State::Waiting)
                && !self.waiting.contains(&id)
            {
                self.waiting.push(id);
            }
        }
        self.build_output(chunks, now, &mut out);
        out.transfers = self.kv.take_transfers();
        out
    }

    /// Sort key, smallest first: effective priority (tier priority plus one level per
    /// `aging_ms_per_level` since arrival) descending, then arrival, then id.
    fn order_key(&self, id: SeqId, now: u64) -> (Reverse<i64>, u64, SeqId) {
        match self.reqs.get(&id) {
            Some(r) => {
                let aging = self.cfg.aging_ms_per_level;
                let age = now.saturating_sub(r.arrived);
                let boost = age.checked_div(aging).unwrap_or(0);
                let eff = i64::from(self.kv.tiers().get(r.tier).priority)
                    .saturating_add(i64::try_from(boost).unwrap_or(i64::MAX));
                (Reverse(eff), r.arrived, id)
            }
            None => (Reverse(i64::MIN), u64::MAX, id),
        }
    }

    fn sort_running(&mut self, now: u64) {
        let mut running = std::mem::take(&mut self.running);
        running.sort_by_cached_key(|&id| self.order_key(id, now));
        self.running = running;
    }

    /// Running sequences: decodes first (one token each, so inter-token latency does not wait
    /// behind long prefills), then prefill chunks, each group in priority order.
    fn schedule_running(
        &mut self,
        now: u64,
        chunks: &mut Vec<Chunk>,
        budget: &mut usize,
        out: &mut SchedulerOutput,
    ) {
        let remaining = |r: &super::request::Request| r.tokens.len() - r.computed;
        let (decodes, prefills): (Vec<SeqId>, Vec<SeqId>) = self
            .running
            .iter()
            .partition(|id| self.reqs.get(id).is_some_and(|r| remaining(r) <= 1));
        for id in decodes.into_iter().chain(prefills) {
            if chunks.len() >= self.cfg.max_num_seqs || *budget == 0 {
                break;
            }
            if out.preempted.contains(&id) {
                continue;
            }
            let Some(req) = self.reqs.get(&id) else {
                continue;
            };
            let start = req.computed;
            let len = remaining(req).min(*budget).min(self.cfg.max_prefill_chunk);
            if len == 0 {
                continue;
            }
            loop {
                if self.kv.allocate_slots(id, start + len, now).is_some() {
                    chunks.push(Chunk {
                        id,
                        start,
                        len,
                        source: None,
                    });
                    *budget -= len;
                    break;
                }
                // Out of blocks: the lowest-priority running sequence gives way (it may be
                // this one, or one already given a chunk in this step).
                let Some(victim) = self.lowest_running(now) else {
                    return;
                };
                self.preempt_scheduled(victim, now, chunks, budget, out);
                if victim == id {
                    break;
                }
            }
        }
    }

    fn schedule_waiting(
        &mut self,
        now: u64,
        chunks: &mut Vec<Chunk>,
        budget: &mut usize,
        out: &mut SchedulerOutput,
    ) {
        self.sort_waiting(now);
        while let Some(&id) = self.waiting.first() {
            if chunks.len() >= self.cfg.max_num_seqs || *budget == 0 {
                break;
            }
            let Some(req) = self.reqs.get(&id) else {
                self.waiting.remove(0);
                continue;
            };
            let chunk = (*budget).min(self.cfg.max_prefill_chunk);
            let tier = req.tier;
            let head_key = self.order_key(id, now);
            let begun = loop {
                let Some(req) = self.reqs.get(&id) else {
                    break None;
                };
                let session = req.session.as_deref();
                if let Some(b) = self.kv.begin_seq(
                    SeqStart {
                        seq: id,
                        tier,
                        tokens: &req.tokens,
                        session,
                        chunk,
                    },
                    now,
                ) {
                    break Some(b);
                }
                // Only a running sequence of strictly lower effective priority may give way.
                let victim = self
                    .lowest_running(now)
                    .filter(|&v| self.order_key(v, now).0.0 < head_key.0.0);
                let Some(victim) = victim else {
                    break None;
                };
                self.preempt_scheduled(victim, now, chunks, budget, out);
            };
            let Some(begun) = begun else {
                break;
            };
            let Some(req) = self.reqs.get_mut(&id) else {
                break;
            };
            req.computed = begun.computed;
            req.state = State::Running;
            let len = (req.tokens.len() - begun.computed).min(chunk);
            self.waiting.remove(0);
            self.running.push(id);
            chunks.push(Chunk {
                id,
                start: begun.computed,
                len,
                source: Some(begun.source),
            });
            *budget -= len;
        }
    }

    /// Orders waiting requests by effective priority (tier priority + aging), then arrival.
    fn sort_waiting(&mut self, now: u64) {
        let mut waiting = std::mem::take(&mut self.waiting);
        waiting.sort_by_cached_key(|&id| self.order_key(id, now));
        self.waiting = waiting;
    }

    /// The lowest-priority running sequence (the one a step preempts first).
    fn lowest_running(&self, now: u64) -> Option<SeqId> {
        self.running
            .iter()
            .copied()
            .max_by_key(|&id| self.order_key(id, now))
    }

    /// Preempts `victim` and drops its chunk from this step if it had one.
    fn preempt_scheduled(
        &mut self,
        victim: SeqId,
        now: u64,
        chunks: &mut Vec<Chunk>,
        budget: &mut usize,
        out: &mut SchedulerOutput,
    ) {
        if let Some(pos) = chunks.iter().position(|c| c.id == victim) {
            *budget += chunks.remove(pos).len;
        }
        self.preempt(victim, now, out);
    }

    /// Takes a running sequence's blocks (offload or drop per its tier) and sends it back to
    /// waiting with nothing computed on the device.
    fn preempt(&mut self, id: SeqId, now: u64, out: &mut SchedulerOutput) {
        self.running.retain(|&r| r != id);
        let Some(req) = self.reqs.get_mut(&id) else {
            return;
        };
        self.kv.preempt_seq(id, &req.tokens[..req.computed], now);
        req.computed = 0;
        req.state = State::Waiting;
        self.stats.preemptions += 1;
        out.preempted.push(id);
    }

    fn build_output(&mut self, chunks: Vec<Chunk>, now: u64, out: &mut SchedulerOutput) {
        for c in chunks {
            let Some(req) = self.reqs.get_mut(&c.id) else {
                continue;
            };
            let Some(table) = self.kv.block_table(c.id) else {
                continue;
            };
            let end = c.start + c.len;
            let want_logits = end == req.tokens.len();
            if c.len == 1 && want_logits && req.generated() > 0 {
                self.stats.decode_tokens += 1;
            } else {
                self.stats.prefill_tokens += c.len as u64;
            }
            let queue_wait_ms = match req.first_scheduled {
                None => {
                    req.first_scheduled = Some(now);
                    Some(now.saturating_sub(req.arrived))
                }
                Some(_) => None,
            };
            out.num_tokens += c.len;
            out.scheduled.push(ScheduledSeq {
                seq_id: c.id,
                tokens: req.tokens[c.start..end].to_vec(),
                start_pos: c.start,
                block_table: table.to_vec(),
                want_logits,
                queue_wait_ms,
                kv_source: c.source,
            });
        }
        if !out.scheduled.is_empty() {
            self.stats.steps += 1;
        }
    }
}
