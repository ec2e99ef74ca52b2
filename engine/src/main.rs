//! tidegate-engine binary: parses the command line and calls into the library.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tidegate-engine", about = "tidegate LLM inference engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a model over the OpenAI-compatible HTTP API (with admin API and /metrics).
    Serve(tidegate_engine::server::cli::ServeArgs),
    /// Offer a multiple of an engine's measured capacity; report refusals, queue wait, RSS.
    OverloadBench(tidegate_engine::bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve(args) => tidegate_engine::server::cli::run(args)?,
        Command::OverloadBench(args) => tidegate_engine::bench::run(args)?,
    }
    Ok(())
}
