//! `tidegate-engine bench`: the engine loop under offered concurrency (1, 8, 32 by default),
//! driven in-process through the [`Engine`] trait (no HTTP). Per level: steady decode tokens/s
//! (while every request decodes; see [`steady_decode_rate`]), output tokens/s over the whole
//! level (prefill included), TTFT and inter-token latency p50/p99, and ratios to the first
//! level. Machine figures: copy and read bandwidth, the batch-1 roofline (read bandwidth ÷
//! weight bytes per token), the cores' FMA peak and the compute ceiling it puts on a batch.
//! Then the returning-session case ([`crate::session`]), an optional soak
//! ([`crate::soak`]), and RSS at start and end. `--json` prints one object instead.
//!
//! Invariant: every figure is measured in this run (nothing is a constant); levels run in the
//! order given, after one warm-up request.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use serde_json::{Value, json};

use crate::client::{Timing, one, percentile, prompt, request, steady_decode_rate};
use crate::model_runner::{Bandwidth, measure_bandwidth, roofline_tokens_per_s};
use crate::{session as bench_session, soak};
use tidegate_kv::kv_sizing::check_device_fit;
use tidegate_runner::candle::{CandleRunner, device_weight_bytes};
use tidegate_runner::kernels::peak::fma_peak_flops;
use tidegate_runner::model::{ModelConfig, ModelFiles};
use tidegate_runner::select::{candle_dtype, device_memory};
use tidegate_runner::{DeviceChoice, Placement, RunnerChoice, WeightChoice};
use tidegate_server::backend::Engine;
use tidegate_server::engine_loop::{LoopConfig, LoopEngine, LoopModel};
use tidegate_server::metrics::{Metrics, resident_memory_bytes};

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
    #[arg(long, default_value_t = 64)]
    pub output_tokens: u32,
    /// History length of the returning-session case; 0 skips it.
    #[arg(long, default_value_t = 1000)]
    pub history: usize,
    /// Seconds of random conversations after the levels, printing RSS each minute; 0 skips.
    #[arg(long, default_value_t = 0)]
    pub soak_seconds: u64,
    /// Concurrent clients of the soak.
    #[arg(long, default_value_t = 8)]
    pub soak_clients: usize,
    /// KV blocks in the pool (16 tokens each).
    #[arg(long, default_value_t = 2048)]
    pub kv_blocks: usize,
    /// Host RAM budget for offloaded KV, MiB.
    #[arg(long, default_value_t = 256)]
    pub kv_host_mib: usize,
    /// Rounds per level; the round with the best steady decode rate is reported (on a shared
    /// machine the best round is the one least disturbed by other work).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Tokens per step over all sequences.
    #[arg(long, default_value_t = 512)]
    pub max_batch_tokens: usize,
    /// Compute threads (default: available parallelism).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Format the weights are served in (as `serve --weights`).
    #[arg(long, value_enum, default_value_t = WeightChoice::AsFile)]
    pub weights: WeightChoice,
    /// Where the model runs (as `serve --device`): cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceChoice,
    /// Which runner (as `serve --runner`; default packed on cpu, candle on cuda and with
    /// --random-config).
    #[arg(long, value_enum)]
    pub runner: Option<RunnerChoice>,
    /// Instead of --model: random weights with the shapes of this Hugging Face config.json,
    /// made on the device (bf16 on cuda, f32 on cpu) through the candle runner. No weight
    /// files and no tokenizer (the prompts are token ids); figures compare with a loaded
    /// model's of the same shapes.
    #[arg(long, value_name = "FILE")]
    pub random_config: Option<PathBuf>,
}

/// What the bench runs: the model, its config (shapes, vocabulary) and what to call it.
struct BenchModel {
    model: LoopModel,
    config: ModelConfig,
    name: String,
}

impl BenchArgs {
    /// The placement: `--random-config` defaults the runner to candle (it has no host
    /// weights to pack), and refuses packed.
    fn placement(&self) -> anyhow::Result<Placement> {
        let random = self.random_config.is_some();
        let runner = self.runner.or(random.then_some(RunnerChoice::Candle));
        let placement = Placement::resolve(self.device, runner)?;
        if random && placement.runner != RunnerChoice::Candle {
            anyhow::bail!(
                "--random-config makes its weights on the device through the candle runner; \
                 use --runner candle (packed needs weight files)"
            );
        }
        if random && self.weights != WeightChoice::AsFile {
            anyhow::bail!(
                "--random-config serves bf16 on cuda and f32 on cpu; drop --weights {:?}",
                self.weights
            );
        }
        Ok(placement)
    }

