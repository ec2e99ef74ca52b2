//! Shared test helpers: the seed-42 random model written once per test binary into a
//! private temporary directory, a float comparison, an engine loop started and waited on, and
//! a server's `/metrics` text, and a client that writes a whole body before reading.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tidegate_runner::model::ModelFiles;
use tidegate_runner::model::random::write_random_model;
use tidegate_server::backend::Engine;
use tidegate_server::engine_loop::{LoopConfig, LoopEngine};
use tidegate_server::metrics::Metrics;

/// Directory holding the seed-42 random model (created on first use).
pub fn random_model_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("tidegate-random-model-{}", std::process::id()));
        write_random_model(&dir, 42).expect("write random model");
        dir
    })
    .clone()
}

/// The seed-42 random model, loaded.
pub fn random_model() -> ModelFiles {
    ModelFiles::load(&random_model_dir()).expect("load random model")
}

/// The engine loop on `files`, once it is ready (weights packed, KV pool built; 30 s at most).
pub async fn ready_loop_engine(
    files: ModelFiles,
    config: LoopConfig,
    metrics: Arc<Metrics>,
) -> Arc<dyn Engine> {
    let engine = LoopEngine::start(files, config, metrics).unwrap();
    for _ in 0..600 {
        if engine.is_ready() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(engine.is_ready(), "engine loaded");
    engine
}

/// Largest absolute difference, asserting it is below `tol`.
pub fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst <= tol, "{what}: max abs diff {worst} > {tol}");
}

/// Where the SmolLM2 GGUF is expected (fetched by scripts/fetch-model.sh), if present.
pub fn smollm2_path() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("models").join("smollm2");
    let found = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "gguf"));
    if found.is_none() {
        println!("note: models/smollm2 not present (run scripts/fetch-model.sh); skipping");
    }
    found
}

/// The `/metrics` text of the server at `base` (`http://host:port`).
pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Reads one HTTP/1.1 response (head and a Content-Length body) from a blocking socket.
pub fn read_response(conn: &mut std::net::TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    use std::io::Read;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok((head, body))
}

/// Sends a request with a JSON body of `body_bytes` whole, then reads the answer (as
/// Python's urllib does).
pub fn send_whole(addr: String, body_bytes: usize) -> std::io::Result<(String, Vec<u8>)> {
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    conn.set_write_timeout(Some(Duration::from_secs(30)))?;
    let pad = body_bytes.saturating_sub(r#"{"prompt": ""}"#.len());
    let body = format!(r#"{{"prompt": "{}"}}"#, "x".repeat(pad));
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body.as_bytes())?;
    read_response(&mut conn)
}
