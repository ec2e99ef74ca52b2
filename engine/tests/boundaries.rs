//! The engine crates' dependency rules, checked on their manifests so that a new dependency
//! that crosses a boundary fails here, with the rule it breaks, instead of quietly turning
//! the KV core into something that needs a tensor library or the router into something that
//! links the model code (docs/architecture.md, "Code map").
//!
//! Direct dependencies are enough: the workspace crates named here are the only way in to
//! candle, tokio or axum for each other, and each of them is checked.
#![allow(clippy::unwrap_used)]

use std::path::Path;

/// (crate folder under engine/, dependencies it must never have, why).
const RULES: &[(&str, &[&str], &str)] = &[
    (
        "kv",
        &[
            "candle-core",
            "tokio",
            "axum",
            "rayon",
            "tidegate-runner",
            "tidegate-http",
            "tidegate-server",
            "tidegate-router",
        ],
        "the KV core is pure bookkeeping: no tensors, no async runtime, no HTTP",
    ),
    (
        "runner",
        &[
            "tokio",
            "axum",
            "tidegate-http",
            "tidegate-server",
            "tidegate-router",
        ],
        "the model runner computes; it serves nothing and knows no tenants",
    ),
    (
        "http",
        &[
            "candle-core",
            "tidegate-kv",
            "tidegate-runner",
            "tidegate-server",
            "tidegate-router",
        ],
        "the HTTP kit is shared by the engine and the router, so it knows neither",
    ),
    (
        "router",
        &[
            "candle-core",
            "tokenizers",
            "tidegate-kv",
            "tidegate-runner",
            "tidegate-server",
        ],
        "the router links no model code and no engine internals",
    ),
    (
        "server",
        &["tidegate-router", "tidegate-bench"],
        "the engine role does not contain the router or the benchmarks",
    ),
    (
        "fetch",
        &[
            "candle-core",
            "tidegate-kv",
            "tidegate-runner",
            "tidegate-server",
            "tidegate-router",
            "reqwest",
        ],
        "the fetch step moves files: no model code, no engine, and no second HTTP/TLS stack (reqwest's TLS would clash with kube's rustls)",
    ),
];

/// Names in the `[dependencies]` table of a manifest (not dev- or build-dependencies).
fn normal_dependencies(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if !in_deps || line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((name, _)) = line.split_once('=') {
            names.push(name.trim().trim_end_matches(".workspace").to_string());
        }
    }
    names
}

#[test]
fn every_engine_crate_keeps_its_dependency_rule() {
    let engine = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    for (folder, forbidden, why) in RULES {
        let path = engine.join(folder).join("Cargo.toml");
        let manifest = std::fs::read_to_string(&path).unwrap();
        let deps = normal_dependencies(&manifest);
        assert!(!deps.is_empty(), "{} lists no dependencies", path.display());
        for dep in deps.iter().filter(|d| forbidden.contains(&d.as_str())) {
            broken.push(format!("engine/{folder} depends on {dep}: {why}"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_manifest_reader_sees_dependencies_and_only_them() {
    let manifest = "[package]\nname = \"x\"\n\n[dependencies]\n# why\nfoo.workspace = true\n\
                    bar = { workspace = true }\n\n[dev-dependencies]\nbaz.workspace = true\n";
    assert_eq!(normal_dependencies(manifest), vec!["foo", "bar"]);
}
