//! The scheduler's side of a step's KV block moves: applying their answers to the step.
//!
//! A failed restore or copy-on-write means a sequence's reused KV is shorter than the step
//! assumed. Its chunk in this step is moved back to start where the good KV ends (same length
//! or less, so the token budget holds and the block table still covers it), so the step
//! recomputes what the move failed to bring: a failed move costs time, never wrong output.

use crate::block_io::BlockIo;
use crate::kv_cache::{KvSource, Rollback, TransferAnswer};

use super::core::Scheduler;
use super::output::SchedulerOutput;

impl Scheduler {
    /// Applies the answers of `out.transfers` (already executed) to the cache and to `out`.
    pub fn apply_transfers(
        &mut self,
        answers: Vec<TransferAnswer>,
        out: &mut SchedulerOutput,
        now: u64,
    ) {
        for rollback in self.kv.apply_transfers(answers, now) {
            self.roll_back(rollback, out);
        }
    }

    /// One step with its moves executed through `io` and answered, and its spill files
    /// written: what the engine loop does, in one call (tests and tensor-free simulations).
    pub fn schedule_with(&mut self, now: u64, io: &mut dyn BlockIo) -> SchedulerOutput {
        let mut out = self.schedule(now);
        let answers = std::mem::take(&mut out.transfers).execute(io);
        self.apply_transfers(answers, &mut out, now);
        self.kv.wait_for_spills();
        out
    }

    /// [`Scheduler::tick`] with its moves executed through `io` and answered.
    pub fn tick_with(&mut self, now: u64, io: &mut dyn BlockIo) {
        let answers = self.tick(now).execute(io);
        self.apply_transfers(answers, &mut SchedulerOutput::default(), now);
        self.kv.wait_for_spills();
    }

    fn roll_back(&mut self, rb: Rollback, out: &mut SchedulerOutput) {
        let Some(req) = self.reqs.get_mut(&rb.seq) else {
            return;
        };
        let Some(s) = out.scheduled.iter_mut().find(|s| s.seq_id == rb.seq) else {
            req.computed = req.computed.min(rb.keep_tokens);
            return;
        };
        if s.start_pos <= rb.keep_tokens {
            return;
        }
        let len = s.tokens.len();
        let start = rb.keep_tokens;
        let end = (start + len).min(req.tokens.len());
        out.num_tokens = out.num_tokens - len + (end - start);
        s.tokens = req.tokens[start..end].to_vec();
        s.start_pos = start;
        s.want_logits = end == req.tokens.len();
        if matches!(s.kv_source, Some(KvSource::Host | KvSource::Disk)) {
            s.kv_source = Some(KvSource::Recompute);
        }
        req.computed = start;
    }
}
