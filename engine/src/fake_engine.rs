//! A fake [`Engine`]: deterministic, model-free, for tests, the local demo and the
//! operator's end-to-end suite (`serve --fake-model`).
//!
//! It behaves like the real engine loop at the boundary: one task owns the waiting queue,
//! the running set and a KV block pool; requests come in through a bounded channel; every
//! `token_delay` one batched step gives each running request one token (so capacity is
//! `max_running / token_delay` tokens/s). Admission keeps the design's order: queue over
//! bound → `QueueFull`; KV short → evict idle sessions (LRU); still short → wait, at most the
//! tier's queue-wait target → `QueueTimeout`; else admit (highest tier priority first).
//! A dropped stream frees its blocks at the next step; one the server finished (stop string)
//! keeps them with its session, as a normal finish does.
//!
//! Tokens are Unicode scalar values (id = code point) so tokenize/detokenize are exact and
//! stateless; EOS is id 0x110000. The "model" echoes the last user message (or the whole
//! prompt), then EOS; with `ignore_eos` it keeps cycling until `max_tokens`. Sampling
//! parameters are accepted and ignored: output is fully deterministic.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use futures::future::BoxFuture;
use tidegate_api::{PressureAction, Tier, TierPolicySpec};
use tokio::sync::{mpsc, oneshot};

use crate::backend::{
    Admitted, ChatMessage, Engine, FinishReason, GenerateRequest, ModelInfo, SubmitError,
    TokenEvent, TokenId, TokenSender, TokenizeError, Usage, token_channel,
};
use crate::metrics::{EvictionLabels, Metrics, RestoreLabel};

/// The fake model's end-of-sequence token.
pub const EOS: TokenId = 0x11_0000;

/// Shape of the fake engine.
#[derive(Clone, Debug)]
pub struct FakeConfig {
    pub model_id: String,
    pub context_length: u32,
    /// Time one batched decode step takes.
    pub token_delay: Duration,
    /// Requests decoded together (batch size).
    pub max_running: usize,
    /// Queue bound: requests waiting for admission beyond this are refused.
    pub max_waiting: usize,
    /// KV blocks in the pool and tokens per block.
    pub kv_blocks_total: u64,
    pub block_size: u32,
    /// Not ready until this long after start (simulates loading weights).
    pub load_delay: Duration,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            model_id: "fake".to_string(),
            context_length: 4096,
            token_delay: Duration::from_millis(5),
            max_running: 16,
            max_waiting: 64,
            kv_blocks_total: 4096,
            block_size: 16,
            load_delay: Duration::ZERO,
        }
    }
}

/// What the fake engine uses of a tier, looked up by the request's tier name in the table
/// that `set_tier_policy` gave it.
#[derive(Clone, Debug, PartialEq)]
struct TierParams {
    name: String,
    priority: i32,
    queue_wait_target: Duration,
    idle_ttl: Duration,
    on_pressure: PressureAction,
}

impl Default for TierParams {
    fn default() -> Self {
        TierParams::from(&TierPolicySpec::single_default().tiers.remove(0))
    }
}

impl From<&Tier> for TierParams {
    fn from(tier: &Tier) -> Self {
        TierParams {
            name: tier.name.clone(),
            priority: tier.priority,
            queue_wait_target: tier.queue_wait_target.as_std(),
            idle_ttl: tier.kv_retention.idle_ttl.as_std(),
            on_pressure: tier.kv_retention.on_pressure,
        }
    }
}

/// The pushed tiers by name, and the default tier for unknown names.
#[derive(Debug, Default)]
struct TierTable {
    by_name: HashMap<String, TierParams>,
    default: TierParams,
}

impl TierTable {
    fn get(&self, name: &str) -> TierParams {
        self.by_name.get(name).unwrap_or(&self.default).clone()
    }
}

struct Job {
    req: GenerateRequest,
    tier: TierParams,
    reply: oneshot::Sender<Result<Admitted, SubmitError>>,
}

/// Handle to the fake engine's task.
pub struct FakeEngine {
    info: ModelInfo,
    started: Instant,
    load_delay: Duration,
    jobs: mpsc::Sender<Job>,
    retry_after: Duration,
    tiers: RwLock<TierTable>,
}

