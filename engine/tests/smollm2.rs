//! SmolLM2-135M-Instruct (GGUF) answers a factual question correctly with greedy decoding.
//! Runs only when models/smollm2 has been fetched (scripts/fetch-model.sh).
#![allow(clippy::unwrap_used, clippy::needless_range_loop)] // test code

mod common;

use tidegate_runner::generate::chat_once;

#[test]
fn smollm2_knows_the_capital_of_france() {
    let Some(path) = common::smollm2_path() else {
        return;
    };
    let answer = chat_once(&path, "What is the capital of France?", 24).unwrap();
    println!("answer: {answer}");
    assert!(answer.contains("Paris"), "answer was {answer:?}");
}
