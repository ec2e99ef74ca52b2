//! The packed runner's self-attention layer: one fused QKV projection, half-split RoPE on
//! Q and K, this step's K/V written into the paged [`KvStore`], paged grouped-query
//! attention over each row's history ([`crate::attention`]), the output projection.
//!
//! Invariants: a row's K/V are written before any row of the step attends (so a prefill
//! chunk's tokens see each other causally); the layer reads and writes only its own layer
//! of the store.

use super::plan::{Packer, Spec};
use crate::attention::{AttnShape, RowPos, paged_attention};
use crate::error::Result;
use crate::kernels::ops::{rope_inv_freq, rope_row};
use crate::kv_store::KvStore;
use crate::model::ModelConfig;
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
}

impl AttnScratch {
    /// Buffers for `t` rows of `cfg`'s shapes.
    pub fn new(t: usize, cfg: &ModelConfig) -> Self {
        let hd = cfg.head_dim();
        let q = cfg.num_attention_heads * hd;
        let kvd = cfg.kv_heads() * hd;
        AttnScratch {
            qkv: vec![0f32; t * (q + 2 * kvd)],
            attn: vec![0f32; t * q],
            cs: vec![0f32; hd],
        }
    }
}

/// Grouped-query self-attention of layer `layer`, over the paged KV store.
#[derive(Debug)]
pub struct Attention {
    layer: usize,
    /// `[(heads + 2·kv_heads)·head_dim, hidden]`: Q rows, then K, then V.
    wqkv: Projection,
    /// `[hidden, heads·head_dim]`.
    wo: Projection,
    shape: AttnShape,
    inv_freq: Vec<f64>,
}

impl Attention {
    /// The projections of layer `i`: fused `[q; k; v]`, then `o`.
    pub fn specs(i: usize, cfg: &ModelConfig) -> [Spec; 2] {
        let h = cfg.hidden_size;
        let q = cfg.num_attention_heads * cfg.head_dim();
        let kvd = cfg.kv_heads() * cfg.head_dim();
        let n = |s: &str| format!("model.layers.{i}.self_attn.{s}_proj.weight");
        [
            Spec::new(&[(n("q"), q), (n("k"), kvd), (n("v"), kvd)], h),
            Spec::new(&[(n("o"), h)], q),
        ]
    }

    /// Packs layer `i`'s attention.
    pub fn load(p: &Packer<'_>, i: usize, cfg: &ModelConfig) -> Result<Self> {
        let [qkv, o] = Self::specs(i, cfg);
        let hd = cfg.head_dim();
        let (heads, kv_heads) = (cfg.num_attention_heads, cfg.kv_heads());
        Ok(Attention {
            layer: i,
            wqkv: p.projection(&qkv)?,
            wo: p.projection(&o)?,
            shape: AttnShape {
                heads,
                kv_heads,
                head_dim: hd,
                q_stride: (heads + 2 * kv_heads) * hd,
            },
            inv_freq: rope_inv_freq(hd, cfg.rope_theta),
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
        self.rope_and_store(rows, kv, s);
        paged_attention(&s.qkv, rows, kv, self.layer, self.shape, &mut s.attn);
        self.wo.matmul(&s.attn, t, out);
    }

    /// Rotates each row's Q and K by its position and writes its K and V to its slot.
    fn rope_and_store(&self, rows: &[RowPos<'_>], kv: &mut KvStore, s: &mut AttnScratch) {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
            q_stride: w,
        } = self.shape;
        let (q, kvd) = (heads * hd, kv_heads * hd);
        let bs = kv.block_size();
        for (r, row) in rows.iter().enumerate() {
            let base = r * w;
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

    /// Bytes of the packed projections.
    pub fn bytes(&self) -> usize {
        self.wqkv.bytes() + self.wo.bytes()
    }
}