impl FakeEngine {
    /// Spawns the engine task on the current tokio runtime.
    pub fn start(config: FakeConfig, metrics: Arc<Metrics>) -> Arc<Self> {
        let (jobs, rx) = mpsc::channel(config.max_waiting.max(1));
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let engine = Arc::new(FakeEngine {
            info: ModelInfo {
                id: config.model_id.clone(),
                context_length: config.context_length,
                created,
                weights: "none".into(),
                weight_bytes_per_token: 0,
            },
            started: Instant::now(),
            load_delay: config.load_delay,
            jobs,
            retry_after: Duration::from_secs(1),
            tiers: RwLock::new(TierTable::default()),
        });
        metrics.kv_blocks_total.set(config.kv_blocks_total as i64);
        tokio::spawn(Loop::new(config, metrics).run(rx));
        engine
    }
}

impl Engine for FakeEngine {
    fn model_info(&self) -> ModelInfo {
        self.info.clone()
    }

    fn is_ready(&self) -> bool {
        self.started.elapsed() >= self.load_delay
    }

    fn tokenize(&self, text: &str) -> Result<Vec<TokenId>, TokenizeError> {
        Ok(text.chars().map(|c| c as TokenId).collect())
    }

    fn detokenize(&self, tokens: &[TokenId]) -> Result<String, TokenizeError> {
        tokens
            .iter()
            .filter(|&&t| t != EOS)
            .map(|&t| char::from_u32(t).ok_or(TokenizeError::UnknownToken(t)))
            .collect()
    }

    fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, TokenizeError> {
        let mut out = String::new();
        for m in messages {
            out.push_str(&format!("<|{}|>\n{}<|end|>\n", m.role, m.content));
        }
        out.push_str("<|assistant|>\n");
        Ok(out)
    }

    fn submit(&self, req: GenerateRequest) -> BoxFuture<'static, Result<Admitted, SubmitError>> {
        let (reply, answer) = oneshot::channel();
        let tier = self
            .tiers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&req.tier);
        let sent = self.jobs.try_send(Job { req, tier, reply });
        let retry_after = self.retry_after;
        async move {
            match sent {
                Ok(()) => answer.await.unwrap_or(Err(SubmitError::ShuttingDown)),
                Err(mpsc::error::TrySendError::Full(_)) => {
                    Err(SubmitError::QueueFull { retry_after })
                }
                Err(mpsc::error::TrySendError::Closed(_)) => Err(SubmitError::ShuttingDown),
            }
        }
        .boxed()
    }

    fn set_tier_policy(&self, policy: &TierPolicySpec) {
        let by_name: HashMap<String, TierParams> = policy
            .tiers
            .iter()
            .map(|t| (t.name.clone(), TierParams::from(t)))
            .collect();
        let default = policy
            .tier(&policy.default_tier)
            .map(TierParams::from)
            .unwrap_or_default();
        *self.tiers.write().unwrap_or_else(|e| e.into_inner()) = TierTable { by_name, default };
    }
}

/// What the fake model says for a prompt: the last user message, or the whole prompt.
fn echo_source(prompt: &[TokenId]) -> Vec<TokenId> {
    let text: String = prompt.iter().filter_map(|&t| char::from_u32(t)).collect();
    let body = match text.rfind("<|user|>\n") {
        Some(at) => {
            let rest = &text[at + "<|user|>\n".len()..];
            rest.split("<|end|>").next().unwrap_or(rest)
        }
        None => text.as_str(),
    };
    let body = body.trim();
    let body = if body.is_empty() { "ok" } else { body };
    body.chars().map(|c| c as TokenId).collect()
}

struct Running {
    tx: TokenSender,
    tier: String,
    session: Option<String>,
    on_pressure: PressureAction,
    idle_ttl: Duration,
    echo: Vec<TokenId>,
    generated: u32,
    max_tokens: u32,
    ignore_eos: bool,
    blocks: u64,
    prompt_len: u32,
    cached: u32,
}

struct Idle {
    blocks: u64,
    tokens: u32,
    tier: String,
    on_pressure: PressureAction,
    idle_ttl: Duration,
    last_used: Instant,
}

struct Loop {
    config: FakeConfig,
    metrics: Arc<Metrics>,
    waiting: VecDeque<Job>,
    running: Vec<Running>,
    /// Idle sessions holding blocks, by session id.
    idle: HashMap<String, Idle>,
    /// Where evicted sessions' KV went (bounded), to label restores.
    evicted: HashMap<String, PressureAction>,
    free_blocks: u64,
}

