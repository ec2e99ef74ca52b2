//! Tokenizer round trips (random model's BPE; SmolLM2's GGUF tokenizer when present) and the
//! ChatML template.
#![allow(clippy::unwrap_used, clippy::needless_range_loop)] // test code

mod common;

use tidegate_runner::model::{ChatMessage, ModelFiles, TextStream, Tokenizer, chat_prompt};

const TEXTS: &[&str] = &[
    "Hello",
    "Hello, world!",
    " leading space and  double  spaces",
    "trailing newline\n\n",
    "digits 1234567890 and 3.14159",
    "unicode: café, naïve, 東京, emoji 🦀🚀",
    "tabs\tand\r\nwindows lines",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
    "",
];

fn check_round_trip(tok: &Tokenizer) {
    for text in TEXTS {
        let ids = tok.encode(text).unwrap();
        assert_eq!(
            &tok.decode(&ids).unwrap(),
            text,
            "round trip of {text:?} via {ids:?}"
        );
    }
    let im_start = tok.token_id("<|im_start|>").unwrap();
    let ids = tok.encode(TEXTS[7]).unwrap();
    assert_eq!(ids[0], im_start, "special token is one id");
    assert_eq!(ids.iter().filter(|&&i| i == im_start).count(), 1);
    assert!(!tok.eos_ids().is_empty());
    // Streaming one id at a time reproduces the text, never splitting a UTF-8 character.
    for text in TEXTS {
        let ids = tok.encode(text).unwrap();
        let mut stream = TextStream::new();
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&stream.push(tok, id).unwrap());
        }
        assert_eq!(out, tok.decode_text(&ids).unwrap(), "streamed {text:?}");
    }
}

#[test]
fn chat_template_is_chatml() {
    let msgs = [
        ChatMessage {
            role: "system".into(),
            content: "Be brief.".into(),
        },
        ChatMessage {
            role: "user".into(),
            content: "Hi".into(),
        },
    ];
    assert_eq!(
        chat_prompt(&msgs, true),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        chat_prompt(&msgs[1..], false),
        "<|im_start|>user\nHi<|im_end|>\n"
    );
}

#[test]
fn random_model_tokenizer_round_trips() {
    let files = common::random_model();
    check_round_trip(&files.tokenizer);
}

#[test]
fn smollm2_gguf_tokenizer_round_trips_without_prefix_space() {
    let Some(path) = common::smollm2_path() else {
        return;
    };
    let files = ModelFiles::load(&path).unwrap();
    let tok = &files.tokenizer;
    check_round_trip(tok);
    let hello = tok.encode("Hello").unwrap();
    assert_eq!(
        hello,
        vec![tok.token_id("Hello").unwrap()],
        "no prefix space added"
    );
    assert_eq!(files.config.num_hidden_layers, 30);
    assert_eq!(files.config.vocab_size, 49152);
}
