//! The owner thread: the only holder of scheduler, KV cache manager, runner and samplers.
//!
//! Each turn: take new requests and policy from the inbox (sleeping on it when there is
//! nothing to do), finish requests the server stopped (stop string) and drop cancelled ones,
//! schedule a step (the scheduler refuses requests queued past their tier's target, on its
//! clock and tier table, and the owner answers them), run one batched forward pass over
//! every scheduled chunk, sample each sequence with its own sampler, stream the tokens, end
//! finished requests with exactly one `Finished`, and publish metrics.
//!
//! Invariants: every id in `live` is live in the scheduler and vice versa, between turns;
//! a request's tier parameters come only from the scheduler's tier table (requests name
//! their tier), and a policy push is applied before any request submitted after it.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::{FinishReason, SubmitError, TokenEvent, Usage};
use crate::metrics::Metrics;
use tidegate_kv::kv_cache::{KvCacheManager, KvConfig, SeqId, StoreConfig, Tiers};
use tidegate_kv::scheduler::{
    AddError, Expired, NewRequest, Scheduler, SchedulerConfig, SchedulerOutput,
};
use tidegate_runner::error::Result;
use tidegate_runner::model::Tokenizer;
use tidegate_runner::{ModelRunner, RunnerConfig, SeqChunk};

use super::live::Live;
use super::publish::publish;
use super::{Job, LoopConfig, LoopModel, Msg};

/// How long an idle owner sleeps on its inbox before applying TTLs again.
const IDLE_TICK: Duration = Duration::from_millis(500);
/// How long it waits when requests are queued but nothing can run (blocks short).
const BLOCKED_TICK: Duration = Duration::from_millis(5);

/// The engine loop's state (lives on its own thread).
pub(crate) struct Owner {
    sched: Scheduler,
    runner: Box<dyn ModelRunner>,
    tokenizer: Tokenizer,
    eos: Vec<u32>,
    live: HashMap<SeqId, Live>,
    next_id: SeqId,
    epoch: Instant,
    metrics: Arc<Metrics>,
    tiers: Arc<Mutex<Option<Tiers>>>,
    retry_after: Duration,
    disconnected: bool,
}

