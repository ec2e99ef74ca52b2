//! Scenario tests of the KV cache manager with an in-memory block store whose bytes model KV:
//! the slot of position `p` holds a digest of all tokens up to `p`, so a restored or copied
//! block is right only if its bytes survived exactly.

use std::hash::{DefaultHasher, Hash, Hasher};

use super::*;
use crate::block_io::{BlockIo, BlockIoCause, BlockIoError, BlockOp};

const B: usize = 4;
const BYTES: usize = 32;

fn tiers() -> Tiers {
    Tiers::new(
        vec![
            TierConfig::new("free", 0, 10_000, PressureAction::Drop),
            TierConfig::new("pro", 10, 10_000, PressureAction::Offload),
            TierConfig::new("ent", 100, 10_000, PressureAction::Retain),
        ],
        "free",
    )
    .unwrap()
}
const FREE: TierId = 0;
const PRO: TierId = 1;
const ENT: TierId = 2;

fn manager(blocks: u32, host: usize, disk: Option<&std::path::Path>) -> KvCacheManager {
    let mut cfg = KvConfig::new(blocks, B, BYTES);
    cfg.store = StoreConfig {
        host_budget_bytes: host,
        disk_budget_bytes: if disk.is_some() { 1 << 20 } else { 0 },
        disk_dir: disk.map(|p| p.to_path_buf()),
    };
    KvCacheManager::new(cfg, tiers())
}

/// The modelled KV of position `p`: a digest of every token up to and including it.
fn slot(tokens: &[u32], p: usize) -> [u8; 8] {
    let mut h = DefaultHasher::new();
    tokens[..=p].hash(&mut h);
    h.finish().to_le_bytes()
}

/// "Runs the model": writes the KV of positions `from..to` of `tokens` into `seq`'s blocks.
fn compute(
    kv: &KvCacheManager,
    io: &mut MemBlockIo,
    seq: SeqId,
    tokens: &[u32],
    from: usize,
    to: usize,
) {
    let table = kv.block_table(seq).unwrap().to_vec();
    let mut buf = Vec::new();
    for p in from..to {
        let b = table[p / B];
        io.read_block(b, &mut buf).unwrap();
        buf[(p % B) * 8..(p % B + 1) * 8].copy_from_slice(&slot(tokens, p));
        io.write_block(b, &buf).unwrap();
    }
}

/// Asserts `seq`'s blocks hold the right KV for its first `computed` tokens.
fn assert_kv(kv: &KvCacheManager, io: &MemBlockIo, seq: SeqId, tokens: &[u32], computed: usize) {
    let table = kv.block_table(seq).unwrap();
    for p in 0..computed {
        let bytes = &io.bytes(table[p / B])[(p % B) * 8..(p % B + 1) * 8];
        assert_eq!(bytes, slot(tokens, p).as_slice(), "position {p}");
    }
}

/// Starts `seq`, computes its whole prompt, and returns how it began.
fn run_prompt(
    kv: &mut KvCacheManager,
    io: &mut MemBlockIo,
    seq: SeqId,
    tier: TierId,
    tokens: &[u32],
    session: Option<&str>,
    now: u64,
) -> Begin {
    let begin = kv
        .begin_seq_io(start(seq, tier, tokens, session, tokens.len()), now, io)
        .unwrap();
    assert_kv(kv, io, seq, tokens, begin.computed);
    kv.allocate_slots_io(seq, tokens.len(), now, io).unwrap();
    compute(kv, io, seq, tokens, begin.computed, tokens.len());
    kv.cache_full_blocks(seq, tokens);
    kv.check().unwrap();
    begin
}

fn start<'a>(
    seq: SeqId,
    tier: TierId,
    tokens: &'a [u32],
    session: Option<&'a str>,
    chunk: usize,
) -> SeqStart<'a> {
    SeqStart {
        seq,
        tier,
        tokens,
        session,
        chunk,
    }
}

fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

