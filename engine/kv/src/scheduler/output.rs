//! What one scheduling step hands to the runner, and what the scheduler reports back.
//!
//! Invariants of a [`SchedulerOutput`]: each sequence appears at most once in `scheduled`;
//! `num_tokens` is the sum of the chunks' lengths and never exceeds the token budget;
//! `scheduled.len()` never exceeds the batch size; every chunk's positions
//! `start_pos..start_pos + tokens.len()` are covered by its `block_table`; a preempted id is
//! not scheduled in the same step; an expired id is neither scheduled nor live.

use crate::kv_cache::{BlockId, KvSource, SeqId, TransferPlan};

use super::request::FinishReason;

/// One sequence's share of a step: compute KV for `tokens` at positions `start_pos..`, reading
/// and writing the paged store through `block_table`; sample a token if `want_logits`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The request.
    pub seq_id: SeqId,
    /// Token ids to run (a prefill chunk, or the one token of a decode step).
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]` in the sequence.
    pub start_pos: usize,
    /// The sequence's block table (block `i` holds positions `i·B .. (i+1)·B`).
    pub block_table: Vec<BlockId>,
    /// Whether this chunk reaches the end of the known tokens (so a token is sampled).
    pub want_logits: bool,
    /// Milliseconds the request waited before its first step (only on that step).
    pub queue_wait_ms: Option<u64>,
    /// Where the reused KV came from, on the step a request starts or resumes.
    pub kv_source: Option<KvSource>,
}

/// The plan of one step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    /// Sequences to run, highest priority first.
    pub scheduled: Vec<ScheduledSeq>,
    /// Total tokens to compute.
    pub num_tokens: usize,
    /// Sequences preempted in this step (their KV was offloaded or dropped already).
    pub preempted: Vec<SeqId>,
    /// Sequences finished or cancelled since the previous step (runner state may be freed).
    pub finished: Vec<SeqId>,
    /// Requests refused in this step because they waited past their tier's queue-wait
    /// target without being admitted (they are no longer live).
    pub expired: Vec<Expired>,
    /// KV block moves decided in this step, in order: executed before the forward pass.
    pub transfers: TransferPlan,
}

/// A request that waited past its tier's queue-wait target and was dropped from the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expired {
    /// The request.
    pub seq_id: SeqId,
    /// Milliseconds it waited.
    pub waited_ms: u64,
    /// Its tier's target at the time (from the tier table in force).
    pub target_ms: u64,
}

impl SchedulerOutput {
    /// Whether there is nothing to run.
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }
}

/// A request that ended during [`super::Scheduler::update`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    /// The request.
    pub seq_id: SeqId,
    /// Why.
    pub reason: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated (including a final stop token).
    pub output_tokens: usize,
}

/// Scheduler counters (the KV cache keeps its own: evictions, restores).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStats {
    /// Steps scheduled with work.
    pub steps: u64,
    /// Preemptions of running sequences.
    pub preemptions: u64,
    /// Tokens computed as prefill (prompt chunks, and recompute after preemption).
    pub prefill_tokens: u64,
    /// Tokens computed as decode (one sampled token fed back).
    pub decode_tokens: u64,
    /// Requests finished (not counting cancels).
    pub finished: u64,
    /// Requests cancelled.
    pub cancelled: u64,
    /// Requests refused for waiting past their tier's queue-wait target.
    pub expired: u64,
}
