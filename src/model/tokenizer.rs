//! The tokenizer (`tokenizer.json`, via the `tokenizers` crate) and the chat template of
//! `tokenizer_config.json`, rendered by a real Jinja engine (minijinja with Python string
//! methods), never by string concatenation.

use crate::files::AtPath;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{ModelError, Result};

/// One chat message.
#[derive(Debug, Clone, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn user(content: impl Into<String>) -> Message {
        Message {
            role: "user".into(),
            content: content.into(),
        }
    }
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    path: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A `tokenizer.json` (a regular file: [`crate::files`]).
pub(crate) fn read_tokenizer_json(path: &Path) -> Result<tokenizers::Tokenizer> {
    crate::files::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|text| text.parse().map_err(|e: tokenizers::Error| e.to_string()))
        .map_err(|reason| ModelError::Tokenizer {
            path: path.to_owned(),
            reason,
        })
}

impl Tokenizer {
    /// Loads `tokenizer.json` and, when present, `tokenizer_config.json` from `dir`.
    pub fn load(dir: &Path) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        let inner = read_tokenizer_json(&path)?;
        let config_path = dir.join("tokenizer_config.json");
        let (mut chat_template, mut eos_token, mut pad_token) = (None, None, None);
        if config_path.exists() {
            let text = crate::files::read_to_string(&config_path).at(&config_path)?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Tokenizer {
                    path: config_path.clone(),
                    reason: e.to_string(),
                })?;
            chat_template = v
                .get("chat_template")
                .and_then(|t| t.as_str())
                .map(String::from);
            let token_str = |key: &str| {
                v.get(key).and_then(|t| {
                    t.as_str()
                        .map(String::from)
                        .or_else(|| t.get("content").and_then(|c| c.as_str()).map(String::from))
                })
            };
            eos_token = token_str("eos_token");
            pad_token = token_str("pad_token");
        }
        Ok(Tokenizer {
            inner,
            chat_template,
            eos_token,
            pad_token,
            path,
        })
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| self.err(e))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| self.err(e))
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The EOS token of `tokenizer_config.json`, as an id.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_id(t))
    }

    /// The padding id: `pad_token`, else EOS, else 0.
    pub fn pad_id(&self) -> u32 {
        self.pad_token
            .as_deref()
            .and_then(|t| self.token_id(t))
            .or_else(|| self.eos_id())
            .unwrap_or(0)
    }

    /// Renders the chat template as `transformers`' `apply_chat_template(..., tokenize=False)`.
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self.chat_template.as_deref().ok_or_else(|| {
            ModelError::Template(format!("{} has no chat_template", self.path.display()))
        })?;
        render_chat_template(
            template,
            messages,
            add_generation_prompt,
            self.eos_token.as_deref(),
        )
    }

    fn err(&self, e: impl std::fmt::Display) -> ModelError {
        ModelError::Tokenizer {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }
}

/// Renders a HF chat template with minijinja (Python-compatible string methods enabled,
/// `raise_exception` defined, trailing newlines kept as Jinja2 does in transformers).
pub fn render_chat_template(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    eos_token: Option<&str>,
) -> Result<String> {
    let mut env = minijinja::Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_keep_trailing_newline(true);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_template("chat", template)
        .map_err(|e| ModelError::Template(e.to_string()))?;
    let tmpl = env
        .get_template("chat")
        .map_err(|e| ModelError::Template(e.to_string()))?;
    tmpl.render(minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        eos_token => eos_token,
    })
    .map_err(|e| ModelError::Template(format!("{e:#}")))
}
