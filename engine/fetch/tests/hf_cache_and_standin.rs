//! The `hf://` source: from a Hugging Face cache laid out as the hub writes it (offline), and
//! its download path against a stand-in for the hub's HTTP API on loopback (the revision
//! API, `resolve` redirecting to a CDN path, `Range` resumes). The stand-in answers as the
//! hub's documented API does; it is not the hub, which no test machine here can reach.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tidegate_fetch::{Cause, Credentials, FetchRequest, fetch};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn request(
    uri: &str,
    dest: &Path,
    home: &Path,
    endpoint: Option<String>,
    offline: bool,
) -> FetchRequest {
    FetchRequest {
        uri: uri.into(),
        dest: dest.to_path_buf(),
        endpoint,
        region: None,
        credentials: Credentials {
            hf_token: Some("hf_test".into()),
            ..Credentials::default()
        },
        hf_home: Some(home.to_path_buf()),
        offline,
    }
}

/// A cache with `files` at COMMIT, `main` pointing at it, as the hub's tools write it.
fn cached(home: &Path, files: &[(&str, &[u8])]) {
    let repo = home.join("hub/models--org--tiny");
    for (name, bytes) in files {
        let id = sha256(bytes);
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(repo.join("blobs").join(&id), bytes).unwrap();
        let snap = repo.join("snapshots").join(COMMIT);
        std::fs::create_dir_all(&snap).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{id}"), snap.join(name)).unwrap();
    }
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
}

#[tokio::test]
async fn offline_the_cache_serves_a_cached_revision_and_names_a_missing_one() {
    let home = tempfile::tempdir().unwrap();
    cached(
        home.path(),
        &[("config.json", b"{}"), ("model.safetensors", b"weights")],
    );
    let dest = home.path().join("dest");
    fetch(&request("hf://org/tiny", &dest, home.path(), None, true))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(dest.join("model.safetensors")).unwrap(),
        b"weights"
    );
    let e = fetch(&request("hf://org/tiny@v9", &dest, home.path(), None, true))
        .await
        .unwrap_err();
    assert!(matches!(e.cause, Cause::NotCached(_)), "{e}");
    assert!(
        e.to_string()
            .starts_with("hf://org/tiny@v9: not in the Hugging Face cache"),
        "{e}"
    );
}

#[tokio::test]
async fn an_unreachable_hub_falls_back_to_the_cache() {
    let home = tempfile::tempdir().unwrap();
    cached(home.path(), &[("config.json", b"{}")]);
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dest = home.path().join("dest");
    let hub = Some(format!("http://{closed}"));
    fetch(&request("hf://org/tiny", &dest, home.path(), hub, false))
        .await
        .unwrap();
    assert!(dest.join("config.json").is_file());
}

/// What the stand-in serves and saw.
struct Hub {
    weights: Vec<u8>,
    /// Range headers of the weight requests.
    ranges: Mutex<Vec<Option<String>>>,
    /// Authorization headers seen on the CDN path (must be none).
    cdn_auth: Mutex<Vec<String>>,
    /// Where `resolve` redirects LFS files: another host (port), as the hub's CDN is.
    cdn: Mutex<String>,
}

fn serve(listener: TcpListener, hub: Arc<Hub>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { return };
        let hub = Arc::clone(&hub);
        std::thread::spawn(move || answer(stream, &hub));
    }
}

