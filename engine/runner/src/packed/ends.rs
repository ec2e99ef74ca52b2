//! The packed model's ends and its small pieces: the token embedding (a row lookup, scaled
//! where the family scales it), RMSNorm over the rows of a step (or over each head of a
//! row, for QK-norm), a bias added to every row, and the LM head (a packed projection, the
//! embedding's copy when tied; logits softcapped where the model says). Norm scales, biases
//! and the embedding stay f32 row-major.
//!
//! Invariants: a norm's scale is what multiplies (the family's `1 + w` offset is added at
//! load); the norms split rows across the compute team's tasks only in chunks of [`ROWS_PER_TASK`] rows.

use super::plan::{Packer, Spec};
use crate::error::Result;
use crate::kernels::ops::rms_norm;
use crate::kernels::team;
use crate::model::{ModelConfig, ModelSpec, Weights};
use crate::weight_format::Projection;

/// Row-wise work is split across threads only in chunks of this many rows.
pub const ROWS_PER_TASK: usize = 16;

/// Token embedding `[vocab, hidden]`.
#[derive(Debug)]
pub struct Embedding {
    table: Vec<f32>,
    hidden: usize,
}

impl Embedding {
    /// Loads `model.embed_tokens.weight`, its rows already multiplied by the family's
    /// scale (one f32 product, as the reference's after the lookup; the LM head packs the
    /// checkpoint's own matrix, so a tied head is not scaled).
    pub fn load(p: &Packer<'_>, cfg: &ModelConfig, spec: &ModelSpec) -> Result<Self> {
        let hidden = cfg.hidden_size;
        let shape = [cfg.vocab_size, hidden];
        let mut table = p.vector("model.embed_tokens.weight", &shape)?;
        if let Some(scale) = spec.embed_scale {
            table.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(Embedding { table, hidden })
    }

    /// The rows of `tokens` (ids already checked against the vocabulary), appended to `x`.
    pub fn forward(&self, tokens: &[u32], x: &mut Vec<f32>) {
        let h = self.hidden;
        for &tok in tokens {
            let at = tok as usize * h;
            x.extend_from_slice(&self.table[at..at + h]);
        }
    }

    /// Bytes a decode step reads: one row.
    pub fn bytes_per_token(&self) -> usize {
        self.hidden * 4
    }
}

/// Root-mean-square norm with a learned scale.
#[derive(Debug)]
pub struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    /// Loads `{name}` (`[len]`), with the family's offset added to the scale.
    pub fn load(
        p: &Packer<'_>,
        name: &str,
        len: usize,
        cfg: &ModelConfig,
        spec: &ModelSpec,
    ) -> Result<Self> {
        let mut weight = p.vector(name, &[len])?;
        weight.iter_mut().for_each(|w| *w += spec.norm_offset);
        Ok(RmsNorm {
            weight,
            eps: cfg.rms_norm_eps as f32,
        })
    }

    /// Each `len`-wide head of one row, in place (`tmp`: one head of scratch).
    pub fn forward_heads(&self, row: &mut [f32], tmp: &mut [f32]) {
        for head in row.chunks_exact_mut(self.weight.len()) {
            rms_norm(head, &self.weight, self.eps, tmp);
            head.copy_from_slice(tmp);
        }
    }

    /// Every row of `x` into the same row of `out`, rows split across threads.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        let h = self.weight.len();
        let r = ROWS_PER_TASK;
        let tasks: Vec<_> = out.chunks_mut(h * r).zip(x.chunks(h * r)).collect();
        team::for_each_item(tasks, |(o, x)| {
            for (o, x) in o.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
                rms_norm(x, &self.weight, self.eps, o);
            }
        });
    }

    /// Rows `rows` of `x`, in that order, into consecutive rows of `out`.
    pub fn forward_rows(&self, x: &[f32], rows: &[usize], out: &mut [f32]) {
        let h = self.weight.len();
        for (o, &r) in out.chunks_exact_mut(h).zip(rows) {
            rms_norm(&x[r * h..(r + 1) * h], &self.weight, self.eps, o);
        }
    }

    /// Bytes of the scale.
    pub fn bytes(&self) -> usize {
        self.weight.len() * 4
    }
}

/// A bias added to every row of a projection's output.
#[derive(Debug)]
pub struct Bias(Vec<f32>);

impl Bias {
    /// The bias of a fused projection: its parts' biases (name, length) one after another.
    pub fn fused(p: &Packer<'_>, parts: &[(String, usize)]) -> Result<Self> {
        let mut b = Vec::new();
        for (name, len) in parts {
            b.extend(p.vector(name, &[*len])?);
        }
        Ok(Bias(b))
    }

    /// `rows[r] += bias` for every row.
    pub fn add_rows(&self, rows: &mut [f32]) {
        for row in rows.chunks_exact_mut(self.0.len()) {
            row.iter_mut().zip(&self.0).for_each(|(x, b)| *x += b);
        }
    }

    /// Bytes of the values.
    pub fn bytes(&self) -> usize {
        self.0.len() * 4
    }
}

/// The LM head `[vocab, hidden]`.
#[derive(Debug)]
pub struct LmHead {
    proj: Projection,
    vocab: usize,
    /// `cap · tanh(logits / cap)`, where the model softcaps its logits.
    softcap: Option<f32>,
}

impl LmHead {
    /// Its own matrix, or the embedding when tied or absent.
    pub fn spec(w: &Weights, cfg: &ModelConfig) -> Spec {
        let name = if !cfg.tie_word_embeddings && w.contains("lm_head.weight") {
            "lm_head.weight"
        } else {
            "model.embed_tokens.weight"
        };
        Spec::new(&[(name.into(), cfg.vocab_size)], cfg.hidden_size).for_logits()
    }

    /// Packs the head in its planned format.
    pub fn load(p: &Packer<'_>, cfg: &ModelConfig, spec: &ModelSpec) -> Result<Self> {
        Ok(LmHead {
            proj: p.projection(&Self::spec(p.weights(), cfg))?,
            vocab: cfg.vocab_size,
            softcap: spec.final_softcap.map(|c| c as f32),
        })
    }

    /// Logits `[rows, vocab]` of normed rows `[rows, hidden]`.
    pub fn forward(&self, normed: &[f32], rows: usize) -> Vec<f32> {
        let mut logits = vec![0f32; rows * self.vocab];
        self.proj.matmul(normed, rows, &mut logits);
        if let Some(cap) = self.softcap {
            logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
        }
        logits
    }

    /// Logits per row (the vocabulary size, at least 1).
    pub fn vocab(&self) -> usize {
        self.vocab.max(1)
    }

    /// Bytes of the packed matrix.
    pub fn bytes(&self) -> usize {
        self.proj.bytes()
    }
}
