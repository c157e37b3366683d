//! The `openai` brain against a fake OpenAI-compatible server on
//! `127.0.0.1:0`: the request's shape, the bearer key from the environment,
//! and timeouts, HTTP errors and malformed answers as `BrainError`s.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use spark_engine::brain::openai::{OpenAiBrain, OpenAiConfig, RECALL_SYSTEM_PROMPT};
use spark_engine::brain::{Brain, BrainRequest, CopyImage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// What the fake server answers.
#[derive(Clone)]
enum Reply {
    /// 200 with a chat completion whose content is this text.
    Answer(String),
    /// Sleeps this long, then answers 200.
    Sleep(Duration),
    /// This status and raw body.
    Raw(u16, String),
}

/// One request the fake server received.
#[derive(Debug)]
struct Seen {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Value,
}

/// Starts a fake server; returns its base URL (`http://127.0.0.1:PORT/v1`)
/// and the requests it sees.
async fn fake_server(reply: Reply) -> (String, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let head_end = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                    let n = socket.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "connection closed before the request head");
                    buf.extend_from_slice(&chunk[..n]);
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                let mut lines = head.split("\r\n");
                let mut first = lines.next().unwrap().split(' ');
                let method = first.next().unwrap().to_string();
                let path = first.next().unwrap().to_string();
                let headers: HashMap<String, String> = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                    .collect();
                let length: usize = headers["content-length"].parse().unwrap();
                while buf.len() < head_end + length {
                    let n = socket.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "connection closed before the body");
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = serde_json::from_slice(&buf[head_end..head_end + length]).unwrap();
                let _ = tx.send(Seen {
                    method,
                    path,
                    headers,
                    body,
                });
                let completion = |text: &str| {
                    json!({
                        "id": "chatcmpl-1",
                        "object": "chat.completion",
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": text}}],
                    })
                    .to_string()
                };
                let (status, body) = match reply {
                    Reply::Answer(text) => (200, completion(&text)),
                    Reply::Sleep(d) => {
                        tokio::time::sleep(d).await;
                        (200, completion("too late"))
                    }
                    Reply::Raw(status, body) => (status, body),
                };
                let response = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (format!("http://{addr}/v1"), rx)
}

fn sign_png() -> Vec<u8> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sign.png");
    std::fs::read(path).unwrap()
}

fn practical(text: Option<&str>) -> BrainRequest {
    BrainRequest {
        moment_text: text.map(Into::into),
        mode: "practical".into(),
        ..BrainRequest::default()
    }
}

#[tokio::test]
async fn sends_text_image_and_key() {
    let (base, mut seen) = fake_server(Reply::Answer("It says: emergency exit.".into())).await;
    std::env::set_var("SPARK_TEST_OPENAI_KEY_SHAPE", "sk-test-123");
    let brain = OpenAiBrain::new(OpenAiConfig {
        api_key_env: Some("SPARK_TEST_OPENAI_KEY_SHAPE".into()),
        max_tokens: Some(256),
        ..OpenAiConfig::new(format!("{base}/"), "test-model")
    });
    let png = sign_png();
    let answer = brain
        .read(BrainRequest {
            copies: vec![CopyImage {
                bytes: png.clone(),
                content_type: "image/png".into(),
            }],
            lang: Some("de".into()),
            ..practical(Some("Notausgang"))
        })
        .await
        .unwrap();
    assert_eq!(answer.text, "It says: emergency exit.");
    assert_eq!(
        (answer.adapter.as_str(), answer.source.as_str()),
        ("openai", "model")
    );

    let req = seen.recv().await.unwrap();
    assert_eq!(req.method, "POST");
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(req.headers["authorization"], "Bearer sk-test-123");
    assert!(req.headers["content-type"].starts_with("application/json"));
    let body = req.body;
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["max_tokens"], 256);
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["role"], "system");
    assert!(messages[0]["content"]
        .as_str()
        .unwrap()
        .contains("practical reading"));
    assert_eq!(messages[1]["role"], "user");
    let parts = messages[1]["content"].as_array().unwrap();
    assert_eq!(parts[0]["type"], "text");
    let text = parts[0]["text"].as_str().unwrap();
    assert!(
        text.contains("Notausgang") && text.contains("Language: de"),
        "{text}"
    );
    assert_eq!(parts[1]["type"], "image_url");
    let expected = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&png)
    );
    assert_eq!(parts[1]["image_url"]["url"], expected.as_str());
}

