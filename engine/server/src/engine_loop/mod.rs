//! The real [`Engine`]: a handle that talks to one owner thread which drives the scheduler,
//! the KV cache manager, the model runner and the per-request samplers.
//!
//! Shape: `submit` builds the request's token channel, puts a [`Job`] on a bounded channel
//! (full → `QueueFull` at once) and waits on a oneshot that the owner thread resolves when the
//! request is first scheduled (admitted) or refused. The owner thread (a dedicated
//! `std::thread`, since forward passes are CPU-bound) loops: drain the inbox, finish requests
//! the server stopped and drop cancelled ones, schedule one step (which refuses requests
//! queued past their tier's wait target), run one batched forward pass, sample, stream
//! tokens, finish requests, publish metrics; it sleeps on the inbox when idle.
//!
//! Tiers: a request names its tier; everything about the tier (priority, queue-wait target,
//! KV retention) is read from the scheduler's one tier table, which `set_tier_policy`
//! replaces. So a push changes all of a tier's parameters together, for queued requests too.
//!
//! What is served is a [`LoopModel`]: a tokenizer and a [`ModelRunner`] built on the owner
//! thread (the packed CPU runner, the candle device runner, or the echo runner of
//! `--fake-model`). The loop, scheduler and KV manager are the same for all of them.
//!
//! Invariant: only the owner thread touches scheduler, KV cache and runner state; the handle
//! shares nothing with it but channels, the ready flag and a one-slot tier-policy mailbox
//! (one slot so a push is never lost to a full inbox; the owner applies it before it takes
//! in any request submitted after the push).

mod live;
mod model;
mod owner;
mod publish;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use crate::backend::{
    Admitted, ChatMessage, Engine, GenerateRequest, ModelInfo, SubmitError, TokenId, TokenSender,
    TokenizeError, token_channel,
};
use crate::metrics::Metrics;
use tidegate_kv::kv_cache::Tiers;
use tidegate_runner::echo::EchoConfig;
use tidegate_runner::error::{Error, Result as EngineResult};
use tidegate_runner::model::{ModelFiles, Tokenizer};
use tidegate_runner::{KvDtype, Placement, WeightChoice};

pub use model::{LoopModel, RunnerBuild, ServedWeights};
use owner::Owner;

/// Sizing of the engine loop.
#[derive(Clone, Debug)]
pub struct LoopConfig {
    /// Served model name.
    pub model_id: String,
    /// KV blocks in the device pool.
    pub kv_blocks: usize,
    /// Tokens per KV block.
    pub kv_block_tokens: usize,
    /// Host RAM for offloaded KV (0 disables the host tier).
    pub kv_host_bytes: usize,
    /// Disk space for spilled KV (0 or no directory disables disk).
    pub kv_disk_bytes: usize,
    /// Directory for spilled KV files.
    pub kv_disk_dir: Option<PathBuf>,
    /// Tokens computed per step over all sequences (decode + prefill chunks).
    pub max_batch_tokens: usize,
    /// Sequences per step.
    pub max_batch_seqs: usize,
    /// Requests waiting for admission at most (the inbox is bounded by this too).
    pub max_waiting: usize,
    /// Retry-After suggested with queue refusals.
    pub retry_after: Duration,
    /// Longest context a request may have (`--max-context-tokens`); None: the model's own.
    pub max_context_tokens: Option<usize>,
    /// The format the projections are served in (`--weights`).
    pub weights: WeightChoice,
    /// The packed runner's KV element type (`--kv-cache-dtype`).
    pub kv_dtype: KvDtype,
    /// Where the model runs and on which runner (`--device`, `--runner`).
    pub placement: Placement,
}

impl LoopConfig {
    /// The longest context a request may have for a model whose own limit is `model_max`:
    /// that limit, capped by `--max-context-tokens`.
    pub fn max_model_len(&self, model_max: usize) -> usize {
        model_max.min(self.max_context_tokens.unwrap_or(usize::MAX))
    }
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            model_id: "model".to_string(),
            kv_blocks: 2048,
            kv_block_tokens: 16,
            kv_host_bytes: 1 << 30,
            kv_disk_bytes: 0,
            kv_disk_dir: None,
            max_batch_tokens: 512,
            max_batch_seqs: 64,
            max_waiting: 256,
            retry_after: Duration::from_secs(1),
            max_context_tokens: None,
            weights: WeightChoice::AsFile,
            kv_dtype: KvDtype::F16,
            placement: Placement::cpu_packed(),
        }
    }
}

/// Inbox room beyond a queue and a batch: policy wake-ups and a burst's stragglers.
const INBOX_SLACK: usize = 16;

/// A request on its way to the owner thread.
pub(crate) struct Job {
    pub(crate) req: GenerateRequest,
    pub(crate) tx: TokenSender,
    /// Resolved with the queue wait once admitted, or with the refusal.
    pub(crate) reply: oneshot::Sender<Result<Duration, SubmitError>>,
}

/// What the owner thread's inbox carries.
pub(crate) enum Msg {
    Submit(Box<Job>),
    /// A new tier policy waits in the mailbox.
    Wake,
}

/// Handle to the engine loop (the server holds it as `Arc<dyn Engine>`).
pub struct LoopEngine {
    info: ModelInfo,
    ready: Arc<AtomicBool>,
    tokenizer: Arc<Tokenizer>,
    inbox: SyncSender<Msg>,
    tiers: Arc<Mutex<Option<Tiers>>>,
    retry_after: Duration,
}

