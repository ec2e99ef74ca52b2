//! Where the candle runner's layer structs get their tensors: [`TensorSource`] is either a
//! loaded checkpoint (tensors by Hugging Face name, quantized GGUF matrices dequantized at
//! load by [`Weights::get`], then narrowed to the runner's dtype and moved to the device) or
//! random values of the config's shapes drawn on the device (`bench --random-config`: a GPU
//! benchmark of real shapes needs no weight files to carry). Each layer struct has one
//! `load` over either source.
//!
//! Invariants: every matrix is `[out, in]` (the checkpoint's layout, used as `x · Wᵀ`) in
//! the runner's dtype; a fused matrix is its parts' rows in the order given; norm scales are
//! f32 (the normalization runs in f32).

use candle_core::{DType, Device, Tensor};

use crate::error::Result;
use crate::model::{ModelConfig, Weights};

/// A checkpoint on the host, or random values.
#[derive(Debug, Clone, Copy)]
enum Origin<'a> {
    Checkpoint(&'a Weights),
    Random,
}

/// The tensors the layer structs load, in the runner's dtype on its device.
#[derive(Debug, Clone, Copy)]
pub struct TensorSource<'a> {
    origin: Origin<'a>,
    dtype: DType,
    device: &'a Device,
}

impl<'a> TensorSource<'a> {
    /// The tensors of a loaded checkpoint.
    pub fn checkpoint(w: &'a Weights, dtype: DType, device: &'a Device) -> Self {
        TensorSource {
            origin: Origin::Checkpoint(w),
            dtype,
            device,
        }
    }

    /// Random tensors: projections N(0, 1/in), so activations keep unit scale through the
    /// layers (bf16 neither overflows nor flushes); norms all ones. Only the shapes matter
    /// to a benchmark: a step does the same work whatever the values.
    pub fn random(dtype: DType, device: &'a Device) -> Self {
        TensorSource {
            origin: Origin::Random,
            dtype,
            device,
        }
    }

    /// The runner's dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The row-wise fusion of `parts` (name, rows), each `[rows, cols]`.
    pub fn matrix(&self, parts: &[(String, usize)], cols: usize) -> Result<Tensor> {
        match self.origin {
            Origin::Checkpoint(w) => {
                let t = parts
                    .iter()
                    .map(|(name, rows)| w.get(name, &[*rows, cols]))
                    .collect::<Result<Vec<_>>>()?;
                let t = if t.len() == 1 {
                    t[0].clone()
                } else {
                    Tensor::cat(&t, 0)?
                };
                Ok(t.to_dtype(self.dtype)?.to_device(self.device)?)
            }
            Origin::Random => {
                let rows = parts.iter().map(|p| p.1).sum::<usize>();
                // candle draws normals only in f32 on CUDA; each matrix is narrowed as it is
                // made, so the f32 copy of one matrix at a time is the only transient.
                let std = 1.0 / (cols as f32).sqrt();
                Ok(Tensor::randn(0f32, std, (rows, cols), self.device)?.to_dtype(self.dtype)?)
            }
        }
    }

    /// A bias: the parts (name, length) one after another, `[len]` in the runner's dtype
    /// (random: small values, as a bias has).
    pub fn vector(&self, parts: &[(String, usize)]) -> Result<Tensor> {
        let len = parts.iter().map(|p| p.1).sum::<usize>();
        match self.origin {
            Origin::Checkpoint(w) => {
                let t = parts
                    .iter()
                    .map(|(name, n)| w.get(name, &[*n]))
                    .collect::<Result<Vec<_>>>()?;
                Ok(Tensor::cat(&t, 0)?
                    .to_dtype(self.dtype)?
                    .to_device(self.device)?)
            }
            Origin::Random => {
                Ok(Tensor::randn(0f32, 0.02, len, self.device)?.to_dtype(self.dtype)?)
            }
        }
    }

    /// A norm scale `[len]` in f32.
    pub fn norm(&self, name: &str, len: usize) -> Result<Tensor> {
        match self.origin {
            Origin::Checkpoint(w) => Ok(w
                .get(name, &[len])?
                .to_dtype(DType::F32)?
                .to_device(self.device)?),
            Origin::Random => Ok(Tensor::ones(len, DType::F32, self.device)?),
        }
    }

    /// Whether the LM head is its own matrix (else the embedding is shared): the config's
    /// tie flag, and for a checkpoint, whether it has `lm_head.weight`.
    pub fn has_own_lm_head(&self, cfg: &ModelConfig) -> bool {
        !cfg.tie_word_embeddings
            && match self.origin {
                Origin::Checkpoint(w) => w.contains("lm_head.weight"),
                Origin::Random => true,
            }
    }
}

/// Bytes of a tensor.
pub fn bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}
