//! Every served architecture against Hugging Face transformers, on the tiny random-weight
//! models of `tests/fixtures/arch/` (made by `scripts/gen-arch-fixtures.py`, which records
//! transformers' logits and chat prompts): Llama 3 (llama3 RoPE scaling), Qwen2 (Q/K/V biases,
//! tied embeddings), Qwen3 (QK-norm, head_dim ≠ hidden/heads), Mistral (a sliding window
//! shorter than the prompts), Gemma 3 (scaled embeddings, `1 + w` norms around both
//! sub-blocks, QK-norm, GeGLU, interleaved sliding and global layers with their own RoPE,
//! query_pre_attn_scalar, final logit softcapping).
//!
//! On both CPU runners (packed, candle f32) from safetensors, and from the GGUF file llama.cpp's
//! converter made of the same weights where it has one: both prompts prefilled in one batch
//! over scattered paged blocks, then greedy decode steps batched, each row against
//! transformers; and one prompt decoded token by token, every position against transformers.
//! The dense reference against transformers, and paged == dense on a longer sequence.
//!
//! Tolerance: the weights are bf16 values on both sides and the math is f32 on both sides, so
//! what differs is summation order, f64 RoPE angles (transformers: f32) and the tanh/exp of
//! each library: [`TOL`] absolute on logits of magnitude ~1–10. Measured maxima (printed with
//! `--nocapture`), the same on both runners, safetensors and GGUF, and the dense reference:
//! Llama 3, Mistral, Gemma 3 under 1e-5; Qwen2 and Qwen3 (RoPE base 10^6) under 6e-5. A
//! layer that ignored its window misses by ~4, one without Gemma's softcap by ~2e-2.
#![allow(clippy::unwrap_used, clippy::needless_range_loop)] // test code

mod common;

use std::path::PathBuf;

use serde::Deserialize;
use tidegate_runner::candle::CandleRunner;
use tidegate_runner::model::{ChatMessage, DenseDecoder, ModelFiles};
use tidegate_runner::{
    DeviceChoice, KvDtype, ModelRunner, PackedModel, PackedRunner, RunnerConfig, SeqChunk,
    WeightChoice,
};

/// Runners and the dense reference against transformers (f32 math on the same bf16 weights):
/// about 9x the worst measured difference.
const TOL: f32 = 5e-4;
/// Paged runners against the dense reference (same arithmetic up to reassociation).
const DENSE_TOL: f32 = 1e-4;
/// The packed runner with its default f16 KV pool against transformers: each K and V value
/// rounded to 2⁻¹¹ relative (measured: 1.5e-3 llama3 to 6.0e-3 qwen3; about 3x the worst).
const F16_TOL: f32 = 2e-2;

const MODELS: [&str; 6] = [
    "llama3",
    "qwen2",
    "qwen3",
    "mistral",
    "gemma3",
    "gemma3_gguf",
];

#[derive(Deserialize)]
struct Expected {
    architecture: String,
    gguf: bool,
    gguf_positions: Option<usize>,
    cases: Vec<Case>,
    chat: Vec<Chat>,
}

