//! A returning session whose KV was spilled to disk, through the real engine loop (scheduler,
//! paged KV cache, runner) on the seed-42 random model over HTTP: restored intact when the
//! spill file is intact; when the file is truncated, corrupted or gone, the session is
//! recomputed by prefill instead, gives the same greedy answer, and the recompute and the
//! restore-failure counters both rise.
//!
//! The disk round trip and one damaged case also run on the candle device runner, whose
//! block images come from its device-resident pool.
//!
//! The pool is five 16-token blocks with no host tier: session A (3 blocks) is offloaded to
//! disk when session B (4 blocks) needs room, and B is offloaded in turn when A returns.

// Test helpers outside #[test] functions: unwrap is the point here.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tidegate_kv::kv_cache::spill_file::PARTIAL_SUFFIX;
use tidegate_runner::model::ModelFiles;
use tidegate_runner::{DeviceChoice, Placement, RunnerChoice};
use tidegate_server::api::{self as server, RunningServer, ServerConfig};
use tidegate_server::engine_loop::LoopConfig;
use tidegate_server::metrics::Metrics;
use tokio::net::TcpListener;

struct Harness {
    base: String,
    client: reqwest::Client,
    spill: tempfile::TempDir,
    _server: RunningServer,
}

async fn start(placement: Placement) -> Harness {
    let spill = tempfile::tempdir().unwrap();
    let metrics = Metrics::new();
    let files = ModelFiles::load(&common::random_model_dir()).unwrap();
    let config = LoopConfig {
        model_id: "test-model".into(),
        kv_blocks: 5,
        kv_block_tokens: 16,
        kv_host_bytes: 0,
        kv_disk_bytes: 1 << 24,
        kv_disk_dir: Some(spill.path().to_path_buf()),
        max_batch_tokens: 256,
        placement,
        ..LoopConfig::default()
    };
    let engine = common::ready_loop_engine(files, config, metrics.clone()).await;
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = server::start(ServerConfig::default(), api, None, engine, metrics).unwrap();
    Harness {
        base: format!("http://{}", server.api_addr),
        client: reqwest::Client::new(),
        spill,
        _server: server,
    }
}

impl Harness {
    async fn complete(&self, body: Value) -> Value {
        let resp = self
            .client
            .post(format!("{}/v1/completions", self.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.json().await.unwrap()
    }

    async fn metrics(&self) -> String {
        let url = format!("{}/metrics", self.base);
        let resp = self.client.get(url).send().await.unwrap();
        resp.text().await.unwrap()
    }

    /// Polls `/metrics` until `series` reaches `want` (counters are published at the end of
    /// the step that finished a request, which may be just after its response).
    async fn wait_metric(&self, series: &str, want: f64) -> String {
        let mut text = self.metrics().await;
        for _ in 0..100 {
            if metric(&text, series) >= want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            text = self.metrics().await;
        }
        text
    }

    fn spill_files(&self) -> Vec<PathBuf> {
        spill_files(self.spill.path())
    }

    /// The spill files once there are `n` (the writer thread writes them after the offload
    /// is counted; a file appears under its name only when whole), or what is there after 5 s.
    async fn wait_spill_files(&self, n: usize) -> Vec<PathBuf> {
        let mut files = self.spill_files();
        for _ in 0..250 {
            if files.len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            files = self.spill_files();
        }
        files
    }
}

fn spill_files(dir: &Path) -> Vec<PathBuf> {
    // A file still being written (under its partial name) is not a spill file yet.
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().ends_with(PARTIAL_SUFFIX))
        .collect();
    files.sort();
    files
}

/// The value of one sample line (`name{labels} value`), 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn session_request(session: &str, prompt: &[u32]) -> Value {
    json!({
        "prompt": prompt,
        "max_tokens": 4,
        "ignore_eos": true,
        "temperature": 0,
        "session_id": session,
    })
}

const DISK: &str = "tidegate_engine_restores_total{source=\"disk\"}";
const RECOMPUTE: &str = "tidegate_engine_restores_total{source=\"recompute\"}";
const FAILED_DISK: &str = "tidegate_engine_kv_restore_failures_total{source=\"disk\"}";
const OFFLOADS: &str = "tidegate_engine_evictions_total{tier=\"default\",action=\"offload\"}";

/// What to do to session A's spill file before A returns.
#[derive(Clone, Copy, Debug)]
enum Damage {
    None,
    Truncate,
    Corrupt,
    Delete,
}

