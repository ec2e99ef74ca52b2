//! How many KV blocks the device pool gets: an explicit count, or a fraction of the memory
//! left for it (the pool's `kvCache.memoryFraction`), decided once at start-up and logged
//! with its reasons.
//!
//! On CPU the memory left for KV is what the container can really have: the smallest of
//! `--memory-limit`, the cgroup's memory limit and the machine's memory (a pod whose limit
//! says 64Gi on a 23 GiB node gets 23 GiB, not a pool it can never touch), less what the
//! process already holds (the loaded weights) and the host offload tier (it lives in the same
//! memory); without any limit it is the free memory less the host tier. The reason logged
//! names the bound that applied and every bound it was the smallest of. The pool is touched at start (`KvStore::new`), so a size that does not fit fails at
//! start, not under load.
//!
//! Invariants: an explicit block count always wins; a sizing that leaves no room, or room for
//! no block, is an error naming the figures, never a silent minimum.

use std::fmt;

/// Blocks when neither a count nor a fraction is given (tests, `serve` by hand).
pub const DEFAULT_KV_BLOCKS: usize = 2048;

/// What the operator (or the user) asked for.
#[derive(Clone, Copy, Debug)]
pub struct KvRequest {
    pub explicit_blocks: Option<usize>,
    pub memory_fraction: Option<f64>,
    /// Bytes of one block for this model and block size.
    pub block_bytes: usize,
    pub host_offload_bytes: u64,
}

/// What the process can see of its memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryFacts {
    /// `--memory-limit`.
    pub limit_flag: Option<u64>,
    /// The cgroup's memory limit, when it has one.
    pub cgroup_limit: Option<u64>,
    /// MemAvailable.
    pub available: Option<u64>,
    /// MemTotal: the machine's memory, the bound no limit can raise.
    pub total: Option<u64>,
    /// Resident bytes of this process now (weights loaded).
    pub resident: u64,
}

/// The chosen pool size and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvSize {
    pub blocks: usize,
    pub why: String,
}

/// A fraction that leaves the KV pool nothing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("KV pool sizing: {0}")]
pub struct KvSizingError(String);

/// A byte count shown in MiB (errors and logs of memory figures).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mib(pub u64);

impl fmt::Display for Mib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} MiB", self.0 as f64 / (1024.0 * 1024.0))
    }
}

/// Decides the pool size (pure; `read_memory_facts` supplies the facts).
pub fn size_kv_pool(req: &KvRequest, facts: &MemoryFacts) -> Result<KvSize, KvSizingError> {
    if let Some(blocks) = req.explicit_blocks {
        let also = if req.memory_fraction.is_some() {
            " (wins over --kv-memory-fraction)"
        } else {
            ""
        };
        return Ok(KvSize {
            blocks: blocks.max(1),
            why: format!("--kv-blocks {blocks}{also}"),
        });
    }
    let Some(fraction) = req.memory_fraction else {
        return Ok(KvSize {
            blocks: DEFAULT_KV_BLOCKS,
            why: "default (no --kv-blocks or --kv-memory-fraction)".to_string(),
        });
    };
    let host = req.host_offload_bytes;
    let (room, basis) = match memory_bound(facts) {
        Some((limit, kind, overridden)) => {
            let held = facts.resident.saturating_add(host);
            let basis = format!(
                "{kind} {}{overridden} − resident {} − host offload {}",
                Mib(limit),
                Mib(facts.resident),
                Mib(host)
            );
            (limit.checked_sub(held), basis)
        }
        None => {
            let available = facts.available.ok_or_else(|| {
                KvSizingError(
                    "no memory limit and no free-memory figure to size from; pass --kv-blocks"
                        .into(),
                )
            })?;
            let basis = format!(
                "free memory {} − host offload {}",
                Mib(available),
                Mib(host)
            );
            (available.checked_sub(host), basis)
        }
    };
    blocks_in(room, &basis, fraction, req.block_bytes)
}

