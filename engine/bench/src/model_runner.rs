//! `tidegate-engine bench-model`: a short micro-benchmark of the runner alone (no scheduler,
//! no HTTP). Prints the machine's measured memory bandwidth, the batch-1 decode roofline
//! (read bandwidth ÷ weight bytes read per token) and decode tokens/s at each batch size.
//! Figures vary run to run on shared machines; compare ratios within one run.

use std::path::PathBuf;
use std::time::Instant;
use tidegate_runner::model::weights::Stored;
use tidegate_runner::weight_format::{Projection, Served};

use rayon::prelude::*;

use tidegate_kv::block_io::BlockIo;
use tidegate_runner::error::{Error, Result};
use tidegate_runner::model::ModelFiles;
use tidegate_runner::sampling::argmax;
use tidegate_runner::{KvDtype, PackedRunner, RunnerConfig, SeqChunk};

use crate::roofline::{self, ReadProbe};

/// Command-line options.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Model path (a .gguf file or model directory).
    #[arg(long, default_value = "models/smollm2")]
    pub model: PathBuf,
    /// Batch sizes (concurrent sequences) to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub batch: Vec<usize>,
    /// Prompt tokens prefilled per sequence before decoding.
    #[arg(long, default_value_t = 32)]
    pub prompt_len: usize,
    /// Decode steps timed per batch size.
    #[arg(long, default_value_t = 16)]
    pub steps: usize,
    /// Also print the matmul kernel's speed on each of the model's projection shapes.
    #[arg(long)]
    pub kernel_shapes: bool,
    /// History length for the prefill (recompute) vs block restore comparison; 0 skips it.
    #[arg(long, default_value_t = 1000)]
    pub history: usize,
    /// Print the measured memory bandwidth (and the kernel sets) only: the roofline's
    /// denominator for scripts/bench-vs-llamacpp.sh.
    #[arg(long)]
    pub bandwidth_only: bool,
    /// Also measure the batch-1 roofline fraction in this many pairs of read passes and
    /// decode steps taken in turn (needs batch 1 in `--batch`; 0 skips it): on a shared host
    /// the bandwidth moves between a separate reading and the decode.
    #[arg(long, default_value_t = 0)]
    pub roofline_pairs: usize,
    /// The KV pool's element type (as `serve --kv-cache-dtype`).
    #[arg(long, default_value_t = KvDtype::F16)]
    pub kv_cache_dtype: KvDtype,
}

/// Measured memory bandwidth, bytes per second.
#[derive(Debug, Clone, Copy)]
pub struct Bandwidth {
    /// Parallel read-only (sum) bandwidth over all threads.
    pub read: f64,
    /// memcpy bandwidth (bytes copied, i.e. read, per second).
    pub copy: f64,
}

/// Measures read and copy bandwidth on a 256 MiB buffer (best of 8 passes).
pub fn measure_bandwidth() -> Bandwidth {
    let probe = ReadProbe::new();
    let src = probe.source();
    let mut dst = vec![0f32; src.len()];
    let bytes = (src.len() * 4) as f64;
    let mut read = 0f64;
    let mut copy = 0f64;
    for _ in 0..8 {
        read = read.max(probe.pass());
        let t = Instant::now();
        dst.par_chunks_mut(1 << 16)
            .zip(src.par_chunks(1 << 16))
            .for_each(|(d, s)| d.copy_from_slice(s));
        std::hint::black_box(&dst);
        copy = copy.max(bytes / t.elapsed().as_secs_f64());
    }
    Bandwidth { read, copy }
}

