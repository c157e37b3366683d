//! `/api/media/{media id}` (SPEC section 4, DESIGN.md "Media"): uploads that
//! answer by content, and downloads with `ETag`, `If-None-Match` and one
//! `Range`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;
use warp::http::{header, HeaderValue, Method, StatusCode};
use warp::reply::{Reply, Response};

use crate::engine::{Command, EngineError, Outcome, PutMedia};
use crate::ids::Id;
use crate::media::{hex_digest, parse_hex_digest, ReceiveError, Sha256Digest};
use crate::mirror::MediaView;
use crate::op::MediaRole;

use super::{json_response, ApiError, AppState, Request};

/// Longest `Content-Type` kept with a blob, in bytes.
const CONTENT_TYPE_MAX_BYTES: usize = 255;

/// Size of the chunks a download is streamed in, in bytes.
const CHUNK_BYTES: usize = 64 * 1024;

#[derive(Serialize)]
struct PutAnswer<'a> {
    created: bool,
    media: &'a MediaView,
}

/// `PUT`, `GET` and `HEAD` on `/api/media/{id}`.
pub async fn item(state: Arc<AppState>, id: String, req: Request) -> Result<Response, ApiError> {
    let id = Id::parse(&id).map_err(|e| ApiError::invalid_id("the media id in the path", e))?;
    match req.method {
        Method::PUT => put(&state, id, req).await,
        Method::GET | Method::HEAD => get(&state, id, &req).await,
        _ => Err(ApiError::method_not_allowed("GET, HEAD, PUT")),
    }
}

fn required<'r>(req: &'r Request, name: &str) -> Result<&'r str, ApiError> {
    req.header(name)?
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::invalid_request(format!("header {name} is required")))
}

async fn put(state: &AppState, id: Id, mut req: Request) -> Result<Response, ApiError> {
    let moment_id = Id::parse(required(&req, "x-moment-id")?)
        .map_err(|e| ApiError::invalid_id("X-Moment-Id", e))?;
    let role = match required(&req, "x-media-role")? {
        "copy" => MediaRole::Copy,
        "original" => MediaRole::Original,
        other => {
            return Err(ApiError::invalid_request(format!(
                "X-Media-Role {other:?} is neither copy nor original"
            )))
        }
    };
    let content_type = req
        .header("content-type")?
        .unwrap_or("application/octet-stream")
        .to_owned();
    if content_type.len() > CONTENT_TYPE_MAX_BYTES || !content_type.contains('/') {
        return Err(ApiError::invalid_request(format!(
            "Content-Type {content_type:.60?} is not a media type of at most {CONTENT_TYPE_MAX_BYTES} bytes"
        )));
    }
    let declared = match req.header("x-content-sha256")? {
        None => None,
        Some(text) => Some(parse_hex_digest(text).ok_or_else(|| {
            ApiError::invalid_request("X-Content-SHA256 is not 64 hex characters")
        })?),
    };
    // Fail fast, before reading a byte, on what the bytes cannot change. The
    // sequencer checks all of it again when the op is decided.
    state.engine.read(|mirror| {
        if let Some(known) = mirror.media.get(&id) {
            if known.moment_id != moment_id || known.role != role {
                return Err(ApiError::from(EngineError::Conflict(format!(
                    "media {id} belongs to moment {} as its {}",
                    known.moment_id,
                    known.role.name()
                ))));
            }
            return Ok(());
        }
        match mirror.moment(moment_id) {
            None => Err(ApiError::from(EngineError::NotFound(moment_id))),
            Some(m) if m.deleted => Err(ApiError::from(EngineError::Deleted(moment_id))),
            Some(_) => Ok(()),
        }
    })?;
    let limit_bytes = state.settings.limits.media_limit_bytes;
    if let Some(length) = req
        .header("content-length")?
        .and_then(|v| v.parse::<u64>().ok())
    {
        if length > limit_bytes {
            return Err(ApiError::too_large(limit_bytes));
        }
    }
    let body = std::mem::replace(&mut req.body, Box::pin(futures_util::stream::empty()));
    let received = state
        .media
        .receive(body, limit_bytes)
        .await
        .map_err(|e| match e {
            ReceiveError::TooLarge { limit_bytes } => ApiError::too_large(limit_bytes),
            ReceiveError::Body(why) => ApiError::invalid_request(why),
            ReceiveError::Io(e) => unavailable(format!("the media store cannot write: {e}")),
        })?;
    if let Some(declared) = declared {
        if declared != received.sha256 {
            let actual = received.sha256;
            state.media.discard(received).await;
            let mut error = ApiError::new(
                StatusCode::BAD_REQUEST,
                "digest_mismatch",
                format!(
                    "X-Content-SHA256 says {} but the bytes hash to {}",
                    hex_digest(&declared),
                    hex_digest(&actual)
                ),
            );
            error
                .extra
                .insert("declared_sha256".into(), Value::from(hex_digest(&declared)));
            error
                .extra
                .insert("actual_sha256".into(), Value::from(hex_digest(&actual)));
            return Err(error);
        }
    }
    // A replay of a known upload: answer by content, keep nothing.
    let known = state
        .engine
        .read(|mirror| mirror.media.get(&id).map(|m| mirror.media_view(m)));
    if let Some(existing) = known {
        let actual = received.sha256;
        let same = existing.sha256 == hex_digest(&actual);
        state.media.discard(received).await;
        return if same {
            Ok(json_response(
                StatusCode::OK,
                &PutAnswer {
                    created: false,
                    media: &existing,
                },
            ))
        } else {
            Err(ApiError::from(EngineError::Conflict(format!(
                "media {id} was uploaded with sha256 {}; these bytes hash to {}",
                existing.sha256,
                hex_digest(&actual)
            ))))
        };
    }
    // Another media already fills this role: refuse before the blob is put
    // in place, so no orphan is left (the sequencer checks again).
    let taken = state.engine.read(|mirror| {
        let moment = mirror.moment(moment_id)?;
        moment
            .media()
            .iter()
            .filter_map(|m| mirror.media.get(m))
            .find(|m| m.role == role)
            .map(|m| m.id)
    });
    if let Some(other) = taken {
        state.media.discard(received).await;
        return Err(ApiError::from(EngineError::Conflict(format!(
            "moment {moment_id} already has its {}: media {other}",
            role.name()
        ))));
    }
    state
        .media
        .commit(&received)
        .await
        .map_err(|e| unavailable(format!("the media store cannot write: {e}")))?;
    // The blob is durable; a crash here leaves an orphan, never an op
    // without its blob.
    crate::failpoints::check("media.before_op")
        .map_err(|e| unavailable(format!("the media store cannot write: {e}")))?;
    let command = Command::PutMedia(PutMedia {
        id,
        moment_id,
        role,
        sha256: received.sha256,
        size_bytes: received.size_bytes,
        content_type,
        device: req.device.clone(),
    });
    match state.engine.submit(command).await? {
        Outcome::MediaPut { created, media } => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(
                status,
                &PutAnswer {
                    created,
                    media: &media,
                },
            ))
        }
        other => Err(super::unexpected(other)),
    }
}

