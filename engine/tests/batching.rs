//! Batching invariants of the paged runner on the random model: batched decode of N
//! sequences equals their one-by-one decode, paged attention (scattered blocks) equals the
//! dense candle reference, and chunked prefill equals one-shot prefill. The first two also
//! run with quantized weights (`--weights q8_0|q4_1`): there paged attention is checked
//! against one contiguous block, as the dense reference is f32.
#![allow(clippy::unwrap_used, clippy::needless_range_loop)] // test code

mod common;

use tidegate_runner::model::DenseDecoder;
use tidegate_runner::sampling::argmax;
use tidegate_runner::{PackedRunner, RunnerConfig, SeqChunk, WeightChoice};

const TOL: f32 = 1e-4;

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 40, 41, 300, 12],
        vec![7, 8, 9, 10, 11, 12, 13, 14, 15, 200, 201],
        vec![3],
        vec![
            100, 250, 251, 252, 253, 254, 255, 256, 257, 258, 259, 260, 261, 99, 98, 97, 96,
        ],
    ]
}

/// Prefill then greedy-decode `steps` tokens; returns every logits vector produced.
fn run_alone(
    runner: &mut PackedRunner,
    prompt: &[u32],
    table: &[u32],
    steps: usize,
) -> Vec<Vec<f32>> {
    let mut all = Vec::new();
    let mut next = prompt.to_vec();
    let mut pos = 0;
    for _ in 0..=steps {
        let out = runner
            .step(&[SeqChunk {
                tokens: &next,
                start_pos: pos,
                block_table: table,
                want_logits: true,
            }])
            .unwrap();
        let l = out.into_iter().next().unwrap().unwrap();
        pos += next.len();
        next = vec![argmax(&l)];
        all.push(l);
    }
    all
}

#[test]
fn batched_decode_equals_sequential_decode() {
    batched_equals_sequential(WeightChoice::AsFile);
}

#[test]
fn batched_decode_equals_sequential_decode_with_quantized_weights() {
    batched_equals_sequential(WeightChoice::Bf16);
    batched_equals_sequential(WeightChoice::Q8_0);
    batched_equals_sequential(WeightChoice::Q4_1);
}

fn batched_equals_sequential(weights: WeightChoice) {
    let files = common::random_model();
    let rc = RunnerConfig {
        block_size: 4,
        num_blocks: 64,
        kv_dtype: tidegate_runner::KvDtype::F16,
    };
    let steps = 6;
    let ps = prompts();
    // Interleaved, non-contiguous block tables.
    let tables: Vec<Vec<u32>> = (0..ps.len())
        .map(|s| (0..8).map(|i| (i * ps.len() + s) as u32).collect())
        .collect();
    let sequential: Vec<Vec<Vec<f32>>> = ps
        .iter()
        .zip(&tables)
        .map(|(p, t)| {
            let mut r = PackedRunner::with_weights(&files, rc, weights).unwrap();
            run_alone(&mut r, p, t, steps)
        })
        .collect();

    let mut runner = PackedRunner::with_weights(&files, rc, weights).unwrap();
    let mut next: Vec<Vec<u32>> = ps.clone();
    let mut pos = vec![0usize; ps.len()];
    for step in 0..=steps {
        let chunks: Vec<SeqChunk<'_>> = (0..ps.len())
            .map(|s| SeqChunk {
                tokens: &next[s],
                start_pos: pos[s],
                block_table: &tables[s],
                want_logits: true,
            })
            .collect();
        let out = runner.step(&chunks).unwrap();
        for s in 0..ps.len() {
            let l = out[s].as_ref().unwrap();
            common::assert_close(
                l,
                &sequential[s][step],
                TOL,
                &format!("{weights:?} seq {s} step {step}"),
            );
            pos[s] += next[s].len();
            next[s] = vec![argmax(l)];
        }
    }
}

#[test]
fn paged_attention_equals_dense_attention() {
    let files = common::random_model();
    let dense = DenseDecoder::load(&files.weights, &files.config).unwrap();
    let tokens: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 480).collect();
    let want = dense.forward(&tokens).unwrap().to_vec2::<f32>().unwrap();
    for block_size in [1, 3, 16] {
        // f32 KV: the dense reference's precision (paging, not rounding, is what is tested).
        let rc = RunnerConfig {
            block_size,
            num_blocks: 40,
            kv_dtype: tidegate_runner::KvDtype::F32,
        };
        let mut runner = PackedRunner::new(&files, rc).unwrap();
        // Blocks in reverse order, so logical and physical order differ.
        let table: Vec<u32> = (0..tokens.len().div_ceil(block_size) as u32)
            .rev()
            .collect();
        for (p, tok) in tokens.iter().enumerate() {
            let out = runner
                .step(&[SeqChunk {
                    tokens: std::slice::from_ref(tok),
                    start_pos: p,
                    block_table: &table,
                    want_logits: true,
                }])
                .unwrap();
            common::assert_close(
                out[0].as_ref().unwrap(),
                &want[p],
                TOL,
                &format!("block size {block_size} position {p}"),
            );
        }
    }
}

