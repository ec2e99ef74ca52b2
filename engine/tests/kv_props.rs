//! Property tests of the KV cache manager and the scheduler under random operation sequences.
//!
//! The in-memory block store models KV exactly: the slot of position `p` holds a digest of
//! every token up to `p`. So besides the bookkeeping invariants (no block leaked or freed
//! twice, reference counts equal holders, device/host/disk budgets never exceeded), every
//! sequence must always see the right bytes for the tokens it counts as computed, whatever
//! sharing, copy-on-write, offload, spill, restore or preemption happened before.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;

use proptest::prelude::*;
use tidegate_engine::block_io::BlockIo;
use tidegate_engine::kv_cache::{
    CostModel, KvCacheManager, KvConfig, MemBlockIo, PressureAction, SeqId, SeqStart, StoreConfig,
    TierConfig, Tiers,
};
use tidegate_engine::scheduler::{NewRequest, Scheduler, SchedulerConfig};

const B: usize = 4;
const BYTES: usize = B * 8;
const BLOCKS: u32 = 24;
const HOST: usize = 4 * BYTES;
const DISK: usize = 8 * BYTES;

fn tiers() -> Tiers {
    Tiers::new(
        vec![
            TierConfig::new("drop", 0, 50, PressureAction::Drop),
            TierConfig::new("offload", 10, 80, PressureAction::Offload),
            TierConfig::new("retain", 20, 50, PressureAction::Retain),
        ],
        "drop",
    )
    .expect("valid tiers")
}

fn kv_config(dir: &Path) -> KvConfig {
    let mut cfg = KvConfig::new(BLOCKS, B, BYTES);
    cfg.store = StoreConfig {
        host_budget_bytes: HOST,
        disk_budget_bytes: DISK,
        disk_dir: Some(dir.to_path_buf()),
    };
    // Make offload always worth it at these tiny sizes, so the offload paths get exercised.
    cfg.cost = CostModel {
        prefill_us_per_token: 1e6,
        ..CostModel::default()
    };
    cfg
}

fn slot(tokens: &[u32], p: usize) -> [u8; 8] {
    let mut h = DefaultHasher::new();
    tokens[..=p].hash(&mut h);
    h.finish().to_le_bytes()
}

fn write_kv(io: &mut MemBlockIo, table: &[u32], tokens: &[u32], from: usize, to: usize) {
    let mut buf = Vec::new();
    for p in from..to {
        let b = table[p / B];
        io.read_block(b, &mut buf);
        buf[(p % B) * 8..(p % B + 1) * 8].copy_from_slice(&slot(tokens, p));
        io.write_block(b, &buf);
    }
}

fn check_kv(io: &MemBlockIo, table: &[u32], tokens: &[u32], computed: usize) -> Result<(), String> {
    for p in 0..computed {
        let got = &io.bytes(table[p / B])[(p % B) * 8..(p % B + 1) * 8];
        if got != slot(tokens, p).as_slice() {
            return Err(format!("wrong KV at position {p}"));
        }
    }
    Ok(())
}

fn dir_bytes(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len() as usize)
                .sum()
        })
        .unwrap_or(0)
}

/// Prompts share one of two "system prompts" so prefix sharing happens.
fn prompt(system: u8, suffix: &[u8]) -> Vec<u32> {
    let mut p: Vec<u32> = (0..6).map(|t| 100 * u32::from(system % 2) + t).collect();
    p.extend(suffix.iter().map(|&t| u32::from(t % 8)));
    p
}

#[derive(Clone, Debug)]
enum KvOp {
    /// A new sequence (optionally of a session) with a system prompt plus a suffix.
    Begin {
        slot: u8,
        tier: u8,
        system: u8,
        suffix: Vec<u8>,
        session: Option<u8>,
        chunk: u8,
    },
    /// A session comes back with (a prefix of) its history plus new tokens.
    Return {
        slot: u8,
        session: u8,
        keep: u8,
        extra: Vec<u8>,
        chunk: u8,
    },
    Append {
        slot: u8,
        n: u8,
    },
    Free {
        slot: u8,
    },
    Finish {
        slot: u8,
        session: u8,
    },
    Preempt {
        slot: u8,
    },
    Resume {
        slot: u8,
    },
    Advance {
        ms: u8,
    },
    MakeRoom {
        blocks: u8,
    },
    Forget {
        session: u8,
    },
}

