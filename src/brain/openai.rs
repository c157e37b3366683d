//! The `openai` brain: any OpenAI-compatible chat-completions server (a hosted
//! API, llama.cpp's server, vLLM, Ollama) (DESIGN.md "Brains").
//!
//! One call is one `POST {base_url}/chat/completions` with a system prompt and
//! a user message carrying the moment's text and, when uploaded, the copy as
//! an image content part (a `data:` URL). The answer is
//! `choices[0].message.content`. Timeouts, connection errors, non-2xx statuses
//! and malformed responses become a [`BrainError`] (and so `turn.fail`).
//!
//! The API key is never in the configuration: `api_key_env` names the
//! environment variable that holds it, read on every call.

use std::error::Error as _;

use base64::Engine as _;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{
    millis, Brain, BrainAnswer, BrainError, BrainRequest, CopyImage, DEFAULT_BRAIN_TIMEOUT_MS,
};

/// The adapter name the OpenAI brain puts on its answers.
pub const ADAPTER: &str = "openai";

/// The system prompt for `practical` turns when none is configured.
pub const PRACTICAL_SYSTEM_PROMPT: &str = "You are Pippa, a friendly language coach. \
The person photographed a sign while travelling. Give a short, practical reading: quote \
what the sign says, translate it into English, say what the person should do, and list \
one to three phrases from it worth keeping. Be brief and concrete; if the text is \
unclear, say what you can and cannot read.";

/// The system prompt for `recall` turns when none is configured.
pub const RECALL_SYSTEM_PROMPT: &str = "You are Pippa, a friendly language coach. \
Run a quick-recall practice session over the person's kept phrases (one per line in the \
message): for each phrase, ask what it means and where one would see it, then give the \
answer in one short line. Keep the whole session brief.";

/// The most characters of an error body quoted in a [`BrainError`].
const MAX_ERROR_BODY_CHARS: usize = 300;

/// Settings of the `openai` adapter (`adapter = "openai"` in a
/// `[[brains.seats]]` block).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The API's base URL, up to and including the version, e.g.
    /// `http://127.0.0.1:8081/v1` or `https://api.openai.com/v1`; the brain
    /// posts to `{base_url}/chat/completions`.
    pub base_url: String,
    /// The model name sent as `model`, e.g. `gpt-4o-mini`.
    pub model: String,
    /// The NAME of the environment variable holding the API key (sent as
    /// `Authorization: Bearer <key>`), e.g. `OPENAI_API_KEY`. `None` sends no
    /// key (local servers). A named variable that is unset or empty fails the
    /// turn.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The most time one call may take (connect, send, answer), in
    /// milliseconds; default [`DEFAULT_BRAIN_TIMEOUT_MS`].
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// `max_tokens` sent with the request; `None` leaves it to the server.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Replaces the built-in system prompt ([`PRACTICAL_SYSTEM_PROMPT`] and
    /// [`RECALL_SYSTEM_PROMPT`]) for every mode.
    #[serde(default)]
    pub system_prompt: Option<String>,
}

fn default_timeout_ms() -> u64 {
    DEFAULT_BRAIN_TIMEOUT_MS
}

impl OpenAiConfig {
    /// A configuration with this base URL and model and every other field at
    /// its default.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key_env: None,
            timeout_ms: DEFAULT_BRAIN_TIMEOUT_MS,
            max_tokens: None,
            system_prompt: None,
        }
    }

    /// The URL the brain posts to: `{base_url}/chat/completions` (a trailing
    /// `/` on `base_url` is ignored).
    pub fn endpoint(&self) -> String {
        format!("{}/chat/completions", self.base_url.trim_end_matches('/'))
    }
}

/// A brain that asks an OpenAI-compatible chat-completions server.
#[derive(Clone, Debug)]
pub struct OpenAiBrain {
    config: OpenAiConfig,
    /// The HTTP client, or why it could not be built (reported on each call).
    client: Result<reqwest::Client, String>,
}

