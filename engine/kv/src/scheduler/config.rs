//! Scheduler limits: the per-step token budget, the batch size, the queue bound, the longest
//! sequence, and how fast waiting requests age.
//!
//! Invariant: every limit is at least 1 after [`SchedulerConfig::normalized`], so a step can
//! always make progress when anything is runnable.

/// Limits of one scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Tokens computed per step, over all sequences (decode tokens + prefill chunks).
    pub max_num_tokens: usize,
    /// Sequences per step (the batch).
    pub max_num_seqs: usize,
    /// Requests waiting at most; beyond it, `add_request` refuses (the caller answers 503 with
    /// Retry-After).
    pub max_waiting: usize,
    /// Prompt plus output tokens of one sequence at most.
    pub max_model_len: usize,
    /// Largest prefill chunk one sequence gets per step (keeps decode latency bounded).
    pub max_prefill_chunk: usize,
    /// A waiting request's effective priority rises by one per this many milliseconds waited
    /// (aging), so a lower tier never starves; 0 disables aging.
    pub aging_ms_per_level: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_num_tokens: 512,
            max_num_seqs: 64,
            max_waiting: 1024,
            max_model_len: 8192,
            max_prefill_chunk: 512,
            aging_ms_per_level: 100,
        }
    }
}

impl SchedulerConfig {
    /// The same limits with every one at least 1.
    pub fn normalized(self) -> Self {
        SchedulerConfig {
            max_num_tokens: self.max_num_tokens.max(1),
            max_num_seqs: self.max_num_seqs.max(1),
            max_waiting: self.max_waiting.max(1),
            max_model_len: self.max_model_len.max(2),
            max_prefill_chunk: self.max_prefill_chunk.max(1),
            aging_ms_per_level: self.aging_ms_per_level,
        }
    }
}
