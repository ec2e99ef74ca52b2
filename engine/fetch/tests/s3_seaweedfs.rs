//! The S3 source against a real S3 server: SeaweedFS's `weed server -s3` on loopback with an
//! access key (`scripts/seaweedfs.sh path` gives the binary; set `TIDEGATE_TEST_WEED` to it).
//! Without the variable the test says so and passes: `e2e/model-sources.sh` runs the same
//! server in CI.
#![allow(clippy::unwrap_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use object_store::path::Path as StorePath;
use object_store::{ObjectStoreExt, PutPayload};
use tidegate_fetch::s3::{S3Options, partial_path, store};
use tidegate_fetch::{Cause, Credentials, FetchRequest, MANIFEST, fetch};

const ACCESS: &str = "fetch-test";
const SECRET: &str = "fetch-test-secret";

struct Weed {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl Drop for Weed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `n` distinct free ports below the kernel's ephemeral range. A port picked by binding to 0
/// comes from that range, where weed's own connections between its parts (master, volume,
/// filer, gateway) take their local ports: one of them could take a port before the part
/// meant to listen on it binds it. `e2e/lib.sh`'s `listen_ports` picks the same way.
fn ports(n: usize) -> Vec<u16> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let high = if low > 21000 { low } else { 32768 };
    // A seed from the clock and the pid: two test processes pick different ports.
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        ^ ((std::process::id() as u64) << 32);
    let mut found = Vec::new();
    for _ in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = 20000 + (x % u64::from(high - 20000)) as u16;
        if !found.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            found.push(port);
            if found.len() == n {
                return found;
            }
        }
    }
    panic!("no {n} free ports in 20000..{high}");
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Starts `weed server` on fresh ports and waits until the gateway takes a signed request.
/// A server that exits (a port taken after all) is started again on other ports, up to three
/// times; one that neither exits nor answers in 180 s fails the test with its log.
fn start_weed(bin: &Path) -> Weed {
    for attempt in 1..=3 {
        match try_start_weed(bin) {
            Ok(w) => return w,
            Err(why) => eprintln!("SeaweedFS, attempt {attempt}: {why}"),
        }
    }
    panic!("SeaweedFS did not start in three attempts (the logs are above)");
}