#[test]
fn shared_system_prompt_is_computed_once() {
    let mut kv = manager(16, 0, None);
    let mut io = MemBlockIo::new(16, BYTES);
    let mut a = toks(0..8);
    a.extend([100, 101, 102]);
    let mut b = toks(0..8);
    b.extend([200, 201]);
    assert_eq!(
        run_prompt(&mut kv, &mut io, 1, FREE, &a, None, 0).computed,
        0
    );
    let begin = run_prompt(&mut kv, &mut io, 2, FREE, &b, None, 0);
    assert_eq!(
        begin,
        Begin {
            computed: 8,
            source: KvSource::Fresh
        }
    );
    assert_eq!(
        kv.block_table(1).unwrap()[..2],
        kv.block_table(2).unwrap()[..2]
    );
    assert_eq!(kv.stats().prefix_hit_tokens, 8);
    // After both end, the prefix stays cached (free but reusable).
    kv.free_seq(1);
    kv.free_seq(2);
    assert_eq!(kv.blocks_used(), 0);
    let begin = run_prompt(&mut kv, &mut io, 3, FREE, &b, None, 0);
    assert_eq!(begin.computed, 8);
    kv.check().unwrap();
}

#[test]
fn whole_prompt_hit_still_computes_last_token() {
    let mut kv = manager(8, 0, None);
    let mut io = MemBlockIo::new(8, BYTES);
    let p = toks(0..8);
    run_prompt(&mut kv, &mut io, 1, FREE, &p, None, 0);
    let begin = run_prompt(&mut kv, &mut io, 2, FREE, &p, None, 0);
    assert_eq!(begin.computed, 4);
}

#[test]
fn returning_session_reuses_resident_blocks_and_copies_shared_partial() {
    let mut kv = manager(16, 0, None);
    let mut io = MemBlockIo::new(16, BYTES);
    let turn1 = toks(0..10);
    run_prompt(&mut kv, &mut io, 1, PRO, &turn1, Some("s"), 0);
    kv.finish_seq(1, Some("s"), &turn1, 5);
    assert_eq!(kv.idle_sessions(), 1);
    let held = kv.blocks_used();
    assert_eq!(held, 3);
    // Turn 2 extends turn 1: everything is reused, including the partial third block.
    let mut turn2 = turn1.clone();
    turn2.extend([50, 51, 52]);
    let begin = run_prompt(&mut kv, &mut io, 2, PRO, &turn2, Some("s"), 10);
    assert_eq!(
        begin,
        Begin {
            computed: 10,
            source: KvSource::Resident
        }
    );
    assert_eq!(kv.stats().resident_hits, 1);
    kv.finish_seq(2, Some("s"), &turn2, 20);
    // An edited conversation that diverges inside block 1, while another sequence shares
    // block 1: the partial block must be copied, not written in place.
    let shared = run_prompt(&mut kv, &mut io, 3, FREE, &toks(0..9), None, 20);
    assert_eq!(shared.computed, 8);
    let mut edited = toks(0..6);
    edited.extend([90, 91]);
    let begin = run_prompt(&mut kv, &mut io, 4, PRO, &edited, Some("s"), 30);
    assert_eq!(
        begin,
        Begin {
            computed: 6,
            source: KvSource::Resident
        }
    );
    assert_eq!(kv.stats().cow_copies, 1);
    assert_kv(&kv, &io, 3, &toks(0..9), 9);
    assert_kv(&kv, &io, 4, &edited, 8);
}

#[test]
fn offload_to_host_then_restore_keeps_bytes() {
    let mut kv = manager(6, 6 * BYTES, None);
    let mut io = MemBlockIo::new(6, BYTES);
    let hist = toks(1000..1018); // 5 blocks (4 full + 2 tokens)
    run_prompt(&mut kv, &mut io, 1, PRO, &hist, Some("s"), 0);
    kv.finish_seq(1, Some("s"), &hist, 0);
    // Another sequence needs 4 blocks: the idle session is offloaded to host.
    run_prompt(&mut kv, &mut io, 2, FREE, &toks(0..16), None, 100);
    assert_eq!(kv.stats().evictions_of("pro", EvictAction::Offload), 1);
    assert_eq!(kv.host_bytes_used(), 5 * BYTES);
    kv.free_seq(2);
    let mut back = hist.clone();
    back.push(7);
    let begin = run_prompt(&mut kv, &mut io, 3, PRO, &back, Some("s"), 200);
    assert_eq!(
        begin,
        Begin {
            computed: 18,
            source: KvSource::Host
        }
    );
    assert_eq!(kv.stats().restores_host, 1);
    assert_eq!(kv.host_bytes_used(), 0);
}