impl OpenAiBrain {
    /// A brain with these settings. Never fails; a client that cannot be
    /// built makes every call fail with the reason.
    pub fn new(config: OpenAiConfig) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(millis(config.timeout_ms.clamp(1, 30_000)))
            .build()
            .map_err(|e| format!("openai: could not set up the HTTP client: {e}"));
        OpenAiBrain { config, client }
    }

    /// The settings this brain was made with.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The JSON body this brain would post for `request`; `Err` when there is
    /// nothing to read (no text, no copy).
    pub fn request_body(&self, request: &BrainRequest) -> Result<Value, BrainError> {
        let recall = request.mode == "recall";
        let system = match (&self.config.system_prompt, recall) {
            (Some(prompt), _) => prompt.as_str(),
            (None, true) => RECALL_SYSTEM_PROMPT,
            (None, false) => PRACTICAL_SYSTEM_PROMPT,
        };
        let text = request
            .moment_text
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty());
        let copies: Vec<&CopyImage> = request
            .copies
            .iter()
            .filter(|c| !c.bytes.is_empty())
            .collect();
        if text.is_none() && copies.is_empty() {
            return Err(BrainError(
                "nothing to read: the moment has no text and no uploaded photo".into(),
            ));
        }

        let mut user = String::new();
        match (recall, text) {
            (true, Some(text)) => user.push_str(&format!("Kept phrases:\n{text}\n")),
            (false, Some(text)) => user.push_str(&format!("The sign's text, as typed:\n{text}\n")),
            (_, None) => user.push_str("No text was typed; read the sign off the photo.\n"),
        }
        if let Some(caption) = request
            .caption
            .as_deref()
            .map(str::trim)
            .filter(|c| !c.is_empty())
        {
            user.push_str(&format!("The person's note: {caption}\n"));
        }
        if let Some(lang) = request
            .lang
            .as_deref()
            .map(str::trim)
            .filter(|l| !l.is_empty())
        {
            user.push_str(&format!("Language: {lang}\n"));
        }
        match copies.len() {
            0 => {}
            1 => user.push_str("The photo of the sign is attached.\n"),
            n => user.push_str(&format!(
                "{n} photos of the sign are attached, in the order they were taken.\n"
            )),
        }

        let user_content = if copies.is_empty() {
            Value::String(user)
        } else {
            let mut parts = vec![json!({"type": "text", "text": user})];
            parts.extend(copies.iter().map(|copy| {
                let url = data_url(&copy.bytes, Some(copy.content_type.as_str()));
                json!({"type": "image_url", "image_url": {"url": url}})
            }));
            Value::Array(parts)
        };
        let mut body = json!({
            "model": self.config.model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user_content},
            ],
        });
        if let (Some(max), Some(map)) = (self.config.max_tokens, body.as_object_mut()) {
            map.insert("max_tokens".into(), json!(max));
        }
        Ok(body)
    }

    async fn answer(&self, request: BrainRequest) -> Result<BrainAnswer, BrainError> {
        let client = self.client.as_ref().map_err(|e| BrainError(e.clone()))?;
        let body = self.request_body(&request)?;
        let key = match &self.config.api_key_env {
            None => None,
            Some(name) => match std::env::var(name) {
                Ok(key) if !key.trim().is_empty() => Some(key.trim().to_string()),
                _ => {
                    return Err(BrainError(format!(
                        "openai: the environment variable {name} (api_key_env) is not set"
                    )))
                }
            },
        };
        let url = self.config.endpoint();
        let timeout = millis(self.config.timeout_ms);
        match tokio::time::timeout(timeout, exchange(client, &url, key.as_deref(), &body)).await {
            Ok(result) => result.map(|text| BrainAnswer {
                text,
                adapter: ADAPTER.into(),
                source: "model".into(),
            }),
            Err(_) => Err(BrainError(format!(
                "openai: timeout: no answer from {url} within {} ms",
                timeout.as_millis()
            ))),
        }
    }
}

impl Brain for OpenAiBrain {
    fn read(&self, request: BrainRequest) -> BoxFuture<'_, Result<BrainAnswer, BrainError>> {
        Box::pin(self.answer(request))
    }
}

/// One POST and its answer's text.
async fn exchange(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &Value,
) -> Result<String, BrainError> {
    let mut post = client.post(url).json(body);
    if let Some(key) = key {
        post = post.bearer_auth(key);
    }
    let response = post.send().await.map_err(|e| {
        let what = if e.is_timeout() {
            "timeout"
        } else if e.is_connect() {
            "could not connect"
        } else {
            "request failed"
        };
        // reqwest's own message repeats the URL; its sources say what failed.
        let detail = e.source().map(error_chain).unwrap_or_else(|| e.to_string());
        BrainError(format!("openai: {what}: {url}: {detail}"))
    })?;
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .map_err(|e| BrainError(format!("openai: reading the answer from {url} failed: {e}")))?;
    if !status.is_success() {
        let body = String::from_utf8_lossy(&bytes);
        return Err(BrainError(format!(
            "openai: {url} answered HTTP {status}: {}",
            short(&body, MAX_ERROR_BODY_CHARS)
        )));
    }
    parse_answer(&bytes)
        .map_err(|why| BrainError(format!("openai: malformed response from {url}: {why}")))
}