/// Throughput of the matmul kernel alone for `[m, k] x [n, k]ᵀ`: (GFLOP/s, weight GB/s),
/// best of `reps` rounds over copies of the weight totalling more than the caches hold.
pub fn kernel_throughput(fmt: Served, m: usize, n: usize, k: usize, reps: usize) -> (f64, f64) {
    let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.1).collect();
    let w: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 * 0.1).collect();
    let bytes = fmt.bytes_for(n, k);
    // Enough copies to exceed the last-level cache, as a whole model does when decoding.
    let copies = (96 << 20) / bytes + 1;
    let Ok(t) = candle_core::Tensor::from_vec(w, (n, k), &candle_core::Device::Cpu) else {
        return (0.0, 0.0);
    };
    let packed: Vec<_> = (0..copies)
        .filter_map(|_| Projection::pack(&[Stored::F32(t.clone())], k, fmt).ok())
        .collect();
    let copies = packed.len().max(1);
    let mut y = vec![0f32; m * n];
    let mut best = f64::INFINITY;
    for i in 0..reps.max(1) * copies {
        let t = Instant::now();
        packed[i % copies].matmul(&x, m, &mut y);
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&y);
    (
        2.0 * (m * n * k) as f64 / best / 1e9,
        bytes as f64 / best / 1e9,
    )
}

/// Batch-1 decode roofline in tokens/s: bandwidth ÷ weight bytes read per token.
pub fn roofline_tokens_per_s(bandwidth: f64, bytes_per_token: usize) -> f64 {
    bandwidth / bytes_per_token as f64
}

/// A set of `batch` sequences decoding together on a runner, using blocks
/// `first_block..first_block + batch · blocks_per_seq`.
#[derive(Debug)]
pub struct DecodeSet {
    tables: Vec<Vec<u32>>,
    next: Vec<u32>,
    pos: usize,
}

impl DecodeSet {
    /// Prefills `batch` synthetic prompts of `prompt_len` tokens.
    pub fn prefill(
        runner: &mut PackedRunner,
        batch: usize,
        prompt_len: usize,
        first_block: usize,
        blocks_per_seq: usize,
    ) -> Result<Self> {
        let tables: Vec<Vec<u32>> = (0..batch)
            .map(|s| {
                let b0 = first_block + s * blocks_per_seq;
                (b0 as u32..(b0 + blocks_per_seq) as u32).collect()
            })
            .collect();
        let vocab = runner.config().vocab_size as u32;
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|s| {
                (0..prompt_len)
                    .map(|i| ((s * 131 + i * 17 + 5) as u32) % vocab)
                    .collect()
            })
            .collect();
        let chunks: Vec<SeqChunk<'_>> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| SeqChunk {
                tokens: p,
                start_pos: 0,
                block_table: t,
                want_logits: true,
            })
            .collect();
        let next = runner
            .step(&chunks)?
            .iter()
            .map(|l| l.as_deref().map_or(0, argmax))
            .collect();
        Ok(Self {
            tables,
            next,
            pos: prompt_len,
        })
    }

    /// Runs `steps` batched greedy decode steps; returns each step's wall time in seconds.
    pub fn decode(&mut self, runner: &mut PackedRunner, steps: usize) -> Result<Vec<f64>> {
        let mut times = Vec::with_capacity(steps);
        for _ in 0..steps {
            let toks: Vec<[u32; 1]> = self.next.iter().map(|&t| [t]).collect();
            let chunks: Vec<SeqChunk<'_>> = toks
                .iter()
                .zip(&self.tables)
                .map(|(t, table)| SeqChunk {
                    tokens: t,
                    start_pos: self.pos,
                    block_table: table,
                    want_logits: true,
                })
                .collect();
            let t0 = Instant::now();
            let out = runner.step(&chunks)?;
            times.push(t0.elapsed().as_secs_f64());
            self.next = out.iter().map(|l| l.as_deref().map_or(0, argmax)).collect();
            self.pos += 1;
        }
        Ok(times)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::INFINITY)
}

/// What [`recompute_vs_restore`] measured, in seconds.
pub struct RestoreTimes {
    /// A one-shot prefill of the history (recompute).
    pub prefill: f64,
    /// Its blocks written back one block per call (the path before transfers were batched).
    pub per_block: f64,
    /// The same blocks written by one batched call (the path the engine loop runs now).
    pub batched: f64,
}