#[derive(Deserialize)]
struct Case {
    prompt: Vec<u32>,
    /// The prompt and its greedy continuation (transformers' choices).
    tokens: Vec<u32>,
    /// The prompt's last position, then each decode step.
    logits: Vec<Vec<f32>>,
    /// Every position of the prompt.
    prompt_logits: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct Chat {
    messages: Vec<Message>,
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/arch")
        .join(name)
}

fn expected(name: &str) -> Expected {
    let text = std::fs::read_to_string(dir(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[derive(Clone, Copy, Debug)]
enum Runner {
    /// The packed runner with an f32 KV pool (the reference comparisons' precision).
    Packed,
    /// The packed runner as served by default: an f16 KV pool.
    PackedF16,
    Candle,
}

impl Runner {
    /// How far its logits may be from transformers'.
    fn tol(self) -> f32 {
        match self {
            Runner::PackedF16 => F16_TOL,
            Runner::Packed | Runner::Candle => TOL,
        }
    }

    fn build(
        self,
        files: &ModelFiles,
        block_size: usize,
        num_blocks: usize,
    ) -> Box<dyn ModelRunner> {
        let kv_dtype = match self {
            Runner::PackedF16 => KvDtype::F16,
            Runner::Packed | Runner::Candle => KvDtype::F32,
        };
        let rc = RunnerConfig {
            block_size,
            num_blocks,
            kv_dtype,
        };
        match self {
            Runner::Packed | Runner::PackedF16 => Box::new(PackedRunner::new(files, rc).unwrap()),
            Runner::Candle => Box::new(CandleRunner::new(files, rc, DeviceChoice::Cpu).unwrap()),
        }
    }
}

fn runner(files: &ModelFiles, kind: Runner, blocks: usize) -> Box<dyn ModelRunner> {
    kind.build(files, 4, blocks)
}

/// Block tables that interleave the sequences' blocks, so no sequence's blocks are adjacent.
fn tables(n: usize, per_seq: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|s| {
            (0..per_seq)
                .map(|i| ((per_seq - 1 - i) * n + s) as u32)
                .collect()
        })
        .collect()
}

/// The worst difference to transformers of one runner on one model: both prompts prefilled
/// in one step, the decode steps batched (fed transformers' tokens), and the first prompt
/// decoded token by token; `positions` limits the comparison to the first positions.
fn worst_against_transformers(
    files: &ModelFiles,
    kind: Runner,
    e: &Expected,
    positions: Option<usize>,
) -> f32 {
    let mut worst = 0f32;
    let cases = &e.cases;
    let per_seq = 8;
    let t = tables(cases.len(), per_seq);
    let full = positions.is_none();
    if full {
        let mut r = runner(files, kind, cases.len() * per_seq);
        let steps = cases[0].logits.len();
        for step in 0..steps {
            let chunks: Vec<SeqChunk<'_>> = cases
                .iter()
                .zip(&t)
                .map(|(c, table)| {
                    let (start, end) = if step == 0 {
                        (0, c.prompt.len())
                    } else {
                        (c.prompt.len() + step - 1, c.prompt.len() + step)
                    };
                    SeqChunk {
                        tokens: &c.tokens[start..end],
                        start_pos: start,
                        block_table: table,
                        want_logits: true,
                    }
                })
                .collect();
            let out = r.step(&chunks).unwrap();
            for (c, got) in cases.iter().zip(out) {
                worst = worst.max(max_diff(&got.unwrap(), &c.logits[step]));
            }
        }
    }
    let c = &cases[0];
    let n = positions.unwrap_or(c.prompt.len()).min(c.prompt.len());
    let mut r = runner(files, kind, cases.len() * per_seq);
    for p in 0..n {
        let out = r
            .step(&[SeqChunk {
                tokens: &c.prompt[p..p + 1],
                start_pos: p,
                block_table: &t[0],
                want_logits: true,
            }])
            .unwrap();
        worst = worst.max(max_diff(out[0].as_ref().unwrap(), &c.prompt_logits[p]));
    }
    worst
}

fn check_runner(kind: Runner) {
    for name in MODELS {
        let e = expected(name);
        let files = ModelFiles::load_hf_dir(&dir(name)).unwrap();
        assert_eq!(files.config.architecture.hf_name(), e.architecture);
        let worst = worst_against_transformers(&files, kind, &e, None);
        println!(
            "{name} ({}) {kind:?} safetensors: max |Δ logit| {worst:.2e}",
            e.architecture
        );
        let tol = kind.tol();
        assert!(worst <= tol, "{name} {kind:?}: {worst} > {tol}");
    }
}

#[test]
fn packed_runner_matches_transformers_on_every_architecture() {
    check_runner(Runner::Packed);
}

#[test]
fn packed_runner_with_its_default_f16_kv_tracks_transformers_on_every_architecture() {
    check_runner(Runner::PackedF16);
}

/// The bytes per token the plan reports before packing (for `/v1/models` and the roofline)
/// are what the packed layers hold, biases and extra norms included.
#[test]
fn the_plan_predicts_the_packed_bytes_of_every_architecture() {
    for name in MODELS {
        let files = ModelFiles::load_hf_dir(&dir(name)).unwrap();
        let m = PackedModel::pack(&files.weights, &files.config, WeightChoice::AsFile).unwrap();
        assert_eq!(m.plan().bytes_per_token(), m.bytes_per_token(), "{name}");
    }
}

#[test]
fn candle_runner_matches_transformers_on_every_architecture() {
    check_runner(Runner::Candle);
}

/// The GGUF files llama.cpp's converter wrote mean the same model: transformers' logits
/// (on Mistral only before the window cuts: llama.cpp's `llama` files keep no window).
#[test]
fn gguf_files_from_llama_cpp_s_converter_match_transformers() {
    let mut seen = 0;
    for name in MODELS {
        let e = expected(name);
        if !e.gguf {
            continue;
        }
        seen += 1;
        let files = ModelFiles::load_gguf(&dir(name).join("model.gguf")).unwrap();
        for kind in [Runner::Packed, Runner::PackedF16, Runner::Candle] {
            let worst = worst_against_transformers(&files, kind, &e, e.gguf_positions);
            println!("{name} {kind:?} gguf: max |Δ logit| {worst:.2e}");
            let tol = kind.tol();
            assert!(worst <= tol, "{name} {kind:?} gguf: {worst} > {tol}");
        }
    }
    assert_eq!(seen, 5, "llama, qwen2, qwen3, mistral (as llama), gemma3");
}

#[test]
fn dense_reference_matches_transformers_and_paged_equals_dense() {
    for name in MODELS {
        let e = expected(name);
        let files = ModelFiles::load_hf_dir(&dir(name)).unwrap();
        let dense = DenseDecoder::load(&files.weights, &files.config).unwrap();
        let mut worst = 0f32;
        for c in &e.cases {
            let rows = dense.forward(&c.tokens).unwrap().to_vec2::<f32>().unwrap();
            for (p, want) in c.prompt_logits.iter().enumerate() {
                worst = worst.max(max_diff(&rows[p], want));
            }
            for (s, want) in c.logits.iter().enumerate() {
                worst = worst.max(max_diff(&rows[c.prompt.len() - 1 + s], want));
            }
        }
        println!("{name} dense: max |Δ logit| {worst:.2e}");
        assert!(worst <= TOL, "{name} dense: {worst} > {TOL}");

        // Paged == dense past every window, with blocks smaller and larger than a window.
        let tokens: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 300).collect();
        let want = dense.forward(&tokens).unwrap().to_vec2::<f32>().unwrap();
        for kind in [Runner::Packed, Runner::Candle] {
            for block_size in [1, 3, 16] {
                let mut r = kind.build(&files, block_size, 40);
                let table: Vec<u32> = (0..tokens.len().div_ceil(block_size) as u32)
                    .rev()
                    .collect();
                for (p, tok) in tokens.iter().enumerate() {
                    let out = r
                        .step(&[SeqChunk {
                            tokens: std::slice::from_ref(tok),
                            start_pos: p,
                            block_table: &table,
                            want_logits: true,
                        }])
                        .unwrap();
                    let what = format!("{name} {kind:?} block {block_size} pos {p}");
                    common::assert_close(out[0].as_ref().unwrap(), &want[p], DENSE_TOL, &what);
                }
            }
        }
    }
}

/// The model's own template, rendered as transformers' `apply_chat_template` renders it, and
/// tokenized to the same ids; from the GGUF file's `tokenizer.chat_template` too.
#[test]
fn chat_templates_render_as_transformers_does() {
    for name in MODELS {
        let e = expected(name);
        let mut sources = vec![ModelFiles::load_hf_dir(&dir(name)).unwrap()];
        if e.gguf {
            sources.push(ModelFiles::load_gguf(&dir(name).join("model.gguf")).unwrap());
        }
        for files in &sources {
            assert_eq!(files.tokenizer.chat_format().describe(), "model", "{name}");
            for chat in &e.chat {
                let msgs: Vec<ChatMessage> = chat
                    .messages
                    .iter()
                    .map(|m| ChatMessage {
                        role: m.role.clone(),
                        content: m.content.clone(),
                    })
                    .collect();
                let text = files.tokenizer.apply_chat_template(&msgs, true).unwrap();
                assert_eq!(text, chat.text, "{name}: rendered prompt");
                let ids = files.tokenizer.encode(&text).unwrap();
                assert_eq!(ids, chat.ids, "{name}: prompt tokens");
            }
        }
    }
}
