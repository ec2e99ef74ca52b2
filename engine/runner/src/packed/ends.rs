//! The packed model's ends and its norm: the token embedding (a row lookup), RMSNorm over
//! the rows of a step, and the LM head (a packed projection, the embedding's copy when
//! tied). Norm scales and the embedding stay f32 row-major.
//!
//! Invariant: every row is `hidden` wide; the norms split rows across rayon tasks only in
//! chunks of [`ROWS_PER_TASK`] rows.

use rayon::prelude::*;

use super::plan::{Packer, Spec};
use crate::error::Result;
use crate::kernels::ops::rms_norm;
use crate::model::{ModelConfig, Weights};
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
    /// Loads `model.embed_tokens.weight`.
    pub fn load(p: &Packer<'_>, cfg: &ModelConfig) -> Result<Self> {
        let hidden = cfg.hidden_size;
        let shape = [cfg.vocab_size, hidden];
        Ok(Embedding {
            table: p.vector("model.embed_tokens.weight", &shape)?,
            hidden,
        })
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
    /// Loads `{name}` (`[hidden]`).
    pub fn load(p: &Packer<'_>, name: &str, cfg: &ModelConfig) -> Result<Self> {
        Ok(RmsNorm {
            weight: p.vector(name, &[cfg.hidden_size])?,
            eps: cfg.rms_norm_eps as f32,
        })
    }

    /// Every row of `x` into the same row of `out`, rows split across threads.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        let h = self.weight.len();
        out.par_chunks_mut(h)
            .zip(x.par_chunks(h))
            .with_min_len(ROWS_PER_TASK)
            .for_each(|(o, r)| rms_norm(r, &self.weight, self.eps, o));
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

/// The LM head `[vocab, hidden]`.
#[derive(Debug)]
pub struct LmHead {
    proj: Projection,
    vocab: usize,
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
    pub fn load(p: &Packer<'_>, cfg: &ModelConfig) -> Result<Self> {
        Ok(LmHead {
            proj: p.projection(&Self::spec(p.weights(), cfg))?,
            vocab: cfg.vocab_size,
        })
    }

    /// Logits `[rows, vocab]` of normed rows `[rows, hidden]`.
    pub fn forward(&self, normed: &[f32], rows: usize) -> Vec<f32> {
        let mut logits = vec![0f32; rows * self.vocab];
        self.proj.matmul(normed, rows, &mut logits);
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