fn unavailable(detail: String) -> ApiError {
    let mut error = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail);
    error.retry_after_s = Some(5);
    error
}

/// One byte range, inclusive of both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ByteRange {
    first: u64,
    last: u64,
}

/// Parses `Range` against a blob of `size` bytes: `Ok(None)` to serve the
/// whole blob (no header, several ranges, or a unit other than bytes),
/// `Ok(Some(range))` for one satisfiable range, `Err(())` when unsatisfiable.
fn parse_range(value: Option<&str>, size: u64) -> Result<Option<ByteRange>, ()> {
    let Some(spec) = value.and_then(|v| v.strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let (start, end) = spec.trim().split_once('-').ok_or(())?;
    let range = if start.is_empty() {
        let suffix: u64 = end.parse().map_err(|_| ())?;
        if suffix == 0 || size == 0 {
            return Err(());
        }
        ByteRange {
            first: size.saturating_sub(suffix),
            last: size - 1,
        }
    } else {
        let first: u64 = start.parse().map_err(|_| ())?;
        let last = if end.is_empty() {
            size.saturating_sub(1)
        } else {
            end.parse::<u64>()
                .map_err(|_| ())?
                .min(size.saturating_sub(1))
        };
        if first >= size || last < first {
            return Err(());
        }
        ByteRange { first, last }
    };
    Ok(Some(range))
}

/// A download's body: chunks sent by the reader task. An error item (the
/// blob no longer hashes to its op) makes the server abort the response, so
/// a damaged blob is never delivered as if it were good.
struct BlobBody(mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl Stream for BlobBody {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

async fn get(state: &AppState, id: Id, req: &Request) -> Result<Response, ApiError> {
    let (media, moment_deleted) = state
        .engine
        .read(|mirror| {
            mirror.media.get(&id).map(|m| {
                let deleted = mirror.moment(m.moment_id).is_none_or(|x| x.deleted);
                (m.clone(), deleted)
            })
        })
        .ok_or_else(|| ApiError::not_found(format!("media {id} does not exist")))?;
    if moment_deleted {
        return Err(ApiError::new(
            StatusCode::GONE,
            "deleted",
            format!("the moment of media {id} is deleted"),
        ));
    }
    let digest: Sha256Digest = media.sha256.0;
    let etag = format!("\"{}\"", hex_digest(&digest));
    if let Some(tags) = req.header("if-none-match")? {
        if tags == "*"
            || tags
                .split(',')
                .any(|t| t.trim().trim_start_matches("W/") == etag)
        {
            let mut response = Response::new(Default::default());
            *response.status_mut() = StatusCode::NOT_MODIFIED;
            set_header(&mut response, header::ETAG, &etag);
            return Ok(response);
        }
    }
    let path = state.media.blob_path(&digest);
    let damaged = |detail: String| {
        tracing::error!(media = %id, %detail, "blob damaged");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "unavailable",
            format!("media {id} is damaged on the server: {detail}"),
        )
    };
    let mut file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| damaged(format!("its blob cannot be opened ({})", e.kind())))?;
    let on_disk = file
        .metadata()
        .await
        .map_err(|e| damaged(format!("its blob cannot be read ({})", e.kind())))?
        .len();
    if on_disk != media.size_bytes {
        return Err(damaged(format!(
            "{on_disk} bytes on disk, {} recorded",
            media.size_bytes
        )));
    }
    let size = media.size_bytes;
    let range = match parse_range(req.header("range")?, size) {
        Ok(r) => r,
        Err(()) => {
            let mut response = ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "invalid_request",
                format!("the range is outside the {size} bytes of media {id}"),
            )
            .into_response();
            set_header(
                &mut response,
                header::CONTENT_RANGE,
                &format!("bytes */{size}"),
            );
            return Ok(response);
        }
    };
    let verified = state.verified_blobs.lock().contains(&digest);
    if range.is_some() && !verified {
        // A part of a blob cannot be checked alone: check the whole once.
        let ok = hash_file(&path).await.map_err(|e| damaged(e.to_string()))? == digest;
        if !ok {
            return Err(damaged(
                "its bytes no longer hash to the recorded sha256".into(),
            ));
        }
        state.verified_blobs.lock().insert(digest);
    }
    let (first, last) = range.map_or((0, size.saturating_sub(1)), |r| (r.first, r.last));
    let length = if size == 0 { 0 } else { last - first + 1 };
    let (tx, rx) = mpsc::channel(4);
    let expected = digest;
    let whole = range.is_none();
    let verified_blobs = Arc::clone(&state.verified_blobs);
    if req.method == Method::GET && length > 0 {
        tokio::spawn(async move {
            let mut hasher = Sha256::new();
            let mut left = length;
            if first > 0 {
                if let Err(e) = file.seek(std::io::SeekFrom::Start(first)).await {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
            let mut buffer = vec![0u8; CHUNK_BYTES];
            while left > 0 {
                // Cast: the minimum is at most CHUNK_BYTES, a usize.
                let want = left.min(CHUNK_BYTES as u64) as usize;
                match file.read(&mut buffer[..want]).await {
                    Ok(0) => {
                        let _ = tx
                            .send(Err(std::io::Error::other("blob shorter than recorded")))
                            .await;
                        return;
                    }
                    Ok(n) => {
                        hasher.update(&buffer[..n]);
                        left -= n as u64;
                        if left == 0
                            && whole
                            && <[u8; 32]>::from(hasher.clone().finalize()) != expected
                        {
                            tracing::error!(media = %id, "blob no longer hashes to its op; response aborted");
                            verified_blobs.lock().remove(&expected);
                            let _ = tx
                                .send(Err(std::io::Error::other("blob hash mismatch")))
                                .await;
                            return;
                        }
                        if tx
                            .send(Ok(Bytes::copy_from_slice(&buffer[..n])))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
            if whole {
                verified_blobs.lock().insert(expected);
            }
        });
    } else {
        drop(tx);
    }
    let mut response = warp::reply::stream(BlobBody(rx)).into_response();
    let status = if range.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    *response.status_mut() = status;
    set_header(&mut response, header::CONTENT_TYPE, &media.content_type);
    set_header(&mut response, header::CONTENT_LENGTH, &length.to_string());
    set_header(&mut response, header::ETAG, &etag);
    set_header(&mut response, header::ACCEPT_RANGES, "bytes");
    set_header(&mut response, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    if range.is_some() {
        set_header(
            &mut response,
            header::CONTENT_RANGE,
            &format!("bytes {first}-{last}/{size}"),
        );
    }
    Ok(response)
}

fn set_header(response: &mut Response, name: header::HeaderName, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, value);
    }
}

/// SHA-256 of a whole file, read in chunks.
pub async fn hash_file(path: &std::path::Path) -> std::io::Result<Sha256Digest> {
    let mut file = tokio::fs::File::open(path).await?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; CHUNK_BYTES];
    loop {
        let n = file.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let r = |v, size| parse_range(Some(v), size);
        assert_eq!(
            r("bytes=100-199", 1000),
            Ok(Some(ByteRange {
                first: 100,
                last: 199
            }))
        );
        assert_eq!(
            r("bytes=900-", 1000),
            Ok(Some(ByteRange {
                first: 900,
                last: 999
            }))
        );
        assert_eq!(
            r("bytes=-10", 1000),
            Ok(Some(ByteRange {
                first: 990,
                last: 999
            }))
        );
        assert_eq!(
            r("bytes=-5000", 1000),
            Ok(Some(ByteRange {
                first: 0,
                last: 999
            }))
        );
        assert_eq!(
            r("bytes=990-5000", 1000),
            Ok(Some(ByteRange {
                first: 990,
                last: 999
            }))
        );
        assert_eq!(r("bytes=1000-", 1000), Err(()));
        assert_eq!(r("bytes=5-2", 1000), Err(()));
        assert_eq!(r("bytes=-0", 1000), Err(()));
        assert_eq!(r("bytes=abc", 1000), Err(()));
        assert_eq!(r("bytes=0-1,5-6", 1000), Ok(None));
        assert_eq!(r("items=0-1", 1000), Ok(None));
        assert_eq!(parse_range(None, 1000), Ok(None));
    }
}
