//! A tiny random-weight Llama for fast tests and the local demo, written in the Hugging Face
//! layout (`config.json`, `model.safetensors`, `tokenizer.json`). Everything is a pure
//! function of the seed: the same seed gives byte-identical files. The tokenizer is a real
//! byte-level BPE (256 byte symbols + merges learned from a fixed text + ChatML specials), so
//! any text round-trips.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor};
use serde_json::json;

use super::arch_params::ArchParams;
use super::architecture::Architecture;
use super::config::ModelConfig;
use super::tokenizer::{byte_level_alphabet, tokenizer_json};
use crate::error::{Error, Result};
use crate::sampling::Rng;

/// Special tokens, at ids 0.. like SmolLM2.
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const MERGES: usize = 240;
const CORPUS: &str = "The capital of France is Paris. The quick brown fox jumps over the lazy \
dog. What is the capital of Germany? Berlin is the capital of Germany. A language model \
predicts the next token of a text. The engine serves tokens to the tenants of the pool, and \
the operator scales the pool from the measured throughput of every engine. Hello, world! \
user assistant system <|im_start|> Tokens per second, queue wait, time to first token. \
1234567890 the of and to in is that it for on with as was at by";

/// The shape of the generated model.
pub fn random_config(vocab_size: usize) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        hidden_size: 64,
        intermediate_size: 160,
        num_hidden_layers: 3,
        num_attention_heads: 4,
        num_key_value_heads: Some(2),
        vocab_size,
        rms_norm_eps: 1e-5,
        rope_theta: 50_000.0,
        max_position_embeddings: 1024,
        tie_word_embeddings: true,
        bos_token_id: Some(0),
        eos_token_id: vec![2],
        arch: ArchParams::default(),
    }
}

/// Learns `MERGES` byte-level BPE merges from the fixed corpus (ties broken by pair order).
fn learn_merges() -> (Vec<String>, Vec<String>) {
    let alphabet = byte_level_alphabet();
    let mut words: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for (i, w) in CORPUS.split(' ').enumerate() {
        let text = if i == 0 {
            w.to_string()
        } else {
            format!(" {w}")
        };
        let syms = text.bytes().map(|b| alphabet[b as usize].clone()).collect();
        *words.entry(syms).or_default() += 1;
    }
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    tokens.extend(alphabet.iter().cloned());
    let mut merges = Vec::new();
    for _ in 0..MERGES {
        let mut counts: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (w, n) in &words {
            for pair in w.windows(2) {
                *counts
                    .entry((pair[0].clone(), pair[1].clone()))
                    .or_default() += n;
            }
        }
        let Some(best) = counts
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(p, _)| p.clone())
        else {
            break;
        };
        let joined = format!("{}{}", best.0, best.1);
        merges.push(format!("{} {}", best.0, best.1));
        tokens.push(joined.clone());
        words = words
            .into_iter()
            .map(|(w, n)| {
                let mut out = Vec::with_capacity(w.len());
                let mut i = 0;
                while i < w.len() {
                    if i + 1 < w.len() && w[i] == best.0 && w[i + 1] == best.1 {
                        out.push(joined.clone());
                        i += 2;
                    } else {
                        out.push(w[i].clone());
                        i += 1;
                    }
                }
                (out, n)
            })
            .collect();
    }
    (tokens, merges)
}

fn normal(rng: &mut Rng, shape: &[usize], std: f32, mean: f32) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| mean + std * rng.next_normal()).collect();
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

/// The random weights for `cfg`, by Hugging Face name.
pub fn random_weights(cfg: &ModelConfig, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut rng = Rng::new(seed);
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let kvd = cfg.kv_heads() * cfg.head_dim();
    let proj = |rng: &mut Rng, out: usize, inp: usize| {
        normal(rng, &[out, inp], 1.0 / (inp as f32).sqrt(), 0.0)
    };
    let mut w = HashMap::new();
    w.insert(
        "model.embed_tokens.weight".to_string(),
        normal(&mut rng, &[cfg.vocab_size, h], 0.5, 0.0)?,
    );
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let mut put = |name: &str, t: Tensor| w.insert(format!("{p}.{name}"), t);
        put("input_layernorm.weight", normal(&mut rng, &[h], 0.1, 1.0)?);
        put("self_attn.q_proj.weight", proj(&mut rng, h, h)?);
        put("self_attn.k_proj.weight", proj(&mut rng, kvd, h)?);
        put("self_attn.v_proj.weight", proj(&mut rng, kvd, h)?);
        put("self_attn.o_proj.weight", proj(&mut rng, h, h)?);
        put(
            "post_attention_layernorm.weight",
            normal(&mut rng, &[h], 0.1, 1.0)?,
        );
        put("mlp.gate_proj.weight", proj(&mut rng, i, h)?);
        put("mlp.up_proj.weight", proj(&mut rng, i, h)?);
        put("mlp.down_proj.weight", proj(&mut rng, h, i)?);
    }
    w.insert(
        "model.norm.weight".to_string(),
        normal(&mut rng, &[h], 0.1, 1.0)?,
    );
    Ok(w)
}

/// Writes `config.json`, `model.safetensors` and `tokenizer.json` into `out` (created).
pub fn write_random_model(out: &Path, seed: u64) -> Result<ModelConfig> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let (tokens, merges) = learn_merges();
    let specials: Vec<u32> = (0..SPECIALS.len() as u32).collect();
    let tok = tokenizer_json(&tokens, &merges, &specials);
    let cfg = random_config(tokens.len());
    let weights = random_weights(&cfg, seed)?;

    let mut cfg_json = serde_json::to_value(&cfg)
        .map_err(|e| Error::Config(format!("serializing config: {e}")))?;
    if let Some(obj) = cfg_json.as_object_mut() {
        obj.insert("model_type".into(), json!("llama"));
        obj.insert("hidden_act".into(), json!("silu"));
        obj.insert("torch_dtype".into(), json!("float32"));
    }
    let write = |name: &str, body: String| {
        let p = out.join(name);
        std::fs::write(&p, body).map_err(|e| Error::io(&p, e))
    };
    write(
        "config.json",
        serde_json::to_string_pretty(&cfg_json)
            .map_err(|e| Error::Config(format!("serializing config: {e}")))?,
    )?;
    write("tokenizer.json", tok.to_string())?;
    let weights_path = out.join("model.safetensors");
    candle_core::safetensors::save(&weights, &weights_path)?;
    // The safetensors writer creates its file owner-only (0600); a model is read by engines
    // running as another user (uid 65532 in the image), e.g. from a volume root filled.
    readable_by_all(&weights_path)?;
    Ok(cfg)
}

#[cfg(unix)]
fn readable_by_all(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| Error::io(path, e))
}

#[cfg(not(unix))]
fn readable_by_all(_path: &Path) -> Result<()> {
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn every_file_of_a_random_model_is_readable_by_other_users() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_random_model(dir.path(), 1).expect("write");
        for name in ["config.json", "model.safetensors", "tokenizer.json"] {
            let mode = std::fs::metadata(dir.path().join(name))
                .expect("metadata")
                .permissions()
                .mode();
            assert_eq!(
                mode & 0o044,
                0o044,
                "{name} is not readable by group and others: {mode:o}"
            );
        }
    }
}
