//! `tidegate-engine bench-router`: the router's three benchmark figures, against running
//! engines and a running router (scripts/bench-router.sh starts them).
//!
//! - `sessions`: returning sessions with a long history. Each session's first turn puts its
//!   history in an engine's cache (not timed); every later turn sends the whole history plus
//!   a new question and its time to first token is timed. Through the router the session's
//!   turns meet its engine; the baseline sends turn `t` straight to engine `t mod N`, as a
//!   plain Service spreads connections, so most turns land where the history is not cached.
//! - `overhead`: an open-loop load at `--rate` requests/s, one-token answers, alternately
//!   straight to one engine and through the router in front of it (A/B, `--rounds` times);
//!   the figure is the router's added p50 and p99 (medians over rounds).
//! - `overload`: `--rate` (set it at several times what the engines serve) through the router
//!   for `--duration`; counts answers by status, checks every refusal carries Retry-After, and
//!   samples the router process's resident memory every second.
//!
//! - `fairness`, `starvation`, `replicas`: flow control ([`crate::router_flow`]).
//!
//! Invariant: every figure printed says what it measured; nothing here is asserted (this is a
//! benchmark, not a test).

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use futures::StreamExt;
use serde_json::json;

fn parse_duration(s: &str) -> Result<Duration, String> {
    s.parse::<tidegate_api::Duration>()
        .map(|d| d.as_std())
        .map_err(|e| e.to_string())
}

/// Which figure to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Sessions,
    Overhead,
    Overload,
    Fairness,
    Starvation,
    Replicas,
}

/// Options of `bench-router`.
#[derive(Debug, Args)]
pub struct BenchRouterArgs {
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// The router's base URL.
    #[arg(long)]
    pub router: String,
    /// An engine's base URL (repeatable): the baseline's targets.
    #[arg(long = "engine")]
    pub engines: Vec<String>,
    /// Model name the engines serve.
    #[arg(long, default_value = "fake")]
    pub model: String,
    /// Sessions (sessions mode).
    #[arg(long, default_value_t = 12)]
    pub sessions: usize,
    /// Turns per session, the first untimed (sessions mode).
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Words of history each session starts with (about a token each).
    #[arg(long, default_value_t = 1000)]
    pub history_words: usize,
    /// Requests per second (overhead and overload modes).
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Length of one phase (overhead) or of the whole run (overload).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// A/B rounds (overhead mode).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Output tokens per request (overhead and overload modes).
    #[arg(long, default_value_t = 1)]
    pub max_tokens: u32,
    /// The router's process id, for its resident memory (overload mode).
    #[arg(long)]
    pub router_pid: Option<u32>,
    /// Another router in front of the same engines (repeatable; replicas mode).
    #[arg(long = "other-router")]
    pub other_routers: Vec<String>,
    /// Tenants with one stream each (fairness mode).
    #[arg(long, default_value_t = 8)]
    pub light_tenants: usize,
    /// Streams of the heavy tenant (fairness), of the top tier (starvation), or in all
    /// (replicas).
    #[arg(long, default_value_t = 48)]
    pub heavy_streams: usize,
    /// The tier the light (fairness), low (starvation) or all (replicas) requests name.
    #[arg(long, default_value = "free")]
    pub tier: String,
    /// The saturating tier (starvation mode).
    #[arg(long, default_value = "enterprise")]
    pub top_tier: String,
    /// The stated worst wait of the low tier (starvation mode), to print beside the figure.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub bound: Duration,
}

/// Runs the benchmark and prints its figures.
pub fn run(args: &BenchRouterArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(300))
            .build()?;
        match args.mode {
            Mode::Sessions => sessions(args, &http).await,
            Mode::Overhead => overhead(args, &http).await,
            Mode::Overload => overload(args, &http).await,
            Mode::Fairness => crate::router_flow::fairness(args, &http).await,
            Mode::Starvation => crate::router_flow::starvation(args, &http).await,
            Mode::Replicas => crate::router_flow::replicas(args, &http).await,
        }
    })
}

fn median(v: &mut [f64]) -> f64 {
    quantile(v, 0.5)
}

pub(crate) fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[(((v.len() - 1) as f64) * q).round() as usize]
}

/// A session's history: `words` pseudo-random words, distinct per session.
fn history(session: usize, words: usize) -> String {
    const WORDS: &[&str] = &[
        "river", "stone", "lamp", "garden", "signal", "copper", "window", "harbor", "meadow",
        "engine", "paper", "violet", "thunder", "orbit", "candle", "forest",
    ];
    (0..words)
        .map(|i| WORDS[(i * 7 + session * 13 + i / 5) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Streams one completion and returns seconds to its first token.
async fn ttft(
    http: &reqwest::Client,
    base: &str,
    model: &str,
    prompt: &str,
    session: &str,
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let resp = http
        .post(format!("{base}/v1/completions"))
        .header(tidegate_api::router::header::SESSION, session)
        .json(&json!({
            "model": model, "prompt": prompt, "max_tokens": 4, "stream": true,
            "temperature": 0.0, "ignore_eos": true,
        }))
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
    let mut body = resp.bytes_stream();
    let mut first = None;
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        if first.is_none() && chunk.windows(6).any(|w| w == b"\"text\"") {
            first = Some(t0.elapsed().as_secs_f64());
        }
    }
    first.context("no token in the stream")
}

/// Median TTFT of returning turns, through `route(session, turn)`.
async fn session_arm(
    args: &BenchRouterArgs,
    http: &reqwest::Client,
    tag: &str,
    route: impl Fn(usize) -> String,
) -> anyhow::Result<Vec<f64>> {
    let mut timed = Vec::new();
    for s in 0..args.sessions {
        let id = format!("{tag}-{s}");
        let mut prompt = history(s, args.history_words);
        for turn in 0..args.turns {
            prompt.push_str(&format!(" question {turn}?"));
            let t = ttft(http, &route(turn), &args.model, &prompt, &id).await?;
            if turn > 0 {
                timed.push(t);
            }
        }
    }
    Ok(timed)
}

async fn sessions(args: &BenchRouterArgs, http: &reqwest::Client) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.engines.is_empty(),
        "--engine is needed for the baseline"
    );
    let n = args.engines.len();
    let mut routed = session_arm(args, http, "routed", |_| args.router.clone()).await?;
    let mut spread =
        session_arm(args, http, "spread", |turn| args.engines[turn % n].clone()).await?;
    let (r, s) = (median(&mut routed), median(&mut spread));
    println!(
        "returning sessions ({} sessions × {} timed turns, {} words of history, {n} engines)",
        args.sessions,
        args.turns.saturating_sub(1),
        args.history_words
    );
    println!("  median TTFT through the router:   {:.1} ms", r * 1e3);
    println!("  median TTFT round-robin:          {:.1} ms", s * 1e3);
    println!("  ratio (round-robin ÷ router):     {:.1}×", s / r);
    Ok(())
}