/// Times a one-shot prefill of `history` tokens (recompute) against restoring the same
/// blocks from host-RAM images, block by block and as one batch; each restore is the median
/// of [`RESTORE_REPS`] runs (a few milliseconds each, so one run is mostly noise).
pub fn recompute_vs_restore(runner: &mut PackedRunner, history: usize) -> Result<RestoreTimes> {
    let bs = runner.block_size();
    let table: Vec<u32> = (0..history.div_ceil(bs) as u32).collect();
    let vocab = runner.config().vocab_size as u32;
    let tokens: Vec<u32> = (0..history)
        .map(|i| (i as u32 * 7919 + 3) % vocab)
        .collect();
    let t0 = Instant::now();
    runner.step(&[SeqChunk {
        tokens: &tokens,
        start_pos: 0,
        block_table: &table,
        want_logits: true,
    }])?;
    let prefill = t0.elapsed().as_secs_f64();
    let mut images = Vec::with_capacity(table.len());
    for &b in &table {
        let mut img = Vec::new();
        runner.kv_store().try_read_block(b, &mut img)?;
        images.push(img);
    }
    let batch_image = images.concat();
    let (mut per_block, mut batched) = (Vec::new(), Vec::new());
    for _ in 0..RESTORE_REPS {
        let t0 = Instant::now();
        for (&b, img) in table.iter().zip(&images) {
            runner.kv_store_mut().try_write_block(b, img)?;
        }
        per_block.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        BlockIo::write_blocks(runner.kv_store_mut(), &table, &batch_image)
            .map_err(|e| Error::InvalidInput(format!("batched restore: {e}")))?;
        batched.push(t0.elapsed().as_secs_f64());
    }
    Ok(RestoreTimes {
        prefill,
        per_block: median(per_block),
        batched: median(batched),
    })
}

/// Runs of each restore path in [`recompute_vs_restore`], alternated.
const RESTORE_REPS: usize = 5;

/// Number of alternating measurement rounds (batch sizes interleaved to cancel load drift).
const ROUNDS: usize = 3;