fn try_start_weed(bin: &Path) -> Result<Weed, String> {
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("s3.json");
    std::fs::write(
        &ids,
        format!(r#"{{"identities":[{{"name":"t","credentials":[{{"accessKey":"{ACCESS}","secretKey":"{SECRET}"}}],"actions":["Admin","Read","List","Tagging","Write"]}}]}}"#),
    )
    .unwrap();
    let p = ports(8);
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let log = dir.path().join("weed.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(bin)
        .args([
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-filer",
            "-s3",
        ])
        .arg(format!("-dir={}", data.display()))
        .arg(format!("-master.port={}", p[1]))
        .arg(format!("-master.port.grpc={}", p[2]))
        .arg(format!("-volume.port={}", p[3]))
        .arg(format!("-volume.port.grpc={}", p[4]))
        .arg(format!("-filer.port={}", p[5]))
        .arg(format!("-filer.port.grpc={}", p[6]))
        .arg(format!("-s3.port={}", p[0]))
        .arg(format!("-s3.port.grpc={}", p[7]))
        .arg(format!("-s3.config={}", ids.display()))
        // No fixed ports: the Iceberg and Lance catalogs are off.
        .args(["-s3.port.iceberg=0", "-s3.port.lance=0"])
        .args(["-master.volumeSizeLimitMB=64", "-volume.max=8"])
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let endpoint = format!("http://127.0.0.1:{}", p[0]);
    let mut w = Weed {
        child,
        endpoint,
        _dir: dir,
    };
    // The bucket, with a signed request once the gateway answers.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(180) {
        if let Ok(Some(status)) = w.child.try_wait() {
            return Err(format!(
                "weed exited ({status}); its log:\n{}",
                log_tail(&log)
            ));
        }
        let ok = Command::new("curl")
            .args([
                "-sf",
                "-X",
                "PUT",
                "--aws-sigv4",
                "aws:amz:us-east-1:s3",
                "--user",
            ])
            .arg(format!("{ACCESS}:{SECRET}"))
            .arg(format!("{}/models", w.endpoint))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            eprintln!(
                "SeaweedFS answered after {:.1} s",
                t0.elapsed().as_secs_f64()
            );
            return Ok(w);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!(
        "SeaweedFS did not answer within 180 s; its log:\n{}",
        log_tail(&log)
    );
}

fn opts(endpoint: &str, secret: &str) -> S3Options {
    S3Options {
        endpoint: Some(endpoint.to_string()),
        region: None,
        credentials: Credentials {
            access_key_id: Some(ACCESS.into()),
            secret_access_key: Some(secret.into()),
            ..Credentials::default()
        },
    }
}

fn request(endpoint: &str, uri: &str, dest: &Path, secret: &str) -> FetchRequest {
    let o = opts(endpoint, secret);
    FetchRequest {
        uri: uri.into(),
        dest: dest.to_path_buf(),
        endpoint: o.endpoint,
        region: None,
        credentials: o.credentials,
        hf_home: None,
        offline: false,
    }
}

fn weed() -> Option<PathBuf> {
    let bin = std::env::var_os("TIDEGATE_TEST_WEED").map(PathBuf::from);
    if bin.is_none() {
        eprintln!(
            "TIDEGATE_TEST_WEED is not set: skipping the SeaweedFS tests (e2e/model-sources.sh runs them)"
        );
    }
    bin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_fetches_resume_verify_and_name_their_failures() {
    let Some(bin) = weed() else { return };
    let w = start_weed(&bin);
    let s = store("models", &opts(&w.endpoint, SECRET)).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    s.put(
        &StorePath::from("m/weights.bin"),
        PutPayload::from(big.clone()),
    )
    .await
    .unwrap();
    s.put(
        &StorePath::from("m/config.json"),
        PutPayload::from_static(b"{}"),
    )
    .await
    .unwrap();
    let meta = s.head(&StorePath::from("m/weights.bin")).await.unwrap();
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("m");

    // A partial download of the same version resumes: only the rest is fetched.
    let part = partial_path(&dest, "weights.bin", meta.e_tag.as_deref());
    std::fs::create_dir_all(part.parent().unwrap()).unwrap();
    std::fs::write(&part, &big[..1_000_000]).unwrap();
    fetch(&request(&w.endpoint, "s3://models/m", &dest, SECRET))
        .await
        .unwrap();
    assert_eq!(std::fs::read(dest.join("weights.bin")).unwrap(), big);
    assert_eq!(std::fs::read(dest.join("config.json")).unwrap(), b"{}");
    assert!(dest.join(MANIFEST).is_file() && !part.exists());

    // A corrupt partial fails the MD5 check (the ETag of a single-part upload) and is
    // dropped, so the next try succeeds.
    std::fs::remove_file(dest.join(MANIFEST)).unwrap();
    std::fs::create_dir_all(part.parent().unwrap()).unwrap();
    std::fs::write(&part, vec![0u8; 1_000_000]).unwrap();
    let e = fetch(&request(&w.endpoint, "s3://models/m", &dest, SECRET))
        .await
        .unwrap_err();
    assert!(matches!(e.cause, Cause::Corrupt(_)), "{e}");
    assert!(e.to_string().contains("checksum"), "{e}");
    fetch(&request(&w.endpoint, "s3://models/m", &dest, SECRET))
        .await
        .unwrap();
    assert_eq!(std::fs::read(dest.join("weights.bin")).unwrap(), big);

    // An object removed from the prefix leaves the folder at the next fetch.
    s.delete(&StorePath::from("m/config.json")).await.unwrap();
    fetch(&request(&w.endpoint, "s3://models/m", &dest, SECRET))
        .await
        .unwrap();
    assert!(!dest.join("config.json").exists());

    // A single object by its key.
    let one = out.path().join("one");
    fetch(&request(
        &w.endpoint,
        "s3://models/m/weights.bin",
        &one,
        SECRET,
    ))
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(one.join("weights.bin")).unwrap().len(),
        big.len()
    );

    // A wrong secret key, a missing prefix: the URI and the cause.
    let e = fetch(&request(
        &w.endpoint,
        "s3://models/m",
        &out.path().join("x"),
        "wrong",
    ))
    .await
    .unwrap_err();
    assert!(matches!(e.cause, Cause::Denied(_)), "{e}");
    assert!(
        e.to_string()
            .starts_with("s3://models/m: credentials refused"),
        "{e}"
    );
    let e = fetch(&request(
        &w.endpoint,
        "s3://models/absent",
        &out.path().join("y"),
        SECRET,
    ))
    .await
    .unwrap_err();
    assert!(matches!(e.cause, Cause::NotFound(_)), "{e}");
}
