//! The served format of every projection, decided before anything is packed: a [`Spec`]
//! names the checkpoint tensors one projection fuses, the layer structs list their specs,
//! and [`WeightsPlan`] picks each one's format from the checkpoint and the `--weights`
//! choice, so the server can report the served format and the bytes per token before the
//! (slower) packing runs on the engine thread. [`Packer`] then packs a spec in the format
//! the plan gave it.
//!
//! Invariant: the plan and the packing see the same specs (both come from
//! [`super::layout`]), so the bytes the plan predicts are the bytes packed.

use std::collections::{BTreeMap, HashMap};

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::model::{ModelConfig, Weights};
use crate::weight_format::{Projection, Served, WeightChoice};

/// One projection: the checkpoint tensors fused into it (name, rows) and its input width.
#[derive(Debug, Clone)]
pub struct Spec {
    parts: Vec<(String, usize)>,
    k: usize,
    /// Whether it produces the logits (kept at 8 bits under a 4-bit choice).
    logits: bool,
}

impl Spec {
    /// The row-wise fusion of `parts` (each `[rows, k]`).
    pub fn new(parts: &[(String, usize)], k: usize) -> Self {
        Spec {
            parts: parts.to_vec(),
            k,
            logits: false,
        }
    }

    /// The same projection, marked as the one that produces the logits.
    pub fn for_logits(self) -> Self {
        Spec {
            logits: true,
            ..self
        }
    }

    fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.1).sum()
    }

    /// The key the plan files its format under: the first tensor's name (unique).
    fn key(&self) -> &str {
        self.parts.first().map_or("", |p| p.0.as_str())
    }

    fn stored<'w>(&self, w: &'w Weights) -> Result<Vec<crate::model::weights::Stored<'w>>> {
        self.parts
            .iter()
            .map(|(name, rows)| w.stored(name, &[*rows, self.k]))
            .collect()
    }
}

/// An architecture's packed layout: its projections, and the f32 values a decode step reads
/// besides them (norm scales, one embedding row).
#[derive(Debug)]
pub struct Layout {
    /// Every projection, layers in order, then the LM head.
    pub specs: Vec<Spec>,
    /// f32 values read per token outside the projections.
    pub f32_per_token: usize,
}

/// The served format of every projection.
#[derive(Debug, Clone)]
pub struct WeightsPlan {
    formats: HashMap<String, Served>,
    /// Weights per served format.
    weights: BTreeMap<Served, usize>,
    bytes_per_token: usize,
}

impl WeightsPlan {
    /// Decides the formats (reads only the tensors' encodings and shapes).
    pub fn new(w: &Weights, cfg: &ModelConfig, choice: WeightChoice) -> Result<Self> {
        let layout = super::layout(w, cfg);
        let mut plan = WeightsPlan {
            formats: HashMap::new(),
            weights: BTreeMap::new(),
            bytes_per_token: layout.f32_per_token * 4,
        };
        for spec in &layout.specs {
            // As llama.cpp's quantizer does, a 4-bit conversion keeps the LM head at 8 bits:
            // its errors go straight into the logits (on SmolLM2, 4-bit doubles their error).
            let choice = match choice {
                WeightChoice::Q4_0 | WeightChoice::Q4_1 if spec.logits => WeightChoice::Q8_0,
                c => c,
            };
            let fmt = spec
                .stored(w)?
                .iter()
                .map(|stored| Served::choose(choice, stored, spec.k))
                .max()
                .unwrap_or(Served::F32);
            plan.formats.insert(spec.key().to_string(), fmt);
            *plan.weights.entry(fmt).or_default() += spec.rows() * spec.k;
            plan.bytes_per_token += fmt.bytes_for(spec.rows(), spec.k);
        }
        Ok(plan)
    }

    /// Weight bytes read by one decode step (every projection once, norms, one embedding
    /// row): the numerator of the batch-1 roofline.
    pub fn bytes_per_token(&self) -> usize {
        self.bytes_per_token
    }

    /// Weights of all projections.
    pub fn weight_count(&self) -> usize {
        self.weights.values().sum()
    }

    /// The formats served, most weights first, e.g. `q4_1 79% + q8_0 21%` (or just `f32`).
    pub fn label(&self) -> String {
        let total: usize = self.weights.values().sum();
        let mut v: Vec<_> = self.weights.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1));
        if v.len() == 1 {
            return v[0].0.name().to_string();
        }
        v.iter()
            .map(|(f, n)| {
                format!(
                    "{} {:.0}%",
                    f.name(),
                    **n as f64 * 100.0 / total.max(1) as f64
                )
            })
            .collect::<Vec<_>>()
            .join(" + ")
    }
}

/// What the layer structs load from: the checkpoint, and the plan's format for each spec.
#[derive(Debug, Clone, Copy)]
pub struct Packer<'a> {
    w: &'a Weights,
    plan: &'a WeightsPlan,
}

impl<'a> Packer<'a> {
    /// Packs `w` as `plan` says.
    pub fn new(w: &'a Weights, plan: &'a WeightsPlan) -> Self {
        Packer { w, plan }
    }

    /// The projection of `spec`, packed in its planned format.
    pub fn projection(&self, spec: &Spec) -> Result<Projection> {
        let fmt = self
            .plan
            .formats
            .get(spec.key())
            .copied()
            .ok_or_else(|| Error::Config(format!("no planned format for {}", spec.key())))?;
        Projection::pack(&spec.stored(self.w)?, spec.k, fmt)
    }

    /// The f32 tensor `name` of shape `shape`, flattened row-major.
    pub fn vector(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        flat(&self.w.get(name, shape)?)
    }

    /// The checkpoint (to ask which optional tensors it has).
    pub fn weights(&self) -> &'a Weights {
        self.w
    }
}

fn flat(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}