/// The text of `choices[0].message.content` in a chat-completions response.
/// Content given as a list of parts is joined from their `text` members.
pub fn parse_answer(bytes: &[u8]) -> Result<String, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        format!(
            "not JSON ({e}): {}",
            short(&String::from_utf8_lossy(bytes), 120)
        )
    })?;
    let content = value
        .get("choices")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("message"))
        .and_then(|m| m.get("content"))
        .ok_or_else(|| "no choices[0].message.content".to_string())?;
    let text = match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        other => {
            return Err(format!(
                "content is not text: {}",
                short(&other.to_string(), 80)
            ))
        }
    };
    let text = text.trim();
    if text.is_empty() {
        return Err("the answer is empty".into());
    }
    Ok(text.to_string())
}

/// `data:<content type>;base64,<bytes>`. The content type is the given one
/// when it is an image type, else sniffed from the bytes (PNG, JPEG, GIF,
/// WebP), else `image/jpeg`.
pub fn data_url(bytes: &[u8], content_type: Option<&str>) -> String {
    let given = content_type
        .and_then(|c| c.split(';').next())
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| c.starts_with("image/"));
    let kind = given.unwrap_or_else(|| sniff_image(bytes).unwrap_or("image/jpeg").to_string());
    format!(
        "data:{kind};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn sniff_image(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF8") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// At most `max` characters of `text` with white space collapsed, ending with
/// `…` when cut.
fn short(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        let mut cut: String = flat.chars().take(max).collect();
        cut.push('…');
        cut
    }
}

/// An error and its sources, `: `-separated.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_without_copy_is_plain_text() {
        let brain = OpenAiBrain::new(OpenAiConfig {
            max_tokens: Some(300),
            ..OpenAiConfig::new("http://x/v1/", "m")
        });
        assert_eq!(brain.config().endpoint(), "http://x/v1/chat/completions");
        let body = brain
            .request_body(&BrainRequest {
                moment_text: Some("Notausgang".into()),
                lang: Some("de".into()),
                mode: "practical".into(),
                ..BrainRequest::default()
            })
            .unwrap();
        assert_eq!(body["model"], "m");
        assert_eq!(body["max_tokens"], 300);
        assert_eq!(body["messages"][0]["role"], "system");
        assert_eq!(body["messages"][0]["content"], PRACTICAL_SYSTEM_PROMPT);
        let user = body["messages"][1]["content"].as_str().unwrap();
        assert!(user.contains("Notausgang") && user.contains("Language: de"));
    }

    #[test]
    fn recall_uses_the_recall_prompt_and_custom_prompt_wins() {
        let request = BrainRequest {
            moment_text: Some("a\nb".into()),
            mode: "recall".into(),
            ..BrainRequest::default()
        };
        let brain = OpenAiBrain::new(OpenAiConfig::new("http://x/v1", "m"));
        let body = brain.request_body(&request).unwrap();
        assert_eq!(body["messages"][0]["content"], RECALL_SYSTEM_PROMPT);
        assert!(body.get("max_tokens").is_none());
        let brain = OpenAiBrain::new(OpenAiConfig {
            system_prompt: Some("custom".into()),
            ..OpenAiConfig::new("http://x/v1", "m")
        });
        let body = brain.request_body(&request).unwrap();
        assert_eq!(body["messages"][0]["content"], "custom");
    }

    #[test]
    fn nothing_to_read() {
        let brain = OpenAiBrain::new(OpenAiConfig::new("http://x/v1", "m"));
        let err = brain.request_body(&BrainRequest::default()).unwrap_err();
        assert!(err.0.contains("nothing to read"));
    }

    #[test]
    fn data_urls() {
        assert_eq!(
            data_url(b"abc", Some("image/png")),
            "data:image/png;base64,YWJj"
        );
        assert_eq!(
            data_url(b"\x89PNG\r\n\x1a\nx", Some("application/octet-stream")),
            "data:image/png;base64,iVBORw0KGgp4"
        );
        assert!(data_url(&[0xFF, 0xD8, 0xFF, 0], None).starts_with("data:image/jpeg;base64,"));
    }

    #[test]
    fn parses_answers() {
        let ok = br#"{"choices":[{"message":{"role":"assistant","content":" Hi "}}]}"#;
        assert_eq!(parse_answer(ok).unwrap(), "Hi");
        let parts = br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#;
        assert_eq!(parse_answer(parts).unwrap(), "ab");
        assert!(parse_answer(b"{nope").unwrap_err().contains("not JSON"));
        assert!(parse_answer(br#"{"choices":[]}"#)
            .unwrap_err()
            .contains("no choices"));
        assert!(parse_answer(br#"{"choices":[{"message":{"content":""}}]}"#)
            .unwrap_err()
            .contains("empty"));
    }
}
