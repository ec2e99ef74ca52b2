//! A request as the scheduler tracks it: all its known tokens, how many have KV computed, and
//! when it may stop.
//!
//! Invariants: `computed ≤ tokens.len()`; `prompt_len ≤ tokens.len()`; the tokens after
//! `prompt_len` are exactly the ones sampled for this request, in order.

use crate::kv_cache::{SeqId, TierId};

/// A request handed to [`super::Scheduler::add_request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRequest {
    /// Caller-chosen id, unique among live requests.
    pub id: SeqId,
    /// Tier (index into the scheduler's tier table; look it up by name with `Tiers::id_of`).
    pub tier: TierId,
    /// Chat session id: the KV stays idle under it after the request ends.
    pub session: Option<String>,
    /// Prompt token ids (for a returning session: the whole conversation so far).
    pub prompt: Vec<u32>,
    /// Output tokens at most.
    pub max_new_tokens: usize,
    /// Sampling one of these ends the request (the token itself is kept).
    pub stop_tokens: Vec<u32>,
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// Sampled a stop token, or the caller said stop.
    Stop,
    /// Reached `max_new_tokens` or the longest sequence allowed.
    Length,
}

impl FinishReason {
    /// OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    Waiting,
    Running,
}

#[derive(Clone, Debug)]
pub(super) struct Request {
    pub(super) tier: TierId,
    pub(super) session: Option<String>,
    pub(super) tokens: Vec<u32>,
    pub(super) prompt_len: usize,
    pub(super) computed: usize,
    pub(super) max_new_tokens: usize,
    pub(super) stop_tokens: Vec<u32>,
    pub(super) arrived: u64,
    pub(super) first_scheduled: Option<u64>,
    pub(super) state: State,
}

impl Request {
    pub(super) fn new(r: NewRequest, now: u64) -> Self {
        Request {
            tier: r.tier,
            session: r.session,
            prompt_len: r.prompt.len(),
            tokens: r.prompt,
            computed: 0,
            max_new_tokens: r.max_new_tokens,
            stop_tokens: r.stop_tokens,
            arrived: now,
            first_scheduled: None,
            state: State::Waiting,
        }
    }

    pub(super) fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}