#[test]
fn spill_to_disk_then_restore_keeps_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut kv = manager(6, 0, Some(dir.path()));
    let mut io = MemBlockIo::new(6, BYTES);
    let hist = toks(1000..1016);
    run_prompt(&mut kv, &mut io, 1, PRO, &hist, Some("s"), 0);
    kv.finish_seq(1, Some("s"), &hist, 0);
    run_prompt(&mut kv, &mut io, 2, FREE, &toks(0..20), None, 1);
    // The file: four blocks behind its header.
    assert_eq!(kv.disk_bytes_used(), 4 * BYTES + spill_file::HEADER_BYTES);
    kv.free_seq(2);
    let mut back = hist.clone();
    back.extend([1, 2]);
    let begin = run_prompt(&mut kv, &mut io, 3, PRO, &back, Some("s"), 2);
    assert_eq!(
        begin,
        Begin {
            computed: 16,
            source: KvSource::Disk
        }
    );
    assert_eq!(kv.disk_bytes_used(), 0);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn dropped_session_recomputes() {
    let mut kv = manager(6, 1 << 20, None);
    let mut io = MemBlockIo::new(6, BYTES);
    let hist = toks(1000..1016);
    run_prompt(&mut kv, &mut io, 1, FREE, &hist, Some("s"), 0);
    kv.finish_seq(1, Some("s"), &hist, 0);
    // Pressure evicts it (Drop tier), and the new prompt reclaims its cached blocks too.
    run_prompt(&mut kv, &mut io, 2, FREE, &toks(0..24), None, 1);
    assert_eq!(kv.stats().evictions_of("free", EvictAction::Drop), 1);
    kv.free_seq(2);
    let mut back = hist.clone();
    back.push(3);
    let begin = run_prompt(&mut kv, &mut io, 3, FREE, &back, Some("s"), 2);
    assert_eq!(begin.source, KvSource::Recompute);
    assert_eq!(kv.stats().restores_recompute, 1);
    // A session never seen is fresh.
    let begin = run_prompt(&mut kv, &mut io, 4, FREE, &toks(500..503), Some("new"), 2);
    assert_eq!(begin.source, KvSource::Fresh);
}

#[test]
fn ttl_offloads_or_drops_but_retain_stays() {
    let mut kv = manager(16, 1 << 20, None);
    let mut io = MemBlockIo::new(16, BYTES);
    for (seq, tier, name) in [(1, FREE, "a"), (2, PRO, "b"), (3, ENT, "c")] {
        let t = toks(seq as u32 * 100..seq as u32 * 100 + 9);
        run_prompt(&mut kv, &mut io, seq, tier, &t, Some(name), 0);
        kv.finish_seq(seq, Some(name), &t, 0);
    }
    assert_eq!(kv.evict_expired_io(9_999, &mut io), 0);
    assert_eq!(kv.evict_expired_io(10_000, &mut io), 2);
    assert_eq!(kv.stats().evictions_of("free", EvictAction::Drop), 1);
    assert_eq!(kv.stats().evictions_of("pro", EvictAction::Offload), 1);
    assert_eq!(kv.blocks_used(), 3);
    kv.check().unwrap();
}

#[test]
fn pressure_evicts_retain_tier_last_and_cheapest_first() {
    let mut kv = manager(9, 0, None);
    let mut io = MemBlockIo::new(9, BYTES);
    for (seq, tier, name, at) in [(1, ENT, "e", 0), (2, FREE, "old", 0), (3, FREE, "new", 50)] {
        let t = toks(seq as u32 * 100..seq as u32 * 100 + 12);
        run_prompt(&mut kv, &mut io, seq, tier, &t, Some(name), at);
        kv.finish_seq(seq, Some(name), &t, at);
    }
    // More than the pool can ever free: refused without evicting anyone.
    assert!(!kv.make_room_io(10, 100, &mut io));
    assert_eq!(kv.idle_sessions(), 3);
    kv.check().unwrap();
    let mut kv2 = manager(9, 0, None);
    for (seq, tier, name, at) in [(1, ENT, "e", 0), (2, FREE, "old", 0), (3, FREE, "new", 50)] {
        let t = toks(seq as u32 * 100..seq as u32 * 100 + 12);
        run_prompt(&mut kv2, &mut io, seq, tier, &t, Some(name), at);
        kv2.finish_seq(seq, Some(name), &t, at);
    }
    // Need 3 blocks: the stalest free-tier session goes first.
    assert!(kv2.make_room_io(3, 100, &mut io));
    assert_eq!(kv2.idle_sessions(), 2);
    let begin = run_prompt(
        &mut kv2,
        &mut io,
        9,
        FREE,
        &toks(300..313),
        Some("new"),
        100,
    );
    assert_eq!(begin.source, KvSource::Resident);
    // Need all 9 (minus 3 the returning one holds): the retained tier goes last, but goes.
    kv2.free_seq(9);
    assert!(kv2.make_room_io(9, 200, &mut io));
    assert_eq!(kv2.stats().evictions_of("free", EvictAction::Drop), 1);
    assert_eq!(kv2.stats().evictions_of("ent", EvictAction::Drop), 1);
}

