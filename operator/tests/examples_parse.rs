//! Every example manifest parses into the Rust API types, and the invalid ones carry the
//! `# expect:` line the API-server e2e check needs.

use std::path::{Path, PathBuf};

use tidegate_api::{InferencePool, TierPolicy};

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read examples")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

#[test]
fn examples_parse_into_api_types() {
    let mut seen = 0;
    for path in yaml_files(&examples()) {
        let text = std::fs::read_to_string(&path).expect("read");
        if text.contains("kind: InferencePool") {
            let pool: InferencePool = serde_saphyr::from_str(&text).expect("parse pool");
            assert!(pool.spec.replicas.min <= pool.spec.replicas.max);
            seen += 1;
        } else if text.contains("kind: TierPolicy") {
            let policy: TierPolicy = serde_saphyr::from_str(&text).expect("parse policy");
            assert!(policy.spec.tier(&policy.spec.default_tier).is_some());
            seen += 1;
        }
    }
    assert!(seen >= 2, "expected a pool and a tier policy example");
}

#[test]
fn invalid_examples_say_what_the_server_must_answer() {
    let files = yaml_files(&examples().join("invalid"));
    assert!(files.len() >= 8);
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read");
        let first = text.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("# expect: "),
            "{}: first line must be '# expect: ...'",
            path.display()
        );
    }
}

/// The one InferencePool in an example file.
fn pool_in(path: &Path) -> InferencePool {
    let text = std::fs::read_to_string(path).expect("read");
    serde_saphyr::from_str(&text).expect("parse pool")
}

#[test]
fn the_cluster_examples_parse_and_every_pool_names_a_claim() {
    let dir = examples().join("cluster");
    let pools: Vec<InferencePool> = yaml_files(&dir)
        .iter()
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains("kind: InferencePool")))
        .map(|p| pool_in(p))
        .collect();
    assert_eq!(pools.len(), 2, "the CPU production pool and the demo pool");
    for pool in &pools {
        assert!(
            pool.spec.model.uri.starts_with("pvc://model-weights/"),
            "{}: a cluster pool reads its model from the claim of 10-model-volumes.yaml",
            pool.spec.model.uri
        );
    }
}

#[test]
fn the_cluster_demo_pool_is_the_local_demo_pool_with_its_model_on_a_claim() {
    let local = pool_in(&examples().join("local/pool.yaml"));
    let mut cluster = pool_in(&examples().join("cluster/demo-pool.yaml"));
    let local_model = local.spec.model.uri.rsplit('/').next().expect("a path");
    assert_eq!(
        cluster.spec.model.uri,
        format!("pvc://model-weights/{local_model}"),
        "the same model, on the claim"
    );
    cluster.spec.model.uri = local.spec.model.uri.clone();
    assert_eq!(
        serde_json::to_value(&cluster).expect("json"),
        serde_json::to_value(&local).expect("json"),
        "examples/cluster/demo-pool.yaml differs from examples/local/pool.yaml in more than the model's place"
    );
}
