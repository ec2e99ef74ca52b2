//! The bad-request corpus: bodies a client may send that must get an OpenAI-shaped 4xx,
//! never a 5xx, from the engine and from the router in front of it alike. The statuses are
//! the engine's with `--max-body-bytes 65536` and a 256-token context.
#![allow(dead_code, clippy::unwrap_used)]

use serde_json::Value;

pub const CHAT: &str = "/v1/chat/completions";
pub const COMPLETIONS: &str = "/v1/completions";
/// The body limit the expected statuses assume.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The context length the expected statuses assume.
pub const CONTEXT_TOKENS: u32 = 256;

/// `(path, body, status)` triples.
pub fn corpus() -> Vec<(&'static str, Vec<u8>, u16)> {
    let big = "x".repeat(100 * 1024);
    vec![
    (COMPLETIONS, b"".to_vec(), 400),
    (COMPLETIONS, b"{".to_vec(), 400),
    (COMPLETIONS, b"null".to_vec(), 400),
    (COMPLETIONS, b"[]".to_vec(), 400),
    (COMPLETIONS, b"\"prompt\"".to_vec(), 400),
    (COMPLETIONS, b"{\"prompt\": \"\xff\xfe\"}".to_vec(), 400),
    (COMPLETIONS, b"\xff\xfe\xfd".to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": 5}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"max_tokens": 5}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "max_tokens": 0}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "max_tokens": -3}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "max_tokens": "ten"}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "max_tokens": 1.5}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "max_tokens": 1000}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "temperature": 5}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "temperature": "hot"}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "top_p": 0}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "n": 2}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "stream": "yes"}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "stop": ["1","2","3","4","5"]}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "stop": [""]}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "seed": "x"}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": ""}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": []}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": ["a", "b"]}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": [[1], [2]]}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": [2000000]}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": [-1]}"#.to_vec(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "model": "gpt-9"}"#.to_vec(), 404),
    (COMPLETIONS, br#"{"prompt": "a", "model": 7}"#.to_vec(), 400),
    (COMPLETIONS, format!(r#"{{"prompt": "{}"}}"#, "y".repeat(300)).into_bytes(), 400),
    (COMPLETIONS, format!(r#"{{"prompt": "{big}"}}"#).into_bytes(), 413),
    (COMPLETIONS, "[".repeat(10_000).into_bytes(), 400),
    (COMPLETIONS, br#"{"prompt": "a", "session_id": 12}"#.to_vec(), 400),
    (CHAT, br#"{"messages": []}"#.to_vec(), 400),
    (CHAT, br#"{"messages": "hi"}"#.to_vec(), 400),
    (CHAT, br#"{"messages": [{"role": "robot", "content": "x"}]}"#.to_vec(), 400),
    (CHAT, br#"{"messages": [{"content": "x"}]}"#.to_vec(), 400),
    (CHAT, br#"{"messages": [{"role": "user", "content": 3}]}"#.to_vec(), 400),
    (
        CHAT,
        br#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#.to_vec(),
        400,
    ),
    (CHAT, br#"{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}"#.to_vec(), 400),
    ("/v1/nope", b"{}".to_vec(), 404),
]
}

/// Sends every body of the corpus to `base` and checks each answer: the expected status and
/// an OpenAI-shaped error (`error.message`, `error.type`).
pub async fn check_corpus(client: &reqwest::Client, base: &str) {
    for (path, body, want) in corpus() {
        let resp = client
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).to_string();
        let v: Value = resp
            .json()
            .await
            .unwrap_or_else(|e| panic!("{shown}: body is not JSON: {e}"));
        assert!(v["error"]["message"].is_string(), "{shown}: {v}");
        assert!(v["error"]["type"].is_string(), "{shown}: {v}");
        assert_eq!(status, want, "{shown}: {v}");
    }
}
