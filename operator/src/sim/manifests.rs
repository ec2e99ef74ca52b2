//! `simulate -f FILE…`: the user's InferencePool and, optionally, TierPolicy manifests (full
//! Kubernetes objects, as applied; several documents per file allowed), parsed into the API
//! types, and the tiers a run uses.
//!
//! Invariants: exactly one InferencePool and at most one TierPolicy across the files; every
//! document is one of the two kinds and has a spec. Tiers: the TierPolicy given; else, for a
//! pool without tierPolicyRef, the single default tier the operator gives such a pool; else
//! (a pool naming a TierPolicy not given) the simulator's built-in three tiers, said so.

use std::path::PathBuf;

use anyhow::Context;
use serde_json::Value;
use tidegate_api::{InferencePoolSpec, TierPolicySpec};

use super::tiers::TierTable;

/// What `-f` gave.
#[derive(Debug)]
pub struct Manifests {
    pub pool_name: String,
    pub spec: InferencePoolSpec,
    /// The TierPolicy's name and spec, when one was given.
    pub tier_policy: Option<(String, TierPolicySpec)>,
}

pub fn load(paths: &[PathBuf]) -> anyhow::Result<Manifests> {
    let mut pool: Option<(String, InferencePoolSpec)> = None;
    let mut tiers: Option<(String, TierPolicySpec)> = None;
    for path in paths {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).with_context(|| format!("reading -f {file}"))?;
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .map_err(|e| anyhow::anyhow!("-f {file}: not YAML: {e}"))?;
        for (i, doc) in docs.into_iter().enumerate().filter(|(_, d)| !d.is_null()) {
            let at = format!("-f {file} (document {})", i + 1);
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
            let name = doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("(unnamed)")
                .to_string();
            let spec = || {
                doc.get("spec")
                    .filter(|s| !s.is_null())
                    .cloned()
                    .ok_or_else(|| anyhow::anyhow!("{at}: {kind} {name} has no spec"))
            };
            match kind {
                "InferencePool" if pool.is_some() => {
                    anyhow::bail!("{at}: a second InferencePool ({name}); give one pool")
                }
                "InferencePool" => {
                    let s = serde_json::from_value(spec()?)
                        .map_err(|e| anyhow::anyhow!("{at}: InferencePool {name}: {e}"))?;
                    pool = Some((name, s));
                }
                "TierPolicy" if tiers.is_some() => {
                    anyhow::bail!("{at}: a second TierPolicy ({name}); give at most one")
                }
                "TierPolicy" => {
                    let s = serde_json::from_value(spec()?)
                        .map_err(|e| anyhow::anyhow!("{at}: TierPolicy {name}: {e}"))?;
                    tiers = Some((name, s));
                }
                other => anyhow::bail!(
                    "{at}: kind {other:?}; expected an InferencePool or a TierPolicy manifest"
                ),
            }
        }
    }
    let Some((pool_name, spec)) = pool else {
        anyhow::bail!("no InferencePool in the -f files (a manifest with kind: InferencePool)");
    };
    if spec.replicas.min > spec.replicas.max {
        anyhow::bail!("InferencePool {pool_name}: replicas.min is above replicas.max");
    }
    Ok(Manifests {
        pool_name,
        spec,
        tier_policy: tiers,
    })
}

impl Manifests {
    /// The run's tiers, and a sentence saying where they came from.
    pub fn tiers(&self) -> anyhow::Result<(TierTable, String)> {
        if let Some((name, policy)) = &self.tier_policy {
            let t = TierTable::from_policy(policy).with_context(|| format!("TierPolicy {name}"))?;
            return Ok((t, format!("TierPolicy {name}")));
        }
        match &self.spec.tier_policy_ref {
            None => Ok((
                TierTable::from_policy(&TierPolicySpec::single_default())?,
                "no tierPolicyRef: one tier, default (queue-wait target 2s, never paused)".into(),
            )),
            Some(r) => Ok((
                TierTable::builtin()?,
                format!(
                    "the pool names TierPolicy {}, not given with -f: the simulator's \
                     enterprise/standard/free tiers",
                    r.name
                ),
            )),
        }
    }
}