#[test]
fn preempted_sequence_offloads_and_resumes() {
    let mut kv = manager(4, 1 << 20, None);
    let mut io = MemBlockIo::new(4, BYTES);
    let p = toks(0..13);
    run_prompt(&mut kv, &mut io, 1, PRO, &p, None, 0);
    let out = kv.preempt_seq_io(1, &p, 1, &mut io);
    assert_eq!(out, Preempted::Offloading);
    assert_eq!(kv.blocks_used(), 0);
    assert_eq!(
        kv.host_bytes_used(),
        4 * BYTES,
        "the answered offload landed in host RAM"
    );
    let mut more = p.clone();
    more.push(99);
    let begin = run_prompt(&mut kv, &mut io, 1, PRO, &more, None, 2);
    assert_eq!(
        begin,
        Begin {
            computed: 13,
            source: KvSource::Host
        }
    );
    // A dropped preemption recomputes (shared full blocks may still hit).
    let out = kv.preempt_seq_io(1, &more, 3, &mut io);
    assert_eq!(out, Preempted::Offloading);
    kv.free_seq(1);
    assert_eq!(kv.host_bytes_used(), 0);
    run_prompt(&mut kv, &mut io, 2, FREE, &p, None, 4);
    assert_eq!(kv.preempt_seq_io(2, &p, 5, &mut io), Preempted::Dropped);
    let begin = run_prompt(&mut kv, &mut io, 2, FREE, &p, None, 6);
    assert_eq!(begin.source, KvSource::Recompute);
    assert_eq!(begin.computed, 12);
}

#[test]
fn no_room_is_none_and_changes_nothing() {
    let mut kv = manager(3, 0, None);
    let mut io = MemBlockIo::new(3, BYTES);
    run_prompt(&mut kv, &mut io, 1, FREE, &toks(0..8), None, 0);
    assert!(
        kv.begin_seq_io(start(2, FREE, &toks(50..60), None, 10), 0, &mut io)
            .is_none()
    );
    assert!(!kv.has_seq(2));
    assert!(kv.allocate_slots_io(1, 13, 0, &mut io).is_none());
    assert_eq!(kv.block_table(1).unwrap().len(), 2);
    kv.check().unwrap();
}

/// A store whose reads fail (a failing device copy).
struct UnreadableIo;

impl BlockIo for UnreadableIo {
    fn block_bytes(&self) -> usize {
        BYTES
    }
    fn read_block(&self, block: u32, _out: &mut Vec<u8>) -> Result<(), BlockIoError> {
        let cause = BlockIoCause::Device("injected".into());
        Err(BlockIoError::new(BlockOp::Read, block, cause))
    }
    fn write_block(&mut self, _block: u32, _data: &[u8]) -> Result<(), BlockIoError> {
        Ok(())
    }
    fn copy_block(&mut self, _src: u32, _dst: u32) -> Result<(), BlockIoError> {
        Ok(())
    }
}

#[test]
fn unreadable_blocks_are_dropped_not_offloaded() {
    let mut kv = manager(4, 1 << 20, None);
    let mut io = MemBlockIo::new(4, BYTES);
    let t = toks(0..10);
    run_prompt(&mut kv, &mut io, 1, PRO, &t, Some("s"), 0);
    kv.finish_seq(1, Some("s"), &t, 0);
    assert!(kv.make_room_io(4, 1, &mut UnreadableIo));
    assert_eq!(kv.stats().evictions_of("pro", EvictAction::Drop), 1);
    assert_eq!(kv.host_bytes_used(), 0);
    kv.check().unwrap();
}

