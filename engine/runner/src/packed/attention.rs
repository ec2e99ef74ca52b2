//! The packed runner's self-attention layer: one fused QKV projection (plus its bias where
//! the architecture has one), a per-head RMSNorm of Q and K under QK-norm, half-split RoPE
//! on Q and K with the layer's own frequencies, this step's K/V written into the paged
//! [`KvStore`], paged grouped-query attention over each row's history or window
//! ([`crate::attention`]), the output projection (and bias).
//!
//! Invariants: a row's K/V are written before any row of the step attends (so a prefill
//! chunk's tokens see each other causally); the layer reads and writes only its own layer
//! of the store; K is normed and rotated before it is stored, as the reference stores it.

use super::ends::{Bias, RmsNorm};
use super::plan::{Packer, Spec};
use crate::attention::{AttnShape, RowPos, paged_attention};
use crate::error::Result;
use crate::kernels::ops::rope_row;
use crate::kv_store::KvStore;
use crate::model::{ModelConfig, ModelSpec};
use crate::weight_format::Projection;

/// The buffers one step's attention reuses across layers.
#[derive(Debug)]
pub struct AttnScratch {
    /// `[T, q + 2·kv]`: the fused projection's output, Q and K rotated in place.
    qkv: Vec<f32>,
    /// `[T, heads·head_dim]`: attention output before the output projection.
    attn: Vec<f32>,
    /// RoPE's cos/sin row.
    cs: Vec<f32>,
    /// One head, normed.
    head: Vec<f32>,
}

impl AttnScratch {
    /// Buffers for `t` rows of `cfg`'s shapes.
    pub fn new(t: usize, cfg: &ModelConfig) -> Self {
        let hd = cfg.head_dim();
        AttnScratch {
            qkv: vec![0f32; t * (cfg.q_dim() + 2 * cfg.kv_dim())],
            attn: vec![0f32; t * cfg.q_dim()],
            cs: vec![0f32; hd],
            head: vec![0f32; hd],
        }
    }
}

/// Grouped-query self-attention of layer `layer`, over the paged KV store.
#[derive(Debug)]
pub struct Attention {
    layer: usize,
    /// `[(heads + 2·kv_heads)·head_dim, hidden]`: Q rows, then K, then V.
    wqkv: Projection,
    /// `[q + 2·kv]`, where the architecture has Q/K/V biases.
    bqkv: Option<Bias>,
    /// Per-head norms of Q and K (`[head_dim]` each), under QK-norm.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    /// `[hidden, heads·head_dim]`.
    wo: Projection,
    bo: Option<Bias>,
    shape: AttnShape,
    inv_freq: Vec<f64>,
}

impl Attention {
    /// The projections of layer `i`: fused `[q; k; v]`, then `o`.
    pub fn specs(i: usize, cfg: &ModelConfig) -> [Spec; 2] {
        let h = cfg.hidden_size;
        let (q, kvd) = (cfg.q_dim(), cfg.kv_dim());
        let n = |s: &str| format!("model.layers.{i}.self_attn.{s}_proj.weight");
        [
            Spec::new(&[(n("q"), q), (n("k"), kvd), (n("v"), kvd)], h),
            Spec::new(&[(n("o"), h)], q),
        ]
    }

    /// f32 values a decode step reads besides the projections: biases and QK-norm scales.
    pub fn f32_per_token(cfg: &ModelConfig, spec: &ModelSpec) -> usize {
        let bias = usize::from(spec.qkv_bias) * (cfg.q_dim() + 2 * cfg.kv_dim())
            + usize::from(spec.o_bias) * cfg.hidden_size;
        bias + usize::from(spec.family.qk_norm) * 2 * cfg.head_dim()
    }

