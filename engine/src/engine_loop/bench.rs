//! `tidegate-engine bench`: the engine loop under offered concurrency (1, 8, 32 by default),
//! driven in-process through the [`Engine`] trait (no HTTP): decode tokens/s, TTFT and
//! inter-token latency p50/p99, throughput(c) / throughput(1), the machine's copy bandwidth
//! and the batch-1 roofline, a returning session's TTFT when its 1,000-token history is
//! restored from host RAM vs recomputed by prefill, and RSS at start and end. `--json` prints
//! one machine-readable object instead of the table.
//!
//! Invariant: every figure is measured in this run (nothing is a constant); concurrency levels
//! run in the order given, after one warm-up request.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use super::{LoopConfig, LoopEngine};
use crate::backend::{Engine, GenerateRequest, SamplingParams, TierParams, TokenEvent};
use crate::bench_model::{measure_bandwidth, recompute_vs_restore, roofline_tokens_per_s};
use crate::metrics::{Metrics, resident_memory_bytes};
use crate::model::ModelFiles;
use crate::runner::{Runner, RunnerConfig};

/// Options of `tidegate-engine bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Model path (a .gguf file, or a directory with one or with Hugging Face files).
    #[arg(long, default_value = "models/smollm2")]
    pub model: PathBuf,
    /// Offered concurrency levels (requests in flight).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub concurrency: Vec<usize>,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 32)]
    pub prompt_tokens: usize,
    /// Output tokens per request (EOS ignored).
    #[arg(long, default_value_t = 32)]
    pub output_tokens: u32,
    /// History length of the returning-session case; 0 skips it.
    #[arg(long, default_value_t = 1000)]
    pub history: usize,
    /// KV blocks in the pool (16 tokens each).
    #[arg(long, default_value_t = 2048)]
    pub kv_blocks: usize,
    /// Tokens per step over all sequences.
    #[arg(long, default_value_t = 512)]
    pub max_batch_tokens: usize,
    /// Compute threads (default: available parallelism).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Timings of one request.
struct Timing {
    ttft: f64,
    gaps: Vec<f64>,
    tokens: usize,
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn prompt(n: usize, salt: usize, vocab: usize) -> Vec<u32> {
    let span = vocab.saturating_sub(300).max(1);
    (0..n.max(1))
        .map(|i| (200 + (i * 7919 + salt * 104_729) % span) as u32)
        .collect()
}

fn request(
    id: String,
    prompt: Vec<u32>,
    max_tokens: u32,
    session: Option<String>,
) -> GenerateRequest {
    GenerateRequest {
        id,
        prompt,
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            seed: Some(0),
        },
        ignore_eos: true,
        tier: TierParams {
            queue_wait_target: Duration::from_secs(3600),
            ..TierParams::default()
        },
        session_id: session,
        arrived: Instant::now(),
    }
}

async fn one(engine: Arc<dyn Engine>, req: GenerateRequest) -> anyhow::Result<Timing> {
    let t0 = req.arrived;
    let admitted = engine
        .submit(req)
        .await
        .map_err(|e| anyhow::anyhow!("refused: {e}"))?;
    let mut stream = admitted.tokens;
    let mut last = None;
    let mut ttft = 0.0;
    let mut gaps = Vec::new();
    let mut tokens = 0;
    while let Some(ev) = stream.next().await {
        match ev {
            TokenEvent::Token { .. } => {
                let now = Instant::now();
                match last {
                    None => ttft = now.duration_since(t0).as_secs_f64(),
                    Some(prev) => gaps.push(now.duration_since(prev).as_secs_f64()),
                }
                last = Some(now);
                tokens += 1;
            }
            TokenEvent::Finished { .. } => break,
            TokenEvent::Failed { message } => anyhow::bail!("failed: {message}"),
        }
    }
    Ok(Timing { ttft, gaps, tokens })
}

