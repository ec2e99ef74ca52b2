//! Loads a checkpoint into f32 tensors on the CPU, keyed by Hugging Face Llama names
//! (`model.layers.{i}.self_attn.q_proj.weight`, ...), whatever the file format:
//! - a directory with `config.json`, `*.safetensors` (any float dtype, converted to f32);
//! - a `.gguf` file (quantized tensors dequantized to f32; llama.cpp's Q/K row permutation for
//!   interleaved RoPE is undone so every format uses the same half-split RoPE).
//!
//! Invariant: every tensor returned is contiguous f32 with the PyTorch `[out, in]` shape.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};

use super::config::LlamaConfig;
use crate::error::{Error, Result};

/// All weights of a checkpoint, by Hugging Face name.
#[derive(Debug)]
pub struct Weights {
    tensors: HashMap<String, Tensor>,
}

impl Weights {
    /// Wraps an already loaded map (used by the random-model generator and tests).
    pub fn from_map(tensors: HashMap<String, Tensor>) -> Self {
        Self { tensors }
    }

    /// Returns the tensor named `name`, checking its shape.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::weight(name, "missing"))?;
        if t.dims() != shape {
            return Err(Error::weight(
                name,
                format!("shape {:?}, expected {shape:?}", t.dims()),
            ));
        }
        Ok(t.clone())
    }

    /// Whether the checkpoint has a tensor of that name.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Loads every `*.safetensors` file of a Hugging Face model directory.
    pub fn from_safetensors_dir(dir: &Path) -> Result<Self> {
        let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
        let mut files = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| Error::io(dir, e))?.path();
            if path.extension().is_some_and(|x| x == "safetensors") {
                files.push(path);
            }
        }
        if files.is_empty() {
            return Err(Error::UnsupportedModel(format!(
                "no .safetensors file in {}",
                dir.display()
            )));
        }
        files.sort();
        let mut tensors = HashMap::new();
        for file in files {
            for (name, t) in candle_core::safetensors::load(&file, &Device::Cpu)? {
                let t = if t.dtype() == DType::F32 {
                    t
                } else {
                    t.to_dtype(DType::F32)?
                };
                tensors.insert(name, t.contiguous()?);
            }
        }
        Ok(Self { tensors })
    }

    /// Loads and dequantizes the tensors of an already parsed GGUF file.
    pub fn from_gguf<R: std::io::Read + std::io::Seek>(
        content: &gguf_file::Content,
        reader: &mut R,
        cfg: &LlamaConfig,
    ) -> Result<Self> {
        let mut tensors = HashMap::new();
        let hd = cfg.head_dim();
        for gguf_name in content.tensor_infos.keys() {
            let Some(hf_name) = hf_name_for_gguf(gguf_name) else {
                continue;
            };
            let q = content.tensor(reader, gguf_name, &Device::Cpu)?;
            let mut t = q.dequantize(&Device::Cpu)?;
            if hf_name.ends_with("self_attn.q_proj.weight") {
                t = unpermute_rope_rows(&t, cfg.num_attention_heads, hd)?;
            } else if hf_name.ends_with("self_attn.k_proj.weight") {
                t = unpermute_rope_rows(&t, cfg.kv_heads(), hd)?;
            }
            tensors.insert(hf_name, t.contiguous()?);
        }
        Ok(Self { tensors })
    }
}

/// Maps a llama.cpp tensor name to the Hugging Face name; `None` for tensors we do not use
/// (e.g. precomputed rope frequencies).
fn hf_name_for_gguf(name: &str) -> Option<String> {
    match name {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf_tail = match tail {
        "attn_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf_tail}"))
}

/// llama.cpp's converter reorders each head's rows from `[2, hd/2]` (half-split RoPE) to
/// `[hd/2, 2]` (interleaved RoPE). This restores the Hugging Face order.
fn unpermute_rope_rows(t: &Tensor, heads: usize, head_dim: usize) -> Result<Tensor> {
    let (out, inp) = t.dims2()?;
    if out != heads * head_dim {
        return Err(Error::weight(
            "attention projection",
            format!("{out} rows, expected {heads}x{head_dim}"),
        ));
    }
    Ok(t.reshape((heads, head_dim / 2, 2, inp))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((out, inp))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_names_map_to_hf() {
        assert_eq!(
            hf_name_for_gguf("blk.12.attn_q.weight").as_deref(),
            Some("model.layers.12.self_attn.q_proj.weight")
        );
        assert_eq!(hf_name_for_gguf("rope_freqs.weight"), None);
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // One head, head_dim 4, in 1: HF rows [a0 a1 b0 b1] become GGUF [a0 b0 a1 b1].
        let gguf = Tensor::new(&[[0f32], [2.], [1.], [3.]], &Device::Cpu).unwrap();
        let hf = unpermute_rope_rows(&gguf, 1, 4).unwrap();
        assert_eq!(
            hf.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            vec![0., 1., 2., 3.]
        );
    }
}
