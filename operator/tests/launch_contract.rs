//! The launch-contract drift test: the engine command lines and environments both runtimes
//! produce, for every pool under examples/ and for a pool with every optional field set, are
//! parsed by the engine's own `serve` parser, and the router pod's by its `route` parser. A flag the engine refuses, a variable it does
//! not read, or a pool field that arrives with another meaning fails here, not as a crash
//! loop in a cluster.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Container;
use tidegate_api::engine_launch::{self as launch, whole_seconds};
use tidegate_api::{InferencePool, InferencePoolSpec};
use tidegate_operator::k8s::deployment::{KV_OFFLOAD_MOUNT, model_location, pod_template};
use tidegate_operator::manifests::load_manifests;
use tidegate_operator::ports::PoolRef;
use tidegate_operator::workload_runtime::local::{LocalRuntime, LocalRuntimeConfig};
use tidegate_runner::DeviceChoice;
use tidegate_server::cli::{ServeArgs, parse_serve, serve_command};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// Every InferencePool under examples/ (not examples/invalid/, which the API server refuses).
fn example_pools() -> Vec<InferencePool> {
    let mut dirs = vec![repo().join("examples")];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read examples") {
            let p = entry.expect("entry").path();
            if p.is_dir() && p.file_name().is_some_and(|n| n != "invalid") {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "yaml") {
                files.push(p);
            }
        }
    }
    let pools = load_manifests(&files).expect("examples parse").pools;
    assert!(pools.len() >= 2, "examples hold the 8B and the local pool");
    pools
}

/// A pool with every optional engine-facing field set.
fn every_field_pool() -> InferencePool {
    serde_saphyr::from_str(
        r#"
apiVersion: tidegate.dev/v1alpha1
kind: InferencePool
metadata: {name: full, namespace: ns}
spec:
  model: {name: m-1, uri: "pvc://weights/m", format: GGUF, maxContextTokens: 4096}
  engine:
    image: img
    resources: {gpus: 0, cpu: "2", memory: 3Gi}
    kvCache: {blockTokens: 32, memoryFraction: 0.5, hostOffload: 512Mi, diskOffload: 2Gi}
    maxBatchSize: 7
    maxBatchTokens: 999
    maxQueuedRequests: 3
    drainGracePeriod: 1500ms
    startupGracePeriod: 2m
    extraArgs: ["--threads", "1"]
  replicas: {min: 1, max: 2}
"#,
    )
    .expect("every-field pool")
}

/// Every variable the engine's `serve` reads.
fn engine_env_names() -> BTreeSet<String> {
    serve_command()
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}

fn bytes(q: Option<&tidegate_api::Quantity>) -> u64 {
    q.map_or(0, |q| q.to_bytes().expect("a byte quantity"))
}

/// The parsed flags mean what the pool's fields say.
fn assert_same_meaning(what: &str, spec: &InferencePoolSpec, a: &ServeArgs) {
    let e = &spec.engine;
    let kv = &e.kv_cache;
    assert_eq!(
        a.served_model_name.as_deref(),
        Some(spec.model.name.as_str()),
        "{what}"
    );
    assert_eq!(
        launch::model_format_arg(spec.model.format),
        format!("{:?}", a.model_format).to_lowercase(),
        "{what}: model.format"
    );
    assert_eq!(a.max_batch_size as i32, e.max_batch_size, "{what}");
    assert_eq!(a.max_batch_tokens as i32, e.max_batch_tokens, "{what}");
    assert_eq!(
        a.max_queued_requests as i32, e.max_queued_requests,
        "{what}"
    );
    assert_eq!(
        a.max_context_tokens.map(|c| c as i32),
        spec.model.max_context_tokens,
        "{what}: model.maxContextTokens"
    );
    assert_eq!(a.kv_block_tokens as i32, kv.block_tokens, "{what}");
    assert_eq!(a.kv_memory_fraction, Some(kv.memory_fraction), "{what}");
    assert_eq!(
        a.memory_limit.as_ref().and_then(|q| q.to_bytes()),
        e.resources.memory.as_ref().and_then(|q| q.to_bytes()),
        "{what}: resources.memory"
    );
    assert_eq!(
        a.kv_host_offload.to_bytes(),
        Some(bytes(kv.host_offload.as_ref())),
        "{what}: kvCache.hostOffload"
    );
    assert_eq!(
        a.kv_disk_offload.to_bytes(),
        Some(bytes(kv.disk_offload.as_ref())),
        "{what}: kvCache.diskOffload"
    );
    assert_eq!(
        a.kv_disk_dir.is_some(),
        kv.disk_offload.is_some(),
        "{what}: a disk tier has a directory"
    );
    assert_eq!(
        format!("{}s", a.drain_grace.as_secs()),
        whole_seconds(&e.drain_grace_period),
        "{what}: drainGracePeriod"
    );
    assert_eq!(
        a.device != DeviceChoice::Cpu,
        e.resources.gpus > 0,
        "{what}: a pool with GPUs serves on CUDA"
    );
    assert!(
        a.secrets.admin_token.is_none(),
        "{what}: the token never travels as a flag"
    );
}

