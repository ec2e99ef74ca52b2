//! OpenAI request bodies and their validation into one [`Prepared`] request.
//!
//! Invariants: every field is checked before anything is queued (types, ranges, model name,
//! prompt within the context); errors name the offending parameter; unknown fields are
//! ignored (clients send extras); only what the engine can honour is accepted (n = 1, text
//! content only). The tier's maxOutputTokens clamp is applied later, by the handler.

use serde::Deserialize;

use crate::backend::{ChatMessage, Engine, SamplingParams, TokenId};
use tidegate_http::error::ApiError;

/// Longest session id accepted.
const MAX_SESSION_ID: usize = 256;
/// Stop strings accepted per request (OpenAI's limit).
const MAX_STOPS: usize = 4;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<TokenId>),
    TokenBatches(Vec<Vec<TokenId>>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: Prompt,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<ChatMessageIn>,
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// Parameters shared by both endpoints.
#[derive(Debug, Default, Deserialize)]
pub struct CommonParams {
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub n: Option<i64>,
}

/// Which endpoint a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// A validated request, before tier limits.
#[derive(Debug)]
pub struct Prepared {
    pub endpoint: Endpoint,
    pub prompt: Vec<TokenId>,
    /// Explicitly requested output limit (None: the endpoint's default).
    pub max_tokens: Option<u32>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    pub session_id: Option<String>,
}

fn json_error(e: serde_json::Error) -> ApiError {
    ApiError::invalid(format!("Invalid request body: {e}"), None)
}

/// Parses and validates a body for `endpoint`.
pub fn prepare(
    endpoint: Endpoint,
    body: &[u8],
    engine: &dyn Engine,
    session_header: Option<&str>,
) -> Result<Prepared, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid(
            "Request body is empty; expected JSON",
            None,
        ));
    }
    let (model, common, prompt, max_completion) = parse_body(endpoint, body, engine)?;
    let info = engine.model_info();
    if let Some(model) = &model
        && model != &info.id
    {
        return Err(ApiError::UnknownModel(model.clone()));
    }
    if let Some(n) = common.n
        && n != 1
    {
        return Err(ApiError::invalid("Only n = 1 is supported", Some("n")));
    }
    let max_tokens = max_tokens(max_completion.or(common.max_tokens))?;
    let sampling = sampling(&common)?;
    let stop = stop_strings(common.stop)?;
    let session_id = session_id(session_header, common.session_id)?;
    check_context(info.context_length as usize, prompt.len(), max_tokens)?;
    let stream = common.stream.unwrap_or(false);
    Ok(Prepared {
        endpoint,
        prompt,
        max_tokens,
        sampling,
        stop,
        stream,
        include_usage: stream
            && common
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
        ignore_eos: common.ignore_eos.unwrap_or(false),
        session_id,
    })
}

/// A parsed body: its model, common parameters, prompt tokens (a chat's messages rendered by
/// the model's template) and a chat's `max_completion_tokens`.
type ParsedBody = (Option<String>, CommonParams, Vec<TokenId>, Option<i64>);

fn parse_body(
    endpoint: Endpoint,
    body: &[u8],
    engine: &dyn Engine,
) -> Result<ParsedBody, ApiError> {
    match endpoint {
        Endpoint::Completions => {
            let req: CompletionRequest = serde_json::from_slice(body).map_err(json_error)?;
            let prompt = completion_prompt(req.prompt, engine)?;
            Ok((req.model, req.common, prompt, None))
        }
        Endpoint::Chat => {
            let req: ChatRequest = serde_json::from_slice(body).map_err(json_error)?;
            let messages = chat_messages(req.messages)?;
            let text = engine
                .apply_chat_template(&messages)
                .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
            let prompt = engine
                .tokenize(&text)
                .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
            Ok((req.model, req.common, prompt, req.max_completion_tokens))
        }
    }
}

fn max_tokens(asked: Option<i64>) -> Result<Option<u32>, ApiError> {
    match asked {
        None => Ok(None),
        Some(v) if v <= 0 => Err(ApiError::invalid(
            format!("max_tokens must be at least 1, got {v}"),
            Some("max_tokens"),
        )),
        Some(v) => Ok(Some(u32::try_from(v).unwrap_or(u32::MAX))),
    }
}