/// Sizes a pool that lives in a GPU's memory: with `--kv-memory-fraction F`, `F × (free
/// device memory before loading − the weights' bytes)`; the host offload tier lives in host
/// RAM and takes nothing here. An explicit count or no fraction behave as in
/// [`size_kv_pool`].
pub fn size_device_kv_pool(
    req: &KvRequest,
    free: u64,
    weight_bytes: u64,
) -> Result<KvSize, KvSizingError> {
    let Some(fraction) = req
        .memory_fraction
        .filter(|_| req.explicit_blocks.is_none())
    else {
        return size_kv_pool(req, &MemoryFacts::default());
    };
    let basis = format!("GPU free {} − weights {}", Mib(free), Mib(weight_bytes));
    blocks_in(
        free.checked_sub(weight_bytes),
        &basis,
        fraction,
        req.block_bytes,
    )
}

/// Whether `weight_bytes` of weights and a pool of `blocks × block_bytes` fit in `free`
/// bytes of device memory; if not, an error with what is needed against what is free. A pool
/// sized from a fraction ≤ 1 always fits; an explicit `--kv-blocks` (or the default count)
/// may not, and on a GPU it must fail here, at start, not as a failed allocation later.
pub fn check_device_fit(
    free: u64,
    weight_bytes: u64,
    blocks: usize,
    block_bytes: usize,
) -> Result<(), KvSizingError> {
    if weight_bytes > free {
        return Err(KvSizingError(format!(
            "the weights need {} of GPU memory but only {} is free",
            Mib(weight_bytes),
            Mib(free)
        )));
    }
    let pool = (blocks as u64).saturating_mul(block_bytes as u64);
    let needed = weight_bytes.saturating_add(pool);
    if needed > free {
        return Err(KvSizingError(format!(
            "weights {} + KV pool {blocks} blocks × {block_bytes} bytes = {} need {} of GPU \
             memory but only {} is free; pass fewer --kv-blocks or a --kv-memory-fraction",
            Mib(weight_bytes),
            Mib(pool),
            Mib(needed),
            Mib(free)
        )));
    }
    Ok(())
}

/// The memory the process can really have when something limits it: the smallest of
/// `--memory-limit`, the cgroup's limit and the machine's memory, named, with every bound it
/// was chosen from (` (smallest of --memory-limit 65536.0 MiB, machine memory 23552.0 MiB)`),
/// so the log shows what the engine saw of its container. None without any limit: the caller
/// then sizes from the free memory.
fn memory_bound(facts: &MemoryFacts) -> Option<(u64, &'static str, String)> {
    facts.limit_flag.or(facts.cgroup_limit)?;
    let bounds = [
        ("--memory-limit", facts.limit_flag),
        ("cgroup memory limit", facts.cgroup_limit),
        ("machine memory", facts.total),
    ];
    let known: Vec<(&'static str, u64)> = bounds
        .iter()
        .filter_map(|(name, b)| b.map(|b| (*name, b)))
        .collect();
    let (name, bound) = known.iter().copied().min_by_key(|(_, b)| *b)?;
    let of = if known.len() > 1 {
        let all: Vec<String> = known
            .iter()
            .map(|(n, b)| format!("{n} {}", Mib(*b)))
            .collect();
        format!(" (smallest of {})", all.join(", "))
    } else {
        String::new()
    };
    Some((bound, name, of))
}

/// `fraction × room` in whole blocks, or why there is no room for one.
fn blocks_in(
    room: Option<u64>,
    basis: &str,
    fraction: f64,
    block_bytes: usize,
) -> Result<KvSize, KvSizingError> {
    let room = room
        .filter(|r| *r > 0)
        .ok_or_else(|| KvSizingError(format!("{basis} leaves nothing for the KV pool")))?;
    let bytes = (room as f64 * fraction) as u64;
    let blocks = usize::try_from(bytes / block_bytes.max(1) as u64).unwrap_or(usize::MAX);
    if blocks == 0 {
        return Err(KvSizingError(format!(
            "{fraction} × ({basis}) = {} holds no block of {} bytes",
            Mib(bytes),
            block_bytes
        )));
    }
    Ok(KvSize {
        blocks,
        why: format!(
            "--kv-memory-fraction {fraction} × ({basis}) = {} in blocks of {} bytes",
            Mib(bytes),
            block_bytes
        ),
    })
}

/// Reads the facts from /proc and the cgroup (absent files are absent facts).
pub fn read_memory_facts(limit_flag: Option<u64>) -> MemoryFacts {
    MemoryFacts {
        limit_flag,
        cgroup_limit: cgroup_limit(),
        available: meminfo_kib("/proc/meminfo", "MemAvailable:").map(|k| k * 1024),
        total: meminfo_kib("/proc/meminfo", "MemTotal:").map(|k| k * 1024),
        resident: meminfo_kib("/proc/self/status", "VmRSS:").map_or(0, |k| k * 1024),
    }
}

/// Above this a cgroup v1 limit means "unlimited" (it reports a page-rounded i64::MAX).
const CGROUP_V1_UNLIMITED: u64 = 1 << 60;

fn cgroup_limit() -> Option<u64> {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok();
    let v1 = || std::fs::read_to_string("/sys/fs/cgroup/memory/memory.limit_in_bytes").ok();
    let text = v2.or_else(v1)?;
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|&b| b < CGROUP_V1_UNLIMITED)
}

