//! Replays of small trace files through small pools, and the CLI's refusals.

use std::path::PathBuf;

use clap::Parser;

use super::*;
use crate::sim::cli::{Args, simulate};

const POOL: &str = "\
apiVersion: tidegate.dev/v1alpha1
kind: InferencePool
metadata: {name: small}
spec:
  model: {name: m, uri: \"file:///m\"}
  engine: {image: e, maxBatchSize: 8, maxQueuedRequests: 16}
  replicas: {min: 2, max: 4}
";

const TIERS: &str = "\
apiVersion: tidegate.dev/v1alpha1
kind: TierPolicy
metadata: {name: two}
spec:
  defaultTier: low
  tiers:
    - {name: low, priority: 1, queueWaitTarget: 5s}
    - {name: high, priority: 9, queueWaitTarget: 1s, kvRetention: {idleTTL: 10m}}
";

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("tidegate-replay-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("dir");
        Dir(d)
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// One request every 2 s for 10 minutes, alternating tiers; each tenant's turns share a
/// session 20 s apart.
fn light_trace() -> String {
    (0..300)
        .map(|i| {
            let (tenant, tier) = if i % 2 == 0 { ("a", "high") } else { ("b", "low") };
            format!(
                "{{\"t\": {}, \"tenant\": \"{tenant}{}\", \"tier\": \"{tier}\", \"prompt_tokens\": {}, \"output_tokens\": 100, \"session\": \"{tenant}{}\"}}\n",
                f64::from(i) * 2.0,
                i % 20,
                200 + 300 * (i / 20),
                i % 20
            )
        })
        .collect()
}

fn args<'a>(manifests: &'a [PathBuf], trace: &'a std::path::Path) -> ReplayArgs<'a> {
    ReplayArgs {
        manifests,
        trace_file: trace,
        pod_model: None,
        startup_s: (60.0, 60.0),
        static_replicas: Some(2),
        known_tenants: false,
        seed: 1,
        baselines: SimConfig::new(1, 1.0).baselines,
        threads: 2,
    }
}

#[test]
fn a_light_trace_through_an_ample_pool_is_all_served_in_time() {
    let d = Dir::new("light");
    let manifests = [d.file("pool.yaml", POOL), d.file("tiers.yaml", TIERS)];
    let trace = d.file("t.jsonl", &light_trace());
    let r = replay(&args(&manifests, &trace)).expect("replay");
    assert_eq!(r.tiers, ["high", "low"]);
    assert_eq!(r.results.len(), PolicyKind::ALL.len() + 1);
    for res in &r.results {
        assert_eq!(res.requests, 300, "{}", res.policy);
        assert_eq!(res.attainment_by_tier[0], Some(1.0), "{res:?}");
        assert_eq!(res.attainment_by_tier[1], Some(1.0), "{res:?}");
        assert_eq!(res.refused.overload + res.refused.rate_limit, 0, "{res:?}");
        // Turns 20 s apart, within the 10 min (high) and 10 min default (low) TTLs.
        let hits = res.kv_reuse_hit_rate.expect("sessions returned");
        assert!(hits > 0.9, "{}: {hits}", res.policy);
        assert!(res.peak_replicas >= 2 && res.peak_replicas <= 4, "{res:?}");
    }
    let stat = &r.mean_replicas.last().expect("static");
    assert_eq!(stat.0, "static");
    assert!((stat.1 - 2.0).abs() < 0.05, "{stat:?}");
    assert!(words(&r).contains("high") && words(&r).contains("built-in pod model"));
}

#[test]
fn more_than_the_pool_can_serve_is_refused_or_late() {
    let d = Dir::new("heavy");
    let manifests = [d.file("pool.yaml", POOL)];
    let lines: String = (0..2000)
        .map(|i| format!("{},u{},default,100,500\n", f64::from(i) * 0.05, i % 7))
        .collect();
    let trace = d.file(
        "t.csv",
        &format!("t,tenant,tier,prompt_tokens,output_tokens\n{lines}"),
    );
    let r = replay(&args(&manifests, &trace)).expect("replay");
    let stat = r.results.last().expect("static");
    assert!(stat.attainment_by_tier[0].expect("some") < 0.5, "{stat:?}");
    assert!(stat.refused.overload > 0, "{stat:?}");
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn cli(argv: &[&str]) -> String {
    let cli = Cli::try_parse_from(std::iter::once("simulate").chain(argv.iter().copied()))
        .expect("parses");
    format!("{:#}", simulate(&cli.args).expect_err("refused"))
}

#[test]
fn the_cli_says_what_is_wrong() {
    let d = Dir::new("cli");
    let pool = d.file("pool.yaml", POOL);
    let pool = pool.to_str().expect("utf-8");
    let trace = d.file("t.jsonl", &light_trace());
    let trace = trace.to_str().expect("utf-8");
    let no_spec = d.file(
        "nospec.yaml",
        "apiVersion: tidegate.dev/v1alpha1\nkind: InferencePool\nmetadata: {name: x}\n",
    );
    let empty = d.file("empty.jsonl", "# nothing\n");
    let cases: [(Vec<&str>, &str); 8] = [
        (vec!["--trace-file", trace], "needs the pool"),
        (vec!["-f", pool], "add --trace-file"),
        (
            vec!["-f", pool, "--trace-file", trace, "--trace", "tidal"],
            "give one",
        ),
        (
            vec!["-f", pool, "--trace-file", "/nonexistent/a.jsonl"],
            "reading trace file /nonexistent/a.jsonl",
        ),
        (
            vec![
                "-f",
                no_spec.to_str().expect("utf-8"),
                "--trace-file",
                trace,
            ],
            "InferencePool x has no spec",
        ),
        (
            vec!["-f", pool, "--trace-file", empty.to_str().expect("utf-8")],
            "empty trace",
        ),
        (
            vec!["-f", pool, "--trace-file", trace],
            "unknown tier \"high\"",
        ),
        (vec!["--startup-seconds", "9-3"], "expected MIN or MIN-MAX"),
    ];
    for (argv, want) in cases {
        let e = cli(&argv);
        assert!(e.contains(want), "{argv:?}: {e:?} lacks {want:?}");
    }
    assert!(cli(&["--pod-model", pool]).contains("--trace-file runs only"));
}
