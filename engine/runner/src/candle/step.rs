//! What one step of the candle runner uploads once and every layer reads: the token ids,
//! the per-row RoPE tables, the KV slot of each row, the attention plan, and which rows'
//! logits are wanted.
//!
//! Invariant: row `r` of every tensor here is row `r` of the flattened batch (chunks in
//! order, tokens in order within a chunk).

use candle_core::{Device, Tensor};

use super::attention::AttnPlan;
use super::kv_pool::DeviceKv;
use crate::SeqChunk;
use crate::error::Result;
use crate::model::ModelConfig;

/// A step's inputs on the device.
#[derive(Debug)]
pub struct StepInputs {
    /// `[T]` token ids.
    pub ids: Tensor,
    /// `[T, 1, head_dim]` RoPE cos per row.
    cos: Tensor,
    /// `[T, 1, head_dim]` RoPE sin per row.
    sin: Tensor,
    /// The pool slot of each row (for [`DeviceKv::write`]).
    pub slots: Tensor,
    /// The step's attention groups.
    pub attn: AttnPlan,
    /// Rows whose logits are wanted, in batch order.
    pub last_rows: Vec<u32>,
}

impl StepInputs {
    /// Builds and uploads the inputs of a validated `batch`.
    pub fn new(
        batch: &[SeqChunk<'_>],
        cfg: &ModelConfig,
        kv: &DeviceKv,
        dev: &Device,
    ) -> Result<Self> {
        let bs = kv.shape().block_size;
        let hd = cfg.head_dim();
        let half = hd / 2;
        let mut ids = Vec::new();
        let mut slots = Vec::new();
        let mut cos = Vec::new();
        let mut sin = Vec::new();
        let mut last_rows = Vec::new();
        for c in batch {
            for (i, &t) in c.tokens.iter().enumerate() {
                let pos = c.start_pos + i;
                ids.push(t);
                slots.push(c.block_table[pos / bs] * bs as u32 + (pos % bs) as u32);
                // f64 angles: positions far into a long context keep their precision.
                for _ in 0..2 {
                    for j in 0..half {
                        let freq = 1.0 / cfg.rope_theta.powf(2.0 * j as f64 / hd as f64);
                        let a = pos as f64 * freq;
                        cos.push(a.cos() as f32);
                        sin.push(a.sin() as f32);
                    }
                }
            }
            if c.want_logits {
                last_rows.push((ids.len() - 1) as u32);
            }
        }
        let t = ids.len();
        Ok(StepInputs {
            ids: Tensor::from_vec(ids, t, dev)?,
            cos: Tensor::from_vec(cos, (t, 1, hd), dev)?,
            sin: Tensor::from_vec(sin, (t, 1, hd), dev)?,
            slots: kv.slot_index(&slots)?,
            attn: AttnPlan::new(batch, bs, dev)?,
            last_rows,
        })
    }

    /// Half-split RoPE on `[T, heads, hd]` (f32) at each row's position.
    pub fn rope(&self, x: &Tensor) -> Result<Tensor> {
        let hd = x.dim(2)?;
        let x1 = x.narrow(2, 0, hd / 2)?;
        let x2 = x.narrow(2, hd / 2, hd / 2)?;
        let rot = Tensor::cat(&[&x2.neg()?, &x1], 2)?;
        Ok((x.broadcast_mul(&self.cos)? + rot.broadcast_mul(&self.sin)?)?)
    }
}