#[test]
fn paged_attention_is_layout_independent_with_quantized_weights() {
    let files = common::random_model();
    let tokens: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 480).collect();
    for weights in [WeightChoice::Q8_0, WeightChoice::Q4_0] {
        let decode = |block_size: usize, reverse: bool| {
            let rc = RunnerConfig {
                block_size,
                num_blocks: 40,
                kv_dtype: tidegate_runner::KvDtype::F16,
            };
            let mut runner = PackedRunner::with_weights(&files, rc, weights).unwrap();
            let mut table: Vec<u32> = (0..tokens.len().div_ceil(block_size) as u32).collect();
            if reverse {
                table.reverse();
            }
            (0..tokens.len())
                .map(|p| {
                    let out = runner
                        .step(&[SeqChunk {
                            tokens: &tokens[p..p + 1],
                            start_pos: p,
                            block_table: &table,
                            want_logits: true,
                        }])
                        .unwrap();
                    out.into_iter().next().unwrap().unwrap()
                })
                .collect::<Vec<_>>()
        };
        let want = decode(32, false);
        for block_size in [1, 3, 16] {
            for (p, got) in decode(block_size, true).iter().enumerate() {
                common::assert_close(
                    got,
                    &want[p],
                    TOL,
                    &format!("{weights:?} block size {block_size} position {p}"),
                );
            }
        }
    }
}

#[test]
fn chunked_prefill_equals_one_shot_prefill() {
    let files = common::random_model();
    let rc = RunnerConfig {
        block_size: 4,
        num_blocks: 16,
        kv_dtype: tidegate_runner::KvDtype::F16,
    };
    let prompt = &prompts()[3];
    let table: Vec<u32> = vec![9, 3, 12, 0, 5, 7];
    let one_shot = run_alone(
        &mut PackedRunner::new(&files, rc).unwrap(),
        prompt,
        &table,
        3,
    );

    let mut runner = PackedRunner::new(&files, rc).unwrap();
    let mut pos = 0;
    let mut last = None;
    for chunk in [&prompt[..5], &prompt[5..9], &prompt[9..10], &prompt[10..]] {
        let out = runner
            .step(&[SeqChunk {
                tokens: chunk,
                start_pos: pos,
                block_table: &table,
                want_logits: pos + chunk.len() == prompt.len(),
            }])
            .unwrap();
        pos += chunk.len();
        last = out.into_iter().next().unwrap();
    }
    let first = last.unwrap();
    common::assert_close(&first, &one_shot[0], TOL, "chunked prefill logits");
    // Decoding after a chunked prefill continues identically.
    let rest = {
        let mut all = vec![first];
        for step in 0..3 {
            let tok = [argmax(all.last().unwrap())];
            let out = runner
                .step(&[SeqChunk {
                    tokens: &tok,
                    start_pos: prompt.len() + step,
                    block_table: &table,
                    want_logits: true,
                }])
                .unwrap();
            all.push(out.into_iter().next().unwrap().unwrap());
        }
        all
    };
    for (i, (a, b)) in rest.iter().zip(&one_shot).enumerate() {
        common::assert_close(a, b, TOL, &format!("decode step {i} after chunked prefill"));
    }
}

#[test]
fn mixed_prefill_and_decode_in_one_step() {
    let files = common::random_model();
    let rc = RunnerConfig {
        block_size: 4,
        num_blocks: 32,
        kv_dtype: tidegate_runner::KvDtype::F16,
    };
    let ps = prompts();
    let ta: Vec<u32> = (0..6).collect();
    let tb: Vec<u32> = (6..12).collect();
    let a_alone = run_alone(&mut PackedRunner::new(&files, rc).unwrap(), &ps[0], &ta, 1);
    let b_alone = run_alone(&mut PackedRunner::new(&files, rc).unwrap(), &ps[1], &tb, 0);

    let mut runner = PackedRunner::new(&files, rc).unwrap();
    let out = runner
        .step(&[SeqChunk {
            tokens: &ps[0],
            start_pos: 0,
            block_table: &ta,
            want_logits: true,
        }])
        .unwrap();
    let a_next = [argmax(out[0].as_ref().unwrap())];
    // A decodes while B prefills, in the same step.
    let out = runner
        .step(&[
            SeqChunk {
                tokens: &a_next,
                start_pos: ps[0].len(),
                block_table: &ta,
                want_logits: true,
            },
            SeqChunk {
                tokens: &ps[1],
                start_pos: 0,
                block_table: &tb,
                want_logits: true,
            },
        ])
        .unwrap();
    common::assert_close(out[0].as_ref().unwrap(), &a_alone[1], TOL, "decode row");
    common::assert_close(out[1].as_ref().unwrap(), &b_alone[0], TOL, "prefill row");
}

