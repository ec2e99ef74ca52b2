//! The candle device runner on `Device::Cpu`, against the same fixtures as the packed runner:
//! golden logits (f32 weights within 2e-3; bf16 weights within the tolerance stated below),
//! paged == the dense reference, batched == sequential, chunked == one-shot, a step mixing
//! prefill chunks and decode rows, KV blocks moved out and back through `BlockIo`, and
//! (when fetched) SmolLM2 answering the capital question.
#![allow(clippy::unwrap_used, clippy::needless_range_loop)] // test code

mod common;

use candle_core::{DType, Device};
use serde::Deserialize;
use tidegate_kv::block_io::BlockIo;
use tidegate_runner::candle::CandleRunner;
use tidegate_runner::generate::generate_greedy;
use tidegate_runner::model::{ChatMessage, DenseDecoder, ModelFiles};
use tidegate_runner::sampling::argmax;
use tidegate_runner::{DeviceChoice, ModelRunner, RunnerConfig, SeqChunk};

/// Paged vs dense, batched vs sequential, chunked vs one-shot: the same f32 arithmetic up to
/// reassociation.
const TOL: f32 = 1e-4;
/// f32 weights against the independent reference's golden logits (as the packed runner).
const GOLDEN_TOL: f32 = 2e-3;
/// bf16 weights and KV against the f32 golden logits: relative L2 error of each position's
/// logits (bf16 keeps 8 significant bits, about 0.4% per value before accumulation).
const BF16_REL_L2: f32 = 0.03;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn golden() -> Golden {
    serde_json::from_str(include_str!("fixtures/golden_random.json")).unwrap()
}

fn runner(files: &ModelFiles, block_size: usize, num_blocks: usize) -> CandleRunner {
    let rc = RunnerConfig {
        block_size,
        num_blocks,
        kv_dtype: tidegate_runner::KvDtype::F16,
    };
    CandleRunner::new(files, rc, DeviceChoice::Cpu).unwrap()
}

fn decode_one(r: &mut dyn ModelRunner, tok: u32, pos: usize, table: &[u32]) -> Vec<f32> {
    let out = r
        .step(&[SeqChunk {
            tokens: &[tok],
            start_pos: pos,
            block_table: table,
            want_logits: true,
        }])
        .unwrap();
    out.into_iter().next().unwrap().unwrap()
}

/// Prefill then greedy-decode `steps` tokens; every logits vector produced.
fn run_alone(
    r: &mut dyn ModelRunner,
    prompt: &[u32],
    table: &[u32],
    steps: usize,
) -> Vec<Vec<f32>> {
    let out = r
        .step(&[SeqChunk {
            tokens: prompt,
            start_pos: 0,
            block_table: table,
            want_logits: true,
        }])
        .unwrap();
    let mut all = vec![out.into_iter().next().unwrap().unwrap()];
    for s in 0..steps {
        let tok = argmax(all.last().unwrap());
        all.push(decode_one(r, tok, prompt.len() + s, table));
    }
    all
}

fn rel_l2(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

#[test]
fn decode_and_prefill_match_golden_logits() {
    let files = common::random_model();
    let table: Vec<u32> = vec![5, 2, 7, 0, 1, 3, 4, 6];
    for case in &golden().cases {
        let mut r = runner(&files, 4, 8);
        for (p, &tok) in case.tokens.iter().enumerate() {
            let got = decode_one(&mut r, tok, p, &table);
            common::assert_close(&got, &case.logits[p], GOLDEN_TOL, &format!("decode {p}"));
        }
        let mut r = runner(&files, 4, 8);
        let all = run_alone(&mut r, &case.tokens, &table, 0);
        let last = case.logits.last().unwrap();
        common::assert_close(&all[0], last, GOLDEN_TOL, "prefill last position");
    }
}

#[test]
fn bf16_weights_stay_within_the_stated_tolerance_of_golden_logits() {
    let files = common::random_model();
    let rc = RunnerConfig {
        block_size: 4,
        num_blocks: 8,
        kv_dtype: tidegate_runner::KvDtype::F16,
    };
    let table: Vec<u32> = vec![5, 2, 7, 0, 1, 3, 4, 6];
    let mut worst = 0f32;
    for case in &golden().cases {
        let mut r =
            CandleRunner::with_dtype(&files.weights, &files.config, rc, &Device::Cpu, DType::BF16)
                .unwrap();
        for (p, &tok) in case.tokens.iter().enumerate() {
            let got = decode_one(&mut r, tok, p, &table);
            worst = worst.max(rel_l2(&got, &case.logits[p]));
            assert_eq!(argmax(&got), argmax(&case.logits[p]), "greedy token at {p}");
        }
    }
    println!("bf16 worst relative L2 error: {worst:.4}");
    assert!(
        worst <= BF16_REL_L2,
        "bf16 relative L2 error {worst} > {BF16_REL_L2}"
    );
}

#[test]
fn paged_attention_equals_dense_attention() {
    let files = common::random_model();
    let dense = DenseDecoder::load(&files.weights, &files.config).unwrap();
    let tokens: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 480).collect();
    let want = dense.forward(&tokens).unwrap().to_vec2::<f32>().unwrap();
    for block_size in [1, 3, 16] {
        let mut r = runner(&files, block_size, 40);
        let table: Vec<u32> = (0..tokens.len().div_ceil(block_size) as u32)
            .rev()
            .collect();
        for (p, &tok) in tokens.iter().enumerate() {
            let got = decode_one(&mut r, tok, p, &table);
            common::assert_close(
                &got,
                &want[p],
                TOL,
                &format!("block size {block_size} pos {p}"),
            );
        }
    }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 40, 41, 300, 12],
        vec![7, 8, 9, 10, 11, 12, 13, 14, 15, 200, 201],
        vec![3],
        (0..17).map(|i| (i * 13 + 96) % 300).collect(),
    ]
}

