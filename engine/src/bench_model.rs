//! `tidegate-engine bench-model`: a short micro-benchmark of the runner alone (no scheduler,
//! no HTTP). Prints the machine's measured memory bandwidth, the batch-1 decode roofline
//! (read bandwidth ÷ weight bytes read per token) and decode tokens/s at each batch size.
//! Figures vary run to run on shared machines; compare ratios within one run.

use std::path::PathBuf;
use std::time::Instant;

use rayon::prelude::*;

use crate::error::Result;
use crate::model::ModelFiles;
use crate::runner::{Runner, RunnerConfig, SeqChunk};
use crate::sampling::argmax;

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
}

/// Measured memory bandwidth, bytes per second.
#[derive(Debug, Clone, Copy)]
pub struct Bandwidth {
    /// Parallel read-only (sum) bandwidth over all threads.
    pub read: f64,
    /// memcpy bandwidth (bytes copied, i.e. read, per second).
    pub copy: f64,
}

/// Measures read and copy bandwidth on a 256 MiB buffer (best of a few passes).
pub fn measure_bandwidth() -> Bandwidth {
    let n = 64 << 20; // f32s = 256 MiB
    let src: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let mut dst = vec![0f32; n];
    let bytes = (n * 4) as f64;
    let mut read = 0f64;
    let mut copy = 0f64;
    for _ in 0..4 {
        let t = Instant::now();
        let s: f32 = src
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0.0, |a, b| a + b))
            .sum();
        std::hint::black_box(s);
        read = read.max(bytes / t.elapsed().as_secs_f64());
        let t = Instant::now();
        dst.par_chunks_mut(1 << 16)
            .zip(src.par_chunks(1 << 16))
            .for_each(|(d, s)| d.copy_from_slice(s));
        std::hint::black_box(&dst);
        copy = copy.max(bytes / t.elapsed().as_secs_f64());
    }
    Bandwidth { read, copy }
}

/// Batch-1 decode roofline in tokens/s: bandwidth ÷ weight bytes read per token.
pub fn roofline_tokens_per_s(bandwidth: f64, bytes_per_token: usize) -> f64 {
    bandwidth / bytes_per_token as f64
}

/// Decode tokens/s of `runner` at `batch` concurrent sequences: prefill each with
/// `prompt_len` tokens, then time `steps` batched decode steps (median step time).
pub fn decode_tokens_per_s(
    runner: &mut Runner,
    batch: usize,
    prompt_len: usize,
    steps: usize,
) -> Result<f64> {
    let bs = runner.block_size();
    let per_seq = (prompt_len + steps + 1).div_ceil(bs);
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
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
    let mut next: Vec<u32> = runner
        .step(&chunks)?
        .iter()
        .map(|l| l.as_deref().map_or(0, argmax))
        .collect();
    let mut times = Vec::with_capacity(steps);
    for step in 0..steps {
        let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let chunks: Vec<SeqChunk<'_>> = toks
            .iter()
            .zip(&tables)
            .map(|(t, table)| SeqChunk {
                tokens: t,
                start_pos: prompt_len + step,
                block_table: table,
                want_logits: true,
            })
            .collect();
        let t0 = Instant::now();
        let out = runner.step(&chunks)?;
        times.push(t0.elapsed().as_secs_f64());
        next = out.iter().map(|l| l.as_deref().map_or(0, argmax)).collect();
    }
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len() / 2).copied().unwrap_or(f64::INFINITY);
    Ok(batch as f64 / median)
}

/// Runs the benchmark and prints the figures.
pub fn run(args: &BenchArgs) -> Result<()> {
    let bw = measure_bandwidth();
    println!(
        "memory bandwidth: read {:.1} GB/s, copy {:.1} GB/s ({} threads)",
        bw.read / 1e9,
        bw.copy / 1e9,
        rayon::current_num_threads()
    );
    let t = Instant::now();
    let files = ModelFiles::load(&args.model)?;
    let max_batch = args.batch.iter().copied().max().unwrap_or(1);
    let block_size = 16;
    let per_seq = (args.prompt_len + args.steps + 1).div_ceil(block_size);
    let mut runner = Runner::new(
        &files,
        RunnerConfig {
            block_size,
            num_blocks: per_seq * max_batch,
        },
    )?;
    drop(files);
    let bytes = runner.bytes_read_per_token();
    let roof = roofline_tokens_per_s(bw.read, bytes);
    println!(
        "model {} loaded in {:.1}s; {:.1} MB of weights read per decode step; batch-1 roofline {:.1} tok/s",
        args.model.display(),
        t.elapsed().as_secs_f64(),
        bytes as f64 / 1e6,
        roof
    );
    let mut base = None;
    for &b in &args.batch {
        let tps = decode_tokens_per_s(&mut runner, b, args.prompt_len, args.steps)?;
        let base_tps = *base.get_or_insert(tps);
        println!(
            "batch {b:>3}: {tps:8.1} decode tok/s  ({:.2}x batch {}; {:.0}% of batch-1 roofline per stream)",
            tps / base_tps,
            args.batch.first().copied().unwrap_or(1),
            100.0 * tps / b as f64 / roof
        );
    }
    Ok(())
}