impl LoopEngine {
    /// Starts the owner thread for a loaded checkpoint on the runner `config.placement`
    /// names.
    pub fn start(
        files: ModelFiles,
        config: LoopConfig,
        metrics: Arc<Metrics>,
    ) -> EngineResult<Arc<Self>> {
        let model = LoopModel::for_files(files, config.placement, config.weights)?;
        Self::start_model(model, config, metrics)
    }

    /// Starts the owner thread for `model`; its runner is built on that thread, and the
    /// engine turns ready when it is done.
    pub fn start_model(
        model: LoopModel,
        config: LoopConfig,
        metrics: Arc<Metrics>,
    ) -> EngineResult<Arc<Self>> {
        let kv_tokens = config.kv_blocks.max(1) * config.kv_block_tokens.max(1);
        // What the scheduler takes, and never more than the KV pool can hold.
        let context = config
            .max_model_len(model.max_position_embeddings)
            .min(kv_tokens);
        let info = ModelInfo {
            id: config.model_id.clone(),
            context_length: u32::try_from(context).unwrap_or(u32::MAX),
            weights: model.weights.label.clone(),
            weight_bytes_per_token: model.weights.bytes_per_token as u64,
            kernels: model.weights.kernels.clone(),
            slots: (config.max_batch_seqs.max(1) + config.max_waiting.max(1)) as u64,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        let ready = Arc::new(AtomicBool::new(false));
        let tokenizer = Arc::new(model.tokenizer.clone());
        // The queue bound is the scheduler's (`waiting ≤ max_waiting`, refused as QueueFull
        // there). The inbox only carries requests to the owner between its turns, so it holds
        // a whole queue's worth plus a batch and room for policy wake-ups: otherwise a request
        // that arrives while the owner is mid-step finds the inbox full and gets a 429 with
        // the queue itself empty.
        let inbox_bound = config.max_waiting.max(1) + config.max_batch_seqs.max(1) + INBOX_SLACK;
        let (inbox, rx) = sync_channel(inbox_bound);
        let tiers = Arc::new(Mutex::new(None));
        let retry_after = config.retry_after;
        let owner_ready = Arc::clone(&ready);
        let owner_tiers = Arc::clone(&tiers);
        std::thread::Builder::new()
            .name("engine-loop".into())
            .spawn(
                move || match Owner::new(model, &config, metrics, owner_tiers) {
                    Ok(mut owner) => {
                        owner_ready.store(true, Ordering::Release);
                        owner.run(&rx);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "engine loop failed to start");
                        // Refuse whatever arrives; the server stays not-ready.
                        for msg in rx.iter() {
                            if let Msg::Submit(job) = msg {
                                let _ = job.reply.send(Err(SubmitError::Internal(e.to_string())));
                            }
                        }
                    }
                },
            )
            .map_err(|e| Error::Config(format!("spawning the engine loop: {e}")))?;
        Ok(Arc::new(LoopEngine {
            info,
            ready,
            tokenizer,
            inbox,
            tiers,
            retry_after,
        }))
    }

    /// Starts the owner thread on the echo runner (`serve --fake-model`, tests, demos).
    pub fn start_echo(
        echo: EchoConfig,
        config: LoopConfig,
        metrics: Arc<Metrics>,
    ) -> EngineResult<Arc<Self>> {
        Self::start_model(LoopModel::echo(echo)?, config, metrics)
    }
}

fn tok_err(e: Error) -> TokenizeError {
    TokenizeError::Invalid(e.to_string())
}

impl Engine for LoopEngine {
    fn model_info(&self) -> ModelInfo {
        self.info.clone()
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    fn tokenize(&self, text: &str) -> Result<Vec<TokenId>, TokenizeError> {
        self.tokenizer.encode(text).map_err(tok_err)
    }

    fn detokenize(&self, tokens: &[TokenId]) -> Result<String, TokenizeError> {
        let vocab = self.tokenizer.vocab_size();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(TokenizeError::UnknownToken(bad));
        }
        self.tokenizer.decode_text(tokens).map_err(tok_err)
    }

    fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, TokenizeError> {
        let msgs: Vec<tidegate_runner::model::ChatMessage> = messages
            .iter()
            .map(|m| tidegate_runner::model::ChatMessage {
                role: m.role.clone(),
                content: m.content.clone(),
            })
            .collect();
        self.tokenizer
            .apply_chat_template(&msgs, true)
            .map_err(|e| TokenizeError::Template(e.to_string()))
    }

    fn submit(&self, req: GenerateRequest) -> BoxFuture<'static, Result<Admitted, SubmitError>> {
        let (tx, tokens) = token_channel();
        let (reply, answer) = oneshot::channel();
        let sent = self
            .inbox
            .try_send(Msg::Submit(Box::new(Job { req, tx, reply })));
        let retry_after = self.retry_after;
        async move {
            match sent {
                Ok(()) => match answer.await {
                    Ok(Ok(queue_wait)) => Ok(Admitted { queue_wait, tokens }),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(SubmitError::ShuttingDown),
                },
                Err(TrySendError::Full(_)) => Err(SubmitError::QueueFull { retry_after }),
                Err(TrySendError::Disconnected(_)) => Err(SubmitError::ShuttingDown),
            }
        }
        .boxed()
    }

    fn set_tier_policy(&self, policy: &tidegate_api::TierPolicySpec) {
        let Some(tiers) = Tiers::from_policy(policy) else {
            tracing::warn!("tier policy without a usable default tier; keeping the current one");
            return;
        };
        *self.tiers.lock().unwrap_or_else(|e| e.into_inner()) = Some(tiers);
        // A full inbox means the owner is busy and will look at the mailbox on its next step.
        let _ = self.inbox.try_send(Msg::Wake);
    }
}
