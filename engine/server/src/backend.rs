//! The boundary between the HTTP server and whatever generates tokens.
//!
//! The server (crate::api) only ever talks to an [`Engine`]: it turns an OpenAI request
//! into a [`GenerateRequest`] (prompt already tokenized, output limit already clamped to the
//! tier's `maxOutputTokens`, tier named), calls [`Engine::submit`], and relays
//! the [`TokenEvent`]s of the returned [`TokenStream`] to the client. One implementation:
//! the engine loop (one owner of scheduler + KV cache + model runner); tests and demos run it
//! on the echo runner (`serve --fake-model`), so they exercise the real scheduler.
//!
//! Contract every implementation keeps:
//! - `submit` resolves only once the request is *admitted* (scheduled for its first prefill
//!   chunk) or refused. Admission follows the design's order: the waiting queue is over its
//!   bound → [`SubmitError::QueueFull`] at once; KV blocks short → evict idle sessions per
//!   their tier's retention; still short → wait in the queue, at most the tier's
//!   `queue_wait_target` (as the last pushed policy has it, measured from
//!   `GenerateRequest::arrived`), then [`SubmitError::QueueTimeout`]; else admit.
//! - Dropping the [`TokenStream`] (client vanished, drain grace over) cancels the request:
//!   the engine notices (`TokenSender::is_closed`) at its next step and frees the request's
//!   KV blocks at once. A future returned by `submit` that is dropped before resolving
//!   cancels the queued request the same way (`TokenSender::is_closed`).
//! - [`TokenStream::finish`] (a stop string matched) ends the request as a finish instead:
//!   the engine stops it at its next step (`TokenSender::finish_requested`) and its KV stays
//!   with its session per the tier's retention, so a returning conversation reuses it.
//! - A stream ends with exactly one [`TokenEvent::Finished`] (unless cancelled); the engine
//!   never blocks on a slow client: per-request streams are unbounded channels, bounded in
//!   practice by `max_tokens`.
//! - Stop strings are matched by the server on the detokenized text; the engine only stops at
//!   EOS (unless `ignore_eos`) or `max_tokens`.
//! - The engine records its own metrics (prefill/decode tokens, running/waiting, KV blocks,
//!   evictions, restores) in the shared [`crate::metrics::Metrics`]; the server records
//!   latency histograms, rejections and request outcomes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
pub use tidegate_http::error::SubmitError;

use futures::future::BoxFuture;
use tokio::sync::mpsc;

/// A token id of the served model's vocabulary.
pub type TokenId = u32;

/// Sampling parameters, validated by the server (temperature in [0, 2], top_p in (0, 1]).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// Same seed, same prompt, same parameters → same output.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            seed: None,
        }
    }
}

/// One generation request, as the server hands it to the engine.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// Request id (also the OpenAI response id), for logs.
    pub id: String,
    /// The prompt, tokenized (chat template already applied for chat requests).
    pub prompt: Vec<TokenId>,
    /// Output tokens to generate at most (≥ 1, already clamped by the tier and the context).
    pub max_tokens: u32,
    pub sampling: SamplingParams,
    /// Generate exactly `max_tokens`, ignoring EOS (benchmark clients send this).
    pub ignore_eos: bool,
    /// The request's tier, by name. The engine reads the tier's parameters (priority,
    /// queue-wait target, KV retention) from the tier table it was given with
    /// [`Engine::set_tier_policy`]; an unknown name means the default tier.
    pub tier: String,
    /// Keys retained KV: a returning conversation reuses or restores it. Already namespaced
    /// by tenant (`<len>:<tenant>:<client session id>`), so equal keys mean the same tenant.
    pub session_id: Option<String>,
    /// When the server received the request (queue wait is measured from here).
    pub arrived: Instant,
}

/// Why a request stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS (or, as decided by the server, a stop string).
    Stop,
    /// `max_tokens` reached (or the context is full).
    Length,
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens served from retained or restored KV instead of prefill.
    pub cached_prompt_tokens: u32,
}

/// What a [`TokenStream`] yields.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenEvent {
    /// One generated token and the text it completes (may be empty when the token ends
    /// in the middle of a UTF-8 sequence; the text then arrives with a later token).
    Token { id: TokenId, text: String },
    /// The last event of a stream.
    Finished { reason: FinishReason, usage: Usage },
    /// The engine failed this request (its resources are already freed).
    Failed { message: String },
}

