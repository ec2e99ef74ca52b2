//! SmolLM2-135M-Instruct (GGUF) answers a factual question correctly with greedy decoding,
//! prompted with its own chat template. Runs only when models/smollm2 has been fetched
//! (scripts/fetch-model.sh).
//!
//! The question goes after a system message: without one the template puts in its default
//! ("You are a helpful AI assistant named SmolLM, trained by Hugging Face"), after which the
//! Q4_1 file served as stored answers "L'Étoile, la Marseillaise, ..." at greedy decoding
//! (the same weights in f32 answer "The capital of France is Paris." after either system
//! message, and so does the file after this one).
#![allow(clippy::unwrap_used, clippy::needless_range_loop)] // test code

mod common;

use tidegate_runner::generate::chat_once;

#[test]
fn smollm2_knows_the_capital_of_france() {
    let Some(path) = common::smollm2_path() else {
        return;
    };
    let system = Some("You are a helpful assistant.");
    let answer = chat_once(&path, system, "What is the capital of France?", 24).unwrap();
    println!("answer: {answer}");
    assert!(answer.contains("Paris"), "answer was {answer:?}");
}
