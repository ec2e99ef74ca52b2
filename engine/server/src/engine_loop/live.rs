//! One request as the owner thread tracks it beside the scheduler: its token stream, its
//! sampler, its incremental detokenizer, and whether it has been admitted yet.
//!
//! Invariant: `reply` is `Some` exactly until the request is admitted or refused, so the
//! admission oneshot resolves at most once.

use std::time::Duration;

use tokio::sync::oneshot;

use crate::backend::{SubmitError, TokenEvent, TokenSender};
use tidegate_runner::model::{TextStream, Tokenizer};
use tidegate_runner::sampling::{Sampler, SamplingParams};

/// A live request (waiting or running).
pub(super) struct Live {
    pub(super) tx: TokenSender,
    pub(super) reply: Option<oneshot::Sender<Result<Duration, SubmitError>>>,
    pub(super) sampler: Sampler,
    pub(super) text: TextStream,
    /// Prompt tokens served from reused KV (known at admission).
    pub(super) cached_prompt_tokens: u32,
}

impl Live {
    pub(super) fn new(
        req: &crate::backend::GenerateRequest,
        tx: TokenSender,
        reply: oneshot::Sender<Result<Duration, SubmitError>>,
        fallback_seed: u64,
    ) -> Self {
        let params = SamplingParams {
            temperature: req.sampling.temperature,
            top_p: req.sampling.top_p,
            seed: req.sampling.seed.unwrap_or(fallback_seed),
        };
        Live {
            tx,
            reply: Some(reply),
            sampler: Sampler::new(params),
            text: TextStream::new(),
            cached_prompt_tokens: 0,
        }
    }

    /// Whether the client is gone (stream or pending `submit` future dropped).
    pub(super) fn is_cancelled(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves admission with the time spent queued (on the scheduler's clock).
    pub(super) fn admit(&mut self, queue_wait: Duration, cached_prompt_tokens: u32) {
        self.cached_prompt_tokens = cached_prompt_tokens;
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(Ok(queue_wait));
        }
    }

    /// Refuses (before admission) or fails (after) the request.
    pub(super) fn refuse(mut self, err: SubmitError) {
        match self.reply.take() {
            Some(reply) => {
                let _ = reply.send(Err(err));
            }
            None => {
                self.tx.send(TokenEvent::Failed {
                    message: err.to_string(),
                });
            }
        }
    }

    /// Streams one sampled token with the text it completes.
    pub(super) fn emit(&mut self, tok: &Tokenizer, id: u32) {
        let text = self.text.push(tok, id).unwrap_or_default();
        self.tx.send(TokenEvent::Token { id, text });
    }
}
