//! tidegate-engine binary: parses the command line and calls into the engine crates (serve:
//! `tidegate_server`, route: `tidegate_router`, fetch-model: `tidegate_fetch`, the benchmarks:
//! `tidegate_bench`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tidegate-engine", about = "tidegate LLM inference engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Highest quantized CPU kernel set to use (amx, avx512-vnni, avx-vnni, avx2, portable); the
    /// default is the best this CPU has that passes its start-up check. The f32 matmul,
    /// attention and activation kernels are held to the width a CPU with that set has
    /// (avx2: 8 lanes, as on an AVX2-only CPU). For comparing kernels on one machine.
    #[arg(long, global = true, env = "TIDEGATE_CPU_KERNELS", value_parser = parse_kernels)]
    cpu_kernels: Option<tidegate_runner::kernels::quant::Isa>,
}

fn parse_kernels(s: &str) -> Result<tidegate_runner::kernels::quant::Isa, String> {
    use tidegate_runner::kernels::quant::{Isa, set_cap};
    let isa = Isa::from_name(s).ok_or_else(|| format!("expected one of {}", Isa::all_names()))?;
    set_cap(isa)?;
    Ok(isa)
}

#[derive(Subcommand)]
enum Command {
    /// Serve a model over the OpenAI-compatible HTTP API (with admin API and /metrics).
    Serve(Box<tidegate_server::cli::ServeArgs>),
    /// Route a pool's traffic to its engines: KV-affine, pool-wide admission, tier queue.
    Route(Box<tidegate_router::cli::RouteArgs>),
    /// Fetch a model (s3://, hf://) into a folder before the engine starts: resumable,
    /// verified, atomic (a pod's init container; local mode's step before its engines).
    FetchModel(Box<tidegate_fetch::cli::FetchArgs>),
    /// Benchmark a running router: returning-session TTFT, added latency, overload memory.
    BenchRouter(tidegate_bench::router::BenchRouterArgs),
    /// Offer a multiple of an engine's measured capacity; report refusals, queue wait, RSS.
    OverloadBench(tidegate_bench::overload::BenchArgs),
    /// Write a tiny random-weight Llama (safetensors + config.json + tokenizer.json).
    GenRandomModel {
        /// Output directory (created).
        #[arg(long)]
        out: PathBuf,
        /// Weight seed.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Micro-benchmark of the model runner: copy bandwidth, batch-1 roofline, decode tok/s.
    BenchModel(tidegate_bench::model_runner::BenchArgs),
    /// Benchmark the engine loop: tok/s, TTFT and ITL by concurrency, roofline, session restore.
    Bench(tidegate_bench::engine_loop::BenchArgs),
    /// Time to ready of `serve` for a model, from a cold and from a warm page cache.
    BenchStartup(tidegate_bench::startup::StartupArgs),
    /// Greedy chat completion of one prompt (a smoke test of model + tokenizer).
    Chat {
        /// Model path: a .gguf file, or a directory with a .gguf or Hugging Face files.
        #[arg(long)]
        model: PathBuf,
        /// The user message.
        #[arg(long)]
        prompt: String,
        /// A system message before it (else the model's template decides, e.g. its default).
        #[arg(long)]
        system: Option<String>,
        /// Tokens to generate at most.
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
    },
}

fn main() -> anyhow::Result<()> {
    // The cap is set while parsing (`parse_kernels`), before any kernel runs.
    match Cli::parse().command {
        Command::Serve(args) => tidegate_server::cli::run(*args)?,
        Command::Route(args) => tidegate_router::cli::run(*args)?,
        Command::FetchModel(args) => tidegate_fetch::cli::run(*args)?,
        Command::BenchRouter(args) => tidegate_bench::router::run(&args)?,
        Command::OverloadBench(args) => tidegate_bench::overload::run(args)?,
        Command::GenRandomModel { out, seed } => {
            let cfg = tidegate_runner::model::random::write_random_model(&out, seed)?;
            println!(
                "wrote {} ({} layers, hidden {}, vocab {})",
                out.display(),
                cfg.num_hidden_layers,
                cfg.hidden_size,
                cfg.vocab_size
            );
        }
        Command::Bench(args) => tidegate_bench::engine_loop::run(&args)?,
        Command::BenchStartup(args) => tidegate_bench::startup::run(&args)?,
        Command::BenchModel(args) => tidegate_bench::model_runner::run(&args)?,
        Command::Chat {
            model,
            prompt,
            system,
            max_tokens,
        } => {
            let answer = tidegate_runner::generate::chat_once(
                &model,
                system.as_deref(),
                &prompt,
                max_tokens,
            )?;
            println!("{answer}");
        }
    }
    Ok(())
}
