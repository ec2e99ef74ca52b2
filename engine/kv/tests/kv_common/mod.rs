//! Shared pieces of the property tests: a small tier table and KV configuration, and an exact
//! model of KV bytes. The in-memory block store models KV exactly: the slot of position `p`
//! holds a digest of every token up to `p`, so a sequence sees the right bytes only if every
//! share, copy-on-write, offload, spill and restore before kept them intact.
#![allow(dead_code)]

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;

use tidegate_kv::block_io::BlockIo;
use tidegate_kv::kv_cache::{
    CostModel, KvCacheManager, KvConfig, MemBlockIo, PressureAction, StoreConfig, TierConfig, Tiers,
};

pub const B: usize = 4;
pub const BYTES: usize = B * 8;
pub const BLOCKS: u32 = 24;
pub const HOST: usize = 4 * BYTES;
pub const DISK: usize = 8 * BYTES;

pub fn tiers() -> Tiers {
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

pub fn kv_config(dir: &Path) -> KvConfig {
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

pub fn slot(tokens: &[u32], p: usize) -> [u8; 8] {
    let mut h = DefaultHasher::new();
    tokens[..=p].hash(&mut h);
    h.finish().to_le_bytes()
}

pub fn write_kv(io: &mut MemBlockIo, table: &[u32], tokens: &[u32], from: usize, to: usize) {
    let mut buf = Vec::new();
    for p in from..to {
        let b = table[p / B];
        io.read_block(b, &mut buf).expect("block in range");
        buf[(p % B) * 8..(p % B + 1) * 8].copy_from_slice(&slot(tokens, p));
        io.write_block(b, &buf).expect("block in range");
    }
}

pub fn check_kv(
    io: &MemBlockIo,
    table: &[u32],
    tokens: &[u32],
    computed: usize,
) -> Result<(), String> {
    for p in 0..computed {
        let got = &io.bytes(table[p / B])[(p % B) * 8..(p % B + 1) * 8];
        if got != slot(tokens, p).as_slice() {
            return Err(format!("wrong KV at position {p}"));
        }
    }
    Ok(())
}

pub fn dir_bytes(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len() as usize)
                .sum()
        })
        .unwrap_or(0)
}

/// Prompts share one of two "system prompts" so prefix sharing happens.
pub fn prompt(system: u8, suffix: &[u8]) -> Vec<u32> {
    let mut p: Vec<u32> = (0..6).map(|t| 100 * u32::from(system % 2) + t).collect();
    p.extend(suffix.iter().map(|&t| u32::from(t % 8)));
    p
}

/// With `KV_PROPS_REPORT` set, prints the counters of each case (to see which paths ran).
pub fn report(what: &str, kv: &KvCacheManager) {
    if std::env::var_os("KV_PROPS_REPORT").is_some() {
        eprintln!("{what} {:?} {:?}", kv.stats(), kv.store_stats());
    }
}
