//! Loads a checkpoint's tensors on the CPU, keyed by Hugging Face Llama names
//! (`model.layers.{i}.self_attn.q_proj.weight`, ...), whatever the file format:
//! - a directory with `config.json`, `*.safetensors` (any float dtype, converted to f32);
//! - a `.gguf` file: 2-D tensors stay as stored (quantized bytes, GGML row-major blocks) so
//!   the runner can pack them without a dequantize-requantize round trip; everything else is
//!   dequantized to f32. What llama.cpp's converter changed is undone, so a tensor means what
//!   the Hugging Face checkpoint's does: the Q/K row permutation it applies to `llama` files
//!   for interleaved RoPE (on whole rows, so it works on quantized rows too; the other
//!   architectures keep half-split RoPE in GGUF), and the `+ 1` it folds into Gemma's norm
//!   scales. The block's norms map by the family's norm names (`ffn_norm` is Llama's
//!   `post_attention_layernorm` but Gemma's `pre_feedforward_layernorm`).
//!
//! Invariant: [`Weights::get`] returns contiguous f32 with the PyTorch `[out, in]` shape
//! (dequantizing on demand) and Hugging Face semantics; [`Weights::stored`] gives the matrix
//! as the file holds it.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor, gguf_file};
use candle_core::{DType, Device, Tensor};

use super::config::ModelConfig;
use super::family::BlockNorms;
use crate::error::{Error, Result};

/// All weights of a checkpoint, by Hugging Face name.
#[derive(Debug)]
pub struct Weights {
    tensors: HashMap<String, Tensor>,
    /// 2-D GGUF tensors kept in their stored encoding (not also in `tensors`).
    raw: HashMap<String, RawMatrix>,
    /// Names of `tensors` that a safetensors file stored in bf16 (widened to f32 at load).
    bf16: HashSet<String>,
}

/// A `[rows, cols]` matrix as a GGUF file stores it: each row is `cols / block` GGML blocks
/// of `dtype` (or plain F32/F16/BF16 values), rows one after another.
#[derive(Debug, Clone)]
pub struct RawMatrix {
    /// The GGML encoding of the bytes.
    pub dtype: GgmlDType,
    /// Output rows.
    pub rows: usize,
    /// Input columns.
    pub cols: usize,
    /// `rows × row_bytes` bytes.
    pub data: Vec<u8>,
}

impl RawMatrix {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_size() * self.dtype.type_size()
    }

    /// The matrix in f32, row-major.
    pub fn dequantize(&self) -> Result<Tensor> {
        let storage = QStorage::from_data(Cow::Borrowed(&self.data), &Device::Cpu, self.dtype)?;
        Ok(QTensor::new(storage, (self.rows, self.cols))?.dequantize(&Device::Cpu)?)
    }

    /// The same matrix with its rows reordered: row `i` of the result is row `order[i]`.
    fn permute_rows(&self, order: &[usize]) -> Self {
        let rb = self.row_bytes();
        let mut data = Vec::with_capacity(self.data.len());
        for &r in order {
            data.extend_from_slice(&self.data[r * rb..(r + 1) * rb]);
        }
        Self {
            data,
            ..self.clone()
        }
    }
}

/// A matrix as stored: f32 values or an encoded GGUF matrix.
#[derive(Debug)]
pub enum Stored<'a> {
    /// Row-major f32 `[rows, cols]`.
    F32(Tensor),
    /// A bf16 checkpoint tensor, widened to f32 (exactly) `[rows, cols]`.
    Bf16(Tensor),
    /// GGUF bytes.
    Raw(&'a RawMatrix),
}

impl Weights {
    /// Wraps an already loaded map (used by the random-model generator and tests).
    pub fn from_map(tensors: HashMap<String, Tensor>) -> Self {
        Self {
            tensors,
            raw: HashMap::new(),
            bf16: HashSet::new(),
        }
    }

    /// Returns the tensor named `name` in f32, checking its shape.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        match self.stored(name, shape)? {
            Stored::F32(t) | Stored::Bf16(t) => Ok(t),
            Stored::Raw(r) => r.dequantize(),
        }
    }

    /// Returns the tensor named `name` as the checkpoint stores it, checking its shape.
    pub fn stored(&self, name: &str, shape: &[usize]) -> Result<Stored<'_>> {
        let dims = if let Some(r) = self.raw.get(name) {
            vec![r.rows, r.cols]
        } else {
            let t = self
                .tensors
                .get(name)
                .ok_or_else(|| Error::weight(name, "missing"))?;
            t.dims().to_vec()
        };
        if dims != shape {
            return Err(Error::weight(
                name,
                format!("shape {dims:?}, expected {shape:?}"),
            ));
        }
        Ok(match self.raw.get(name) {
            Some(r) => Stored::Raw(r),
            None if self.bf16.contains(name) => Stored::Bf16(self.tensors[name].clone()),
            None => Stored::F32(self.tensors[name].clone()),
        })
    }

    /// Whether the checkpoint has a tensor of that name.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name) || self.raw.contains_key(name)
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
        let mut bf16 = HashSet::new();
        for file in files {
            for (name, t) in candle_core::safetensors::load(&file, &Device::Cpu)? {
                if t.dtype() == DType::BF16 {
                    bf16.insert(name.clone());
                }
                let t = if t.dtype() == DType::F32 {
                    t
                } else {
                    t.to_dtype(DType::F32)?
                };
                tensors.insert(name, t.contiguous()?);
            }
        }
        Ok(Self {
            bf16,
            ..Self::from_map(tensors)
        })
    }

    /// Loads the tensors of an already parsed GGUF file: matrices as stored, the rest in f32.
    pub fn from_gguf<R: std::io::Read + std::io::Seek>(
        content: &gguf_file::Content,
        reader: &mut R,
        cfg: &ModelConfig,
    ) -> Result<Self> {
        let mut w = Self::from_map(HashMap::new());
        let spec = cfg.spec();
        // Only llama.cpp's `llama` files have their Q/K rows permuted.
        let permuted = cfg.architecture.gguf_name() == "llama";
        for gguf_name in content.tensor_infos.keys() {
            let Some(hf_name) = hf_name_for_gguf(gguf_name, &spec.family.norms) else {
                continue;
            };
            let q = content.tensor(reader, gguf_name, &Device::Cpu)?;
            if let Ok((rows, cols)) = q.shape().dims2() {
                let mut m = RawMatrix {
                    dtype: q.dtype(),
                    rows,
                    cols,
                    data: q.data()?.into_owned(),
                };
                if let Some(heads) = permuted_heads(&hf_name, cfg).filter(|_| permuted) {
                    let order = unpermuted_row_order(rows, heads, cfg.head_dim(), &hf_name)?;
                    m = m.permute_rows(&order);
                }
                w.raw.insert(hf_name, m);
                continue;
            }
            let mut t = q.dequantize(&Device::Cpu)?.contiguous()?;
            if hf_name.ends_with("norm.weight") && spec.norm_offset != 0.0 {
                t = t.affine(1.0, -f64::from(spec.norm_offset))?;
            }
            w.tensors.insert(hf_name, t);
        }
        Ok(w)
    }
}