/// Offloads session "s" (10 tokens, tier PRO) to a disk-only store and returns its spill file.
fn spill_session(
    kv: &mut KvCacheManager,
    io: &mut MemBlockIo,
    dir: &std::path::Path,
    t: &[u32],
) -> std::path::PathBuf {
    run_prompt(kv, io, 1, PRO, t, Some("s"), 0);
    kv.finish_seq(1, Some("s"), t, 0);
    assert!(kv.make_room_io(4, 1, io));
    assert_eq!(kv.stats().evictions_of("pro", EvictAction::Offload), 1);
    assert_eq!(kv.host_bytes_used(), 0);
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    // Someone else takes every block, so nothing of the session is left on the device.
    run_prompt(kv, io, 9, FREE, &toks(100..116), None, 1);
    kv.free_seq(9);
    files[0].clone()
}

#[test]
fn corrupt_spill_file_is_recomputed_not_restored() {
    let dir = tempfile::tempdir().unwrap();
    let mut kv = manager(4, 0, Some(dir.path()));
    let mut io = MemBlockIo::new(4, BYTES);
    let t = toks(0..10);
    let file = spill_session(&mut kv, &mut io, dir.path(), &t);
    // Same length, different bytes: only a checksum can tell.
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len();
    bytes[n - 32] ^= 0x01; // position 8, the first of the last block
    std::fs::write(&file, bytes).unwrap();
    // run_prompt checks that every position reported computed holds the right KV.
    let begin = run_prompt(&mut kv, &mut io, 2, PRO, &t, Some("s"), 2);
    assert_eq!(begin.source, KvSource::Recompute);
    assert_eq!(begin.computed, 0);
    assert!(!file.exists());
}

#[test]
fn truncated_or_missing_spill_file_is_a_counted_recompute() {
    for truncate in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut kv = manager(4, 0, Some(dir.path()));
        let mut io = MemBlockIo::new(4, BYTES);
        let t = toks(0..10);
        let file = spill_session(&mut kv, &mut io, dir.path(), &t);
        if truncate {
            let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
            f.set_len(30).unwrap();
        } else {
            std::fs::remove_file(&file).unwrap();
        }
        let begin = run_prompt(&mut kv, &mut io, 2, PRO, &t, Some("s"), 2);
        assert_eq!(
            begin,
            Begin {
                computed: 0,
                source: KvSource::Recompute
            }
        );
        let s = kv.stats();
        assert_eq!((s.restores_recompute, s.restores_disk), (1, 0));
        assert_eq!((s.restore_failures_disk, s.restore_failures_host), (1, 0));
        assert_eq!(kv.store_stats().disk_errors, 1);
        assert_eq!(kv.disk_bytes_used(), 0);
        kv.check().unwrap();
    }
}

/// A store whose writes fail (the device refuses a restored block).
struct UnwritableIo(MemBlockIo);

impl BlockIo for UnwritableIo {
    fn block_bytes(&self) -> usize {
        BYTES
    }
    fn read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<(), BlockIoError> {
        self.0.read_block(block, out)
    }
    fn write_block(&mut self, block: u32, _data: &[u8]) -> Result<(), BlockIoError> {
        let cause = BlockIoCause::Device("injected".into());
        Err(BlockIoError::new(BlockOp::Write, block, cause))
    }
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), BlockIoError> {
        self.0.copy_block(src, dst)
    }
}

#[test]
fn failed_block_write_on_restore_from_host_is_a_counted_recompute() {
    let mut kv = manager(4, 1 << 20, None);
    let mut io = MemBlockIo::new(4, BYTES);
    let t = toks(0..10);
    run_prompt(&mut kv, &mut io, 1, PRO, &t, Some("s"), 0);
    kv.finish_seq(1, Some("s"), &t, 0);
    assert!(kv.make_room_io(4, 1, &mut io));
    assert_eq!(kv.host_bytes_used(), 3 * BYTES);
    run_prompt(&mut kv, &mut io, 9, FREE, &toks(100..116), None, 1);
    kv.free_seq(9);
    let mut bad = UnwritableIo(io);
    let begin = kv
        .begin_seq_io(start(2, PRO, &t, Some("s"), t.len()), 2, &mut bad)
        .unwrap();
    assert_eq!(
        begin,
        Begin {
            computed: 0,
            source: KvSource::Recompute
        }
    );
    let s = kv.stats();
    assert_eq!((s.restore_failures_host, s.restore_failures_disk), (1, 0));
    assert_eq!((s.restores_recompute, s.restores_host), (1, 0));
    assert_eq!(kv.host_bytes_used(), 0);
    // The sequence holds room for its whole prompt, to be prefilled from scratch.
    assert!(kv.block_table(2).unwrap().len() >= 3);
    kv.check().unwrap();
}
