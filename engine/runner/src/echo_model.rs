//! The echo "model": its vocabulary and tokenizer, and its next-token function.
//!
//! Vocabulary: ids 0–255 are the UTF-8 bytes (byte-level BPE symbols without merges, so
//! `decode(encode(text)) == text` for any text and ASCII text is one token per character),
//! then the ChatML specials `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, so the engine's
//! one chat template and EOS handling apply unchanged.
//!
//! Invariant: [`next_token`] is a pure function of the history (every token at positions
//! `0..=p`), as a real model's output is. So it does not matter how the history reached the
//! KV pool (prefill chunks, decode steps, a restore, a recompute after preemption): the answer
//! is the same, which is what lets the real scheduler and KV manager run underneath it.
//!
//! What it answers:
//! - In a chat (the history's last `<|im_start|>` opens an `assistant` turn): the content of
//!   the last user message (trimmed; `ok` when empty), then `<|im_end|>`, then the same again
//!   (what `ignore_eos` sees).
//! - Otherwise (a raw completion prompt): it continues the history's shortest period, and ends
//!   (`<|im_end|>`) once the history holds exactly two whole periods. A prompt that does not
//!   repeat itself (most text) is thus echoed once, then EOS.

use crate::error::Result;
use crate::model::Tokenizer;
use crate::model::tokenizer::{byte_level_alphabet, tokenizer_json};

/// `<|endoftext|>`.
pub const END_OF_TEXT: u32 = 256;
/// `<|im_start|>`.
pub const IM_START: u32 = 257;
/// `<|im_end|>`: the echo's end of turn (an EOS id of its tokenizer).
pub const IM_END: u32 = 258;
/// Ids in the vocabulary.
pub const VOCAB_SIZE: usize = 259;

/// The echo's tokenizer (byte-level, ChatML specials).
pub fn echo_tokenizer() -> Result<Tokenizer> {
    let mut tokens = byte_level_alphabet();
    tokens.extend(["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from));
    let doc = tokenizer_json(&tokens, &[], &[END_OF_TEXT, IM_START, IM_END]);
    Tokenizer::from_json_str(&doc.to_string())
}

/// The token that follows `history` (not empty).
pub fn next_token(history: &[u32]) -> u32 {
    match assistant_turn(history) {
        Some((source, generated)) => {
            let cycle = source.len() + 1;
            source.get(generated % cycle).copied().unwrap_or(IM_END)
        }
        None => continue_period(history),
    }
}

/// For a history whose last `<|im_start|>` opens an assistant turn: what to echo (the last
/// user message before it) and how many tokens of the turn are already generated.
fn assistant_turn(history: &[u32]) -> Option<(Vec<u32>, usize)> {
    let turn = history.iter().rposition(|&t| t == IM_START)?;
    let header = b"assistant\n".map(u32::from);
    let body = history[turn + 1..].strip_prefix(&header[..])?;
    Some((last_user_message(&history[..turn]), body.len()))
}

/// The trimmed content of the last `<|im_start|>user\n … <|im_end|>` in `prefix`; `ok` when
/// there is none or it is blank.
fn last_user_message(prefix: &[u32]) -> Vec<u32> {
    let header = b"user\n".map(u32::from);
    let content = prefix
        .iter()
        .enumerate()
        .rev()
        .filter(|&(_, &t)| t == IM_START)
        .find_map(|(at, _)| prefix[at + 1..].strip_prefix(&header[..]))
        .map(|rest| {
            let end = rest.iter().position(|&t| t == IM_END).unwrap_or(rest.len());
            &rest[..end]
        })
        .unwrap_or(&[]);
    let blank = |t: &u32| matches!(*t, 0x20 | 0x09 | 0x0a | 0x0d);
    let start = content.iter().position(|t| !blank(t));
    let end = content.iter().rposition(|t| !blank(t));
    match (start, end) {
        (Some(s), Some(e)) => content[s..=e].to_vec(),
        _ => b"ok".map(u32::from).to_vec(),
    }
}

/// Continues the shortest period of `h`; EOS once `h` is exactly two periods long (and does
/// not already end with EOS, so an `ignore_eos` history never repeats EOS back to back).
fn continue_period(h: &[u32]) -> u32 {
    let border = longest_border(h);
    let period = h.len() - border;
    if h.len() == 2 * period && h.last() != Some(&IM_END) {
        return IM_END;
    }
    h.get(border).copied().unwrap_or(IM_END)
}

/// Length of the longest proper prefix of `h` that is also its suffix (the last value of the
/// KMP prefix function).
fn longest_border(h: &[u32]) -> usize {
    let mut pi = vec![0usize; h.len()];
    for i in 1..h.len() {
        let mut k = pi[i - 1];
        while k > 0 && h[i] != h[k] {
            k = pi[k - 1];
        }
        if h[i] == h[k] {
            k += 1;
        }
        pi[i] = k;
    }
    pi.last().copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Generates `n` tokens after `prompt`.
    fn generate(prompt: &[u32], n: usize) -> Vec<u32> {
        let mut h = prompt.to_vec();
        for _ in 0..n {
            let t = next_token(&h);
            h.push(t);
        }
        h[prompt.len()..].to_vec()
    }

    #[test]
    fn a_chat_echoes_the_last_user_message_then_ends_its_turn() {
        let tok = echo_tokenizer().unwrap();
        let chat = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nfirst<|im_end|>\n\
                    <|im_start|>assistant\nx<|im_end|>\n<|im_start|>user\n  hi there \n<|im_end|>\n\
                    <|im_start|>assistant\n";
        let prompt = tok.encode(chat).unwrap();
        let out = generate(&prompt, 9);
        assert_eq!(tok.decode_text(&out[..8]).unwrap(), "hi there");
        assert_eq!(out[8], IM_END);
        assert!(tok.eos_ids().contains(&IM_END));
        // ignore_eos: the same again.
        let more = generate(&prompt, 12);
        assert_eq!(tok.decode_text(&more).unwrap(), "hi therehi ");
    }

    #[test]
    fn a_raw_prompt_is_echoed_once_then_eos() {
        let tok = echo_tokenizer().unwrap();
        let prompt = tok.encode("one two. three").unwrap();
        let out = generate(&prompt, 15);
        assert_eq!(tok.decode_text(&out[..14]).unwrap(), "one two. three");
        assert_eq!(out[14], IM_END);
        let abc = generate(&tok.encode("abc").unwrap(), 5);
        assert_eq!(abc[3], IM_END);
        assert_eq!(tok.decode_text(&abc).unwrap(), "abca");
    }

    #[test]
    fn text_round_trips_and_ascii_is_one_token_per_character() {
        let tok = echo_tokenizer().unwrap();
        for text in ["hello tide", "é ü 日本 🌊", "<|im_start|>user\nx<|im_end|>"] {
            let ids = tok.encode(text).unwrap();
            assert_eq!(tok.decode(&ids).unwrap(), text);
        }
        assert_eq!(tok.encode("hello tide").unwrap().len(), 10);
        assert_eq!(tok.vocab_size(), VOCAB_SIZE);
        assert_eq!(tok.encode("a").unwrap(), vec![u32::from(b'a')]);
    }

    #[test]
    fn an_ignore_eos_history_cycles_without_back_to_back_eos() {
        let out = generate(&[u32::from(b'a')], 40);
        assert!(out.windows(2).all(|w| w != [IM_END, IM_END]), "{out:?}");
        assert!(out.iter().filter(|&&t| t == IM_END).count() >= 5);
    }
}