    /// Loads `--model`, or describes the random one of `--random-config`.
    fn model(&self, placement: Placement) -> anyhow::Result<BenchModel> {
        let Some(path) = &self.random_config else {
            let files = ModelFiles::load(&self.model)
                .with_context(|| format!("loading {}", self.model.display()))?;
            let config = files.config.clone();
            return Ok(BenchModel {
                model: LoopModel::for_files(files, placement, self.weights)?,
                config,
                name: self.model.display().to_string(),
            });
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --random-config {}", path.display()))?;
        let config = ModelConfig::from_json(&text)
            .with_context(|| format!("--random-config {}", path.display()))?;
        Ok(BenchModel {
            model: LoopModel::candle_random(config.clone(), placement.device)?,
            config,
            name: format!("random weights, shapes of {}", path.display()),
        })
    }
}

/// On a GPU, weights and the pool must fit in its free memory: refused here with the bytes,
/// not as a failed allocation on the engine's thread.
fn check_fits(config: &ModelConfig, placement: Placement, args: &BenchArgs) -> anyhow::Result<()> {
    if placement.runner != RunnerChoice::Candle {
        return Ok(());
    }
    if let Some((free, _total)) = device_memory(placement.device)? {
        let dtype = candle_dtype(placement.device);
        let block_bytes =
            CandleRunner::block_bytes_for(config, LoopConfig::default().kv_block_tokens, dtype);
        let weights = device_weight_bytes(config, dtype);
        check_device_fit(free, weights, args.kv_blocks.max(1), block_bytes)?;
    }
    Ok(())
}

/// Host figures (copy and read bandwidth, FMA peak) where the model runs on the host; on a
/// GPU they would describe the wrong memory, so they are left out (NaN, `null` in JSON) and
/// the GPU's are measured outside (`scripts/gpu-bench.sh`).
fn machine_figures(placement: Placement) -> (Bandwidth, f64) {
    match placement.device {
        DeviceChoice::Cpu => (measure_bandwidth(), fma_peak_flops()),
        DeviceChoice::Cuda(_) => (
            Bandwidth {
                read: f64::NAN,
                copy: f64::NAN,
            },
            f64::NAN,
        ),
    }
}

/// Runs the benchmark and prints the figures.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    if let Some(t) = args.threads {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build_global();
    }
    let placement = args.placement()?;
    let rss_start = resident_memory_bytes().unwrap_or(0);
    let (bw, peak) = machine_figures(placement);
    let BenchModel {
        model,
        config: model_config,
        name,
    } = args.model(placement)?;
    check_fits(&model_config, placement, args)?;
    let vocab = model_config.vocab_size;
    let served = model.weights.clone();
    let bytes_per_token = served.bytes_per_token;
    let roofline = roofline_tokens_per_s(bw.read, bytes_per_token);
    // One multiply-add (two FLOPs, or two integer ops) per weight. Quantized weights use
    // integer dot products; the FMA peak stands in for their peak too (no int8 probe yet).
    let flops_per_token = 2.0 * served.weight_count as f64;
    let compute_ceiling = peak / flops_per_token;
    let config = LoopConfig {
        model_id: "bench".into(),
        kv_blocks: args.kv_blocks.max(1),
        kv_host_bytes: args.kv_host_mib << 20,
        max_batch_tokens: args.max_batch_tokens.max(1),
        max_batch_seqs: args.concurrency.iter().copied().max().unwrap_or(1).max(1),
        max_waiting: 4096,
        weights: args.weights,
        placement,
        ..LoopConfig::default()
    };
    let metrics = Metrics::new();
    let engine: Arc<dyn Engine> = LoopEngine::start_model(model, config, Arc::clone(&metrics))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    engine.set_tier_policy(&levels_policy()?);
    let (mut levels, session, soaked) = rt.block_on(async {
        // The warm-up also waits for the runner: the loop answers it once the runner is
        // built, or refuses it with the reason the runner failed to build (polling
        // `is_ready` would wait forever on a runner that never builds).
        let warm = request("warmup".into(), prompt(8, 0, vocab), 4, None, "default");
        one(Arc::clone(&engine), warm)
            .await
            .context("the engine did not start")?;
        let mut levels = Vec::new();
        for (i, &c) in args.concurrency.iter().enumerate() {
            let mut best: Option<Value> = None;
            for round in 0..args.rounds.max(1) {
                let l = level(&engine, args, i * 100 + round, c.max(1), vocab).await?;
                let rate = |v: &Value| v["steady_decode_tokens_per_s"].as_f64().unwrap_or(0.0);
                if best.as_ref().is_none_or(|b| rate(&l) > rate(b)) {
                    best = Some(l);
                }
            }
            levels.extend(best);
        }
        engine.set_tier_policy(&bench_session::offload_policy(1)?);
        let session = match args.history {
            0 => Value::Null,
            h => bench_session::returning_session(&engine, &metrics, h, vocab).await?,
        };
        let soaked = match args.soak_seconds {
            0 => Value::Null,
            s => soak::soak(&engine, &metrics, s, args.soak_clients, vocab).await?,
        };
        anyhow::Ok((levels, session, soaked))
    })?;
    for key in ["steady_decode_tokens_per_s", "output_tokens_per_s"] {
        let base = levels
            .first()
            .and_then(|l| l[key].as_f64())
            .unwrap_or(f64::NAN);
        for l in &mut levels {
            let v = l[key].as_f64().unwrap_or(f64::NAN);
            l[format!("{key}_ratio")] = json!(v / base);
        }
    }
    for l in &mut levels {
        let c = l["concurrency"].as_f64().unwrap_or(1.0);
        // What c sequences could reach at best: c × the batch-1 roofline while memory bound,
        // the FMA peak once compute bound.
        let ceiling = (c * roofline).min(compute_ceiling);
        l["ceiling_tokens_per_s"] = json!(ceiling);
        l["ceiling_ratio_vs_roofline"] = json!(ceiling / roofline);
    }
    let batch1 = levels
        .iter()
        .find(|l| l["concurrency"] == 1)
        .and_then(|l| l["steady_decode_tokens_per_s"].as_f64());
    let report = json!({
        "model": name,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "rounds": args.rounds.max(1),
        "copy_bandwidth_gb_s": bw.copy / 1e9,
        "read_bandwidth_gb_s": bw.read / 1e9,
        "fma_peak_gflop_s": peak / 1e9,
        "device": placement.device.to_string(),
        "runner": placement.runner.to_string(),
        "weights": served.label,
        "weight_bytes_per_token": bytes_per_token,
        "batch1_roofline_tokens_per_s": roofline,
        "compute_ceiling_tokens_per_s": compute_ceiling,
        "batch1_fraction_of_roofline": batch1.map(|b| b / roofline),
        "levels": levels,
        "returning_session": session,
        "soak": soaked,
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

/// One round of a concurrency level: `c` identical-shape requests submitted at once.
async fn level(
    engine: &Arc<dyn Engine>,
    args: &BenchArgs,
    round: usize,
    c: usize,
    vocab: usize,
) -> anyhow::Result<Value> {
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..c)
        .map(|i| {
            let req = request(
                format!("bench-{c}-{i}"),
                prompt(args.prompt_tokens, round * 1000 + i + 1, vocab),
                args.output_tokens,
                None,
                "default",
            );
            tokio::spawn(one(Arc::clone(engine), req))
        })
        .collect();
    let mut timings: Vec<Timing> = Vec::with_capacity(c);
    for t in tasks {
        timings.push(t.await??);
    }
    let wall = t0.elapsed().as_secs_f64();
    let tokens: usize = timings.iter().map(|t| t.stamps.len()).sum();
    let mut ttft: Vec<f64> = timings.iter().map(|t| t.ttft).collect();
    let mut itl: Vec<f64> = timings.iter().flat_map(Timing::gaps).collect();
    Ok(json!({
        "concurrency": c,
        "steady_decode_tokens_per_s": steady_decode_rate(&timings),
        "output_tokens_per_s": tokens as f64 / wall,
        "ttft_p50_s": percentile(&mut ttft, 0.5),
        "ttft_p99_s": percentile(&mut ttft, 0.99),
        "itl_p50_s": percentile(&mut itl, 0.5),
        "itl_p99_s": percentile(&mut itl, 0.99),
    }))
}

fn print_text(r: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    println!(
        "runner {} on {}",
        r["runner"].as_str().unwrap_or("?"),
        r["device"].as_str().unwrap_or("?")
    );
    println!(
        "model {}; weights {}, {} weight bytes/token",
        r["model"].as_str().unwrap_or("?"),
        r["weights"].as_str().unwrap_or("?"),
        r["weight_bytes_per_token"],
    );
    if r["copy_bandwidth_gb_s"].is_null() {
        println!(
            "bandwidth, FMA peak and roofline: host probes, not run for a GPU \
             (scripts/gpu-bench.sh measures the device's)"
        );
    }
    println!(
        "copy bandwidth {:.1} GB/s, read {:.1} GB/s; batch-1 roofline {:.1} tok/s",
        f(&r["copy_bandwidth_gb_s"]),
        f(&r["read_bandwidth_gb_s"]),
        f(&r["batch1_roofline_tokens_per_s"]),
    );
    println!(
        "FMA peak {:.1} GFLOP/s over all threads; compute ceiling {:.1} tok/s = {:.2}x the batch-1 roofline",
        f(&r["fma_peak_gflop_s"]),
        f(&r["compute_ceiling_tokens_per_s"]),
        f(&r["compute_ceiling_tokens_per_s"]) / f(&r["batch1_roofline_tokens_per_s"]),
    );
    println!(
        "prompt {} tokens, output {} tokens per request; best of {} rounds per level",
        r["prompt_tokens"], r["output_tokens"], r["rounds"]
    );
    println!(
        "conc  decode/s  ratio  ceiling  out/s    ratio  ttft_p50  ttft_p99  itl_p50  itl_p99"
    );
    for l in r["levels"].as_array().into_iter().flatten() {
        println!(
            "{:>4}  {:>8.1}  {:>5.2}  {:>6.2}x  {:>7.1}  {:>5.2}  {:>7.3}s  {:>7.3}s  {:>6.4}s  {:>6.4}s",
            l["concurrency"],
            f(&l["steady_decode_tokens_per_s"]),
            f(&l["steady_decode_tokens_per_s_ratio"]),
            f(&l["ceiling_ratio_vs_roofline"]),
            f(&l["output_tokens_per_s"]),
            f(&l["output_tokens_per_s_ratio"]),
            f(&l["ttft_p50_s"]),
            f(&l["ttft_p99_s"]),
            f(&l["itl_p50_s"]),
            f(&l["itl_p99_s"]),
        );
    }
    println!(
        "(decode/s: steady rate while every request decodes; ceiling: min(c x roofline, compute \
         ceiling) / roofline; out/s: output tokens over the level's wall time, prefill included)"
    );
    if let Some(b) = r["batch1_fraction_of_roofline"].as_f64() {
        println!("batch-1 decode = {:.0}% of roofline", b * 100.0);
    }
    let s = &r["returning_session"];
    if s.is_object() {
        println!(
            "returning session ({} tokens): recompute TTFT {:.3}s, resident {:.4}s, \
             restored from host {:.4}s; recompute / restore = {:.1}x",
            s["history_tokens"],
            f(&s["recompute_ttft_s"]),
            f(&s["resident_ttft_s"]),
            f(&s["restore_from_host_ttft_s"]),
            f(&s["recompute_over_restore"]),
        );
    }
    let k = &r["soak"];
    if k.is_object() {
        println!(
            "soak {}s, {} clients: {} requests, {} output tokens; restores host {} disk {} \
             recompute {}; RSS {} -> {} MiB",
            k["seconds"],
            k["clients"],
            k["requests"],
            k["output_tokens"],
            k["restores_host"],
            k["restores_disk"],
            k["restores_recompute"],
            k["rss_start_mib"],
            k["rss_end_mib"],
        );
    }
    println!(
        "RSS start {} MiB, end {} MiB",
        r["rss_start_bytes"].as_i64().unwrap_or(0) >> 20,
        r["rss_end_bytes"].as_i64().unwrap_or(0) >> 20
    );
}

/// The tier the levels run in: the engine's default tier, except that no request times out of
/// the queue (queue waits are part of what a level measures).
fn levels_policy() -> anyhow::Result<tidegate_api::TierPolicySpec> {
    Ok(serde_json::from_value(serde_json::json!({
        "tiers": [{"name": "default", "queueWaitTarget": "1h"}],
        "defaultTier": "default"
    }))?)
}
