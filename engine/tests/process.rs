//! The real binary: `serve --fake-model` refuses to start without an admin token, a device
//! this build cannot use is refused at once, and a drain through the admin API ends the
//! process with exit code 0.

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
