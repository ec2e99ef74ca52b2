//! `simulate --pod-model FILE`: the step-time line ITL(k) = a + b·k of a real pool's pods.
//!
//! Two forms, YAML or JSON: an InferencePool's status holding `status.podModel` (what the
//! operator learned from a live pool: `kubectl get tgpool NAME -o yaml`; a bare `podModel`
//! or its fields alone also do), or the object `tidegate-engine bench --json` prints, whose
//! levels give the step time at each concurrency c as c ÷ steady decode tokens/s; a and b are
//! the least-squares line through them.
//!
//! Invariants: a > 0 and b ≥ 0, finite (a bench whose step time falls with the batch gets
//! b = 0 and a = the mean step time); a bench needs two levels of different concurrency.

use std::path::Path;

use anyhow::Context;
use serde_json::Value;
use tidegate_api::status::PodModelStatus;

/// A pod's step-time line and where it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct ItlLine {
    pub itl_base_s: f64,
    pub itl_per_seq_s: f64,
    /// Words for the report, e.g. "status.podModel of pool.yaml (1200 samples)".
    pub origin: String,
}

pub fn load(path: &Path) -> anyhow::Result<ItlLine> {
    let name = path.display().to_string();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading --pod-model {name}"))?;
    parse(&name, &text)
}

pub fn parse(name: &str, text: &str) -> anyhow::Result<ItlLine> {
    let v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => serde_saphyr::from_str(text)
            .map_err(|e| anyhow::anyhow!("--pod-model {name}: neither JSON nor YAML: {e}"))?,
    };
    let line = if let Some(levels) = v.get("levels") {
        from_bench(name, levels)?
    } else {
        from_status(name, &v)?
    };
    let ok = |x: f64| x.is_finite() && x >= 0.0;
    if !(ok(line.itl_base_s) && line.itl_base_s > 0.0 && ok(line.itl_per_seq_s)) {
        anyhow::bail!(
            "--pod-model {name}: step time {}s + {}s × batch is not a usable line \
             (the base must be > 0, the slope ≥ 0)",
            line.itl_base_s,
            line.itl_per_seq_s
        );
    }
    Ok(line)
}

fn from_status(name: &str, v: &Value) -> anyhow::Result<ItlLine> {
    let (model, at) = if let Some(m) = v.get("status").and_then(|s| s.get("podModel")) {
        (m, "status.podModel")
    } else if let Some(m) = v.get("podModel") {
        (m, "podModel")
    } else if v.get("itlBaseSeconds").is_some() {
        (v, "the pod model")
    } else {
        anyhow::bail!(
            "--pod-model {name}: no status.podModel (an InferencePool's status) and no levels \
             (tidegate-engine bench --json)"
        );
    };
    let m: PodModelStatus = serde_json::from_value(model.clone())
        .map_err(|e| anyhow::anyhow!("--pod-model {name}: {at}: {e}"))?;
    Ok(ItlLine {
        itl_base_s: m.itl_base_seconds,
        itl_per_seq_s: m.itl_per_sequence_seconds,
        origin: format!("{at} of {name} ({} samples)", m.samples),
    })
}

fn from_bench(name: &str, levels: &Value) -> anyhow::Result<ItlLine> {
    let points: Vec<(f64, f64)> = levels
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| {
            let c = l.get("concurrency")?.as_f64()?;
            let rate = l.get("steady_decode_tokens_per_s")?.as_f64()?;
            (c >= 1.0 && rate > 0.0).then_some((c, c / rate))
        })
        .collect();
    let n = points.len() as f64;
    let mean = |f: fn(&(f64, f64)) -> f64| points.iter().map(f).sum::<f64>() / n;
    let (mc, mi) = (mean(|p| p.0), mean(|p| p.1));
    let sxx: f64 = points.iter().map(|p| (p.0 - mc).powi(2)).sum();
    if points.len() < 2 || sxx <= 0.0 {
        anyhow::bail!(
            "--pod-model {name}: the bench needs two levels of different concurrency with a \
             steady decode rate (run it with e.g. --concurrency 1,8,32)"
        );
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mc) * (p.1 - mi)).sum();
    let slope = (sxy / sxx).max(0.0);
    let base = if slope > 0.0 { mi - slope * mc } else { mi };
    Ok(ItlLine {
        itl_base_s: base,
        itl_per_seq_s: slope,
        origin: format!(
            "tidegate-engine bench levels of {name} (c ÷ steady decode tokens/s at c = {})",
            points
                .iter()
                .map(|p| p.0.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_status_gives_its_learned_line() {
        let yaml = "apiVersion: tidegate.dev/v1alpha1\nkind: InferencePool\nstatus:\n  podModel: \
                    {itlBaseSeconds: 0.03, itlPerSequenceSeconds: 0.002, sessionsAtSLO: 10, samples: 42}\n";
        let l = parse("p.yaml", yaml).expect("status");
        assert_eq!((l.itl_base_s, l.itl_per_seq_s), (0.03, 0.002));
        assert!(l.origin.contains("42 samples"), "{}", l.origin);
    }

    #[test]
    fn bench_levels_give_the_least_squares_line() {
        // ITL(c) = 0.02 + 0.001 c exactly: rate = c / ITL(c).
        let level = |c: f64| {
            format!(
                r#"{{"concurrency": {c}, "steady_decode_tokens_per_s": {}}}"#,
                c / (0.02 + 0.001 * c)
            )
        };
        let json = format!(
            r#"{{"levels": [{}, {}, {}]}}"#,
            level(1.0),
            level(8.0),
            level(32.0)
        );
        let l = parse("b.json", &json).expect("bench");
        assert!((l.itl_base_s - 0.02).abs() < 1e-9 && (l.itl_per_seq_s - 0.001).abs() < 1e-9);
    }

    #[test]
    fn unusable_files_say_why() {
        let one = r#"{"levels": [{"concurrency": 1, "steady_decode_tokens_per_s": 50}]}"#;
        let e = parse("b.json", one).expect_err("one level").to_string();
        assert!(e.contains("two levels"), "{e}");
        let e = parse("x.yaml", "kind: Foo\n")
            .expect_err("nothing")
            .to_string();
        assert!(e.contains("no status.podModel"), "{e}");
        let bad = "podModel: {itlBaseSeconds: 0, itlPerSequenceSeconds: 0.01, sessionsAtSLO: 1}";
        let e = parse("x.yaml", bad).expect_err("zero base").to_string();
        assert!(e.contains("not a usable line"), "{e}");
    }
}