impl Loop {
    fn new(config: FakeConfig, metrics: Arc<Metrics>) -> Self {
        Loop {
            free_blocks: config.kv_blocks_total,
            config,
            metrics,
            waiting: VecDeque::new(),
            running: Vec::new(),
            idle: HashMap::new(),
            evicted: HashMap::new(),
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        let mut tick =
            tokio::time::interval(self.config.token_delay.max(Duration::from_micros(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.waiting.is_empty() && self.running.is_empty() {
                match rx.recv().await {
                    Some(job) => self.enqueue(job),
                    None => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(job) => self.enqueue(job),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        if self.running.is_empty() && self.waiting.is_empty() {
                            return;
                        }
                        break;
                    }
                }
            }
            self.expire_idle();
            self.expire_waiting();
            self.admit();
            self.publish_gauges();
            tick.tick().await;
            self.step();
            self.publish_gauges();
        }
    }

    fn blocks_for(&self, tokens: u32) -> u64 {
        u64::from(tokens.div_ceil(self.config.block_size.max(1)))
    }

    fn enqueue(&mut self, job: Job) {
        if self.waiting.len() >= self.config.max_waiting {
            let _ = job.reply.send(Err(SubmitError::QueueFull {
                retry_after: Duration::from_secs(1),
            }));
            return;
        }
        let needed = self.blocks_for(job.req.prompt.len() as u32 + job.req.max_tokens);
        if needed > self.config.kv_blocks_total {
            let _ = job.reply.send(Err(SubmitError::KvExhausted {
                needed,
                total: self.config.kv_blocks_total,
            }));
            return;
        }
        // Highest priority first, FIFO within a priority.
        let priority = job.tier.priority;
        let at = self
            .waiting
            .iter()
            .position(|w| w.tier.priority < priority)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(at, job);
    }

    fn expire_waiting(&mut self) {
        let now = Instant::now();
        self.waiting.retain_mut(|job| {
            if job.reply.is_closed() {
                return false;
            }
            let target = job.tier.queue_wait_target;
            if now.duration_since(job.req.arrived) > target {
                let (tx, _) = oneshot::channel();
                let reply = std::mem::replace(&mut job.reply, tx);
                let _ = reply.send(Err(SubmitError::QueueTimeout {
                    target,
                    retry_after: target.max(Duration::from_secs(1)),
                }));
                return false;
            }
            true
        });
    }

    fn expire_idle(&mut self) {
        let now = Instant::now();
        let expired: Vec<String> = self
            .idle
            .iter()
            .filter(|(_, s)| {
                s.on_pressure != PressureAction::Retain
                    && now.duration_since(s.last_used) > s.idle_ttl
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.evict(&key);
        }
    }

    fn evict(&mut self, key: &str) {
        if let Some(s) = self.idle.remove(key) {
            self.free_blocks += s.blocks;
            let action = match s.on_pressure {
                PressureAction::Offload => "offload",
                PressureAction::Drop | PressureAction::Retain => "drop",
            };
            self.metrics
                .evictions
                .get_or_create(&EvictionLabels {
                    tier: s.tier,
                    action,
                })
                .inc();
            if self.evicted.len() >= 65_536 {
                self.evicted.clear();
            }
            let kept = if action == "offload" {
                PressureAction::Offload
            } else {
                PressureAction::Drop
            };
            self.evicted.insert(key.to_string(), kept);
        }
    }

    /// Evicts idle sessions, least recently used first and `Retain` tiers last, until
    /// `needed` blocks are free. False when even that is not enough.
    fn make_room(&mut self, needed: u64) -> bool {
        while self.free_blocks < needed {
            let victim = self
                .idle
                .iter()
                .min_by_key(|(_, s)| (s.on_pressure == PressureAction::Retain, s.last_used))
                .map(|(k, _)| k.clone());
            match victim {
                Some(key) => self.evict(&key),
                None => return false,
            }
        }
        true
    }

    fn admit(&mut self) {
        while self.running.len() < self.config.max_running {
            let Some(job) = self.waiting.pop_front() else {
                return;
            };
            let req = &job.req;
            let tier = &job.tier;
            let prompt_len = req.prompt.len() as u32;
            // A returning session takes its retained blocks back.
            let mut cached = 0;
            let mut reclaimed = 0;
            if let Some(session) = &req.session_id {
                if let Some(s) = self.idle.remove(session) {
                    cached = s.tokens.min(prompt_len);
                    reclaimed = s.blocks;
                    self.free_blocks += s.blocks;
                } else if let Some(action) = self.evicted.remove(session) {
                    let source = if action == PressureAction::Offload {
                        "host"
                    } else {
                        "recompute"
                    };
                    self.metrics
                        .restores
                        .get_or_create(&RestoreLabel { source })
                        .inc();
                }
            }
            let needed = self.blocks_for(prompt_len + req.max_tokens);
            if !self.make_room(needed) {
                // Still short: the request keeps its place and waits.
                if reclaimed > 0
                    && let Some(session) = &req.session_id
                {
                    self.free_blocks -= reclaimed;
                    self.idle.insert(
                        session.clone(),
                        Idle {
                            blocks: reclaimed,
                            tokens: cached,
                            tier: tier.name.clone(),
                            on_pressure: tier.on_pressure,
                            idle_ttl: tier.idle_ttl,
                            last_used: Instant::now(),
                        },
                    );
                }
                self.waiting.push_front(job);
                return;
            }
            self.free_blocks -= needed;
            let (tx, tokens) = token_channel();
            let queue_wait = req.arrived.elapsed();
            let running = Running {
                tx,
                tier: tier.name.clone(),
                session: req.session_id.clone(),
                on_pressure: tier.on_pressure,
                idle_ttl: tier.idle_ttl,
                echo: echo_source(&req.prompt),
                generated: 0,
                max_tokens: req.max_tokens,
                ignore_eos: req.ignore_eos,
                blocks: needed,
                prompt_len,
                cached,
            };
            if job.reply.send(Ok(Admitted { queue_wait, tokens })).is_err() {
                self.free_blocks += needed;
                continue;
            }
            self.metrics
                .prefill_tokens
                .inc_by(u64::from(prompt_len - cached));
            self.running.push(running);
        }
    }

    fn step(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            if r.tx.is_closed() {
                let r = self.running.swap_remove(i);
                // Stopped by the server (stop string): a finish; otherwise a cancel.
                if r.tx.finish_requested() {
                    self.finish(r);
                } else {
                    self.free_blocks += r.blocks;
                }
                continue;
            }
            let pos = r.generated as usize;
            let echo_len = r.echo.len();
            let done_echo = pos >= echo_len;
            let finish = if done_echo && !r.ignore_eos {
                Some(FinishReason::Stop)
            } else {
                let id = r.echo[pos % echo_len.max(1)];
                let text = char::from_u32(id).map(String::from).unwrap_or_default();
                r.generated += 1;
                self.metrics.decode_tokens.inc();
                r.tx.send(TokenEvent::Token { id, text });
                (r.generated >= r.max_tokens).then_some(FinishReason::Length)
            };
            if let Some(reason) = finish {
                let r = self.running.swap_remove(i);
                r.tx.send(TokenEvent::Finished {
                    reason,
                    usage: Usage {
                        prompt_tokens: r.prompt_len,
                        completion_tokens: r.generated,
                        cached_prompt_tokens: r.cached,
                    },
                });
                self.finish(r);
                continue;
            }
            i += 1;
        }
    }

    /// A finished request with a session keeps its KV as an idle session.
    fn finish(&mut self, r: Running) {
        match r.session {
            Some(session) => {
                if let Some(old) = self.idle.remove(&session) {
                    self.free_blocks += old.blocks;
                }
                self.idle.insert(
                    session,
                    Idle {
                        blocks: r.blocks,
                        tokens: r.prompt_len + r.generated,
                        tier: r.tier,
                        on_pressure: r.on_pressure,
                        idle_ttl: r.idle_ttl,
                        last_used: Instant::now(),
                    },
                );
            }
            None => self.free_blocks += r.blocks,
        }
    }

    fn publish_gauges(&self) {
        self.metrics.requests_running.set(self.running.len() as i64);
        self.metrics.requests_waiting.set(self.waiting.len() as i64);
        self.metrics
            .kv_blocks_used
            .set((self.config.kv_blocks_total - self.free_blocks) as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(engine: &FakeEngine, text: &str, max_tokens: u32) -> GenerateRequest {
        GenerateRequest {
            id: "t".into(),
            prompt: engine.tokenize(text).unwrap(),
            max_tokens,
            sampling: Default::default(),
            ignore_eos: false,
            tier: "default".into(),
            session_id: None,
            arrived: Instant::now(),
        }
    }

    async fn collect(mut admitted: Admitted) -> (String, FinishReason, Usage) {
        let mut text = String::new();
        loop {
            match admitted.tokens.next().await.unwrap() {
                TokenEvent::Token { text: t, .. } => text.push_str(&t),
                TokenEvent::Finished { reason, usage } => return (text, reason, usage),
                TokenEvent::Failed { message } => panic!("{message}"),
            }
        }
    }

    #[tokio::test]
    async fn echoes_then_stops() {
        let engine = FakeEngine::start(FakeConfig::default(), Metrics::new());
        let chat = engine
            .apply_chat_template(&[ChatMessage {
                role: "user".into(),
                content: "hi there".into(),
            }])
            .unwrap();
        let a = engine.submit(request(&engine, &chat, 100)).await.unwrap();
        let (text, reason, usage) = collect(a).await;
        assert_eq!(text, "hi there");
        assert_eq!(reason, FinishReason::Stop);
        assert_eq!(usage.completion_tokens, 8);

        let mut req = request(&engine, "abc", 7);
        req.ignore_eos = true;
        let (text, reason, _) = collect(engine.submit(req).await.unwrap()).await;
        assert_eq!(text, "abcabca");
        assert_eq!(reason, FinishReason::Length);
    }

    #[tokio::test]
    async fn queue_bound_and_wait_target() {
        let config = FakeConfig {
            max_running: 1,
            max_waiting: 1,
            token_delay: Duration::from_millis(20),
            ..FakeConfig::default()
        };
        let engine = FakeEngine::start(config, Metrics::new());
        let mut long = request(&engine, "x", 1000);
        long.ignore_eos = true;
        let _running = engine.submit(long).await.unwrap();
        let policy: TierPolicySpec = serde_json::from_value(serde_json::json!({
            "tiers": [{"name": "default"}, {"name": "quick", "queueWaitTarget": "100ms"}],
            "defaultTier": "default"
        }))
        .unwrap();
        engine.set_tier_policy(&policy);
        let mut waiter = request(&engine, "y", 5);
        waiter.tier = "quick".into();
        let waiting = tokio::spawn(engine.submit(waiter));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let full = engine.submit(request(&engine, "z", 5)).await;
        assert!(
            matches!(full, Err(SubmitError::QueueFull { .. })),
            "{full:?}"
        );
        let timed_out = waiting.await.unwrap();
        assert!(
            matches!(timed_out, Err(SubmitError::QueueTimeout { .. })),
            "{timed_out:?}"
        );
    }

    #[tokio::test]
    async fn sessions_reuse_then_restore_after_eviction() {
        let metrics = Metrics::new();
        let config = FakeConfig {
            kv_blocks_total: 4,
            block_size: 16,
            ..FakeConfig::default()
        };
        let engine = FakeEngine::start(config, Arc::clone(&metrics));
        let mut first = request(&engine, "twenty characters!!!", 10);
        first.session_id = Some("s1".into());
        let (_, _, usage) = collect(engine.submit(first.clone()).await.unwrap()).await;
        assert_eq!(usage.cached_prompt_tokens, 0);
        first.arrived = Instant::now();
        let (_, _, usage) = collect(engine.submit(first.clone()).await.unwrap()).await;
        assert_eq!(
            usage.cached_prompt_tokens, 20,
            "the idle session's KV was reused"
        );
        // Another session needs the whole pool: s1 is evicted (offload by default), and s1
        // coming back evicts s2 in turn.
        let mut other = request(&engine, "x", 60);
        other.session_id = Some("s2".into());
        other.ignore_eos = true;
        collect(engine.submit(other).await.unwrap()).await;
        first.arrived = Instant::now();
        let (_, _, usage) = collect(engine.submit(first).await.unwrap()).await;
        assert_eq!(usage.cached_prompt_tokens, 0);
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("tidegate_engine_evictions_total{tier=\"default\",action=\"offload\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("tidegate_engine_restores_total{source=\"host\"} 1"),
            "{text}"
        );
    }
}
