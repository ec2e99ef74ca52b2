//! `tidegate-operator`: the operator binary. Subcommands stay thin; the work is in the library.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tidegate-operator",
    version,
    about = "Scales LLM inference pools from measured throughput and pauses new tenants at the ceiling"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write the CustomResourceDefinitions (crds/ and charts/tidegate/crds/), or check them.
    Crds {
        /// Repository root to write under.
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Print the CRDs to stdout instead of writing files.
        #[arg(long, conflicts_with = "check")]
        stdout: bool,
        /// Exit 1 if the committed files differ from what would be generated.
        #[arg(long)]
        check: bool,
    },
    /// Print, as YAML, the objects the operator would apply for the pools in some manifests
    /// (admin Secret; engine Deployment, Service `<pool>-engines` and PodDisruptionBudget;
    /// router Deployment and PodDisruptionBudget `<pool>-router`; the front-door Service
    /// `<pool>` on the routers), for review and `kubectl diff`.
    Render(tidegate_operator::k8s::render::RenderArgs),
    /// Run the operator against an API server (in a cluster or from a kubeconfig).
    Run(tidegate_operator::run::RunArgs),
    /// Run tidegate on this machine: engine processes, the real control loop, and a tidal
    /// load that shows the pool scale up, pause new tenants at its ceiling, and recover.
    Local(tidegate_operator::local::LocalArgs),
    /// Simulate a pool under traffic traces; compare tidegate with HPA, KEDA and an oracle.
    Simulate(tidegate_operator::sim::cli::Args),
    /// Reconcile many pools in memory (planner + status, no I/O): plan() p99 and CPU per reconcile.
    BenchPlan(tidegate_operator::bench_plan::BenchPlanArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds {
            root,
            stdout,
            check,
        } => crds(&root, stdout, check),
        Command::Render(args) => tidegate_operator::k8s::render::run(&args),
        Command::Run(args) => tidegate_operator::run::main(args),
        Command::Local(args) => {
            init_logs();
            tokio::runtime::Runtime::new()?.block_on(tidegate_operator::local::run(args))
        }
        Command::Simulate(args) => tidegate_operator::sim::cli::simulate(&args),
        Command::BenchPlan(args) => tidegate_operator::bench_plan::run(&args),
    }
}

/// Logs to stderr; RUST_LOG picks the level (warn by default, so local mode's table stays readable).
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn crds(root: &std::path::Path, stdout: bool, check: bool) -> anyhow::Result<()> {
    use tidegate_operator::crdgen;
    if stdout {
        for (i, (_, text)) in crdgen::render()?.iter().enumerate() {
            if i > 0 {
                println!("---");
            }
            print!("{text}");
        }
        return Ok(());
    }
    if check {
        let drifted = crdgen::drifted(root)?;
        if drifted.is_empty() {
            println!("CRDs are up to date");
            return Ok(());
        }
        for path in &drifted {
            eprintln!("out of date: {}", path.display());
        }
        anyhow::bail!(
            "generated CRDs differ from the committed files; run `tidegate-operator crds`"
        );
    }
    for path in crdgen::write_all(root)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}
