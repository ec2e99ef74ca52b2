//! Chat prompts rendered from the model's own Jinja template, as Hugging Face transformers
//! renders them (`apply_chat_template`): the `chat_template` of `tokenizer_config.json` (or
//! a `chat_template.jinja` beside it, or a GGUF file's `tokenizer.chat_template`), with
//! `trim_blocks` and `lstrip_blocks`, Python's string and dict methods, `raise_exception`
//! and `strftime_now`, and the context transformers passes: `messages`, `tools` and
//! `documents` (none), `add_generation_prompt` and the special tokens (`bos_token`,
//! `eos_token`, `unk_token`, `pad_token`). A model without a template is served with the
//! built-in ChatML format ([`ChatFormat::BuiltIn`]), which the engine logs at start.
//!
//! Invariants: a template that does not parse is refused at load, not at the first request;
//! a template that raises (`raise_exception`, a bad call) is an error for that request
//! only; rendering never reads anything but the messages and the special tokens.

mod sources;
mod strftime;

use std::sync::Arc;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value;
use minijinja::{Environment, Error as JinjaError, ErrorKind};

pub use sources::{from_gguf, from_hf_dir};

use super::tokenizer::{ChatMessage, chat_prompt};
use crate::error::{Error, Result};

const NAME: &str = "chat_template";

/// The special tokens a template may name, as strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `bos_token`.
    pub bos: Option<String>,
    /// `eos_token`.
    pub eos: Option<String>,
    /// `unk_token`.
    pub unk: Option<String>,
    /// `pad_token`.
    pub pad: Option<String>,
}

/// A compiled chat template and the special tokens it is rendered with.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    tokens: SpecialTokens,
}

/// How a model's chat prompts are made.
#[derive(Debug, Clone, Default)]
pub enum ChatFormat {
    /// The model's own template.
    Template(ChatTemplate),
    /// No template in the model: the built-in ChatML format ([`chat_prompt`]).
    #[default]
    BuiltIn,
}

impl ChatTemplate {
    /// Compiles `source` (an error names the template's syntax problem).
    pub fn new(source: String, tokens: SpecialTokens) -> Result<Self> {
        let mut env = Environment::new();
        // As transformers' environment: blocks eat their own newline and leading spaces.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| Error::Tokenizer(format!("chat template syntax: {e}")))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime::strftime_now);
        env.add_template_owned(NAME, source)
            .map_err(|e| Error::Tokenizer(format!("chat template does not parse: {e:#}")))?;
        Ok(ChatTemplate {
            env: Arc::new(env),
            tokens,
        })
    }

    /// The prompt for `messages`, ending with the assistant's opening when
    /// `add_generation_prompt` is set.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_pairs([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let t = &self.tokens;
        let token = |s: &Option<String>| s.as_deref().map_or(Value::UNDEFINED, Value::from);
        let ctx = Value::from_pairs([
            ("messages", Value::from(msgs)),
            ("tools", Value::from(())),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", token(&t.bos)),
            ("eos_token", token(&t.eos)),
            ("unk_token", token(&t.unk)),
            ("pad_token", token(&t.pad)),
        ]);
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| Error::Tokenizer(format!("chat template: {e:#}")))?;
        tmpl.render(ctx)
            .map_err(|e| Error::Tokenizer(format!("chat template: {e:#}")))
    }
}

impl ChatFormat {
    /// The prompt for `messages` in this format.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        match self {
            ChatFormat::Template(t) => t.render(messages, add_generation_prompt),
            ChatFormat::BuiltIn => Ok(chat_prompt(messages, add_generation_prompt)),
        }
    }

    /// `model` for a model's own template, `built-in` for ChatML (for logs).
    pub fn describe(&self) -> &'static str {
        match self {
            ChatFormat::Template(_) => "model",
            ChatFormat::BuiltIn => "built-in",
        }
    }
}

/// `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: String) -> std::result::Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn renders_with_transformers_whitespace_and_python_methods() {
        let src = "{{ bos_token }}{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content.strip() }}]\n  {% endif %}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}\n";
        let t = ChatTemplate::new(
            src.into(),
            SpecialTokens {
                bos: Some("<s>".into()),
                ..SpecialTokens::default()
            },
        )
        .unwrap();
        let out = t
            .render(&[msg("user", "  hi "), msg("assistant", "x")], true)
            .unwrap();
        assert_eq!(out, "<s>[hi]\n>");
    }

    #[test]
    fn a_raised_exception_is_an_error_and_a_bad_template_is_refused_at_load() {
        let t = ChatTemplate::new(
            "{{ raise_exception('roles must alternate') }}".into(),
            SpecialTokens::default(),
        )
        .unwrap();
        let err = t.render(&[msg("user", "a")], true).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
        let bad = ChatTemplate::new("{% for %}".into(), SpecialTokens::default()).unwrap_err();
        assert!(bad.to_string().contains("does not parse"), "{bad}");
    }
}
