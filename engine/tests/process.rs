//! The real binary: `serve --fake-model` refuses to start without an admin token, a device
//! this build cannot use is refused at once, a drain through the admin API ends the
//! process with exit code 0, and `bench --random-config` runs random weights of a config's
//! shapes through the candle runner and the engine loop (or names what is wrong with it),
//! and `--cpu-kernels` lowers the float kernels with the int8 ones.

// Test helpers outside #[test] functions: unwrap is the point here.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tidegate-engine");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn refuses_to_start_without_admin_token() {
    let out = Command::new(BIN)
        .args(["serve", "--fake-model", "--listen", "127.0.0.1:0"])
        .env_remove("TIDEGATE_ADMIN_TOKEN")
        .env_remove("TIDEGATE_ADMIN_TOKEN_FILE")
        .env_remove("TIDEGATE_ADMIN_DISABLED")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("admin API needs a token"), "{err}");
}

#[test]
fn refuses_a_device_or_runner_it_cannot_use_before_loading_anything() {
    let serve = |extra: &[&str]| {
        let out = Command::new(BIN)
            .args(["serve", "--model", "/no/such/model", "--admin-disabled"])
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{extra:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = serve(&["--device", "cuda", "--runner", "packed"]);
    assert!(err.contains("packed runs only on the CPU"), "{err}");
    if !cfg!(feature = "cuda") {
        let err = serve(&["--device", "cuda"]);
        assert!(err.contains("without CUDA support"), "{err}");
        assert!(err.contains("`cuda` cargo feature"), "{err}");
    }
    let err = serve(&["--device", "tpu"]);
    assert!(err.contains("expected cpu, cuda or cuda:N"), "{err}");
}

const TINY_CONFIG: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
 "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
 "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 2048,
 "tie_word_embeddings": false}"#;

/// `bench --device cpu --runner candle --random-config FILE` with small levels.
fn random_bench(config: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.json");
    std::fs::write(&path, config).unwrap();
    Command::new(BIN)
        .args([
            "bench",
            "--device",
            "cpu",
            "--runner",
            "candle",
            "--random-config",
        ])
        .arg(&path)
        .args([
            "--concurrency",
            "1,4",
            "--prompt-tokens",
            "8",
            "--output-tokens",
            "8",
        ])
        .args([
            "--rounds",
            "1",
            "--history",
            "0",
            "--kv-blocks",
            "64",
            "--threads",
            "2",
        ])
        .arg("--json")
        .output()
        .unwrap()
}

#[test]
fn bench_runs_random_weights_of_a_config_through_the_candle_runner() {
    let out = random_bench(TINY_CONFIG);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The figures are the last line, one JSON object (as scripts/gpu-bench.sh reads them).
    let last = stdout.lines().rfind(|l| l.starts_with('{')).unwrap();
    let report: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(report["runner"], "candle");
    assert_eq!(report["device"], "cpu");
    assert!(
        report["weights"].as_str().unwrap().contains("f32 random"),
        "{report}"
    );
    let levels = report["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2, "{report}");
    for (l, c) in levels.iter().zip([1, 4]) {
        assert_eq!(l["concurrency"], c);
        for key in ["steady_decode_tokens_per_s", "ttft_p50_s", "itl_p50_s"] {
            assert!(l[key].as_f64().unwrap() > 0.0, "{key} in {l}");
        }
    }
    eprintln!("{last}");
}

#[test]
fn bench_names_the_field_a_random_config_lacks_or_gets_wrong() {
    let fails = |config: &str| {
        let out = random_bench(config);
        assert!(!out.status.success(), "{config}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = fails(&TINY_CONFIG.replace(r#""num_attention_heads": 4, "#, ""));
    assert!(err.contains("--random-config"), "{err}");
    assert!(err.contains("missing field `num_attention_heads`"), "{err}");
    let err = fails(&TINY_CONFIG.replace(r#""hidden_size": 64"#, r#""hidden_size": "64""#));
    assert!(err.contains("field hidden_size: invalid type"), "{err}");
    let err =
        fails(&TINY_CONFIG.replace(r#""num_key_value_heads": 2"#, r#""num_key_value_heads": 3"#));
    assert!(
        err.contains("not divisible by num_key_value_heads 3"),
        "{err}"
    );
}

#[tokio::test]
async fn admin_drain_exits_zero() {
    let (port, admin_port) = (free_port(), free_port());
    let mut child = Command::new(BIN)
        .args(["serve", "--fake-model", "--log-format", "json"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
        .env("TIDEGATE_ADMIN_TOKEN", "tok")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = client
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await;
        if ready.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "engine never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resp = client
        .post(format!("http://127.0.0.1:{admin_port}/admin/v1/drain"))
        .header("authorization", "Bearer tok")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "engine did not exit after draining"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
}

/// `--cpu-kernels SET bench-model --bandwidth-only`: its `kernel sets` line.
fn kernel_sets_under(cap: &str) -> Result<String, String> {
    let out = Command::new(BIN)
        .args(["--cpu-kernels", cap, "bench-model", "--bandwidth-only"])
        .env_remove("TIDEGATE_CPU_KERNELS")
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("kernel sets:"));
    Ok(line.unwrap_or_default().to_string())
}

/// The cap holds every kernel family to what a CPU with that int8 set has, so an AVX-512
/// machine runs an AVX2-only CPU's paths under `--cpu-kernels avx2`.
#[test]
fn cpu_kernels_caps_the_float_kernels_too() {
    assert_eq!(
        kernel_sets_under("portable").unwrap(),
        "kernel sets: int8 portable, f32 portable"
    );
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = kernel_sets_under("avx2");
        if has!("avx2") && has!("fma") && has!("f16c") {
            assert_eq!(avx2.unwrap(), "kernel sets: int8 avx2, f32 avx2");
        } else {
            let err = avx2.unwrap_err();
            assert!(err.contains("this CPU lacks its instructions"), "{err}");
        }
    }
}
