//! The runner's weight layout: every projection is a [`Projection`] in its served format
//! ([`super::weight_format`]), with the projections that read the same input fused so one
//! kernel call serves them (`wqkv = [q; k; v]`, `w_gate_up = [gate; up]`). Norm scales and
//! the embedding (for row lookup) stay f32 row-major. Built once from [`Weights`]; the
//! checkpoint can be dropped afterwards.
//!
//! [`WeightsPlan`] decides every projection's format from the checkpoint and the
//! `--weights` choice without packing, so the server can report the served format and the
//! bytes per token before the (slower) packing runs on the engine thread.

use std::collections::BTreeMap;

use candle_core::Tensor;

use super::weight_format::{Projection, Served, WeightChoice};
use crate::error::Result;
use crate::model::{LlamaConfig, Weights};

/// One decoder layer, packed.
#[derive(Debug)]
pub struct PackedLayer {
    /// Input RMSNorm scale `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// `[(heads + 2·kv_heads)·head_dim, hidden]`.
    pub wqkv: Projection,
    /// `[hidden, hidden]`.
    pub wo: Projection,
    /// Post-attention RMSNorm scale `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// `[2·intermediate, hidden]`: gate rows then up rows.
    pub w_gate_up: Projection,
    /// `[hidden, intermediate]`.
    pub w_down: Projection,
}

/// All weights, packed.
#[derive(Debug)]
pub struct PackedModel {
    /// `[vocab, hidden]`.
    pub embed: Vec<f32>,
    /// The layers in order.
    pub layers: Vec<PackedLayer>,
    /// Final norm scale.
    pub norm: Vec<f32>,
    /// `[vocab, hidden]` (a packed copy of `embed` when tied).
    pub lm_head: Projection,
    /// The formats chosen and the bytes per token.
    pub plan: WeightsPlan,
}

/// One projection: the checkpoint tensors fused into it (name, rows) and its input width.
struct Spec {
    parts: Vec<(String, usize)>,
    k: usize,
}

impl Spec {
    fn new(parts: &[(&str, usize)], k: usize) -> Self {
        Spec {
            parts: parts.iter().map(|(n, r)| (n.to_string(), *r)).collect(),
            k,
        }
    }

    fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.1).sum()
    }
}

/// Projections of layer `i`, in the order wqkv, wo, w_gate_up, w_down.
fn layer_specs(i: usize, cfg: &LlamaConfig) -> [Spec; 4] {
    let h = cfg.hidden_size;
    let kvd = cfg.kv_heads() * cfg.head_dim();
    let inter = cfg.intermediate_size;
    let p = format!("model.layers.{i}");
    let n = |s: &str| format!("{p}.{s}");
    [
        Spec::new(
            &[
                (&n("self_attn.q_proj.weight"), h),
                (&n("self_attn.k_proj.weight"), kvd),
                (&n("self_attn.v_proj.weight"), kvd),
            ],
            h,
        ),
        Spec::new(&[(&n("self_attn.o_proj.weight"), h)], h),
        Spec::new(
            &[
                (&n("mlp.gate_proj.weight"), inter),
                (&n("mlp.up_proj.weight"), inter),
            ],
            h,
        ),
        Spec::new(&[(&n("mlp.down_proj.weight"), h)], inter),
    ]
}

/// The LM head: its own matrix, or the embedding when tied.
fn lm_head_spec(w: &Weights, cfg: &LlamaConfig) -> Spec {
    let name = if !cfg.tie_word_embeddings && w.contains("lm_head.weight") {
        "lm_head.weight"
    } else {
        "model.embed_tokens.weight"
    };
    Spec::new(&[(name, cfg.vocab_size)], cfg.hidden_size)
}

fn all_specs(w: &Weights, cfg: &LlamaConfig) -> Vec<Spec> {
    let mut specs: Vec<Spec> = (0..cfg.num_hidden_layers)
        .flat_map(|i| layer_specs(i, cfg))
        .collect();
    specs.push(lm_head_spec(w, cfg));
    specs
}

/// The served format of every projection (layers in order, then the LM head).
#[derive(Debug, Clone)]
pub struct WeightsPlan {
    formats: Vec<Served>,
    /// Weights per served format.
    weights: BTreeMap<Served, usize>,
    bytes_per_token: usize,
}