fn sampling(common: &CommonParams) -> Result<SamplingParams, ApiError> {
    let temperature = common.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            format!("temperature must be between 0 and 2, got {temperature}"),
            Some("temperature"),
        ));
    }
    let top_p = common.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            format!("top_p must be in (0, 1], got {top_p}"),
            Some("top_p"),
        ));
    }
    Ok(SamplingParams {
        temperature: temperature as f32,
        top_p: top_p as f32,
        seed: common.seed.map(|s| s as u64),
    })
}

fn stop_strings(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
    let stop = match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > MAX_STOPS || stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            format!("stop takes at most {MAX_STOPS} non-empty strings"),
            Some("stop"),
        ));
    }
    Ok(stop)
}

/// The session: the header wins over the body's field; an empty one is none.
fn session_id(header: Option<&str>, body: Option<String>) -> Result<Option<String>, ApiError> {
    let session_id = header
        .map(str::to_string)
        .or(body)
        .filter(|s| !s.is_empty());
    if let Some(s) = &session_id
        && s.len() > MAX_SESSION_ID
    {
        return Err(ApiError::invalid(
            format!("session id is longer than {MAX_SESSION_ID} bytes"),
            Some("session_id"),
        ));
    }
    Ok(session_id)
}

/// The prompt must leave room for output, and prompt plus `max_tokens` must fit.
fn check_context(context: usize, prompt: usize, max_tokens: Option<u32>) -> Result<(), ApiError> {
    if prompt >= context {
        return Err(ApiError::ContextLength(format!(
            "This model's maximum context length is {context} tokens; the prompt has {prompt} \
             tokens and leaves no room for output"
        )));
    }
    if let Some(m) = max_tokens
        && prompt + m as usize > context
    {
        return Err(ApiError::ContextLength(format!(
            "This model's maximum context length is {context} tokens; you requested {} tokens \
             ({prompt} in the prompt, {m} for the output)",
            prompt + m as usize
        )));
    }
    Ok(())
}

fn completion_prompt(prompt: Prompt, engine: &dyn Engine) -> Result<Vec<TokenId>, ApiError> {
    let one_prompt =
        || ApiError::invalid("Only one prompt per request is supported", Some("prompt"));
    let tokens = match prompt {
        Prompt::Text(text) => tokenize(&text, engine)?,
        Prompt::Texts(mut texts) => {
            if texts.len() != 1 {
                return Err(one_prompt());
            }
            tokenize(&texts.remove(0), engine)?
        }
        Prompt::Tokens(tokens) => tokens,
        Prompt::TokenBatches(mut batches) => {
            if batches.len() != 1 {
                return Err(one_prompt());
            }
            batches.remove(0)
        }
    };
    if tokens.is_empty() {
        return Err(ApiError::invalid(
            "prompt must not be empty",
            Some("prompt"),
        ));
    }
    // Token ids must be in the vocabulary.
    engine
        .detokenize(&tokens)
        .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))?;
    Ok(tokens)
}

fn tokenize(text: &str, engine: &dyn Engine) -> Result<Vec<TokenId>, ApiError> {
    engine
        .tokenize(text)
        .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))
}

fn chat_messages(messages: Vec<ChatMessageIn>) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages must contain at least one message",
            Some("messages"),
        ));
    }
    messages
        .into_iter()
        .map(|m| {
            if !matches!(
                m.role.as_str(),
                "system" | "developer" | "user" | "assistant" | "tool"
            ) {
                return Err(ApiError::invalid(
                    format!("unknown message role {:?}", m.role),
                    Some("messages"),
                ));
            }
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), p.text) {
                            ("text", Some(t)) => text.push_str(&t),
                            (kind, _) => {
                                return Err(ApiError::invalid(
                                    format!("content part type {kind:?} is not supported"),
                                    Some("messages"),
                                ));
                            }
                        }
                    }
                    text
                }
            };
            Ok(ChatMessage {
                role: m.role,
                content,
            })
        })
        .collect()
}