fn kv_op() -> impl Strategy<Value = KvOp> {
    let begin = (
        0..6u8,
        0..3u8,
        0..2u8,
        prop::collection::vec(0..8u8, 0..14),
        prop::option::of(0..4u8),
        1..20u8,
    )
        .prop_map(|(slot, tier, system, suffix, session, chunk)| KvOp::Begin {
            slot,
            tier,
            system,
            suffix,
            session,
            chunk,
        });
    let ret = (
        0..6u8,
        0..4u8,
        0..40u8,
        prop::collection::vec(0..8u8, 0..6),
        1..20u8,
    )
        .prop_map(|(slot, session, keep, extra, chunk)| KvOp::Return {
            slot,
            session,
            keep,
            extra,
            chunk,
        });
    prop_oneof![
        begin,
        ret,
        (0..6u8, 1..9u8).prop_map(|(slot, n)| KvOp::Append { slot, n }),
        (0..6u8).prop_map(|slot| KvOp::Free { slot }),
        (0..6u8, 0..4u8).prop_map(|(slot, session)| KvOp::Finish { slot, session }),
        (0..6u8).prop_map(|slot| KvOp::Preempt { slot }),
        (0..6u8).prop_map(|slot| KvOp::Resume { slot }),
        (1..60u8).prop_map(|ms| KvOp::Advance { ms }),
        (1..30u8).prop_map(|blocks| KvOp::MakeRoom { blocks }),
        (0..4u8).prop_map(|session| KvOp::Forget { session }),
    ]
}

/// Test-side view of a sequence: all its tokens and how many have KV.
#[derive(Clone, Debug)]
struct Live {
    tier: usize,
    tokens: Vec<u32>,
    computed: usize,
    session: Option<String>,
    preempted: bool,
}

/// The KV manager plus the test's model of what each sequence holds.
struct KvWorld {
    kv: KvCacheManager,
    io: MemBlockIo,
    live: HashMap<SeqId, Live>,
    histories: HashMap<String, Vec<u32>>,
    now: u64,
}

impl KvWorld {
    /// Starts `seq` with `tokens` and computes its first chunk.
    fn begin(
        &mut self,
        seq: SeqId,
        tier: usize,
        tokens: Vec<u32>,
        session: Option<String>,
        chunk: usize,
    ) -> Result<(), TestCaseError> {
        if self.live.contains_key(&seq) {
            return Ok(());
        }
        let start = SeqStart {
            seq,
            tier,
            tokens: &tokens,
            session: session.as_deref(),
            chunk,
        };
        let Some(b) = self.kv.begin_seq(start, self.now, &mut self.io) else {
            prop_assert!(!self.kv.has_seq(seq));
            return Ok(());
        };
        let table = self
            .kv
            .block_table(seq)
            .expect("live sequence has a table")
            .to_vec();
        prop_assert!(b.computed < tokens.len());
        check_kv(&self.io, &table, &tokens, b.computed).map_err(TestCaseError::fail)?;
        let to = (b.computed + chunk).min(tokens.len());
        prop_assert!(table.len() * B >= to);
        write_kv(&mut self.io, &table, &tokens, b.computed, to);
        self.kv.cache_full_blocks(seq, &tokens[..to]);
        self.live.insert(
            seq,
            Live {
                tier,
                tokens,
                computed: to,
                session,
                preempted: false,
            },
        );
        Ok(())
    }