fn check_pod(pool: &InferencePool) {
    let name = pool.metadata.name.as_deref().expect("name");
    let what = format!("pod of {name}");
    let template = pod_template(name, &pool.spec).expect("pod template");
    let pod = template.spec.expect("pod spec");
    let c: &Container = &pod.containers[0];
    let args = c.args.clone().expect("args");
    assert!(
        c.command.is_none(),
        "{what}: the image's entrypoint is the engine"
    );
    let parsed = parse_serve(&args).unwrap_or_else(|e| panic!("{what}: {args:?}\n{e}"));
    assert_same_meaning(&what, &pool.spec, &parsed);
    let model = model_location(&pool.spec.model.uri).expect("uri");
    assert_eq!(
        parsed.model.as_deref(),
        Some(Path::new(&model.path)),
        "{what}"
    );
    assert_eq!(parsed.listen.port(), launch::HTTP_PORT, "{what}");
    assert_eq!(parsed.admin_listen.port(), launch::ADMIN_PORT, "{what}");
    if pool.spec.engine.kv_cache.disk_offload.is_some() {
        assert_eq!(
            parsed.kv_disk_dir.as_deref(),
            Some(Path::new(KV_OFFLOAD_MOUNT))
        );
        let mounts = c.volume_mounts.clone().unwrap_or_default();
        assert!(
            mounts.iter().any(|m| m.mount_path == KV_OFFLOAD_MOUNT),
            "{what}: the disk tier's directory is mounted"
        );
    }
    let known = engine_env_names();
    for var in c.env.clone().unwrap_or_default() {
        assert!(
            known.contains(&var.name),
            "{what}: the engine does not read {}",
            var.name
        );
    }
    let ports: Vec<i32> = c.ports.iter().flatten().map(|p| p.container_port).collect();
    assert!(
        ports.contains(&parsed.listen.port().into()),
        "{what}: {ports:?}"
    );
}

fn check_local(pool: &InferencePool) {
    let name = pool.metadata.name.as_deref().expect("name");
    let what = format!("local engine of {name}");
    let uri = &pool.spec.model.uri;
    if !(uri.starts_with("file://") || uri.starts_with("s3://") || uri.starts_with("hf://")) {
        return; // local mode serves file://, s3:// and hf:// models only (and says so)
    }
    let state = tempfile::tempdir().expect("tempdir");
    let runtime = LocalRuntime::new(LocalRuntimeConfig {
        engine_bin: PathBuf::from("tidegate-engine"),
        base_dir: repo(),
        log_dir: state.path().join("logs"),
        admin_token: "t".to_string(),
        extra_args: Vec::new(),
        file_sd_path: None,
        engine_book: None,
        routers_file: None,
        secrets: Default::default(),
    });
    let pref = PoolRef {
        namespace: "ns".to_string(),
        name: name.to_string(),
    };
    let cmd = runtime
        .engine_command(&pref, &pool.spec, "r-0", 18000, 18001)
        .expect("command");
    let parsed = parse_serve(&cmd.args).unwrap_or_else(|e| panic!("{what}: {:?}\n{e}", cmd.args));
    assert_same_meaning(&what, &pool.spec, &parsed);
    assert_eq!(parsed.listen.port(), 18000, "{what}");
    let known = engine_env_names();
    for (var, _) in &cmd.env {
        assert!(
            known.contains(var),
            "{what}: the engine does not read {var}"
        );
    }
}

/// A local-mode pool (`file://` relative to the manifests) as a pod would take it: the same
/// pool with the model at an absolute path in the image.
fn as_cluster_pool(pool: &InferencePool) -> InferencePool {
    let mut p = pool.clone();
    if let Some(rel) = p.spec.model.uri.strip_prefix("file://")
        && !rel.starts_with('/')
    {
        p.spec.model.uri = format!("file:///{rel}");
    }
    p
}

#[test]
fn every_example_pool_launches_with_flags_the_engine_parses_with_the_same_meaning() {
    for pool in example_pools()
        .iter()
        .chain([&every_field_pool()])
        .chain(&fetched_pools())
    {
        check_pod(&as_cluster_pool(pool));
    }
}