    /// Packs layer `i`'s attention.
    pub fn load(p: &Packer<'_>, i: usize, cfg: &ModelConfig, spec: &ModelSpec) -> Result<Self> {
        let [qkv, o] = Self::specs(i, cfg);
        let hd = cfg.head_dim();
        let (heads, kv_heads) = (cfg.num_attention_heads, cfg.kv_heads());
        let (q, kvd) = (cfg.q_dim(), cfg.kv_dim());
        let at = |s: &str| format!("model.layers.{i}.self_attn.{s}");
        let bqkv = spec
            .qkv_bias
            .then(|| {
                Bias::fused(
                    p,
                    &[
                        (at("q_proj.bias"), q),
                        (at("k_proj.bias"), kvd),
                        (at("v_proj.bias"), kvd),
                    ],
                )
            })
            .transpose()?;
        let bo = spec
            .o_bias
            .then(|| Bias::fused(p, &[(at("o_proj.bias"), cfg.hidden_size)]))
            .transpose()?;
        let qk_norm = if spec.family.qk_norm {
            let norm = |s: &str| RmsNorm::load(p, &at(s), hd, cfg, spec);
            Some((norm("q_norm.weight")?, norm("k_norm.weight")?))
        } else {
            None
        };
        let layer = &spec.layers[i];
        Ok(Attention {
            layer: i,
            wqkv: p.projection(&qkv)?,
            bqkv,
            qk_norm,
            wo: p.projection(&o)?,
            bo,
            shape: AttnShape {
                heads,
                kv_heads,
                head_dim: hd,
                q_stride: q + 2 * kvd,
                scale: spec.attn_scale as f32,
                window: layer.window,
            },
            inv_freq: layer.rope.inv_freq(hd),
        })
    }

    /// `out[T, hidden]` = attention of the normed rows `hn[T, hidden]` at `rows`, after
    /// writing their K/V into `kv`.
    pub fn forward(
        &self,
        hn: &[f32],
        rows: &[RowPos<'_>],
        kv: &mut KvStore,
        s: &mut AttnScratch,
        out: &mut [f32],
    ) {
        let t = rows.len();
        self.wqkv.matmul(hn, t, &mut s.qkv);
        if let Some(b) = &self.bqkv {
            b.add_rows(&mut s.qkv);
        }
        self.rope_and_store(rows, kv, s);
        paged_attention(&s.qkv, rows, kv, self.layer, self.shape, &mut s.attn);
        self.wo.matmul(&s.attn, t, out);
        if let Some(b) = &self.bo {
            b.add_rows(out);
        }
    }

    /// Norms (under QK-norm) and rotates each row's Q and K by its position and writes its
    /// K and V to its slot.
    fn rope_and_store(&self, rows: &[RowPos<'_>], kv: &mut KvStore, s: &mut AttnScratch) {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
            q_stride: w,
            ..
        } = self.shape;
        let (q, kvd) = (heads * hd, kv_heads * hd);
        let bs = kv.block_size();
        for (r, row) in rows.iter().enumerate() {
            let base = r * w;
            if let Some((qn, kn)) = &self.qk_norm {
                let (qs, ks) = s.qkv[base..base + q + kvd].split_at_mut(q);
                qn.forward_heads(qs, &mut s.head);
                kn.forward_heads(ks, &mut s.head);
            }
            rope_row(
                &mut s.qkv[base..base + q + kvd],
                hd,
                row.pos,
                &self.inv_freq,
                &mut s.cs,
            );
            let block = row.block_table[row.pos / bs];
            let (k, v) = s.qkv[base + q..base + w].split_at(kvd);
            kv.write_token(self.layer, block, row.pos % bs, k, v);
        }
    }

    /// Bytes of the packed projections, biases and QK-norm scales.
    pub fn bytes(&self) -> usize {
        let bias =
            self.bqkv.as_ref().map_or(0, Bias::bytes) + self.bo.as_ref().map_or(0, Bias::bytes);
        let norms = self
            .qk_norm
            .as_ref()
            .map_or(0, |(q, k)| q.bytes() + k.bytes());
        self.wqkv.bytes() + self.wo.bytes() + bias + norms
    }
}