fn damage(path: &Path, how: Damage) {
    let len = std::fs::metadata(path).unwrap().len();
    match how {
        Damage::None => {}
        Damage::Truncate => {
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            f.set_len(len / 2).unwrap();
        }
        Damage::Corrupt => {
            // Same length; a stretch in the middle (the second block's K and V) becomes NaN.
            let mut bytes = std::fs::read(path).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid - 2048..mid + 2048].fill(0xFF);
            std::fs::write(path, bytes).unwrap();
        }
        Damage::Delete => std::fs::remove_file(path).unwrap(),
    }
}

/// The two answers session A gets (first visit, return after its KV went to disk and had
/// `how` done to it) and the metrics after the return.
async fn serve_offload_return(how: Damage) -> (Value, Value, String) {
    serve_offload_return_on(how, Placement::cpu_packed()).await
}

async fn serve_offload_return_on(how: Damage, placement: Placement) -> (Value, Value, String) {
    let h = start(placement).await;
    let prompt_a: Vec<u32> = (10..50).collect();
    let prompt_b: Vec<u32> = (100..160).collect();
    let first = h.complete(session_request("a", &prompt_a)).await;
    assert!(h.spill_files().is_empty());
    h.complete(session_request("b", &prompt_b)).await;
    let m = h.wait_metric(OFFLOADS, 1.0).await;
    assert_eq!(metric(&m, OFFLOADS), 1.0, "A was offloaded for B:\n{m}");
    let files = h.wait_spill_files(1).await;
    assert_eq!(files.len(), 1, "A's KV is one spill file: {files:?}");
    damage(&files[0], how);
    let before = h.metrics().await;
    let again = h.complete(session_request("a", &prompt_a)).await;
    let want = metric(&before, DISK) + metric(&before, RECOMPUTE) + 1.0;
    let mut after = h.metrics().await;
    for _ in 0..100 {
        if metric(&after, DISK) + metric(&after, RECOMPUTE) >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = h.metrics().await;
    }
    (first, again, after)
}

fn text(v: &Value) -> &Value {
    &v["choices"][0]["text"]
}

/// The control: an intact spill file is restored from disk (so the damaged cases below really
/// go through the disk restore path) and gives the first visit's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intact_spill_file_is_restored_from_disk() {
    let (first, again, m) = serve_offload_return(Damage::None).await;
    assert_eq!(text(&first), text(&again), "{first}\n{again}");
    assert_eq!(metric(&m, DISK), 1.0, "{m}");
    assert_eq!(metric(&m, RECOMPUTE), 0.0, "{m}");
    assert_eq!(metric(&m, FAILED_DISK), 0.0, "{m}");
}

fn candle_cpu() -> Placement {
    Placement::resolve(DeviceChoice::Cpu, Some(RunnerChoice::Candle)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intact_spill_file_is_restored_from_disk_on_the_candle_runner() {
    let (first, again, m) = serve_offload_return_on(Damage::None, candle_cpu()).await;
    assert_eq!(text(&first), text(&again), "{first}\n{again}");
    assert_eq!(metric(&m, DISK), 1.0, "{m}");
    assert_eq!(metric(&m, RECOMPUTE), 0.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_spill_file_is_recomputed_on_the_candle_runner() {
    let (first, again, m) = serve_offload_return_on(Damage::Corrupt, candle_cpu()).await;
    assert_eq!(text(&first), text(&again), "{first}\n{again}");
    assert_eq!(metric(&m, RECOMPUTE), 1.0, "{m}");
    assert_eq!(metric(&m, FAILED_DISK), 1.0, "{m}");
}

async fn damaged_spill_file_is_recomputed(how: Damage) {
    let (first, again, m) = serve_offload_return(how).await;
    assert_eq!(text(&first), text(&again), "{how:?}: {first}\n{again}");
    assert_eq!(
        metric(&m, DISK),
        0.0,
        "{how:?}: no disk restore counted\n{m}"
    );
    assert_eq!(
        metric(&m, RECOMPUTE),
        1.0,
        "{how:?}: recompute counted\n{m}"
    );
    assert_eq!(
        metric(&m, FAILED_DISK),
        1.0,
        "{how:?}: failure counted\n{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_spill_file_is_recomputed() {
    damaged_spill_file_is_recomputed(Damage::Truncate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_spill_file_is_recomputed() {
    damaged_spill_file_is_recomputed(Damage::Corrupt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_spill_file_is_recomputed() {
    damaged_spill_file_is_recomputed(Damage::Delete).await;
}