fn meminfo_kib(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn req(blocks: Option<usize>, fraction: Option<f64>, host: u64) -> KvRequest {
        KvRequest {
            explicit_blocks: blocks,
            memory_fraction: fraction,
            block_bytes: 1024 * 1024,
            host_offload_bytes: host,
        }
    }

    #[test]
    fn an_explicit_count_wins_over_a_fraction() {
        let s = size_kv_pool(&req(Some(7), Some(0.9), 0), &MemoryFacts::default()).expect("size");
        assert_eq!(s.blocks, 7);
        assert!(s.why.contains("wins"), "{}", s.why);
    }

    #[test]
    fn no_request_is_the_default_count() {
        let s = size_kv_pool(&req(None, None, 0), &MemoryFacts::default()).expect("size");
        assert_eq!(s.blocks, DEFAULT_KV_BLOCKS);
    }

    #[test]
    fn a_limit_less_weights_and_host_tier_times_the_fraction() {
        let facts = MemoryFacts {
            limit_flag: Some(1024 * MIB),
            cgroup_limit: Some(4096 * MIB),
            available: Some(9000 * MIB),
            total: Some(16384 * MIB),
            resident: 24 * MIB,
        };
        // 0.5 × (1024 − 24 − 200) MiB = 400 blocks of 1 MiB; the flag wins over the cgroup.
        let s = size_kv_pool(&req(None, Some(0.5), 200 * MIB), &facts).expect("size");
        assert_eq!(s.blocks, 400, "{}", s.why);
        assert!(s.why.contains("--memory-limit"), "{}", s.why);
        let cgroup = MemoryFacts {
            limit_flag: None,
            ..facts
        };
        let s = size_kv_pool(&req(None, Some(0.5), 0), &cgroup).expect("size");
        assert_eq!(s.blocks, 2036, "{}", s.why);
    }

    #[test]
    fn the_smallest_of_flag_cgroup_and_machine_memory_applies_and_is_named() {
        // The production example on a 23 GiB machine: --memory-limit 64Gi, no cgroup limit.
        let facts = MemoryFacts {
            limit_flag: Some(64 * 1024 * MIB),
            total: Some(23 * 1024 * MIB),
            available: Some(20 * 1024 * MIB),
            resident: 0,
            ..MemoryFacts::default()
        };
        let s = size_kv_pool(&req(None, Some(0.5), 0), &facts).expect("size");
        assert_eq!(s.blocks, 23 * 512, "{}", s.why);
        assert!(
            s.why.contains(
                "machine memory 23552.0 MiB (smallest of --memory-limit 65536.0 MiB, machine memory 23552.0 MiB)"
            ),
            "{}",
            s.why
        );
        // A cgroup limit below the flag wins over it, and says so.
        let cgroup = MemoryFacts {
            cgroup_limit: Some(2048 * MIB),
            ..facts
        };
        let s = size_kv_pool(&req(None, Some(0.5), 0), &cgroup).expect("size");
        assert_eq!(s.blocks, 1024, "{}", s.why);
        assert!(
            s.why
                .starts_with("--kv-memory-fraction 0.5 × (cgroup memory limit"),
            "{}",
            s.why
        );
        // The flag below both applies, and the reason lists every bound it saw.
        let flag = MemoryFacts {
            limit_flag: Some(1024 * MIB),
            ..cgroup
        };
        let s = size_kv_pool(&req(None, Some(0.5), 0), &flag).expect("size");
        assert_eq!(s.blocks, 512, "{}", s.why);
        assert!(
            s.why.contains("--memory-limit 1024.0 MiB (smallest of --memory-limit 1024.0 MiB, cgroup memory limit 2048.0 MiB, machine memory 23552.0 MiB)"),
            "{}",
            s.why
        );
    }

    #[test]
    fn without_a_limit_free_memory_less_the_host_tier() {
        let facts = MemoryFacts {
            available: Some(1000 * MIB),
            resident: 500 * MIB,
            ..MemoryFacts::default()
        };
        let s = size_kv_pool(&req(None, Some(0.9), 100 * MIB), &facts).expect("size");
        assert_eq!(s.blocks, 810, "{}", s.why);
    }

    #[test]
    fn a_host_tier_larger_than_the_limit_is_an_error_naming_the_figures() {
        let facts = MemoryFacts {
            limit_flag: Some(512 * MIB),
            ..MemoryFacts::default()
        };
        let e = size_kv_pool(&req(None, Some(0.9), 32 * 1024 * MIB), &facts).expect_err("no room");
        assert!(e.to_string().contains("leaves nothing"), "{e}");
        let tiny = MemoryFacts {
            limit_flag: Some(MIB),
            ..MemoryFacts::default()
        };
        let e = size_kv_pool(&req(None, Some(0.5), 0), &tiny).expect_err("no block");
        assert!(e.to_string().contains("holds no block"), "{e}");
    }

    #[test]
    fn this_process_has_a_resident_size() {
        assert!(read_memory_facts(None).resident > 0);
    }

    #[test]
    fn a_gpu_pool_is_sized_from_device_memory_after_the_weights() {
        let r = req(None, Some(0.5), 512 * MIB);
        // 0.5 × (1000 − 200) MiB = 400 blocks of 1 MiB; the host tier is not on the device.
        let s = size_device_kv_pool(&r, 1000 * MIB, 200 * MIB).expect("size");
        assert_eq!(s.blocks, 400, "{}", s.why);
        assert!(s.why.contains("GPU free"), "{}", s.why);
        assert!(size_device_kv_pool(&r, 100 * MIB, 200 * MIB).is_err());
        let explicit = size_device_kv_pool(&req(Some(7), Some(0.5), 0), 0, 0).expect("size");
        assert_eq!(explicit.blocks, 7);
    }

    #[test]
    fn a_gpu_pool_or_weights_that_do_not_fit_name_the_bytes() {
        assert!(check_device_fit(1000 * MIB, 200 * MIB, 800, MIB as usize).is_ok());
        let e = check_device_fit(1000 * MIB, 200 * MIB, 801, MIB as usize).expect_err("pool");
        let text = e.to_string();
        for part in [
            "weights 200.0 MiB",
            "801 blocks",
            "1001.0 MiB",
            "1000.0 MiB is free",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
        let e = check_device_fit(100 * MIB, 200 * MIB, 1, 1).expect_err("weights");
        assert!(
            e.to_string()
                .contains("weights need 200.0 MiB of GPU memory but only 100.0 MiB"),
            "{e}"
        );
    }
}
