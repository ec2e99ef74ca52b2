//! Property test of the scheduler driven like the engine loop under random add / return /
//! cancel / step sequences: step outputs respect the token budget and batch size, every chunk
//! reads correct KV for its context, the scheduler's and the cache's invariants hold after
//! every step, and everything admitted finishes in bounded steps.

mod kv_common;

use std::collections::HashMap;

use kv_common::*;
use proptest::prelude::*;
use tidegate_kv::kv_cache::{KvCacheManager, MemBlockIo, SeqId};
use tidegate_kv::scheduler::{NewRequest, Scheduler, SchedulerConfig};

#[derive(Clone, Debug)]
enum SchedOp {
    Add {
        tier: u8,
        system: u8,
        suffix: Vec<u8>,
        max_new: u8,
        session: Option<u8>,
    },
    /// A chat session's next turn: (a prefix of) its last history plus new tokens.
    Return {
        session: u8,
        keep: u8,
        extra: Vec<u8>,
        max_new: u8,
    },
    Cancel {
        nth: u8,
    },
    Step {
        ms: u8,
    },
}

fn sched_op() -> impl Strategy<Value = SchedOp> {
    let add = (
        0..3u8,
        0..2u8,
        prop::collection::vec(0..8u8, 0..20),
        1..12u8,
        prop::option::of(0..3u8),
    )
        .prop_map(|(tier, system, suffix, max_new, session)| SchedOp::Add {
            tier,
            system,
            suffix,
            max_new,
            session,
        });
    let ret = (
        0..3u8,
        0..60u8,
        prop::collection::vec(0..8u8, 0..8),
        1..12u8,
    )
        .prop_map(|(session, keep, extra, max_new)| SchedOp::Return {
            session,
            keep,
            extra,
            max_new,
        });
    prop_oneof![
        2 => add,
        2 => ret,
        1 => (0..8u8).prop_map(|nth| SchedOp::Cancel { nth }),
        5 => (0..30u8).prop_map(|ms| SchedOp::Step { ms }),
    ]
}

/// The scheduler plus the test's model of every live request's tokens.
struct SchedWorld {
    s: Scheduler,
    io: MemBlockIo,
    tokens: HashMap<SeqId, Vec<u32>>,
    sessions: HashMap<SeqId, String>,
    histories: HashMap<String, Vec<u32>>,
    next_id: SeqId,
    now: u64,
}

impl SchedWorld {
    fn add(&mut self, tier: usize, prompt: Vec<u32>, max_new: usize, session: Option<String>) {
        let id = self.next_id;
        self.next_id += 1;
        let req = NewRequest {
            id,
            tier,
            session: session.clone(),
            prompt: prompt.clone(),
            max_new_tokens: max_new,
            stop_tokens: vec![],
        };
        if self.s.add_request(req, self.now).is_ok() {
            self.tokens.insert(id, prompt);
            if let Some(name) = session {
                self.sessions.insert(id, name);
            }
        }
    }

    /// One engine-loop step with a runner that checks the context KV it would read and
    /// writes the chunk's KV.
    fn step(&mut self) -> Result<(), TestCaseError> {
        let out = self.s.schedule_with(self.now, &mut self.io);
        let cfg = *self.s.config();
        prop_assert!(out.num_tokens <= cfg.max_num_tokens);
        prop_assert!(out.scheduled.len() <= cfg.max_num_seqs);
        let mut sampled = Vec::new();
        for c in &out.scheduled {
            let tokens = self
                .tokens
                .get(&c.seq_id)
                .ok_or_else(|| TestCaseError::fail("unknown seq"))?;
            let end = c.start_pos + c.tokens.len();
            prop_assert_eq!(&tokens[c.start_pos..end], c.tokens.as_slice());
            check_kv(&self.io, &c.block_table, tokens, c.start_pos).map_err(TestCaseError::fail)?;
            prop_assert!(c.block_table.len() * B >= end);
            write_kv(&mut self.io, &c.block_table, tokens, c.start_pos, end);
            if c.want_logits {
                prop_assert_eq!(end, tokens.len());
                sampled.push((c.seq_id, (end as u32 * 5 + c.seq_id as u32) % 8));
            }
        }
        let finished = self.s.update(&out, &sampled, self.now);
        for &(id, t) in &sampled {
            if let Some(tokens) = self.tokens.get_mut(&id) {
                tokens.push(t);
            }
        }
        for f in finished {
            if let (Some(t), Some(name)) =
                (self.tokens.remove(&f.seq_id), self.sessions.get(&f.seq_id))
            {
                self.histories.insert(name.clone(), t);
            }
        }
        self.s.check().map_err(TestCaseError::fail)?;
        prop_assert!(self.s.kv().blocks_used() <= BLOCKS as usize);
        prop_assert!(self.s.kv().host_bytes_used() <= HOST);
        prop_assert!(self.s.kv().disk_bytes_used() <= DISK);
        Ok(())
    }

    fn apply(&mut self, op: SchedOp) -> Result<(), TestCaseError> {
        match op {
            SchedOp::Add {
                tier,
                system,
                suffix,
                max_new,
                session,
            } => {
                self.add(
                    usize::from(tier),
                    prompt(system, &suffix),
                    usize::from(max_new),
                    session.map(|x| format!("c{x}")),
                );
            }
            SchedOp::Return {
                session,
                keep,
                extra,
                max_new,
            } => {
                let name = format!("c{session}");
                let Some(h) = self.histories.get(&name) else {
                    return Ok(());
                };
                let mut p = h[..usize::from(keep).min(h.len())].to_vec();
                p.extend(extra.iter().map(|&t| u32::from(t)));
                self.add(
                    usize::from(session % 3),
                    p,
                    usize::from(max_new),
                    Some(name),
                );
            }
            SchedOp::Cancel { nth } => {
                let mut ids: Vec<_> = self.tokens.keys().copied().collect();
                ids.sort_unstable();
                if let Some(&id) = ids.get(usize::from(nth)) {
                    prop_assert!(self.s.cancel(id));
                    self.tokens.remove(&id);
                }
            }
            SchedOp::Step { ms } => {
                self.now += u64::from(ms);
                self.step()?;
            }
        }
        Ok(())
    }
}

fn run_sched_ops(ops: Vec<SchedOp>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let cfg = SchedulerConfig {
        max_num_tokens: 16,
        max_num_seqs: 4,
        max_waiting: 16,
        max_model_len: 64,
        max_prefill_chunk: 12,
        aging_ms_per_level: 5,
    };
    let mut w = SchedWorld {
        s: Scheduler::new(cfg, KvCacheManager::new(kv_config(dir.path()), tiers())),
        io: MemBlockIo::new(BLOCKS as usize, BYTES),
        tokens: HashMap::new(),
        sessions: HashMap::new(),
        histories: HashMap::new(),
        next_id: 0,
        now: 0,
    };
    for op in ops {
        w.apply(op)?;
    }
    // Liveness: everything admitted finishes in bounded steps.
    let mut steps = 0;
    while w.s.num_running() + w.s.num_waiting() > 0 {
        w.now += 1;
        w.step()?;
        steps += 1;
        prop_assert!(steps < 2_000, "requests never finished");
    }
    report("sched", w.s.kv());
    prop_assert!(w.tokens.is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn scheduler_keeps_invariants_and_finishes_everything_under_random_ops(ops in prop::collection::vec(sched_op(), 1..120)) {
        run_sched_ops(ops)?;
    }
}
