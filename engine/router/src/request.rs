//! What the router reads from an OpenAI request body: its affinity key and its cost.
//!
//! The router does not validate requests (the engine does, with the OpenAI error it would
//! give anyway); it only needs the body to be a JSON object. The key is the session when
//! there is one (header or `session_id`, namespaced by tenant as the engine namespaces it),
//! else a hash of the prompt's prefix: the first two chat messages (system prompt and first
//! turn) or the first [`PREFIX_BYTES`] of a completion prompt, so requests sharing a system
//! prompt meet the engine that has it cached.

use axum::http::HeaderMap;
use serde_json::Value;
use tidegate_api::router::header;

use super::dispatch::{Key, KeyKind};
use super::ring::hash64;
use tidegate_http::error::ApiError;

/// Bytes of a completion prompt that make its prefix key.
pub const PREFIX_BYTES: usize = 512;
/// Chat messages that make a chat's prefix key.
pub const PREFIX_MESSAGES: usize = 2;

/// The parts of a request the router uses.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteInfo {
    pub key: Option<Key>,
    /// Prompt + output tokens charged to the tenant's token limit (an estimate: four bytes
    /// of prompt text per token, plus the requested or tier-capped output).
    pub estimated_tokens: u64,
    pub stream: bool,
}

fn session_of<'a>(headers: &'a HeaderMap, body: &'a Value) -> Option<&'a str> {
    headers
        .get(header::SESSION)
        .and_then(|v| v.to_str().ok())
        .or_else(|| body.get("session_id").and_then(Value::as_str))
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

fn prefix_of(body: &Value) -> Option<String> {
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        let head: Vec<&Value> = messages.iter().take(PREFIX_MESSAGES).collect();
        return (!head.is_empty()).then(|| serde_json::to_string(&head).unwrap_or_default());
    }
    let prompt = match body.get("prompt")? {
        Value::String(s) => s.clone(),
        Value::Array(items) => match items.first()? {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        },
        _ => return None,
    };
    let mut end = prompt.len().min(PREFIX_BYTES);
    while !prompt.is_char_boundary(end) {
        end -= 1;
    }
    (end > 0).then(|| prompt[..end].to_string())
}

fn prompt_bytes(body: &Value) -> usize {
    match (body.get("messages"), body.get("prompt")) {
        (Some(m), _) => m.to_string().len(),
        (None, Some(p)) => p.to_string().len(),
        _ => 0,
    }
}

impl RouteInfo {
    /// Reads `body` (a JSON object) for `tenant`; `max_output` is the tier's output cap.
    pub fn parse(
        body: &[u8],
        headers: &HeaderMap,
        tenant: &str,
        max_output: u64,
    ) -> Result<Self, ApiError> {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid(format!("Invalid request body: {e}"), None))?;
        if !v.is_object() {
            return Err(ApiError::invalid(
                "Request body must be a JSON object",
                None,
            ));
        }
        let model = v.get("model").and_then(Value::as_str).unwrap_or("");
        let key = match session_of(headers, &v) {
            Some(s) => Some(Key {
                kind: KeyKind::Session,
                hash: hash64(format!("{}:{tenant}:{s}", tenant.len()).as_bytes()),
            }),
            None => prefix_of(&v).map(|p| Key {
                kind: KeyKind::Prefix,
                hash: hash64(format!("{model}\0{p}").as_bytes()),
            }),
        };
        let asked = ["max_completion_tokens", "max_tokens"]
            .iter()
            .find_map(|f| v.get(*f).and_then(Value::as_u64))
            .unwrap_or(max_output);
        Ok(RouteInfo {
            key,
            estimated_tokens: (prompt_bytes(&v) / 4) as u64 + asked.min(max_output.max(1)),
            stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str, session: Option<&str>) -> RouteInfo {
        let mut h = HeaderMap::new();
        if let Some(s) = session {
            h.insert(header::SESSION, s.parse().unwrap());
        }
        RouteInfo::parse(body.as_bytes(), &h, "acme", 256).unwrap()
    }

    #[test]
    fn session_beats_prefix_and_is_per_tenant() {
        let a = parse(r#"{"prompt":"hello"}"#, Some("s1"));
        let b = parse(r#"{"prompt":"other","session_id":"s1"}"#, None);
        assert_eq!(a.key, b.key);
        assert_eq!(a.key.unwrap().kind, KeyKind::Session);
        let mut h = HeaderMap::new();
        h.insert(header::SESSION, "s1".parse().unwrap());
        let other = RouteInfo::parse(br#"{"prompt":"x"}"#, &h, "globex", 256).unwrap();
        assert_ne!(
            other.key, a.key,
            "one tenant's session never names another's"
        );
    }

    #[test]
    fn shared_system_prompts_share_a_prefix_key() {
        let sys = r#"{"role":"system","content":"You are a helpful assistant."}"#;
        let one = format!(
            r#"{{"model":"m","messages":[{sys},{{"role":"user","content":"hi"}},{{"role":"assistant","content":"a"}}]}}"#
        );
        let two = format!(
            r#"{{"model":"m","messages":[{sys},{{"role":"user","content":"hi"}},{{"role":"assistant","content":"b"}}]}}"#
        );
        let three =
            format!(r#"{{"model":"m","messages":[{sys},{{"role":"user","content":"yo"}}]}}"#);
        let (k1, k2, k3) = (
            parse(&one, None).key,
            parse(&two, None).key,
            parse(&three, None).key,
        );
        assert_eq!(k1, k2);
        assert_ne!(k1, k3);
        assert_eq!(k1.unwrap().kind, KeyKind::Prefix);
        let long = "x".repeat(PREFIX_BYTES);
        let p1 = parse(&format!(r#"{{"prompt":"{long}tail one"}}"#), None);
        let p2 = parse(&format!(r#"{{"prompt":"{long}tail two"}}"#), None);
        assert_eq!(p1.key, p2.key);
    }

    #[test]
    fn estimates_and_refuses_non_objects() {
        let r = parse(
            r#"{"prompt":"abcdefgh","max_tokens":10,"stream":true}"#,
            None,
        );
        assert!(r.stream);
        assert_eq!(r.estimated_tokens, 10 / 4 + 10);
        let r = parse(r#"{"prompt":"abcd","max_tokens":100000}"#, None);
        assert_eq!(r.estimated_tokens, 6 / 4 + 256, "capped by the tier");
        for bad in ["[]", "nope", "", "3"] {
            assert!(RouteInfo::parse(bad.as_bytes(), &HeaderMap::new(), "t", 1).is_err());
        }
    }
}
