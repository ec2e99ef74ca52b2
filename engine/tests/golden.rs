//! The Rust forward passes (paged runner and dense candle reference) against golden logits
//! computed by an independent reference (tests/reference/golden.py) on the seed-42 random
//! model.
#![allow(clippy::unwrap_used, clippy::needless_range_loop)] // test code

mod common;

use candle_core::Tensor;
use serde::Deserialize;
use tidegate_runner::model::DenseDecoder;
use tidegate_runner::{PackedRunner, RunnerConfig, SeqChunk};

#[derive(Deserialize)]
struct Golden {
    vocab_size: usize,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn golden() -> Golden {
    let text = include_str!("fixtures/golden_random.json");
    serde_json::from_str(text).unwrap()
}

const TOL: f32 = 2e-3;

#[test]
fn dense_reference_matches_golden_logits() {
    let files = common::random_model();
    let g = golden();
    assert_eq!(files.config.vocab_size, g.vocab_size);
    let model = DenseDecoder::load(&files.weights, &files.config).unwrap();
    for case in &g.cases {
        let logits: Tensor = model.forward(&case.tokens).unwrap();
        let rows = logits.to_vec2::<f32>().unwrap();
        for (p, (got, want)) in rows.iter().zip(&case.logits).enumerate() {
            common::assert_close(got, want, TOL, &format!("dense position {p}"));
        }
    }
}

#[test]
fn runner_decode_and_prefill_match_golden_logits() {
    let files = common::random_model();
    let g = golden();
    for case in &g.cases {
        let rc = RunnerConfig {
            block_size: 4,
            num_blocks: 8,
            // f32 KV: the golden logits are f32 math (the f16 pool: arch_fixtures.rs).
            kv_dtype: tidegate_runner::KvDtype::F32,
        };
        // Token by token: every position's logits.
        let mut runner = PackedRunner::new(&files, rc).unwrap();
        let table: Vec<u32> = vec![5, 2, 7, 0, 1, 3, 4, 6];
        for (p, tok) in case.tokens.iter().enumerate() {
            let out = runner
                .step(&[SeqChunk {
                    tokens: std::slice::from_ref(tok),
                    start_pos: p,
                    block_table: &table,
                    want_logits: true,
                }])
                .unwrap();
            let got = out[0].as_ref().unwrap();
            common::assert_close(got, &case.logits[p], TOL, &format!("decode position {p}"));
        }
        // One-shot prefill: last position.
        let mut runner = PackedRunner::new(&files, rc).unwrap();
        let out = runner
            .step(&[SeqChunk {
                tokens: &case.tokens,
                start_pos: 0,
                block_table: &table,
                want_logits: true,
            }])
            .unwrap();
        let last = case.logits.last().unwrap();
        common::assert_close(out[0].as_ref().unwrap(), last, TOL, "prefill last position");
    }
}