/// What `submit` returns once a request is admitted.
#[derive(Debug)]
pub struct Admitted {
    /// Time spent queued before admission.
    pub queue_wait: Duration,
    pub tokens: TokenStream,
}

/// Receiving side of a request's tokens. Dropping it cancels the request;
/// [`TokenStream::finish`] ends it as finished.
#[derive(Debug)]
pub struct TokenStream {
    rx: mpsc::UnboundedReceiver<TokenEvent>,
    finish: Arc<AtomicBool>,
}

/// Sending side, held by the engine.
#[derive(Debug, Clone)]
pub struct TokenSender {
    tx: mpsc::UnboundedSender<TokenEvent>,
    finish: Arc<AtomicBool>,
}

/// A connected pair: the engine keeps the sender, the server gets the stream.
pub fn token_channel() -> (TokenSender, TokenStream) {
    let (tx, rx) = mpsc::unbounded_channel();
    let finish = Arc::new(AtomicBool::new(false));
    (
        TokenSender {
            tx,
            finish: Arc::clone(&finish),
        },
        TokenStream { rx, finish },
    )
}

impl TokenStream {
    /// The next event; `None` when the engine dropped the request without finishing it.
    pub async fn next(&mut self) -> Option<TokenEvent> {
        self.rx.recv().await
    }

    /// Ends the request as finished, not cancelled (a stop string matched): the engine stops
    /// generating and keeps the request's KV with its session, as after EOS.
    pub fn finish(self) {
        // Set before the receiver drops, so an engine that sees the stream closed also sees
        // why.
        self.finish.store(true, Ordering::Release);
    }
}

impl TokenSender {
    /// Sends an event; `false` when the receiver is gone (the request was cancelled).
    pub fn send(&self, event: TokenEvent) -> bool {
        self.tx.send(event).is_ok()
    }

    /// True once the server dropped the stream: free the request's resources.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// True once the server ended the request with [`TokenStream::finish`]: finish it (its
    /// KV stays with its session) instead of cancelling it.
    pub fn finish_requested(&self) -> bool {
        self.finish.load(Ordering::Acquire)
    }
}

/// Why text could not be tokenized or a chat rendered.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum TokenizeError {
    #[error("cannot tokenize: {0}")]
    Invalid(String),
    #[error("token id {0} is outside the vocabulary")]
    UnknownToken(TokenId),
    #[error("chat template failed: {0}")]
    Template(String),
}

impl TokenizeError {
    pub fn metric_label(&self) -> &'static str {
        "bad_request"
    }
}

/// One chat message, after the server flattened content parts to text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Static facts about the served model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// Served model name (`model` in requests and /v1/models).
    pub id: String,
    /// Context length: prompt + output tokens.
    pub context_length: u32,
    /// Unix seconds the model was loaded (`created` in /v1/models).
    pub created: u64,
    /// The format the weights are served in (`q4_1 79% + q8_0 21%`, `f32`, ...).
    pub weights: String,
    /// Weight bytes read per decoded token (0 when not applicable).
    pub weight_bytes_per_token: u64,
    /// The kernels that run the weights (`int8 avx512-vnni, f32 avx512`, `candle`, `none`).
    pub kernels: String,
    /// Requests the engine holds at most: its batch plus its own queue. Reported to routers
    /// with every answer, so a router never needs to be told it.
    pub slots: u64,
}

/// What the server needs from a token generator. Object safe: the server holds an
/// `Arc<dyn Engine>`.
pub trait Engine: Send + Sync + 'static {
    fn model_info(&self) -> ModelInfo;

    /// False while weights are loading (readyz answers 503).
    fn is_ready(&self) -> bool;

    fn tokenize(&self, text: &str) -> Result<Vec<TokenId>, TokenizeError>;

    fn detokenize(&self, tokens: &[TokenId]) -> Result<String, TokenizeError>;

    /// Renders a conversation with the model's chat template, ending with the assistant's
    /// generation prompt.
    fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, TokenizeError>;

    /// Queues a request; resolves when it is admitted or refused (see the module note).
    fn submit(&self, req: GenerateRequest) -> BoxFuture<'static, Result<Admitted, SubmitError>>;

    /// The tier policy in force, called at start and on every accepted push: the only road
    /// by which tier parameters reach the engine (requests name their tier). Requests
    /// already queued follow the new parameters of their tier from then on.
    fn set_tier_policy(&self, policy: &tidegate_api::TierPolicySpec);
}
