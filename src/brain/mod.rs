//! Brains: the reading models that give a practical reading of a moment in a
//! turn (SPEC section 4, DESIGN.md "Brains").
//!
//! A [`Brain`] has one call, [`Brain::read`]. Seats are named brain
//! configurations ([`SeatConfig`]); the default is one seat `pippa` using the
//! offline [`local`] adapter. The engine asks a brain once per turn, in the
//! background, under a concurrency limit and a timeout; the outcome becomes a
//! `turn.finish` or a `turn.fail` op.

pub mod local;
pub mod openai;
pub mod scripted;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// What a brain is asked: one turn's input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BrainRequest {
    /// The moment's text (what the sign says, as typed on the phone), if any.
    pub moment_text: Option<String>,
    /// The moment's caption, if any.
    pub caption: Option<String>,
    /// Language tag of the text, if known.
    pub lang: Option<String>,
    /// The small copies of the moment's photos that were uploaded, in photo
    /// order (`X-Photo`; a moment holds up to 10 photos, issue 27); empty
    /// when none was.
    pub copies: Vec<CopyImage>,
    /// The turn's mode: `practical` (a reading of one sign) or `recall` (a
    /// quick-recall session over kept phrases).
    pub mode: String,
}

/// One photo's small copy, as a brain reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyImage {
    /// The bytes, as uploaded (checked against their SHA-256).
    pub bytes: Vec<u8>,
    /// Their `Content-Type`, as uploaded.
    pub content_type: String,
}

/// What a brain answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrainAnswer {
    /// The reading, for the person.
    pub text: String,
    /// Which adapter answered, e.g. `local`, `openai`, `scripted`.
    pub adapter: String,
    /// What the reading was made from, e.g. `ocr` (text read off the copy),
    /// `text` (the moment's text), `model`.
    pub source: String,
}

/// Why a brain gave no answer; recorded as `turn.fail` with this message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BrainError(pub String);

/// A reading model. Implementations must be cheap to share (`Arc`) and safe
/// to call from many tasks at once.
pub trait Brain: Send + Sync + 'static {
    /// Gives a reading for one turn. Errors (and the engine's timeout) become
    /// `turn.fail`.
    fn read(&self, request: BrainRequest) -> BoxFuture<'_, Result<BrainAnswer, BrainError>>;
}

/// A named brain configuration (`[[brains.seats]]` in the settings file).
///
/// Unknown keys are still rejected: by the adapter's settings struct, which
/// receives every key but `name` and `adapter`. (`deny_unknown_fields` cannot
/// be set here: with `#[serde(flatten)]` of an internally tagged enum it
/// rejects every adapter key, `adapter` included.)
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatConfig {
    /// The seat's name, recorded on every turn it answers (e.g. `pippa`).
    pub name: String,
    /// Which adapter and how it is set up.
    #[serde(flatten)]
    pub adapter: AdapterConfig,
}

/// The adapter of a seat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "adapter", rename_all = "lowercase", deny_unknown_fields)]
pub enum AdapterConfig {
    /// Offline, no model: OCR with the `tesseract` program when installed,
    /// else the moment's text.
    Local(local::LocalConfig),
    /// An OpenAI-compatible chat-completions server.
    Openai(openai::OpenAiConfig),
}

impl SeatConfig {
    /// The default seat: `pippa` on the local adapter.
    pub fn default_seats() -> Vec<SeatConfig> {
        vec![SeatConfig {
            name: "pippa".into(),
            adapter: AdapterConfig::Local(local::LocalConfig::default()),
        }]
    }

    /// Builds the brain this seat describes.
    pub fn build(&self) -> Arc<dyn Brain> {
        match &self.adapter {
            AdapterConfig::Local(c) => Arc::new(local::LocalBrain::new(c.clone())),
            AdapterConfig::Openai(c) => Arc::new(openai::OpenAiBrain::new(c.clone())),
        }
    }
}

/// The default timeout of one brain call, in milliseconds.
pub const DEFAULT_BRAIN_TIMEOUT_MS: u64 = 60_000;

/// `Duration` from milliseconds (a helper for adapters' settings).
pub fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `[[brains.seats]]` form documented for the settings file.
    #[test]
    fn seats_parse_from_toml() {
        #[derive(Deserialize)]
        struct File {
            brains: Brains,
        }
        #[derive(Deserialize)]
        struct Brains {
            seats: Vec<SeatConfig>,
        }
        let text = r#"
            [[brains.seats]]
            name = "pippa"
            adapter = "local"
            ocr_lang = "deu+eng"
            timeout_ms = 20000

            [[brains.seats]]
            name = "gpt"
            adapter = "openai"
            base_url = "http://127.0.0.1:8081/v1"
            model = "gpt-4o-mini"
            api_key_env = "OPENAI_API_KEY"
            timeout_ms = 45000
            max_tokens = 400

            [[brains.seats]]
            name = "plain"
            adapter = "local"
        "#;
        let file: File = toml::from_str(text).unwrap();
        let seats = file.brains.seats;
        assert_eq!(seats.len(), 3);
        assert_eq!(
            seats[0],
            SeatConfig {
                name: "pippa".into(),
                adapter: AdapterConfig::Local(local::LocalConfig {
                    ocr_lang: Some("deu+eng".into()),
                    timeout_ms: 20_000,
                    ..local::LocalConfig::default()
                }),
            }
        );
        assert_eq!(
            seats[1],
            SeatConfig {
                name: "gpt".into(),
                adapter: AdapterConfig::Openai(openai::OpenAiConfig {
                    api_key_env: Some("OPENAI_API_KEY".into()),
                    timeout_ms: 45_000,
                    max_tokens: Some(400),
                    ..openai::OpenAiConfig::new("http://127.0.0.1:8081/v1", "gpt-4o-mini")
                }),
            }
        );
        assert_eq!(
            seats[2],
            SeatConfig::default_seats()[0].clone().renamed("plain")
        );
        // Round trip through TOML.
        let again: SeatConfig = toml::from_str(&toml::to_string(&seats[1]).unwrap()).unwrap();
        assert_eq!(again, seats[1]);
    }

    #[test]
    fn unknown_fields_and_adapters_are_rejected() {
        let bad = [
            "name = \"a\"\nadapter = \"local\"\nbogus = 1",
            "name = \"a\"\nadapter = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\napi_key = \"sk\"",
            "name = \"a\"\nadapter = \"magic\"",
            "name = \"a\"\nadapter = \"openai\"\nmodel = \"m\"",
        ];
        for text in bad {
            assert!(toml::from_str::<SeatConfig>(text).is_err(), "{text}");
        }
    }

    impl SeatConfig {
        fn renamed(mut self, name: &str) -> Self {
            self.name = name.into();
            self
        }
    }
}
