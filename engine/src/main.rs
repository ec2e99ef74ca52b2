//! `tidegate-engine`: a thin dispatcher over the engine's subcommands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tidegate-engine",
    version,
    about = "tidegate LLM inference engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a model over the OpenAI-compatible HTTP API (with admin API and /metrics).
    Serve(tidegate_engine::server::cli::ServeArgs),
    /// Offer a multiple of an engine's measured capacity and report refusals and queue wait.
    OverloadBench(tidegate_engine::bench::BenchArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Serve(args) => tidegate_engine::server::cli::run(args),
        Command::OverloadBench(args) => tidegate_engine::bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tidegate-engine: {e:#}");
            ExitCode::FAILURE
        }
    }
}
