//! What one step of the candle runner uploads once and every layer reads: the token ids,
//! the per-row RoPE tables, the KV slot of each row, the attention plans, and which rows'
//! logits are wanted. A model whose layers differ in RoPE or window (Gemma 3's sliding and
//! global layers) gets one table per distinct RoPE and one plan per distinct window
//! ([`Variants`]); a layer names its pair by [`Variant`].
//!
//! Invariant: row `r` of every tensor here is row `r` of the flattened batch (chunks in
//! order, tokens in order within a chunk).

use candle_core::{Device, Tensor};

use super::attention::{AttnPlan, Heads};
use super::kv_pool::DeviceKv;
use crate::SeqChunk;
use crate::error::Result;
use crate::model::{ModelConfig, ModelSpec};

/// A layer's RoPE table and attention plan, as indices into the step's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    rope: usize,
    plan: usize,
}

/// The distinct RoPEs (as inverse frequencies) and windows of a model's layers.
#[derive(Debug, Clone)]
pub struct Variants {
    inv_freqs: Vec<Vec<f64>>,
    windows: Vec<Option<usize>>,
    /// Each layer's.
    pub layers: Vec<Variant>,
}

impl Variants {
    /// The variants of `spec`'s layers (`head_dim` wide RoPE).
    pub fn new(spec: &ModelSpec, head_dim: usize) -> Self {
        let mut v = Variants {
            inv_freqs: Vec::new(),
            windows: Vec::new(),
            layers: Vec::new(),
        };
        for layer in &spec.layers {
            let f = layer.rope.inv_freq(head_dim);
            let rope = index_of(&mut v.inv_freqs, f);
            let plan = index_of(&mut v.windows, layer.window);
            v.layers.push(Variant { rope, plan });
        }
        v
    }
}

fn index_of<T: PartialEq>(list: &mut Vec<T>, item: T) -> usize {
    match list.iter().position(|x| *x == item) {
        Some(i) => i,
        None => {
            list.push(item);
            list.len() - 1
        }
    }
}

/// A step's inputs on the device.
#[derive(Debug)]
pub struct StepInputs {
    /// `[T]` token ids.
    pub ids: Tensor,
    /// Per distinct RoPE: `[T, 1, head_dim]` cos and sin per row.
    tables: Vec<(Tensor, Tensor)>,
    /// The pool slot of each row (for [`DeviceKv::write`]).
    pub slots: Tensor,
    /// Per distinct window: the step's attention groups.
    plans: Vec<AttnPlan>,
    /// Rows whose logits are wanted, in batch order.
    pub last_rows: Vec<u32>,
}

impl StepInputs {
    /// Builds and uploads the inputs of a validated `batch`.
    pub fn new(
        batch: &[SeqChunk<'_>],
        cfg: &ModelConfig,
        variants: &Variants,
        kv: &DeviceKv,
        dev: &Device,
    ) -> Result<Self> {
        let bs = kv.shape().block_size;
        let hd = cfg.head_dim();
        let mut ids = Vec::new();
        let mut slots = Vec::new();
        let mut positions = Vec::new();
        let mut last_rows = Vec::new();
        for c in batch {
            for (i, &t) in c.tokens.iter().enumerate() {
                let pos = c.start_pos + i;
                ids.push(t);
                positions.push(pos);
                slots.push(c.block_table[pos / bs] * bs as u32 + (pos % bs) as u32);
            }
            if c.want_logits {
                last_rows.push((ids.len() - 1) as u32);
            }
        }
        let t = ids.len();
        let tables = variants
            .inv_freqs
            .iter()
            .map(|f| rope_table(f, &positions, hd, dev))
            .collect::<Result<Vec<_>>>()?;
        let plans = variants
            .windows
            .iter()
            .map(|&w| AttnPlan::new(batch, bs, w, dev))
            .collect::<Result<Vec<_>>>()?;
        Ok(StepInputs {
            ids: Tensor::from_vec(ids, t, dev)?,
            tables,
            slots: kv.slot_index(&slots)?,
            plans,
            last_rows,
        })
    }

    /// Half-split RoPE on `[T, heads, hd]` (f32) at each row's position, with the layer's
    /// frequencies.
    pub fn rope(&self, v: Variant, x: &Tensor) -> Result<Tensor> {
        let (cos, sin) = &self.tables[v.rope];
        let hd = x.dim(2)?;
        let x1 = x.narrow(2, 0, hd / 2)?;
        let x2 = x.narrow(2, hd / 2, hd / 2)?;
        let rot = Tensor::cat(&[&x2.neg()?, &x1], 2)?;
        Ok((x.broadcast_mul(cos)? + rot.broadcast_mul(sin)?)?)
    }

    /// Attention of `layer` with the layer's window (see [`AttnPlan::attend`]).
    pub fn attend(
        &self,
        v: Variant,
        kv: &DeviceKv,
        layer: usize,
        q: &Tensor,
        h: Heads,
    ) -> Result<Tensor> {
        self.plans[v.plan].attend(kv, layer, q, h)
    }
}

/// `[T, 1, hd]` cos and sin of each row's position (f64 angles: positions far into a long
/// context keep their precision), each frequency repeated for both halves.
fn rope_table(
    inv_freq: &[f64],
    positions: &[usize],
    hd: usize,
    dev: &Device,
) -> Result<(Tensor, Tensor)> {
    let t = positions.len();
    let mut cos = Vec::with_capacity(t * hd);
    let mut sin = Vec::with_capacity(t * hd);
    for &pos in positions {
        for _ in 0..2 {
            for f in inv_freq {
                let a = pos as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
    }
    Ok((
        Tensor::from_vec(cos, (t, 1, hd), dev)?,
        Tensor::from_vec(sin, (t, 1, hd), dev)?,
    ))
}