impl WeightsPlan {
    /// Decides the formats (reads only the tensors' encodings and shapes).
    pub fn new(w: &Weights, cfg: &LlamaConfig, choice: WeightChoice) -> Result<Self> {
        let h = cfg.hidden_size;
        let mut plan = WeightsPlan {
            formats: Vec::new(),
            weights: BTreeMap::new(),
            // Norm scales of every layer and the final norm, and one embedding row.
            bytes_per_token: (2 * cfg.num_hidden_layers + 2) * h * 4,
        };
        let specs = all_specs(w, cfg);
        let last = specs.len() - 1;
        for (i, spec) in specs.into_iter().enumerate() {
            // As llama.cpp's quantizer does, a 4-bit conversion keeps the LM head at 8 bits:
            // its errors go straight into the logits (on SmolLM2, 4-bit doubles their error).
            let choice = match choice {
                WeightChoice::Q4_0 | WeightChoice::Q4_1 if i == last => WeightChoice::Q8_0,
                c => c,
            };
            let mut fmt = None;
            for (name, rows) in &spec.parts {
                let stored = w.stored(name, &[*rows, spec.k])?;
                let f = Served::choose(choice, &stored, spec.k);
                fmt = Some(fmt.map_or(f, |g: Served| g.max(f)));
            }
            let fmt = fmt.unwrap_or(Served::F32);
            plan.formats.push(fmt);
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

fn flat(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

impl PackedModel {
    /// Packs checked weights (shapes validated against `cfg`) in the formats `choice` gives.
    pub fn pack(w: &Weights, cfg: &LlamaConfig, choice: WeightChoice) -> Result<Self> {
        let plan = WeightsPlan::new(w, cfg, choice)?;
        let h = cfg.hidden_size;
        let specs = all_specs(w, cfg);
        let mut fmts = plan.formats.iter().copied();
        let mut projections = Vec::with_capacity(specs.len());
        for spec in &specs {
            let parts = spec
                .parts
                .iter()
                .map(|(name, rows)| w.stored(name, &[*rows, spec.k]))
                .collect::<Result<Vec<_>>>()?;
            let fmt = fmts.next().unwrap_or(Served::F32);
            projections.push(Projection::pack(&parts, spec.k, fmt)?);
        }
        let lm_head = projections
            .pop()
            .ok_or_else(|| crate::error::Error::Config("model without an LM head".into()))?;
        let mut it = projections.into_iter();
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let (Some(wqkv), Some(wo), Some(w_gate_up), Some(w_down)) =
                (it.next(), it.next(), it.next(), it.next())
            else {
                return Err(crate::error::Error::Config("layer count".into()));
            };
            layers.push(PackedLayer {
                attn_norm: flat(&w.get(&format!("{p}.input_layernorm.weight"), &[h])?)?,
                wqkv,
                wo,
                ffn_norm: flat(&w.get(&format!("{p}.post_attention_layernorm.weight"), &[h])?)?,
                w_gate_up,
                w_down,
            });
        }
        Ok(Self {
            embed: flat(&w.get("model.embed_tokens.weight", &[cfg.vocab_size, h])?)?,
            layers,
            norm: flat(&w.get("model.norm.weight", &[h])?)?,
            lm_head,
            plan,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::random::{random_config, random_weights};

    #[test]
    fn the_plan_predicts_the_packed_bytes_for_every_choice() {
        let cfg = random_config(300);
        let w = Weights::from_map(random_weights(&cfg, 1).unwrap());
        for choice in [
            WeightChoice::AsFile,
            WeightChoice::F32,
            WeightChoice::Q8_0,
            WeightChoice::Q4_0,
            WeightChoice::Q4_1,
        ] {
            let m = PackedModel::pack(&w, &cfg, choice).unwrap();
            let packed: usize = m
                .layers
                .iter()
                .map(|l| {
                    (l.attn_norm.len() + l.ffn_norm.len()) * 4
                        + l.wqkv.bytes()
                        + l.wo.bytes()
                        + l.w_gate_up.bytes()
                        + l.w_down.bytes()
                })
                .sum::<usize>()
                + (m.norm.len() + cfg.hidden_size) * 4
                + m.lm_head.bytes();
            assert_eq!(m.plan.bytes_per_token(), packed, "{choice:?}");
        }
    }

    #[test]
    fn as_file_serves_an_f32_checkpoint_in_f32_and_converts_on_request() {
        let cfg = random_config(300);
        let w = Weights::from_map(random_weights(&cfg, 1).unwrap());
        let label = |c| WeightsPlan::new(&w, &cfg, c).unwrap().label();
        assert_eq!(label(WeightChoice::AsFile), "f32");
        assert_eq!(label(WeightChoice::Q8_0), "q8_0");
        assert!(
            label(WeightChoice::Q4_0).starts_with("q4_0 "),
            "the LM head stays q8_0"
        );
    }
}