/// The heads of a Q or K projection (whose rows llama.cpp permutes), else `None`.
fn permuted_heads(hf_name: &str, cfg: &ModelConfig) -> Option<usize> {
    if hf_name.ends_with("self_attn.q_proj.weight") {
        Some(cfg.num_attention_heads)
    } else if hf_name.ends_with("self_attn.k_proj.weight") {
        Some(cfg.kv_heads())
    } else {
        None
    }
}

/// Maps a llama.cpp tensor name to the Hugging Face name; `None` for tensors we do not use
/// as weights (e.g. `rope_freqs`, read into the config).
fn hf_name_for_gguf(name: &str, norms: &BlockNorms) -> Option<String> {
    match name {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (base, kind) = tail.rsplit_once('.')?;
    let hf_base = match base {
        "attn_norm" => norms.attn_in,
        "ffn_norm" => norms.mlp_in,
        "post_attention_norm" => norms.attn_out?,
        "post_ffw_norm" => norms.mlp_out?,
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    if kind != "weight" && kind != "bias" {
        return None;
    }
    Some(format!("model.layers.{layer}.{hf_base}.{kind}"))
}

/// llama.cpp's converter reorders each head's rows from `[2, hd/2]` (half-split RoPE) to
/// `[hd/2, 2]` (interleaved RoPE). Row `i` of the Hugging Face order is GGUF row
/// `order[i]`: within a head, HF row `h·hd/2 + j` (half `h`, index `j`) is GGUF row `2j + h`.
fn unpermuted_row_order(
    rows: usize,
    heads: usize,
    head_dim: usize,
    name: &str,
) -> Result<Vec<usize>> {
    if rows != heads * head_dim || !head_dim.is_multiple_of(2) {
        return Err(Error::weight(
            name,
            format!("{rows} rows, expected {heads}x{head_dim}"),
        ));
    }
    let half = head_dim / 2;
    Ok((0..rows)
        .map(|i| {
            let (head, r) = (i / head_dim, i % head_dim);
            head * head_dim + 2 * (r % half) + r / half
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_names_map_to_hf_by_the_family_s_norms() {
        use crate::model::Architecture;
        let llama = Architecture::Llama.family().norms;
        let gemma = Architecture::Gemma3.family().norms;
        let map = |n: &str, norms| hf_name_for_gguf(n, norms);
        assert_eq!(
            map("blk.12.attn_q.weight", &llama).as_deref(),
            Some("model.layers.12.self_attn.q_proj.weight")
        );
        assert_eq!(
            map("blk.0.attn_k.bias", &llama).as_deref(),
            Some("model.layers.0.self_attn.k_proj.bias")
        );
        assert_eq!(map("rope_freqs.weight", &llama), None);
        assert_eq!(
            map("blk.1.ffn_norm.weight", &llama).as_deref(),
            Some("model.layers.1.post_attention_layernorm.weight")
        );
        assert_eq!(
            map("blk.1.ffn_norm.weight", &gemma).as_deref(),
            Some("model.layers.1.pre_feedforward_layernorm.weight")
        );
        assert_eq!(
            map("blk.1.post_attention_norm.weight", &gemma).as_deref(),
            Some("model.layers.1.post_attention_layernorm.weight")
        );
        assert_eq!(map("blk.1.post_ffw_norm.weight", &llama), None);
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // One head, head_dim 4: HF rows [a0 a1 b0 b1] became GGUF [a0 b0 a1 b1], so HF row
        // a1 (1) is GGUF row 2 and b0 (2) is GGUF row 1.
        assert_eq!(
            unpermuted_row_order(4, 1, 4, "q").unwrap(),
            vec![0, 2, 1, 3]
        );
        // Two heads of 4: the second head maps the same way, offset by 4.
        assert_eq!(
            unpermuted_row_order(8, 2, 4, "q").unwrap()[4..],
            [4, 6, 5, 7]
        );
    }
}