fn answer(mut s: TcpStream, hub: &Hub) {
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).unwrap();
        if h.trim().is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        match k.to_ascii_lowercase().as_str() {
            "range" => range = Some(v.trim().to_string()),
            "authorization" => auth = Some(v.trim().to_string()),
            _ => {}
        }
    }
    let w = &hub.weights;
    let reply = |s: &mut TcpStream, status: &str, headers: &str, body: &[u8]| {
        let head = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n{headers}\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
    };
    if path.starts_with("/api/models/org/tiny/revision/main") {
        let json = format!(
            r#"{{"sha":"{COMMIT}","siblings":[{{"rfilename":"config.json","blobId":"b1","size":2}},{{"rfilename":"model.safetensors","blobId":"b2","size":{},"lfs":{{"sha256":"{}","size":{}}}}},{{"rfilename":"pytorch_model.bin","blobId":"b3","size":5}}]}}"#,
            w.len(),
            sha256(w),
            w.len()
        );
        reply(
            &mut s,
            "200 OK",
            "content-type: application/json\r\n",
            json.as_bytes(),
        );
    } else if path.starts_with("/api/models/") {
        reply(&mut s, "401 Unauthorized", "", b"");
    } else if path == format!("/org/tiny/resolve/{COMMIT}/config.json") {
        reply(&mut s, "200 OK", "", b"{}");
    } else if path == format!("/org/tiny/resolve/{COMMIT}/model.safetensors") {
        let to = format!("location: {}/cdn/weights\r\n", hub.cdn.lock().unwrap());
        reply(&mut s, "302 Found", &to, b"");
    } else if path == "/cdn/weights" {
        hub.ranges.lock().unwrap().push(range.clone());
        if let Some(a) = auth {
            hub.cdn_auth.lock().unwrap().push(a);
        }
        let from: usize = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
            .unwrap_or(0);
        let status = if from > 0 {
            "206 Partial Content"
        } else {
            "200 OK"
        };
        reply(&mut s, status, "", &w[from..]);
    } else {
        reply(&mut s, "404 Not Found", "", b"");
    }
    let _ = s.read(&mut [0u8; 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_go_into_the_cache_layout_resume_and_are_verified() {
    let weights: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let hub = Arc::new(Hub {
        weights: weights.clone(),
        ranges: Mutex::new(Vec::new()),
        cdn_auth: Mutex::new(Vec::new()),
        cdn: Mutex::new(String::new()),
    });
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = Some(format!("http://{}", listener.local_addr().unwrap()));
    let cdn = TcpListener::bind("127.0.0.1:0").unwrap();
    *hub.cdn.lock().unwrap() = format!("http://{}", cdn.local_addr().unwrap());
    for l in [listener, cdn] {
        let h = Arc::clone(&hub);
        std::thread::spawn(move || serve(l, h));
    }

    let home = tempfile::tempdir().unwrap();
    let id = sha256(&weights);
    // A partial blob, as an interrupted download leaves it.
    let blobs = home.path().join("hub/models--org--tiny/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("{id}.incomplete")), &weights[..50_000]).unwrap();

    let dest = home.path().join("dest");
    fetch(&request(
        "hf://org/tiny",
        &dest,
        home.path(),
        endpoint.clone(),
        false,
    ))
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(dest.join("model.safetensors")).unwrap(),
        weights
    );
    assert_eq!(std::fs::read(dest.join("config.json")).unwrap(), b"{}");
    assert!(
        !dest.join("pytorch_model.bin").exists(),
        "not a file the engine reads"
    );
    assert!(blobs.join(&id).is_file() && !blobs.join(format!("{id}.incomplete")).exists());
    let refs = home.path().join("hub/models--org--tiny/refs/main");
    assert_eq!(std::fs::read_to_string(refs).unwrap(), COMMIT);
    assert_eq!(
        *hub.ranges.lock().unwrap(),
        [Some("bytes=50000-".to_string())]
    );
    assert!(
        hub.cdn_auth.lock().unwrap().is_empty(),
        "the token stays on the hub's host"
    );

    // Everything in place: nothing is downloaded again.
    fetch(&request(
        "hf://org/tiny",
        &dest,
        home.path(),
        endpoint.clone(),
        false,
    ))
    .await
    .unwrap();
    assert_eq!(hub.ranges.lock().unwrap().len(), 1);

    // A revision the hub refuses: not found, or a token is needed.
    let e = fetch(&request(
        "hf://org/other",
        &dest,
        home.path(),
        endpoint,
        false,
    ))
    .await
    .unwrap_err();
    assert!(matches!(e.cause, Cause::Denied(_)), "{e}");
}