/// Issue 27: every photo's copy is attached, in photo order, and the text
/// says how many.
#[tokio::test]
async fn several_photos_are_attached_in_order() {
    let (base, mut seen) = fake_server(Reply::Answer("Two signs.".into())).await;
    let brain = OpenAiBrain::new(OpenAiConfig::new(base, "m"));
    let copies: Vec<CopyImage> = [&b"first"[..], b"second", b"third"]
        .iter()
        .map(|bytes| CopyImage {
            bytes: bytes.to_vec(),
            content_type: "image/jpeg".into(),
        })
        .collect();
    brain
        .read(BrainRequest {
            copies,
            ..practical(None)
        })
        .await
        .unwrap();
    let req = seen.recv().await.unwrap();
    let parts = req.body["messages"][1]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(parts.len(), 4, "{parts:?}");
    let text = parts[0]["text"].as_str().unwrap();
    assert!(text.contains("3 photos of the sign are attached"), "{text}");
    for (part, bytes) in parts[1..].iter().zip([&b"first"[..], b"second", b"third"]) {
        let url = format!(
            "data:image/jpeg;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        );
        assert_eq!(part["image_url"]["url"], url.as_str());
    }
}

#[tokio::test]
async fn text_only_recall_without_a_key() {
    let (base, mut seen) = fake_server(Reply::Answer("Let's practise.".into())).await;
    let brain = OpenAiBrain::new(OpenAiConfig::new(base, "m"));
    let answer = brain
        .read(BrainRequest {
            moment_text: Some("Notausgang\nKein Zutritt".into()),
            mode: "recall".into(),
            ..BrainRequest::default()
        })
        .await
        .unwrap();
    assert_eq!(answer.text, "Let's practise.");
    let req = seen.recv().await.unwrap();
    assert!(!req.headers.contains_key("authorization"));
    assert_eq!(req.body["messages"][0]["content"], RECALL_SYSTEM_PROMPT);
    let user = req.body["messages"][1]["content"].as_str().unwrap();
    assert!(
        user.contains("Kept phrases:\nNotausgang\nKein Zutritt"),
        "{user}"
    );
    assert!(req.body.get("max_tokens").is_none());
}

#[tokio::test]
async fn a_missing_key_variable_is_a_clear_error() {
    let (base, mut seen) = fake_server(Reply::Answer("unused".into())).await;
    let brain = OpenAiBrain::new(OpenAiConfig {
        api_key_env: Some("SPARK_TEST_OPENAI_KEY_NEVER_SET".into()),
        ..OpenAiConfig::new(base, "m")
    });
    let err = brain.read(practical(Some("Ausgang"))).await.unwrap_err();
    assert!(
        err.0.contains("SPARK_TEST_OPENAI_KEY_NEVER_SET") && err.0.contains("not set"),
        "{err}"
    );
    assert!(seen.try_recv().is_err(), "no request was sent");
}

#[tokio::test]
async fn a_slow_server_times_out() {
    // The server would answer after a minute; the brain gives up at
    // 300 ms (the bound below is only far from both, for a loaded machine).
    let (base, _seen) = fake_server(Reply::Sleep(Duration::from_secs(60))).await;
    let brain = OpenAiBrain::new(OpenAiConfig {
        timeout_ms: 300,
        ..OpenAiConfig::new(base, "m")
    });
    let started = Instant::now();
    let err = brain.read(practical(Some("Ausgang"))).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(
        err.0.contains("timeout") && err.0.contains("300 ms"),
        "{err}"
    );
}

#[tokio::test]
async fn a_server_error_names_the_status() {
    let (base, _seen) = fake_server(Reply::Raw(
        500,
        r#"{"error":{"message":"model crashed"}}"#.into(),
    ))
    .await;
    let brain = OpenAiBrain::new(OpenAiConfig::new(base, "m"));
    let err = brain.read(practical(Some("Ausgang"))).await.unwrap_err();
    assert!(err.0.contains("500"), "{err}");
    assert!(err.0.contains("model crashed"), "{err}");
}

#[tokio::test]
async fn a_malformed_answer_is_an_error() {
    let (base, _seen) = fake_server(Reply::Raw(200, "this is {not json".into())).await;
    let brain = OpenAiBrain::new(OpenAiConfig::new(base, "m"));
    let err = brain.read(practical(Some("Ausgang"))).await.unwrap_err();
    assert!(err.0.contains("malformed"), "{err}");

    let (base, _seen) = fake_server(Reply::Raw(200, r#"{"choices":[]}"#.into())).await;
    let brain = OpenAiBrain::new(OpenAiConfig::new(base, "m"));
    let err = brain.read(practical(Some("Ausgang"))).await.unwrap_err();
    assert!(
        err.0.contains("malformed") && err.0.contains("choices"),
        "{err}"
    );
}

#[tokio::test]
async fn a_closed_port_is_a_connection_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let brain = OpenAiBrain::new(OpenAiConfig {
        timeout_ms: 5_000,
        ..OpenAiConfig::new(format!("http://{addr}/v1"), "m")
    });
    let err = brain.read(practical(Some("Ausgang"))).await.unwrap_err();
    assert!(err.0.contains("could not connect"), "{err}");
}

#[tokio::test]
async fn nothing_to_read_sends_nothing() {
    let (base, mut seen) = fake_server(Reply::Answer("unused".into())).await;
    let brain = OpenAiBrain::new(OpenAiConfig::new(base, "m"));
    let err = brain.read(practical(None)).await.unwrap_err();
    assert!(err.0.contains("nothing to read"), "{err}");
    assert!(seen.try_recv().is_err());
}
