//! Adoption after an operator restart: the engines of the book that still run are taken
//! over with their token and count; one that is gone later counts as retired; a clean
//! shutdown kills the adopted ones too.

use super::*;

/// A stand-in engine: a process whose command line ends with the API port, as an engine's
/// `--listen 127.0.0.1:PORT` does.
fn stand_in(api_port: u16) -> std::process::Child {
    // Two commands, so the shell stays (a lone `sleep` would be exec'd, and the command line
    // with the port in it would be gone by the time the runtime reads it).
    let child = std::process::Command::new("sh")
        .args(["-c", "sleep 60; exit 0", &format!("127.0.0.1:{api_port}")])
        .spawn()
        .expect("spawn sh");
    // Until the child has exec'd, its /proc command line is still this test binary's, and
    // the runtime rightly refuses to adopt it: wait for the exec before a book names it.
    let cmdline = format!("/proc/{}/cmdline", child.id());
    let port = api_port.to_string();
    for _ in 0..500 {
        let exec_done = std::fs::read(&cmdline)
            .map(|c| String::from_utf8_lossy(&c).contains(&port))
            .unwrap_or(true);
        if exec_done {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child
}

fn config(book: &Path) -> LocalRuntimeConfig {
    LocalRuntimeConfig {
        engine_bin: PathBuf::from("tidegate-engine"),
        base_dir: PathBuf::from("."),
        log_dir: book.with_file_name("logs"),
        admin_token: "fresh-token".into(),
        extra_args: Vec::new(),
        file_sd_path: None,
        engine_book: Some(book.to_path_buf()),
        routers_file: None,
        secrets: Default::default(),
    }
}

fn pool() -> PoolRef {
    PoolRef {
        namespace: "ns".into(),
        name: "p".into(),
    }
}

#[tokio::test]
async fn a_restarted_runtime_adopts_the_engines_that_still_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("engines.json");
    let (live_port, dead_port) = (free_port().expect("port"), free_port().expect("port"));
    let mut live = stand_in(live_port);
    let book = EngineBook {
        admin_token: "old-token".into(),
        pools: vec![PoolEntry {
            namespace: "ns".into(),
            name: "p".into(),
            desired: 2,
            next_index: 7,
            replicas: vec![
                ReplicaEntry {
                    name: "p-5".into(),
                    pid: live.id(),
                    api_port: live_port,
                    admin_port: live_port,
                },
                // Its process is gone (the pid is not an engine on that port).
                ReplicaEntry {
                    name: "p-6".into(),
                    pid: std::process::id(),
                    api_port: dead_port,
                    admin_port: dead_port,
                },
            ],
            router: None,
        }],
    };
    book.save(&path).expect("save");

    let runtime = LocalRuntime::new(config(&path));
    assert_eq!(
        runtime.token(),
        "old-token",
        "adopted engines keep their token"
    );
    let seen = runtime.observe(&pool()).await.expect("observe");
    assert_eq!(seen.replicas, Some(2), "the count asked for is kept");
    let names: Vec<&str> = seen.endpoints.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["p-5"]);
    let written = EngineBook::load(&path).expect("book");
    assert_eq!(
        written.pools[0].replicas.len(),
        1,
        "the book forgets the gone one"
    );
    assert_eq!(written.pools[0].next_index, 7);

    // The adopted engine exits: it counts as retired (the driver orders it again if wanted).
    live.kill().expect("kill");
    live.wait().expect("wait");
    let seen = runtime.observe(&pool()).await.expect("observe");
    assert_eq!((seen.replicas, seen.endpoints.len()), (Some(1), 0));
}

#[tokio::test]
async fn a_runtime_with_nothing_to_adopt_keeps_its_own_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("engines.json");
    let runtime = LocalRuntime::new(config(&path));
    assert_eq!(runtime.token(), "fresh-token");
    let seen = runtime.observe(&pool()).await.expect("observe");
    assert_eq!(seen.replicas, None);
}

#[tokio::test]
async fn a_clean_shutdown_kills_the_adopted_engines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("engines.json");
    let port = free_port().expect("port");
    let mut engine = stand_in(port);
    EngineBook {
        admin_token: "t".into(),
        pools: vec![PoolEntry {
            namespace: "ns".into(),
            name: "p".into(),
            desired: 1,
            next_index: 1,
            replicas: vec![ReplicaEntry {
                name: "p-0".into(),
                pid: engine.id(),
                api_port: port,
                admin_port: port,
            }],
            router: None,
        }],
    }
    .save(&path)
    .expect("save");
    drop(LocalRuntime::new(config(&path)));
    let status = engine.wait().expect("wait");
    assert!(!status.success(), "killed, not left running: {status}");
}