impl Owner {
    /// Builds the model's runner (packing weights, allocating the KV pool) and the scheduler.
    pub(crate) fn new(
        model: LoopModel,
        cfg: &LoopConfig,
        metrics: Arc<Metrics>,
        tiers: Arc<Mutex<Option<Tiers>>>,
    ) -> Result<Self> {
        let block_size = cfg.kv_block_tokens.max(1);
        let num_blocks = cfg.kv_blocks.max(1);
        let LoopModel {
            tokenizer,
            max_position_embeddings,
            weights,
            build,
        } = model;
        let runner = build(RunnerConfig {
            block_size,
            num_blocks,
            kv_dtype: cfg.kv_dtype,
        })?;
        tracing::info!(
            runner = runner.kind(),
            weights = %weights.label,
            bytes_per_token = weights.bytes_per_token,
            kv_dtype = %cfg.kv_dtype,
            "runner ready"
        );
        let block_bytes = runner.block_bytes();
        let mut kv_cfg = KvConfig::new(
            u32::try_from(num_blocks).unwrap_or(u32::MAX),
            block_size,
            block_bytes,
        );
        kv_cfg.store = StoreConfig {
            host_budget_bytes: cfg.kv_host_bytes,
            disk_budget_bytes: if cfg.kv_disk_dir.is_some() {
                cfg.kv_disk_bytes
            } else {
                0
            },
            disk_dir: cfg.kv_disk_dir.clone(),
        };
        let initial = tiers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default();
        let kv = KvCacheManager::new(kv_cfg, initial);
        let sched_cfg = SchedulerConfig {
            max_num_tokens: cfg.max_batch_tokens.max(1),
            max_num_seqs: cfg.max_batch_seqs.max(1),
            max_waiting: cfg.max_waiting.max(1),
            max_model_len: cfg.max_model_len(max_position_embeddings),
            max_prefill_chunk: cfg.max_batch_tokens.max(1),
            ..SchedulerConfig::default()
        };
        let sched = Scheduler::new(sched_cfg, kv);
        metrics.kv_blocks_total.set(num_blocks as i64);
        Ok(Owner {
            sched,
            runner,
            eos: tokenizer.eos_ids().to_vec(),
            tokenizer,
            live: HashMap::new(),
            next_id: 1,
            epoch: Instant::now(),
            metrics,
            tiers,
            retry_after: cfg.retry_after,
            disconnected: false,
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Runs until every handle is gone and no request is live.
    pub(crate) fn run(&mut self, inbox: &Receiver<Msg>) {
        loop {
            if !self.take_inbox(inbox) {
                return;
            }
            self.turn();
        }
    }

    /// Drains the inbox; blocks on it when nothing is live. False: shut down.
    fn take_inbox(&mut self, inbox: &Receiver<Msg>) -> bool {
        if self.live.is_empty() {
            if self.disconnected {
                return false;
            }
            match inbox.recv_timeout(IDLE_TICK) {
                Ok(msg) => self.handle(msg),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => self.disconnected = true,
            }
        }
        loop {
            match inbox.try_recv() {
                Ok(msg) => self.handle(msg),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.disconnected = true;
                    break;
                }
            }
        }
        self.apply_tiers();
        true
    }

    fn apply_tiers(&mut self) {
        let pending = self.tiers.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(tiers) = pending {
            self.sched.set_tiers(tiers);
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Wake => {}
            Msg::Submit(job) => {
                // A push that returned before this request was submitted governs it.
                self.apply_tiers();
                self.add(*job);
            }
        }
    }

    /// `at` on the scheduler's clock (milliseconds since `epoch`).
    fn ms_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    fn add(&mut self, job: Job) {
        let Job { req, tx, reply } = job;
        let id = self.next_id;
        self.next_id += 1;
        let live = Live::new(&req, tx, reply, id ^ 0x9e37_79b9_7f4a_7c15);
        let tiers = self.sched.tiers();
        let tier = tiers.id_of(&req.tier).unwrap_or(tiers.default_id());
        // Queue wait counts from when the server received the request.
        let arrived = self.ms_at(req.arrived);
        let new = NewRequest {
            id,
            tier,
            session: req.session_id.clone(),
            prompt: req.prompt,
            max_new_tokens: req.max_tokens.max(1) as usize,
            stop_tokens: if req.ignore_eos {
                Vec::new()
            } else {
                self.eos.clone()
            },
        };
        match self.sched.add_request(new, arrived) {
            Ok(()) => {
                self.live.insert(id, live);
            }
            Err(AddError::QueueFull(_)) => live.refuse(SubmitError::QueueFull {
                retry_after: self.retry_after,
            }),
            Err(AddError::TooLong { prompt, limit }) => {
                let bs = self.sched.kv().block_size().max(1);
                live.refuse(SubmitError::KvExhausted {
                    needed: prompt.div_ceil(bs) as u64,
                    total: (limit / bs) as u64,
                })
            }
            Err(e) => live.refuse(SubmitError::Internal(format!("{e:?}"))),
        }
    }

    /// Ends requests the server is done with: finished ones (a stop string matched) keep
    /// their session's KV, cancelled ones (client gone) free it.
    fn sweep(&mut self) {
        let now = self.now_ms();
        let mut finished = Vec::new();
        let mut cancelled = Vec::new();
        for (&id, l) in &self.live {
            if l.tx.finish_requested() {
                finished.push(id);
            } else if l.is_cancelled() {
                cancelled.push(id);
            }
        }
        for id in finished {
            self.sched.finish(id, now);
            self.live.remove(&id);
        }
        for id in cancelled {
            self.sched.cancel(id);
            self.live.remove(&id);
        }
    }

    /// Refuses the requests the scheduler dropped for waiting past their tier's target.
    fn refuse_expired(&mut self, expired: &[Expired]) {
        for e in expired {
            if let Some(l) = self.live.remove(&e.seq_id) {
                l.refuse(SubmitError::QueueTimeout {
                    target: Duration::from_millis(e.target_ms),
                    retry_after: self.retry_after,
                });
            }
        }
    }

    /// Executes the KV block moves `out` decided, batched, on the runner's paged store, and
    /// applies the answers (a failed restore or copy moves its sequence's chunk back to
    /// recompute): after this, the store is ready for `out`'s forward pass.
    fn move_blocks(&mut self, out: &mut SchedulerOutput, now: u64) {
        let plan = std::mem::take(&mut out.transfers);
        if plan.is_empty() {
            return;
        }
        let (moves, blocks) = (plan.moves().len(), plan.blocks());
        let started = Instant::now();
        let answers = plan.execute(self.runner.as_mut());
        tracing::debug!(moves, blocks, took = ?started.elapsed(), "KV blocks moved");
        self.sched.apply_transfers(answers, out, now);
    }

    /// One scheduling step and its forward pass.
    fn turn(&mut self) {
        self.sweep();
        let now = self.now_ms();
        let mut out = self.sched.schedule(now);
        self.move_blocks(&mut out, now);
        self.refuse_expired(&out.expired);
        if out.is_empty() {
            let mut idle = SchedulerOutput {
                transfers: self.sched.tick(now),
                ..SchedulerOutput::default()
            };
            self.move_blocks(&mut idle, now);
            publish(&self.metrics, &self.sched);
            if !self.live.is_empty() {
                std::thread::sleep(BLOCKED_TICK);
            }
            return;
        }
        for s in &out.scheduled {
            if let (Some(l), Some(wait)) = (self.live.get_mut(&s.seq_id), s.queue_wait_ms) {
                let cached = u32::try_from(s.start_pos).unwrap_or(u32::MAX);
                l.admit(Duration::from_millis(wait), cached);
            }
        }
        let chunks: Vec<SeqChunk<'_>> = out
            .scheduled
            .iter()
            .map(|s| SeqChunk {
                tokens: &s.tokens,
                start_pos: s.start_pos,
                block_table: &s.block_table,
                want_logits: s.want_logits,
            })
            .collect();
        let logits = match self.runner.step(&chunks) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "forward pass failed; failing its requests");
                for s in &out.scheduled {
                    self.sched.cancel(s.seq_id);
                    if let Some(l) = self.live.remove(&s.seq_id) {
                        l.refuse(SubmitError::Internal(e.to_string()));
                    }
                }
                return;
            }
        };
        let mut sampled = Vec::new();
        for (s, lg) in out.scheduled.iter().zip(logits) {
            if let (Some(lg), Some(l)) = (lg, self.live.get_mut(&s.seq_id)) {
                sampled.push((s.seq_id, l.sampler.sample(&lg)));
            }
        }
        let finished = self.sched.update(&out, &sampled, self.now_ms());
        // Publish before any client sees this step's tokens: a client that reads /metrics
        // after a token arrived sees the step that produced it (running, blocks in use).
        publish(&self.metrics, &self.sched);
        for &(id, tok) in &sampled {
            if let Some(l) = self.live.get_mut(&id) {
                l.emit(&self.tokenizer, tok);
            }
        }
        for f in finished {
            if let Some(l) = self.live.remove(&f.seq_id) {
                let reason = match f.reason {
                    tidegate_kv::scheduler::FinishReason::Stop => FinishReason::Stop,
                    tidegate_kv::scheduler::FinishReason::Length => FinishReason::Length,
                };
                let usage = Usage {
                    prompt_tokens: u32::try_from(f.prompt_tokens).unwrap_or(u32::MAX),
                    completion_tokens: u32::try_from(f.output_tokens).unwrap_or(u32::MAX),
                    cached_prompt_tokens: l.cached_prompt_tokens,
                };
                l.tx.send(TokenEvent::Finished { reason, usage });
            }
        }
    }
}