/// Runs the benchmark and prints the figures.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    if let Some(t) = args.threads {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build_global();
    }
    let rss_start = resident_memory_bytes().unwrap_or(0);
    let bw = measure_bandwidth();
    let files = ModelFiles::load(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let vocab = files.config.vocab_size;
    // Runner-level pieces: weight bytes per token, and block restore vs prefill of the history.
    let (bytes_per_token, restore_copy_s) = {
        let blocks = args.history.div_ceil(16).max(1) + 1;
        let mut runner = Runner::new(
            &files,
            RunnerConfig {
                block_size: 16,
                num_blocks: blocks,
            },
        )?;
        let copy = if args.history > 0 {
            recompute_vs_restore(&mut runner, args.history)?.1
        } else {
            0.0
        };
        (runner.bytes_read_per_token(), copy)
    };
    let roofline = roofline_tokens_per_s(bw.read, bytes_per_token);
    let config = LoopConfig {
        model_id: "bench".into(),
        kv_blocks: args.kv_blocks.max(1),
        max_batch_tokens: args.max_batch_tokens.max(1),
        max_batch_seqs: args.concurrency.iter().copied().max().unwrap_or(1).max(1),
        max_waiting: 4096,
        ..LoopConfig::default()
    };
    let engine: Arc<dyn Engine> = LoopEngine::start(files, config, Metrics::new())?;
    while !engine.is_ready() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let out = rt.block_on(async {
        one(
            Arc::clone(&engine),
            request("warmup".into(), prompt(8, 0, vocab), 4, None),
        )
        .await?;
        let mut levels = Vec::new();
        for (round, &c) in args.concurrency.iter().enumerate() {
            let c = c.max(1);
            let t0 = Instant::now();
            let tasks: Vec<_> = (0..c)
                .map(|i| {
                    let req = request(
                        format!("bench-{c}-{i}"),
                        prompt(args.prompt_tokens, round * 1000 + i + 1, vocab),
                        args.output_tokens,
                        None,
                    );
                    tokio::spawn(one(Arc::clone(&engine), req))
                })
                .collect();
            let mut ttft = Vec::new();
            let mut itl = Vec::new();
            let mut tokens = 0;
            for t in tasks {
                let timing = t.await??;
                ttft.push(timing.ttft);
                itl.extend(timing.gaps);
                tokens += timing.tokens;
            }
            let wall = t0.elapsed().as_secs_f64();
            levels.push(json!({
                "concurrency": c,
                "decode_tokens_per_s": tokens as f64 / wall,
                "ttft_p50_s": percentile(&mut ttft, 0.5),
                "ttft_p99_s": percentile(&mut ttft, 0.99),
                "itl_p50_s": percentile(&mut itl, 0.5),
                "itl_p99_s": percentile(&mut itl, 0.99),
            }));
        }
        let mut session = json!(null);
        if args.history > 0 {
            let hist = prompt(args.history, 7, vocab);
            let recompute = one(
                Arc::clone(&engine),
                request("fresh".into(), hist.clone(), 1, None),
            )
            .await?;
            one(
                Arc::clone(&engine),
                request("s1".into(), hist.clone(), 1, Some("bench-session".into())),
            )
            .await?;
            let resident = one(
                Arc::clone(&engine),
                request("s2".into(), hist, 1, Some("bench-session".into())),
            )
            .await?;
            let restore = resident.ttft + restore_copy_s;
            session = json!({
                "history_tokens": args.history,
                "recompute_ttft_s": recompute.ttft,
                "resident_ttft_s": resident.ttft,
                "restore_copy_s": restore_copy_s,
                "restore_from_host_ttft_s": restore,
                "recompute_over_restore": recompute.ttft / restore,
            });
        }
        anyhow::Ok((levels, session))
    })?;
    let (mut levels, session) = out;
    let base = levels
        .first()
        .and_then(|l| l["decode_tokens_per_s"].as_f64())
        .unwrap_or(f64::NAN);
    for l in &mut levels {
        let tps = l["decode_tokens_per_s"].as_f64().unwrap_or(f64::NAN);
        l["ratio_vs_first"] = json!(tps / base);
    }
    let batch1 = levels
        .iter()
        .find(|l| l["concurrency"] == 1)
        .and_then(|l| l["decode_tokens_per_s"].as_f64());
    let report = json!({
        "model": args.model.display().to_string(),
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "copy_bandwidth_gb_s": bw.copy / 1e9,
        "read_bandwidth_gb_s": bw.read / 1e9,
        "weight_bytes_per_token": bytes_per_token,
        "batch1_roofline_tokens_per_s": roofline,
        "batch1_fraction_of_roofline": batch1.map(|b| b / roofline),
        "levels": levels,
        "returning_session": session,
        "rss_start_bytes": rss_start,
        "rss_end_bytes": resident_memory_bytes().unwrap_or(0),
    });
    if args.json {
        println!("{report}");
    } else {
        print_text(&report);
    }
    Ok(())
}

fn print_text(r: &serde_json::Value) {
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    println!(
        "copy bandwidth {:.1} GB/s, read {:.1} GB/s; batch-1 roofline {:.1} tok/s ({} weight bytes/token)",
        f(&r["copy_bandwidth_gb_s"]),
        f(&r["read_bandwidth_gb_s"]),
        f(&r["batch1_roofline_tokens_per_s"]),
        r["weight_bytes_per_token"]
    );
    println!("conc  tok/s    ratio  ttft_p50  ttft_p99  itl_p50  itl_p99");
    if let Some(levels) = r["levels"].as_array() {
        for l in levels {
            println!(
                "{:>4}  {:>7.1}  {:>5.2}  {:>7.3}s  {:>7.3}s  {:>6.4}s  {:>6.4}s",
                l["concurrency"],
                f(&l["decode_tokens_per_s"]),
                f(&l["ratio_vs_first"]),
                f(&l["ttft_p50_s"]),
                f(&l["ttft_p99_s"]),
                f(&l["itl_p50_s"]),
                f(&l["itl_p99_s"]),
            );
        }
    }
    if let Some(b) = r["batch1_fraction_of_roofline"].as_f64() {
        println!("batch-1 decode = {:.0}% of roofline", b * 100.0);
    }
    let s = &r["returning_session"];
    if s.is_object() {
        println!(
            "returning session ({} tokens): recompute TTFT {:.3}s, restore-from-host TTFT {:.4}s \
             (resident {:.4}s + block copy {:.4}s), ratio {:.1}x",
            s["history_tokens"],
            f(&s["recompute_ttft_s"]),
            f(&s["restore_from_host_ttft_s"]),
            f(&s["resident_ttft_s"]),
            f(&s["restore_copy_s"]),
            f(&s["recompute_over_restore"]),
        );
    }
    println!(
        "RSS start {} MiB, end {} MiB",
        r["rss_start_bytes"].as_i64().unwrap_or(0) >> 20,
        r["rss_end_bytes"].as_i64().unwrap_or(0) >> 20
    );
}