#[test]
fn local_engines_launch_from_the_same_contract() {
    let mut local = every_field_pool();
    local.spec.model.uri = "file://models/m".to_string();
    for pool in example_pools()
        .iter()
        .chain([&local])
        .chain(&fetched_pools())
    {
        check_local(pool);
    }
}

#[test]
fn every_engine_facing_spec_field_is_accounted_for() {
    // A new field under spec.model or spec.engine must be mapped to a flag (and checked in
    // assert_same_meaning) or named here as the operator's own.
    let operator_only = [
        "uri",
        // The fetch step's, checked in
        // a_fetched_model_runs_an_init_container_the_fetch_step_parses_with_the_same_meaning.
        "source",
        "image",
        "resources",
        "startupGracePeriod",
        "extraArgs",
    ];
    let mapped = [
        "name",
        "format",
        "maxContextTokens",
        "kvCache",
        "maxBatchSize",
        "maxBatchTokens",
        "maxQueuedRequests",
        "drainGracePeriod",
        "blockTokens",
        "memoryFraction",
        "hostOffload",
        "diskOffload",
    ];
    let spec = serde_json::to_value(&every_field_pool().spec).expect("json");
    let mut seen = Vec::new();
    for section in ["model", "engine"] {
        seen.extend(spec[section].as_object().expect(section).keys().cloned());
    }
    seen.extend(
        spec["engine"]["kvCache"]
            .as_object()
            .expect("kv")
            .keys()
            .cloned(),
    );
    for key in seen {
        assert!(
            mapped.contains(&key.as_str()) || operator_only.contains(&key.as_str()),
            "spec field {key:?} is neither passed to the engine nor marked operator-only"
        );
    }
}

#[test]
fn a_flag_the_engine_does_not_know_is_refused_by_its_parser() {
    // The drift this test exists for: the operator once passed a flag the engine lacked.
    let err = parse_serve(["serve", "--model", "/m", "--no-such-flag", "1"]).expect_err("refused");
    assert!(err.to_string().contains("--no-such-flag"), "{err}");
}

/// The router's subcommand, parsed as the engine binary parses it.
#[derive(clap::Parser)]
struct RouterBinary {
    #[command(subcommand)]
    cmd: RouterCmd,
}

#[derive(clap::Subcommand)]
enum RouterCmd {
    Route(tidegate_router::cli::RouteArgs),
}

/// Every variable the router reads.
fn router_env_names() -> BTreeSet<String> {
    use clap::CommandFactory;
    let cmd = RouterBinary::command();
    let route = cmd
        .find_subcommand(tidegate_api::router::ROUTE)
        .expect("route subcommand");
    route
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn every_example_pool_runs_a_router_the_router_parses_with_the_same_meaning() {
    use clap::Parser;
    let known = router_env_names();
    for pool in example_pools().iter().chain([&every_field_pool()]) {
        let name = pool.metadata.name.as_deref().expect("name");
        let spec = &pool.spec;
        let tpl = tidegate_operator::k8s::router::router_pod_template(name, spec);
        let c: &Container = &tpl.spec.as_ref().expect("pod").containers[0];
        let args = c.args.clone().expect("args");
        let argv = std::iter::once("tidegate-engine".to_string()).chain(args.iter().cloned());
        let RouterCmd::Route(r) = RouterBinary::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("{name}: the router refuses {args:?}: {e}"))
            .cmd;
        assert_eq!(r.listen.to_string(), "0.0.0.0:8000", "{name}");
        assert_eq!(r.admin_listen.to_string(), "0.0.0.0:8001", "{name}");
        assert!(
            r.endpoints.is_empty(),
            "{name}: the operator pushes engines"
        );
        assert_eq!(r.load_factor, spec.router.load_factor, "{name}");
        assert_eq!(
            r.hold_timeout.as_secs(),
            spec.router.hold_timeout.as_std().as_secs_f64().ceil() as u64,
            "{name}"
        );
        assert_eq!(
            r.max_held_requests, spec.router.max_held_requests as usize,
            "{name}"
        );
        assert_eq!(
            i64::from(r.limit_share),
            i64::from(spec.router.replicas),
            "{name}: each router enforces 1/replicas"
        );
        assert_eq!(
            i64::try_from(r.engine_slots).expect("slots"),
            i64::from(spec.engine.max_batch_size) + i64::from(spec.engine.max_queued_requests),
            "{name}: an engine's batch and its own queue"
        );
        for var in c.env.iter().flatten() {
            assert!(
                known.contains(&var.name),
                "{name}: the router does not read {}",
                var.name
            );
        }
    }
}

/// The fetch step's subcommand, parsed as the engine binary parses it.
#[derive(clap::Parser)]
struct FetchBinary {
    #[command(subcommand)]
    cmd: FetchCmd,
}