/// Latencies (seconds) and statuses of an open-loop load at `rate` for `duration`.
async fn open_loop(
    args: &BenchRouterArgs,
    http: &reqwest::Client,
    base: &str,
) -> (Vec<f64>, Vec<(u16, bool)>) {
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(1.0));
    let n = (args.duration.as_secs_f64() * args.rate) as usize;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        tokio::time::sleep_until(start + interval * i as u32).await;
        let (http, url) = (http.clone(), format!("{base}/v1/completions"));
        let body = json!({
            "model": args.model, "prompt": format!("request {i}"),
            "max_tokens": args.max_tokens, "temperature": 0.0,
        });
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let resp = http.post(url).json(&body).send().await;
            match resp {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let retry = r.headers().contains_key("retry-after");
                    let _ = r.bytes().await;
                    (t0.elapsed().as_secs_f64(), status, retry)
                }
                Err(_) => (t0.elapsed().as_secs_f64(), 0, false),
            }
        }));
    }
    let mut lat = Vec::with_capacity(n);
    let mut statuses = Vec::with_capacity(n);
    for t in tasks {
        if let Ok((l, s, r)) = t.await {
            if s == 200 {
                lat.push(l);
            }
            statuses.push((s, r));
        }
    }
    (lat, statuses)
}

async fn overhead(args: &BenchRouterArgs, http: &reqwest::Client) -> anyhow::Result<()> {
    let engine = args.engines.first().context("--engine is needed")?;
    let (mut p50s, mut p99s) = (Vec::new(), Vec::new());
    println!(
        "router overhead: {} req/s open loop, {:?} per phase, {} A/B rounds",
        args.rate, args.duration, args.rounds
    );
    for round in 0..args.rounds {
        let (mut direct, ds) = open_loop(args, http, engine).await;
        let (mut routed, rs) = open_loop(args, http, &args.router).await;
        let bad = |s: &[(u16, bool)]| s.iter().filter(|(c, _)| *c != 200).count();
        let (d50, d99) = (quantile(&mut direct, 0.5), quantile(&mut direct, 0.99));
        let (r50, r99) = (quantile(&mut routed, 0.5), quantile(&mut routed, 0.99));
        println!(
            "  round {round}: direct p50 {:.3} ms p99 {:.3} ms | router p50 {:.3} ms p99 {:.3} ms | non-200: {} / {}",
            d50 * 1e3,
            d99 * 1e3,
            r50 * 1e3,
            r99 * 1e3,
            bad(&ds),
            bad(&rs)
        );
        p50s.push(r50 - d50);
        p99s.push(r99 - d99);
    }
    println!(
        "  added by the router (median of rounds): p50 {:.3} ms, p99 {:.3} ms",
        median(&mut p50s) * 1e3,
        median(&mut p99s) * 1e3
    );
    Ok(())
}

/// Resident memory of `pid` in MiB (Linux).
fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

async fn overload(args: &BenchRouterArgs, http: &reqwest::Client) -> anyhow::Result<()> {
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::<f64>::new()));
    let sampler = args.router_pid.map(|pid| {
        let samples = std::sync::Arc::clone(&samples);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(m) = rss_mib(pid) else { return };
                if let Ok(mut v) = samples.lock() {
                    v.push(m);
                }
            }
        })
    });
    let (_, statuses) = open_loop(args, http, &args.router).await;
    if let Some(s) = sampler {
        s.abort();
    }
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for (s, _) in &statuses {
        *by_status.entry(*s).or_default() += 1;
    }
    let refusals = statuses.iter().filter(|(s, _)| *s != 200).count();
    let with_retry = statuses.iter().filter(|(s, r)| *s != 200 && *r).count();
    println!(
        "overload: {} req/s through the router for {:?}",
        args.rate, args.duration
    );
    println!("  answers by status: {by_status:?} (0 = no answer)");
    println!("  refusals with Retry-After: {with_retry} of {refusals}");
    let v = samples.lock().map(|v| v.clone()).unwrap_or_default();
    if let (Some(first), Some(last)) = (v.first(), v.last()) {
        let peak = v.iter().copied().fold(0.0, f64::max);
        let tenth = v.len() / 10;
        println!(
            "  router RSS: {first:.1} MiB at the start, {:.1} MiB after 10% of the run, peak {peak:.1} MiB, {last:.1} MiB at the end ({} samples)",
            v[tenth],
            v.len()
        );
    }
    Ok(())
}