    fn apply(&mut self, op: KvOp) -> Result<(), TestCaseError> {
        let now = self.now;
        match op {
            KvOp::Begin {
                slot,
                tier,
                system,
                suffix,
                session,
                chunk,
            } => {
                let session = session.map(|s| format!("s{s}"));
                self.begin(
                    SeqId::from(slot),
                    usize::from(tier),
                    prompt(system, &suffix),
                    session,
                    usize::from(chunk),
                )?;
            }
            KvOp::Return {
                slot,
                session,
                keep,
                extra,
                chunk,
            } => {
                let name = format!("s{session}");
                let Some(h) = self.histories.get(&name) else {
                    return Ok(());
                };
                let mut tokens = h[..usize::from(keep).min(h.len())].to_vec();
                tokens.extend(extra.iter().map(|&t| u32::from(t)));
                if tokens.is_empty() {
                    return Ok(());
                }
                let tier = usize::from(slot % 3);
                self.begin(
                    SeqId::from(slot),
                    tier,
                    tokens,
                    Some(name),
                    usize::from(chunk),
                )?;
            }
            KvOp::Append { slot, n } => {
                let seq = SeqId::from(slot);
                let Some(l) = self.live.get_mut(&seq).filter(|l| !l.preempted) else {
                    return Ok(());
                };
                // New tokens arrive (sampled), then their KV is computed.
                while l.tokens.len() < l.computed + usize::from(n) {
                    let t = (l.tokens.len() as u32 * 7 + seq as u32) % 8;
                    l.tokens.push(t);
                }
                let to = l.computed + usize::from(n);
                if self.kv.allocate_slots(seq, to, now, &mut self.io).is_some() {
                    let table = self
                        .kv
                        .block_table(seq)
                        .expect("live sequence has a table")
                        .to_vec();
                    write_kv(&mut self.io, &table, &l.tokens, l.computed, to);
                    l.computed = to;
                    self.kv.cache_full_blocks(seq, &l.tokens[..to]);
                }
            }
            KvOp::Free { slot } => {
                let seq = SeqId::from(slot);
                if self.live.remove(&seq).is_some() {
                    self.kv.free_seq(seq);
                }
            }
            KvOp::Finish { slot, session } => {
                let seq = SeqId::from(slot);
                let Some(l) = self.live.get(&seq).filter(|l| !l.preempted) else {
                    return Ok(());
                };
                let name = l.session.clone().unwrap_or(format!("s{session}"));
                self.kv
                    .finish_seq(seq, Some(&name), &l.tokens[..l.computed], now);
                self.histories.insert(name, l.tokens[..l.computed].to_vec());
                self.live.remove(&seq);
            }
            KvOp::Preempt { slot } => {
                let seq = SeqId::from(slot);
                let Some(l) = self.live.get_mut(&seq).filter(|l| !l.preempted) else {
                    return Ok(());
                };
                self.kv
                    .preempt_seq(seq, &l.tokens[..l.computed], now, &mut self.io);
                l.preempted = true;
                l.computed = 0;
            }
            KvOp::Resume { slot } => {
                let seq = SeqId::from(slot);
                let Some(l) = self.live.get_mut(&seq).filter(|l| l.preempted) else {
                    return Ok(());
                };
                let start = SeqStart {
                    seq,
                    tier: l.tier,
                    tokens: &l.tokens,
                    session: l.session.as_deref(),
                    chunk: 8,
                };
                if let Some(b) = self.kv.begin_seq(start, now, &mut self.io) {
                    let table = self
                        .kv
                        .block_table(seq)
                        .expect("live sequence has a table")
                        .to_vec();
                    check_kv(&self.io, &table, &l.tokens, b.computed)
                        .map_err(TestCaseError::fail)?;
                    let to = (b.computed + 8).min(l.tokens.len());
                    write_kv(&mut self.io, &table, &l.tokens, b.computed, to);
                    self.kv.cache_full_blocks(seq, &l.tokens[..to]);
                    l.computed = to;
                    l.preempted = false;
                }
            }
            KvOp::Advance { ms } => {
                self.now += u64::from(ms);
                self.kv.evict_expired(self.now, &mut self.io);
            }
            KvOp::MakeRoom { blocks } => {
                let before = self.kv.stats().clone();
                let ok = self.kv.make_room(usize::from(blocks), now, &mut self.io);
                prop_assert_eq!(ok, self.kv.blocks_free() >= usize::from(blocks));
                // A request that cannot fit evicts nobody.
                if !ok {
                    prop_assert_eq!(&before, self.kv.stats());
                }
            }
            KvOp::Forget { session } => self.kv.forget_session(&format!("s{session}")),
        }
        Ok(())
    }

    fn check(&self, dir: &Path) -> Result<(), TestCaseError> {
        self.kv.check().map_err(TestCaseError::fail)?;
        prop_assert!(self.kv.blocks_used() <= BLOCKS as usize);
        prop_assert!(self.kv.host_bytes_used() <= HOST);
        prop_assert!(self.kv.disk_bytes_used() <= DISK);
        prop_assert!(dir_bytes(dir) <= DISK);
        for (&seq, l) in self.live.iter().filter(|(_, l)| !l.preempted) {
            let table = self.kv.block_table(seq).expect("live sequence has a table");
            check_kv(&self.io, table, &l.tokens, l.computed).map_err(TestCaseError::fail)?;
        }
        Ok(())
    }
}

fn run_kv_ops(ops: Vec<KvOp>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut w = KvWorld {
        kv: KvCacheManager::new(kv_config(dir.path()), tiers()),
        io: MemBlockIo::new(BLOCKS as usize, BYTES),
        live: HashMap::new(),
        histories: HashMap::new(),
        now: 0,
    };
    for op in ops {
        w.apply(op)?;
        w.check(dir.path())?;
    }
    report("kv", &w.kv);
    // Ending everything returns every block: nothing leaked.
    for seq in w.live.keys() {
        w.kv.free_seq(*seq);
    }
    for s in 0..4 {
        w.kv.forget_session(&format!("s{s}"));
    }
    w.kv.check().map_err(TestCaseError::fail)?;
    prop_assert_eq!(w.kv.blocks_used(), 0);
    prop_assert_eq!(w.kv.host_bytes_used(), 0);
    prop_assert_eq!(w.kv.disk_bytes_used(), 0);
    prop_assert_eq!(w.kv.idle_sessions(), 0);
    prop_assert_eq!(dir_bytes(dir.path()), 0);
    Ok(())
}

/// With `KV_PROPS_REPORT` set, prints the counters of each case (to see which paths ran).
fn report(what: &str, kv: &KvCacheManager) {
    if std::env::var_os("KV_PROPS_REPORT").is_some() {
        eprintln!("{what} {:?} {:?}", kv.stats(), kv.store_stats());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn kv_budgets_refcounts_and_bytes_hold_under_random_ops(ops in prop::collection::vec(kv_op(), 1..120)) {
        run_kv_ops(ops)?;
    }
}

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
        let out = self.s.schedule(self.now, &mut self.io);
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