#[derive(clap::Subcommand)]
enum FetchCmd {
    FetchModel(tidegate_fetch::cli::FetchArgs),
}

fn parse_fetch(args: &[String]) -> tidegate_fetch::cli::FetchArgs {
    use clap::Parser;
    let argv = std::iter::once("tidegate-engine".to_string()).chain(args.iter().cloned());
    let FetchCmd::FetchModel(f) = FetchBinary::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("fetch-model refuses {args:?}: {e}"))
        .cmd;
    f
}

/// Every variable `fetch-model` reads.
fn fetch_env_names() -> BTreeSet<String> {
    use clap::CommandFactory;
    let cmd = FetchBinary::command();
    let sub = cmd
        .find_subcommand(tidegate_api::fetch_launch::FETCH_MODEL)
        .expect("fetch-model subcommand");
    sub.get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}

/// Pools whose model is fetched, with every source field set.
fn fetched_pools() -> Vec<InferencePool> {
    let pool = |name: &str, model: &str| -> InferencePool {
        serde_saphyr::from_str(&format!(
            "apiVersion: tidegate.dev/v1alpha1\nkind: InferencePool\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  model: {model}\n  engine: {{image: img, resources: {{gpus: 0}}}}\n  replicas: {{min: 1, max: 2}}\n"
        ))
        .expect("fetched pool")
    };
    vec![
        pool(
            "s3",
            r#"{name: m, uri: "s3://models/tiny", source: {credentialsSecret: s3-creds, endpoint: "http://s3.local:8333", region: eu-west-1, cacheSize: 2Gi}}"#,
        ),
        pool(
            "hf",
            r#"{name: m, uri: "hf://org/tiny@v1", source: {credentialsSecret: hf-token}}"#,
        ),
    ]
}

#[test]
fn a_fetched_model_runs_an_init_container_the_fetch_step_parses_with_the_same_meaning() {
    let known = fetch_env_names();
    for pool in fetched_pools() {
        let name = pool.metadata.name.clone().expect("name");
        let spec = &pool.spec;
        let pod = pod_template(&name, spec).expect("pod").spec.expect("spec");
        let init = pod.init_containers.clone().expect("an init container");
        assert_eq!(init.len(), 1, "{name}");
        let c = &init[0];
        assert_eq!(c.image.as_deref(), Some("img"), "{name}: the engine image");
        let f = parse_fetch(c.args.as_deref().expect("args"));
        assert_eq!(f.uri, spec.model.uri, "{name}");
        let engine = parse_serve(pod.containers[0].args.as_deref().expect("args")).expect("serve");
        assert_eq!(
            engine.model.as_deref(),
            Some(f.dest.as_path()),
            "{name}: the engine reads what the fetch wrote"
        );
        let source = spec.model.source.clone().unwrap_or_default();
        assert_eq!(f.endpoint, source.endpoint, "{name}: model.source.endpoint");
        assert_eq!(f.region, source.region, "{name}: model.source.region");
        assert!(
            f.message_file.is_some(),
            "{name}: the cause becomes the termination message"
        );
        let secret = source.credentials_secret.expect("secret");
        for var in c.env.iter().flatten() {
            assert!(
                known.contains(&var.name),
                "{name}: fetch-model does not read {}",
                var.name
            );
            if let Some(r) = var
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
            {
                assert_eq!(
                    r.name, secret,
                    "{name}: {} comes from the pool's Secret",
                    var.name
                );
                assert_eq!(
                    r.key, var.name,
                    "{name}: the Secret's key is the variable's name"
                );
            }
            assert!(
                var.value.is_none() || var.name == "HF_HOME",
                "{name}: {} is a literal",
                var.name
            );
        }
        let engine_mounts = pod.containers[0].volume_mounts.clone().unwrap_or_default();
        assert!(
            engine_mounts
                .iter()
                .any(|m| f.dest.starts_with(&m.mount_path) && m.read_only == Some(true)),
            "{name}: the engine mounts the cache read-only"
        );
    }
}

#[test]
fn local_fetch_steps_launch_from_the_same_contract() {
    use tidegate_operator::workload_runtime::local::model_fetch::local_fetch_site;
    let cache = Path::new("/state/models");
    for pool in fetched_pools() {
        let site = local_fetch_site(cache, Some(Path::new("/state/logs/msg")));
        let launch = tidegate_api::fetch_launch::fetch_launch(&pool.spec, &site)
            .expect("uri")
            .expect("fetched");
        let f = parse_fetch(&launch.args);
        assert_eq!(f.uri, pool.spec.model.uri);
        assert!(f.dest.starts_with(cache));
        let known = fetch_env_names();
        for (var, _) in &launch.env {
            assert!(known.contains(*var), "fetch-model does not read {var}");
        }
    }
}