#[test]
fn bad_batches_are_refused() {
    let files = common::random_model();
    let rc = RunnerConfig {
        block_size: 4,
        num_blocks: 4,
        kv_dtype: tidegate_runner::KvDtype::F16,
    };
    let mut runner = PackedRunner::new(&files, rc).unwrap();
    let short = [0u32];
    let toks = [1u32, 2, 3, 4, 5];
    let too_long = SeqChunk {
        tokens: &toks,
        start_pos: 0,
        block_table: &short,
        want_logits: true,
    };
    assert!(runner.step(&[too_long]).is_err());
    let oob = [9u32, 1];
    let bad_block = SeqChunk {
        tokens: &toks,
        start_pos: 0,
        block_table: &oob,
        want_logits: true,
    };
    assert!(runner.step(&[bad_block]).is_err());
    let big = [100_000u32];
    let bad_token = SeqChunk {
        tokens: &big,
        start_pos: 0,
        block_table: &short,
        want_logits: true,
    };
    assert!(runner.step(&[bad_token]).is_err());
}

#[test]
fn offloaded_blocks_restore_exactly() {
    use tidegate_kv::block_io::BlockIo;
    let files = common::random_model();
    let rc = RunnerConfig {
        block_size: 4,
        num_blocks: 8,
        kv_dtype: tidegate_runner::KvDtype::F16,
    };
    let prompt = &prompts()[1];
    let table: Vec<u32> = vec![6, 1, 3, 0];
    let want = run_alone(
        &mut PackedRunner::new(&files, rc).unwrap(),
        prompt,
        &table,
        2,
    );

    let mut runner = PackedRunner::new(&files, rc).unwrap();
    let out = runner
        .step(&[SeqChunk {
            tokens: prompt,
            start_pos: 0,
            block_table: &table,
            want_logits: true,
        }])
        .unwrap();
    let first = out[0].clone().unwrap();
    // Offload the sequence's blocks, let another sequence overwrite them, restore them into
    // different block ids, and continue decoding there.
    let images: Vec<Vec<u8>> = table
        .iter()
        .map(|&b| {
            let mut img = Vec::new();
            runner.read_block(b, &mut img).unwrap();
            img
        })
        .collect();
    let other = [9u32; 16];
    runner
        .step(&[SeqChunk {
            tokens: &other,
            start_pos: 0,
            block_table: &table,
            want_logits: false,
        }])
        .unwrap();
    let moved: Vec<u32> = vec![2, 5, 7, 4];
    for (&b, img) in moved.iter().zip(&images) {
        runner.write_block(b, img).unwrap();
    }
    let mut logits = vec![first];
    for step in 0..2 {
        let tok = [argmax(logits.last().unwrap())];
        let out = runner
            .step(&[SeqChunk {
                tokens: &tok,
                start_pos: prompt.len() + step,
                block_table: &moved,
                want_logits: true,
            }])
            .unwrap();
        logits.push(out[0].clone().unwrap());
    }
    for (i, (a, b)) in logits.iter().zip(&want).enumerate() {
        common::assert_close(a, b, TOL, &format!("after restore, step {i}"));
    }
}

#[test]
fn shared_prefix_blocks_are_reused_and_copy_on_write_works() {
    use tidegate_kv::block_io::BlockIo;
    let files = common::random_model();
    let rc = RunnerConfig {
        block_size: 4,
        num_blocks: 16,
        kv_dtype: tidegate_runner::KvDtype::F16,
    };
    // Two prompts sharing their first 8 tokens (two full blocks).
    let shared: Vec<u32> = vec![1, 40, 41, 300, 12, 77, 78, 79];
    let a: Vec<u32> = shared.iter().copied().chain([5, 6, 7]).collect();
    let b: Vec<u32> = shared.iter().copied().chain([200, 201]).collect();
    let b_alone = run_alone(
        &mut PackedRunner::new(&files, rc).unwrap(),
        &b,
        &[0, 1, 2],
        0,
    );

    let mut runner = PackedRunner::new(&files, rc).unwrap();
    let ta: Vec<u32> = vec![3, 4, 5];
    runner
        .step(&[SeqChunk {
            tokens: &a,
            start_pos: 0,
            block_table: &ta,
            want_logits: true,
        }])
        .unwrap();
    // B points at A's two full prefix blocks and only computes its own suffix.
    let tb: Vec<u32> = vec![3, 4, 9];
    let out = runner
        .step(&[SeqChunk {
            tokens: &b[8..],
            start_pos: 8,
            block_table: &tb,
            want_logits: true,
        }])
        .unwrap();
    common::assert_close(out[0].as_ref().unwrap(), &b_alone[0], TOL, "shared prefix");
    // A copy of a shared block behaves like the original.
    runner.copy_block(4, 10).unwrap();
    let tb2: Vec<u32> = vec![3, 10, 11];
    let out = runner
        .step(&[SeqChunk {
            tokens: &b[8..],
            start_pos: 8,
            block_table: &tb2,
            want_logits: true,
        }])
        .unwrap();
    common::assert_close(out[0].as_ref().unwrap(), &b_alone[0], TOL, "copied block");
}
