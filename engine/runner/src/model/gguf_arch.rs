//! The architecture-specific fields of a GGUF file's config ([`ArchParams`]): what
//! llama.cpp's converter writes under `{arch}.*` and, where it writes nothing, what
//! llama.cpp itself assumes for the architecture, so a file means here what it means there.
//!
//! - `llama`: Llama 3's RoPE scaling is not in the metadata but a `rope_freqs` tensor (one
//!   divisor per frequency); Mistral is written as `llama` without its window.
//! - `gemma3`: the window, the global layers' RoPE base and scaling, and the final logit
//!   cap are written; llama.cpp fixes the rest: every 6th layer global, sliding layers at
//!   RoPE base 10 000, queries scaled by `head_dim^-0.5` (the 27B model, 62 layers, by
//!   `(hidden / heads)^-0.5`), GeGLU with tanh GELU.
//!
//! Invariant: only fields a GGUF reader can know are set; everything else stays at its
//! default, as for a `config.json` that leaves it out.

use std::io::{Read, Seek};

use candle_core::Device;
use candle_core::quantized::gguf_file;

use super::arch_params::{ArchParams, RopeParams};
use super::architecture::Architecture;
use crate::error::Result;

/// llama.cpp's layer count for Gemma 3 27B (the one size with another query scale).
const GEMMA3_27B_LAYERS: usize = 62;

/// The [`ArchParams`] of a GGUF file of `arch`.
pub fn params<R: Read + Seek>(
    content: &gguf_file::Content,
    reader: &mut R,
    arch: Architecture,
    head_dim: Option<usize>,
) -> Result<ArchParams> {
    let mut p = ArchParams {
        head_dim,
        ..ArchParams::default()
    };
    match arch {
        Architecture::Llama | Architecture::Mistral => {
            if content.tensor_infos.contains_key("rope_freqs.weight") {
                let t = content.tensor(reader, "rope_freqs.weight", &Device::Cpu)?;
                let d = t
                    .dequantize(&Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                p.rope_freq_factors = Some(d.into_iter().map(f64::from).collect());
            }
        }
        Architecture::Qwen2 | Architecture::Qwen3 => {}
        Architecture::Gemma3 => gemma3(content, &mut p)?,
    }
    Ok(p)
}

fn gemma3(content: &gguf_file::Content, p: &mut ArchParams) -> Result<()> {
    let md = &content.metadata;
    let num = |k: &str| -> Result<Option<f64>> {
        md.get(&format!("gemma3.{k}"))
            .map(|v| {
                v.to_f32()
                    .map(f64::from)
                    .or_else(|_| v.to_u32().map(f64::from))
            })
            .transpose()
            .map_err(Into::into)
    };
    let count = |k: &str| -> Result<usize> { Ok(num(k)?.unwrap_or(0.0) as usize) };
    p.sliding_window = num("attention.sliding_window")?.map(|w| w as usize);
    p.sliding_window_pattern = Some(6);
    p.rope_local_base_freq = Some(10_000.0);
    p.final_logit_softcapping = num("final_logit_softcapping")?;
    p.hidden_activation = Some("gelu_pytorch_tanh".into());
    let heads = count("attention.head_count")?.max(1);
    let head_dim = count("attention.key_length")?;
    let scalar = if count("block_count")? == GEMMA3_27B_LAYERS {
        count("embedding_length")? / heads
    } else {
        head_dim
    };
    p.query_pre_attn_scalar = (scalar > 0).then_some(scalar as f64);
    let scaling = md
        .get("gemma3.rope.scaling.type")
        .and_then(|v| v.to_string().ok().cloned());
    if scaling.as_deref() == Some("linear") {
        p.rope_scaling = Some(RopeParams {
            rope_type: Some("linear".into()),
            factor: num("rope.scaling.factor")?,
            ..RopeParams::default()
        });
    }
    Ok(())
}
