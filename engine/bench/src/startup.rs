//! `tidegate-engine bench-startup`: time to ready of an engine, from a cold and from a warm
//! page cache — the figure the planner's lead time is made of, besides scheduling and the
//! image pull.
//!
//! Each round starts `tidegate-engine serve` as the operator launches it (its own process,
//! loopback ports) and polls `/readyz` until it answers 200: process start, weight load and
//! packing, KV pool allocation, listeners. "Cold" drops the model's files from the page cache
//! first with `posix_fadvise(POSIX_FADV_DONTNEED)` (no root needed; the kernel drops the clean
//! pages nobody else maps), so the weights are read from the disk; "warm" runs right after a
//! start that read them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// Arguments of `bench-startup`.
#[derive(clap::Args, Debug)]
pub struct StartupArgs {
    /// Model path (a .gguf file, or a directory with one or with Hugging Face files).
    #[arg(long, default_value = "models/smollm2")]
    pub model: PathBuf,
    /// Rounds of each kind (cold, warm); the median and the best are printed.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Compute threads of the engine.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Give up on a start after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

/// Runs the benchmark and prints its figures.
pub fn run(args: &StartupArgs) -> anyhow::Result<()> {
    let files = model_files(&args.model)?;
    let bytes: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    println!(
        "model: {} ({:.1} MiB in {} file(s)); engine: serve --threads {}",
        args.model.display(),
        bytes as f64 / (1 << 20) as f64,
        files.len(),
        args.threads
    );
    let exe = std::env::current_exe()?;
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for round in 0..args.rounds.max(1) {
        drop_page_cache(&files)?;
        cold.push(time_to_ready(&exe, args)?);
        warm.push(time_to_ready(&exe, args)?);
        println!(
            "round {}: cold {:.2} s, warm {:.2} s",
            round + 1,
            cold[round].as_secs_f64(),
            warm[round].as_secs_f64()
        );
    }
    report("cold page cache", &mut cold, bytes);
    report("warm page cache", &mut warm, bytes);
    Ok(())
}

fn report(what: &str, times: &mut [Duration], bytes: u64) {
    times.sort();
    let best = times[0].as_secs_f64();
    let median = times[times.len() / 2].as_secs_f64();
    println!(
        "{what}: time to ready median {median:.2} s, best {best:.2} s ({:.0} MiB/s of weights at the median)",
        bytes as f64 / (1 << 20) as f64 / median.max(1e-3)
    );
}

/// The files of a model path: the file itself, or every file under the folder (links
/// followed, as the engine follows them).
fn model_files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).with_context(|| path.display().to_string())? {
        let p = entry?.path();
        if p.is_file() {
            out.push(p);
        }
    }
    anyhow::ensure!(!out.is_empty(), "{}: no model files", path.display());
    out.sort();
    Ok(out)
}

/// Asks the kernel to drop the files' pages from the page cache.
fn drop_page_cache(files: &[PathBuf]) -> anyhow::Result<()> {
    for f in files {
        let file = std::fs::File::open(f).with_context(|| f.display().to_string())?;
        rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
            .with_context(|| format!("posix_fadvise(DONTNEED) {}", f.display()))?;
    }
    Ok(())
}

/// Two distinct free loopback addresses (both held while choosing, so they differ).
fn free_addrs() -> anyhow::Result<(SocketAddr, SocketAddr)> {
    let a = TcpListener::bind("127.0.0.1:0")?;
    let b = TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?, b.local_addr()?))
}

/// Starts one engine and times it until `/readyz` answers 200; then stops it.
fn time_to_ready(exe: &Path, args: &StartupArgs) -> anyhow::Result<Duration> {
    let (api, admin) = free_addrs()?;
    let started = Instant::now();
    let mut child = Command::new(exe)
        .arg("serve")
        .arg("--model")
        .arg(&args.model)
        .args([
            "--listen",
            &api.to_string(),
            "--admin-listen",
            &admin.to_string(),
        ])
        .args(["--threads", &args.threads.to_string(), "--kv-blocks", "256"])
        .env("TIDEGATE_ADMIN_TOKEN", "bench-startup")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting tidegate-engine serve")?;
    let result = wait_ready(
        &mut child,
        api,
        started,
        Duration::from_secs(args.timeout_s),
    );
    let _ = child.kill();
    let _ = child.wait();
    result
}

fn wait_ready(
    child: &mut Child,
    api: SocketAddr,
    started: Instant,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    while started.elapsed() < timeout {
        if ready(api) {
            return Ok(started.elapsed());
        }
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("the engine exited before it was ready ({status})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    anyhow::bail!("the engine was not ready within {timeout:?}")
}

/// Whether `GET /readyz` answers 200.
fn ready(api: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&api, Duration::from_millis(100)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}
