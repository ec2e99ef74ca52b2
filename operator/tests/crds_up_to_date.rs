//! The committed CRDs (crds/ and the chart's crds/) must equal what the Rust types generate.

use std::path::Path;

#[test]
fn committed_crds_match_generated() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let drifted = tidegate_operator::crdgen::drifted(&root).expect("render CRDs");
    assert!(
        drifted.is_empty(),
        "CRDs out of date: {drifted:?}\nrun `cargo run -p tidegate-operator -- crds` and commit the result"
    );
}