#[test]
fn batched_decode_equals_sequential_decode() {
    let files = common::random_model();
    let ps = prompts();
    let steps = 6;
    let tables: Vec<Vec<u32>> = (0..ps.len())
        .map(|s| (0..8).map(|i| (i * ps.len() + s) as u32).collect())
        .collect();
    let sequential: Vec<Vec<Vec<f32>>> = ps
        .iter()
        .zip(&tables)
        .map(|(p, t)| run_alone(&mut runner(&files, 4, 64), p, t, steps))
        .collect();
    let mut r = runner(&files, 4, 64);
    let mut next = ps.clone();
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
        let out = r.step(&chunks).unwrap();
        for s in 0..ps.len() {
            let l = out[s].as_ref().unwrap();
            common::assert_close(
                l,
                &sequential[s][step],
                TOL,
                &format!("seq {s} step {step}"),
            );
            pos[s] += next[s].len();
            next[s] = vec![argmax(l)];
        }
    }
}

#[test]
fn chunked_prefill_equals_one_shot_and_mixes_with_decode_rows() {
    let files = common::random_model();
    let ps = prompts();
    let prompt = &ps[3];
    let table: Vec<u32> = vec![9, 3, 12, 0, 5, 7];
    let one_shot = run_alone(&mut runner(&files, 4, 16), prompt, &table, 0);
    let other_table: Vec<u32> = vec![1, 2, 4];
    let other = run_alone(&mut runner(&files, 4, 16), &ps[0], &other_table, 2);

    // The other sequence prefills, then decodes while `prompt` is prefilled in chunks in the
    // same steps.
    let mut r = runner(&files, 4, 16);
    let first = run_alone(&mut r, &ps[0], &other_table, 0);
    common::assert_close(&first[0], &other[0], TOL, "other prefill");
    let mut pos = 0;
    let mut got = None;
    let mut other_pos = ps[0].len();
    let mut other_next = argmax(&first[0]);
    for (step, chunk) in [&prompt[..5], &prompt[5..9], &prompt[9..]]
        .iter()
        .enumerate()
    {
        let last = pos + chunk.len() == prompt.len();
        let mut chunks = vec![SeqChunk {
            tokens: chunk,
            start_pos: pos,
            block_table: &table,
            want_logits: last,
        }];
        let tok = [other_next];
        if step < 2 {
            chunks.push(SeqChunk {
                tokens: &tok,
                start_pos: other_pos,
                block_table: &other_table,
                want_logits: true,
            });
        }
        let out = r.step(&chunks).unwrap();
        if let Some(l) = out.get(1).and_then(|l| l.as_ref()) {
            common::assert_close(l, &other[step + 1], TOL, &format!("decode row {step}"));
            other_next = argmax(l);
            other_pos += 1;
        }
        pos += chunk.len();
        got = out.into_iter().next().unwrap();
    }
    common::assert_close(&got.unwrap(), &one_shot[0], TOL, "chunked prefill logits");
}

#[test]
fn blocks_moved_out_and_back_give_the_same_logits() {
    let files = common::random_model();
    let prompt = &prompts()[1];
    let table: Vec<u32> = vec![3, 0, 6, 1];
    let want = run_alone(&mut runner(&files, 4, 8), prompt, &table, 2);

    let mut r = runner(&files, 4, 8);
    let first = run_alone(&mut r, prompt, &table, 0);
    // Offload every block, clobber the pool, restore; block 6 comes back by copy-on-write.
    let mut images = Vec::new();
    for &b in &table[..3] {
        let mut img = Vec::new();
        r.read_block(b, &mut img).unwrap();
        assert_eq!(img.len(), r.block_bytes());
        images.push(img);
    }
    let zeros = vec![0u8; r.block_bytes()];
    for &b in &table[..3] {
        r.write_block(b, &zeros).unwrap();
    }
    r.write_block(3, &images[0]).unwrap();
    r.write_block(0, &images[1]).unwrap();
    r.write_block(7, &images[2]).unwrap();
    r.copy_block(7, 6).unwrap();
    let t1 = argmax(&first[0]);
    let l1 = decode_one(&mut r, t1, prompt.len(), &table);
    common::assert_close(&l1, &want[1], TOL, "after restore");
    let mut img = Vec::new();
    assert!(
        r.read_block(8, &mut img).is_err(),
        "out of range is an error"
    );
    assert!(r.write_block(0, &[0; 3]).is_err(), "wrong size is an error");
}

#[test]
fn smollm2_knows_the_capital_of_france_on_the_device_runner() {
    let Some(path) = common::smollm2_path() else {
        return;
    };
    let files = ModelFiles::load(&path).unwrap();
    // The model's own template, after a system message (see tests/smollm2.rs).
    let message = |role: &str, content: &str| ChatMessage {
        role: role.into(),
        content: content.into(),
    };
    let messages = [
        message("system", "You are a helpful assistant."),
        message("user", "What is the capital of France?"),
    ];
    let prompt = files
        .tokenizer
        .apply_chat_template(&messages, true)
        .unwrap();
    let ids = files.tokenizer.encode(&prompt).unwrap();
    let mut r = runner(&files, 16, (ids.len() + 24).div_ceil(16));
    let out = generate_greedy(&mut r, &ids, 24, files.tokenizer.eos_ids()).unwrap();
    let answer = files.tokenizer.decode_text(&out).unwrap();
    println!("answer: {answer}");
    assert!(answer.contains("Paris"), "answer was {answer:?}");
}