/// Runs the benchmark and prints the figures.
pub fn run(args: &BenchArgs) -> Result<()> {
    let bw = measure_bandwidth();
    println!(
        "memory bandwidth: read {:.1} GB/s, copy {:.1} GB/s ({} threads)",
        bw.read / 1e9,
        bw.copy / 1e9,
        rayon::current_num_threads()
    );
    println!("kernel sets: {}", tidegate_runner::kernels::describe());
    if args.bandwidth_only {
        return Ok(());
    }
    for fmt in [Served::F32, Served::Q8_0, Served::Q4_1] {
        let (_, gemv_bw) = kernel_throughput(fmt, 1, 49152, 576, 5);
        let (gemm_flops, _) = kernel_throughput(fmt, 32, 1536, 576, 20);
        println!(
            "kernels {:<4}: GEMV 1x576 by 49152x576 reads weights at {gemv_bw:.1} GB/s; GEMM 32x576 by 1536x576 runs at {gemm_flops:.1} GFLOP/s",
            fmt.name()
        );
    }
    let t = Instant::now();
    let files = ModelFiles::load(&args.model)?;
    let block_size = 16;
    // Positions per sequence: the prompt, the timed rounds, and the paired roofline's steps.
    let decoded = ROUNDS * args.steps + args.roofline_pairs * PAIR_STEPS;
    let per_seq = (args.prompt_len + decoded + 1).div_ceil(block_size);
    let total_seqs: usize = args.batch.iter().sum();
    let history_blocks = args.history.div_ceil(block_size);
    let mut runner = PackedRunner::new(
        &files,
        RunnerConfig {
            block_size,
            num_blocks: (per_seq * total_seqs).max(history_blocks).max(1),
            kv_dtype: args.kv_cache_dtype,
        },
    )?;
    drop(files);
    let bytes = runner.bytes_read_per_token();
    let roof = roofline_tokens_per_s(bw.read, bytes);
    println!(
        "model {} loaded in {:.1}s; KV {}; {:.1} MB of weights read per decode step; batch-1 roofline {:.1} tok/s",
        args.model.display(),
        t.elapsed().as_secs_f64(),
        args.kv_cache_dtype,
        bytes as f64 / 1e6,
        roof
    );
    if args.kernel_shapes {
        let c = runner.config().clone();
        let kvd = c.kv_heads() * c.head_dim();
        let shapes = [
            ("qkv", c.hidden_size + 2 * kvd, c.hidden_size),
            ("o", c.hidden_size, c.hidden_size),
            ("gate_up", 2 * c.intermediate_size, c.hidden_size),
            ("down", c.hidden_size, c.intermediate_size),
            ("lm_head", c.vocab_size, c.hidden_size),
        ];
        for fmt in [Served::F32, Served::Q8_0, Served::Q4_1] {
            for &b in &args.batch {
                for (name, n, k) in shapes {
                    let (gf, gb) = kernel_throughput(fmt, b, n, k, 5);
                    println!(
                        "  kernel {:<4} m={b:<3} {name:<8} n={n:<6} k={k:<5} {gf:7.1} GFLOP/s {gb:6.1} GB/s of weights",
                        fmt.name()
                    );
                }
            }
        }
    }
    if args.history > 0 {
        let t = recompute_vs_restore(&mut runner, args.history)?;
        println!(
            "history of {} tokens: recompute (prefill) {:.0} ms ({:.0} tok/s), restore from host RAM {:.1} ms batched ({:.0}x faster), {:.1} ms block by block",
            args.history,
            t.prefill * 1e3,
            args.history as f64 / t.prefill,
            t.batched * 1e3,
            t.prefill / t.batched,
            t.per_block * 1e3,
        );
    }
    let mut sets = Vec::new();
    let mut first = 0;
    for &b in &args.batch {
        sets.push(DecodeSet::prefill(
            &mut runner,
            b,
            args.prompt_len,
            first,
            per_seq,
        )?);
        first += b * per_seq;
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); sets.len()];
    for _ in 0..ROUNDS {
        for (set, t) in sets.iter_mut().zip(times.iter_mut()) {
            t.extend(set.decode(&mut runner, args.steps)?);
        }
    }
    let mut base = None;
    for (&b, t) in args.batch.iter().zip(times) {
        let tps = b as f64 / median(t);
        let base_tps = *base.get_or_insert(tps);
        println!(
            "batch {b:>3}: {tps:8.1} decode tok/s  ({:.2}x batch {}; {:.0}% of batch-1 roofline per stream)",
            tps / base_tps,
            args.batch.first().copied().unwrap_or(1),
            100.0 * tps / b as f64 / roof
        );
    }
    if let Some(one) = args.batch.iter().position(|&b| b == 1) {
        paired_roofline(&mut runner, &mut sets[one], bytes, args.roofline_pairs)?;
    } else if args.roofline_pairs > 0 {
        println!("--roofline-pairs needs batch 1 in --batch; skipped");
    }
    Ok(())
}

/// Decode steps between read passes, per pair.
const PAIR_STEPS: usize = 8;

/// Prints the batch-1 roofline fraction measured in `pairs` pairs (none: nothing).
fn paired_roofline(
    runner: &mut PackedRunner,
    set: &mut DecodeSet,
    bytes: usize,
    pairs: usize,
) -> Result<()> {
    if pairs == 0 {
        return Ok(());
    }
    let probe = ReadProbe::new();
    let measured = roofline::measure(&probe, pairs, PAIR_STEPS, bytes, || {
        Ok::<_, Error>(
            set.decode(runner, 1)?
                .first()
                .copied()
                .unwrap_or(f64::INFINITY),
        )
    })?;
    if let Some(s) = roofline::summarize(&measured) {
        println!(
            "batch-1 roofline, paired ({} pairs of a read pass, {PAIR_STEPS} decode steps, a read pass): {:.2} of the read bandwidth (pairs {:.2}-{:.2}); decode reads weights at {:.1} GB/s, read passes {:.1} GB/s (medians)",
            s.pairs,
            s.fraction,
            s.lowest,
            s.highest,
            s.decode / 1e9,
            s.read / 1e9,
        );
    }
    Ok(())
}
