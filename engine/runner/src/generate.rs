//! Single-sequence generation on any [`ModelRunner`] for smoke tests and the `chat` command
//! (the serving path is the engine loop, which batches many sequences). Uses blocks
//! `0..needed` of the runner's pool, so it must not share a runner with a live cache.

use std::path::Path;

use crate::error::{Error, Result};
use crate::model::{ChatMessage, ModelFiles};
use crate::sampling::argmax;
use crate::{ModelRunner, PackedRunner, RunnerConfig, SeqChunk};

/// Greedily extends `prompt` by up to `max_tokens`, stopping after any id in `stop`.
/// Returns the generated ids (the stop token included when hit).
pub fn generate_greedy(
    runner: &mut dyn ModelRunner,
    prompt: &[u32],
    max_tokens: usize,
    stop: &[u32],
) -> Result<Vec<u32>> {
    let bs = runner.block_size();
    let needed = (prompt.len() + max_tokens).div_ceil(bs);
    if needed > runner.num_blocks() {
        return Err(Error::InvalidInput(format!(
            "{} tokens need {needed} blocks, the pool has fewer",
            prompt.len() + max_tokens
        )));
    }
    let table: Vec<u32> = (0..needed as u32).collect();
    let mut out = Vec::new();
    let mut next = prompt.to_vec();
    let mut pos = 0;
    while out.len() < max_tokens {
        let chunk = SeqChunk {
            tokens: &next,
            start_pos: pos,
            block_table: &table,
            want_logits: true,
        };
        let logits = runner
            .step(&[chunk])?
            .pop()
            .flatten()
            .ok_or_else(|| Error::InvalidInput("runner returned no logits".into()))?;
        pos += next.len();
        let tok = argmax(&logits);
        out.push(tok);
        if stop.contains(&tok) {
            break;
        }
        next = vec![tok];
    }
    Ok(out)
}

/// Loads a model, asks it one user question (after a system message, when given) with its
/// chat format and returns the greedy answer text.
pub fn chat_once(
    model: &Path,
    system: Option<&str>,
    question: &str,
    max_tokens: usize,
) -> Result<String> {
    let files = ModelFiles::load(model)?;
    let message = |role: &str, content: &str| ChatMessage {
        role: role.into(),
        content: content.into(),
    };
    let mut messages: Vec<ChatMessage> = system.map(|s| message("system", s)).into_iter().collect();
    messages.push(message("user", question));
    let prompt = files.tokenizer.apply_chat_template(&messages, true)?;
    let ids = files.tokenizer.encode(&prompt)?;
    let block_size = 16;
    let rc = RunnerConfig {
        block_size,
        num_blocks: (ids.len() + max_tokens).div_ceil(block_size),
        kv_dtype: crate::KvDtype::F16,
    };
    let mut runner = PackedRunner::new(&files, rc)?;
    let out = generate_greedy(&mut runner, &ids, max_tokens, files.tokenizer.eos_ids())?;
    files.tokenizer.decode_text(&out)
}
