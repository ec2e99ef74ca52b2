//! The packed runner's gated feed-forward: `down(act(gate(x)) · up(x))` with SiLU (SwiGLU)
//! or tanh-approximated GELU (GeGLU, Gemma), gate and up fused into one projection so one
//! kernel call serves both.
//!
//! Invariant: the fused projection's row is `[gate | up]`, each `intermediate` wide.

use super::ends::ROWS_PER_TASK;
use super::plan::{Packer, Spec};
use crate::error::Result;
use crate::kernels::ops::silu_mul;
use crate::kernels::team;
use crate::model::arch_params::Activation;
use crate::model::{ModelConfig, ModelSpec};
use crate::weight_format::Projection;

/// The buffers one step's feed-forward reuses across layers.
#[derive(Debug)]
pub struct MlpScratch {
    /// `[T, 2·intermediate]`: gate then up.
    gu: Vec<f32>,
    /// `[T, intermediate]`: `silu(gate) · up`.
    act: Vec<f32>,
}

impl MlpScratch {
    /// Buffers for `t` rows of `cfg`'s shapes.
    pub fn new(t: usize, cfg: &ModelConfig) -> Self {
        let inter = cfg.intermediate_size;
        MlpScratch {
            gu: vec![0f32; t * 2 * inter],
            act: vec![0f32; t * inter],
        }
    }
}

/// SwiGLU feed-forward.
#[derive(Debug)]
pub struct Mlp {
    /// `[2·intermediate, hidden]`: gate rows then up rows.
    w_gate_up: Projection,
    /// `[hidden, intermediate]`.
    w_down: Projection,
    inter: usize,
    activation: Activation,
}

impl Mlp {
    /// The projections of layer `i`: fused `[gate; up]`, then `down`.
    pub fn specs(i: usize, cfg: &ModelConfig) -> [Spec; 2] {
        let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let n = |s: &str| format!("model.layers.{i}.mlp.{s}_proj.weight");
        [
            Spec::new(&[(n("gate"), inter), (n("up"), inter)], h),
            Spec::new(&[(n("down"), h)], inter),
        ]
    }

    /// Packs layer `i`'s feed-forward.
    pub fn load(p: &Packer<'_>, i: usize, cfg: &ModelConfig, spec: &ModelSpec) -> Result<Self> {
        let [gate_up, down] = Self::specs(i, cfg);
        Ok(Mlp {
            w_gate_up: p.projection(&gate_up)?,
            w_down: p.projection(&down)?,
            inter: cfg.intermediate_size,
            activation: spec.activation,
        })
    }

    /// `out[T, hidden]` = the feed-forward of the normed rows `hn[T, hidden]`.
    pub fn forward(&self, hn: &[f32], t: usize, s: &mut MlpScratch, out: &mut [f32]) {
        let inter = self.inter;
        self.w_gate_up.matmul(hn, t, &mut s.gu);
        let act = match self.activation {
            Activation::Silu => silu_mul,
            Activation::GeluTanh => gelu_tanh_mul,
        };
        let r = ROWS_PER_TASK;
        let tasks: Vec<_> = (s.act.chunks_mut(inter * r))
            .zip(s.gu.chunks(2 * inter * r))
            .collect();
        team::for_each_item(tasks, |(a, gu)| {
            for (a, row) in a.chunks_exact_mut(inter).zip(gu.chunks_exact(2 * inter)) {
                act(&row[..inter], &row[inter..], a);
            }
        });
        self.w_down.matmul(&s.act, t, out);
    }

    /// Bytes of the packed projections.
    pub fn bytes(&self) -> usize {
        self.w_gate_up.bytes() + self.w_down.bytes()
    }
}

/// `out[i] = gelu(gate[i]) · up[i]` with GELU's tanh form, as PyTorch's `gelu(approximate=
/// "tanh")`: `0.5 g (1 + tanh(√(2/π) (g + 0.044715 g³)))`.
fn gelu_tanh_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for ((o, &g), u) in out.iter_mut().zip(gate).zip(up) {
        let inner = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
        *o = 0.5 * g * (1.0 + inner.tanh()) * u;
    }
}
