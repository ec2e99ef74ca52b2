//! Property test of the KV cache manager under random allocate / append / free /
//! finish-session / return / evict / make-room / preempt / resume sequences: no block leaked
//! or freed twice, reference counts equal holders, device/host/disk budgets never exceeded,
//! and every live sequence always sees the right KV bytes for the tokens it counts computed.

mod kv_common;

use std::collections::HashMap;
use std::path::Path;

use kv_common::*;
use proptest::prelude::*;
use tidegate_kv::kv_cache::{KvCacheManager, MemBlockIo, MoveNow, SeqId, SeqStart};

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
        let Some(b) = self.kv.begin_seq_io(start, self.now, &mut self.io) else {
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
                if self
                    .kv
                    .allocate_slots_io(seq, to, now, &mut self.io)
                    .is_some()
                {
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
                    .preempt_seq_io(seq, &l.tokens[..l.computed], now, &mut self.io);
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
                if let Some(b) = self.kv.begin_seq_io(start, now, &mut self.io) {
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
                self.kv.evict_expired_io(self.now, &mut self.io);
            }
            KvOp::MakeRoom { blocks } => {
                let before = self.kv.stats().clone();
                let ok = self.kv.make_room_io(usize::from(blocks), now, &mut self.io);
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn kv_budgets_refcounts_and_bytes_hold_under_random_ops(ops in prop::collection::vec(kv_op(), 1..120)) {
        run_kv_ops(ops)?;
    }
}
