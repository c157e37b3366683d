//! The client's link to the server, behind a trait so tests can drop
//! replies, time out, or answer with chosen statuses.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;

/// The HTTP methods the client uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
    /// `PUT`.
    Put,
}

impl Method {
    /// The method's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One request, relative to the server's base URL.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// The method.
    pub method: Method,
    /// The path and query, starting with `/` (e.g. `/api/moments`).
    pub path: String,
    /// Headers, name and value.
    pub headers: Vec<(String, String)>,
    /// The body (empty for none).
    pub body: Bytes,
}

impl HttpRequest {
    /// A request with `value` as its JSON body.
    pub fn json(method: Method, path: impl Into<String>, value: &serde_json::Value) -> Self {
        HttpRequest {
            method,
            path: path.into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from(value.to_string()),
        }
    }

    /// The first value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }
}

/// An answer from the server.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Headers, name and value.
    pub headers: Vec<(String, String)>,
    /// The whole body.
    pub body: Bytes,
}

impl HttpResponse {
    /// The first value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The body as JSON (`Null` when it is empty or not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A request that got no answer. Either way the server may or may not have
/// acted on it; the client cannot tell, so it retries with the same ids.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// No whole answer within the time limit.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The connection failed, was reset, or closed before a whole answer.
    #[error("network error: {0}")]
    Network(String),
}

/// Sends one request and returns the server's whole answer.
pub trait Transport: Send + Sync {
    /// Sends `request`; any status is an `Ok` answer, and only a missing
    /// answer is an error.
    fn send(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>>;
}

/// The real transport: reqwest over HTTP(S) to a base URL.
#[derive(Debug, Clone)]
pub struct ReqwestTransport {
    base: String,
    client: reqwest::Client,
    token: Option<String>,
}

/// Default limit for one request, its body and its whole answer.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

impl ReqwestTransport {
    /// A transport to `base` (e.g. `http://127.0.0.1:8080`) with the default
    /// time limit per request.
    pub fn new(base: &str) -> Result<Self, TransportError> {
        ReqwestTransport::with_timeout(base, DEFAULT_REQUEST_TIMEOUT)
    }

    /// A transport to `base` with `timeout` per request (connecting,
    /// sending and reading the whole answer).
    pub fn with_timeout(base: &str, timeout: Duration) -> Result<Self, TransportError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(15)))
            .build()
            .map_err(|e| TransportError::Network(format!("cannot build the HTTP client: {e}")))?;
        Ok(ReqwestTransport {
            base: base.trim_end_matches('/').to_owned(),
            client,
            token: None,
        })
    }

    /// Sends `Authorization: Bearer <token>` with every request (SPEC
    /// section 9).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// The base URL, without a trailing slash.
    pub fn base(&self) -> &str {
        &self.base
    }
}

fn classify(error: reqwest::Error) -> TransportError {
    if error.is_timeout() {
        TransportError::Timeout(error.to_string())
    } else {
        // Include the cause chain: reqwest's own message is terse.
        let mut text = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        TransportError::Network(text)
    }
}

impl Transport for ReqwestTransport {
    fn send(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        Box::pin(async move {
            let method = match request.method {
                Method::Get => reqwest::Method::GET,
                Method::Post => reqwest::Method::POST,
                Method::Put => reqwest::Method::PUT,
            };
            let mut builder = self
                .client
                .request(method, format!("{}{}", self.base, request.path));
            for (name, value) in &request.headers {
                builder = builder.header(name.as_str(), value.as_str());
            }
            if let Some(token) = &self.token {
                builder = builder.bearer_auth(token);
            }
            if !request.body.is_empty() || request.method != Method::Get {
                builder = builder.body(request.body);
            }
            let response = builder.send().await.map_err(classify)?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect();
            let body = response.bytes().await.map_err(classify)?;
            Ok(HttpResponse {
                status,
                headers,
                body,
            })
        })
    }
}
