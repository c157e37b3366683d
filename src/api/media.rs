//! `/api/media/{media id}` (SPEC section 4, DESIGN.md "Media"): uploads that
//! answer by content, and downloads with `ETag`, `If-None-Match` and one
//! `Range`.

use spark_core::wire::problem as wire;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, TryStreamExt};
use serde_json::Value;
use sha2::{Digest, Sha256};
use spark_core::wire::{
    HEADER_CONTENT_SHA256, HEADER_MEDIA_ROLE, HEADER_MOMENT_ID, HEADER_PHOTO, MEDIA_ROLE_COPY,
    MEDIA_ROLE_ORIGINAL, PHOTOS_PER_MOMENT,
};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;
use warp::http::{header, HeaderValue, Method, StatusCode};
use warp::reply::{Reply, Response};

use crate::media::{hex_digest, parse_hex_digest, Sha256Digest, Upload, UploadError};
use spark_core::blob::BlobFault;
use spark_core::ids::Id;
use spark_core::mirror::Media;
use spark_core::op::MediaRole;

use super::{ApiError, AppState, Request};

/// Longest `Content-Type` kept with a blob, in bytes.
const CONTENT_TYPE_MAX_BYTES: usize = 255;

/// Size of the chunks a download is streamed in, in bytes.
const CHUNK_BYTES: usize = 64 * 1024;

/// The media id of a `/api/media/{id}` path: `400 invalid_id` when it is
/// not a ULID.
pub(crate) fn path_id(text: &str) -> Result<Id, ApiError> {
    Id::parse(text).map_err(|e| ApiError::invalid_id("the media id in the path", e))
}

fn required<'r>(req: &'r Request, name: &str) -> Result<&'r str, ApiError> {
    req.header(name)?
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::invalid_request(format!("header {name} is required")))
}

/// What an upload's headers say (`400 invalid_request` or `400
/// invalid_id` when they say it wrong): where the blob goes, what it is,
/// and what the client says of its bytes.
fn upload_of(id: Id, req: &Request) -> Result<Upload, ApiError> {
    let moment_id = Id::parse(required(req, HEADER_MOMENT_ID)?)
        .map_err(|e| ApiError::invalid_id("X-Moment-Id", e))?;
    let role = match required(req, HEADER_MEDIA_ROLE)? {
        MEDIA_ROLE_COPY => MediaRole::Copy,
        MEDIA_ROLE_ORIGINAL => MediaRole::Original,
        other => {
            return Err(ApiError::invalid_request(format!(
                "X-Media-Role {other:?} is neither copy nor original"
            )))
        }
    };
    let photo = match req.header(HEADER_PHOTO)? {
        None => 0,
        Some(text) => parse_photo(text).ok_or_else(|| {
            ApiError::invalid_request(format!(
                "X-Photo {:?} is not a photo number from 0 to {}",
                clipped(text, 20),
                PHOTOS_PER_MOMENT - 1
            ))
        })?,
    };
    let content_type = req
        .header("content-type")?
        .unwrap_or("application/octet-stream")
        .to_owned();
    if content_type.len() > CONTENT_TYPE_MAX_BYTES || !content_type.contains('/') {
        return Err(ApiError::invalid_request(format!(
            "Content-Type {:?} is not a media type of at most {CONTENT_TYPE_MAX_BYTES} bytes",
            clipped(&content_type, 60)
        )));
    }
    let declared_sha256 = match req.header(HEADER_CONTENT_SHA256)? {
        None => None,
        Some(text) => Some(parse_hex_digest(text).ok_or_else(|| {
            ApiError::invalid_request("X-Content-SHA256 is not 64 hex characters")
        })?),
    };
    Ok(Upload {
        id,
        moment_id,
        role,
        photo,
        content_type,
        declared_sha256,
        declared_length_bytes: None,
        device: req.device.clone(),
    })
}

/// The photo number of an `X-Photo` header: ASCII decimal digits only (no
/// sign, no spaces; leading zeros allowed) for a number below
/// [`PHOTOS_PER_MOMENT`]; `None` otherwise.
fn parse_photo(text: &str) -> Option<u8> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = text.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    // More than 3 digits is past any u8 (and saves parsing a long value).
    if digits.len() > 3 {
        return None;
    }
    digits
        .parse::<u8>()
        .ok()
        .filter(|photo| *photo < PHOTOS_PER_MOMENT)
}

/// At most the first `max_chars` characters of a client's value, for a
/// problem's detail (`{:.N?}` does not shorten a `Debug` string).
fn clipped(text: &str, max_chars: usize) -> &str {
    text.char_indices()
        .nth(max_chars)
        .map_or(text, |(end, _)| &text[..end])
}

/// `400 digest_mismatch`: `X-Content-SHA256` names other bytes.
fn digest_mismatch(declared: &Sha256Digest, actual: &Sha256Digest) -> ApiError {
    let mut error = ApiError::new(
        StatusCode::BAD_REQUEST,
        wire::DIGEST_MISMATCH,
        format!(
            "X-Content-SHA256 says {} but the bytes hash to {}",
            hex_digest(declared),
            hex_digest(actual)
        ),
    );
    error
        .extra
        .insert("declared_sha256".into(), Value::from(hex_digest(declared)));
    error
        .extra
        .insert("actual_sha256".into(), Value::from(hex_digest(actual)));
    error
}

/// A media body must not be empty (curl sends 0 bytes for a
/// file that does not exist): `400 invalid_request`, nothing written.
const EMPTY_BODY: &str = "the media body is empty (0 bytes): send the file's bytes";

/// `PUT /api/media/{id}`: reads the upload's headers and hands it to
/// [`crate::media::MediaStore::put`], which owns it, then answers its
/// outcome. A refusal made before the body was read answers with
/// `Connection: close`.
pub(crate) async fn put(state: &AppState, id: Id, mut req: Request) -> Result<Response, ApiError> {
    let mut upload = upload_of(id, &req).map_err(ApiError::closing)?;
    upload.declared_length_bytes = req
        .header("content-length")?
        .and_then(|v| v.parse::<u64>().ok());
    let body = std::mem::replace(&mut req.body, Box::pin(futures_util::stream::empty()))
        .map_err(std::io::Error::other);
    let limit_bytes = state.settings.limits.media_limit_bytes;
    match state
        .media
        .put(&state.engine, upload, body, limit_bytes)
        .await
    {
        Ok(outcome) => Ok(super::outcome_response(outcome)),
        Err(e) => Err(upload_error(e)),
    }
}

/// The answer to an upload [`crate::media::MediaStore::put`] refused.
fn upload_error(e: UploadError) -> ApiError {
    match e {
        UploadError::Unread(refusal) => ApiError::from(refusal).closing(),
        UploadError::TooLarge { limit_bytes } => ApiError::too_large(limit_bytes).closing(),
        UploadError::Empty => ApiError::invalid_request(EMPTY_BODY),
        UploadError::Body(why) => ApiError::invalid_request(why),
        UploadError::DigestMismatch { declared, actual } => digest_mismatch(&declared, &actual),
        UploadError::Engine(e) => e.into(),
        UploadError::Store(e) => unavailable(format!("the media store cannot write: {e}")),
        UploadError::Task(e) => unavailable(format!("the upload task failed: {e}")),
    }
}

fn unavailable(detail: String) -> ApiError {
    let mut error = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, wire::UNAVAILABLE, detail);
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

/// Whether `Range` is to be honoured under `If-Range` (RFC 9110 section
/// 13.1.5): yes without the header; with it, only when it is this blob's
/// strong entity tag (`etag`, quoted). A weak tag or a date never matches
/// (a blob has no `Last-Modified`), so the whole blob is served, `200`.
fn if_range_holds(if_range: Option<&str>, etag: &str) -> bool {
    if_range.is_none_or(|v| v.trim() == etag)
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

/// `GET`/`HEAD`: the blob with `ETag`, `If-None-Match` and one `Range`;
/// a blob that no longer is what its op recorded is a `500`, never served.
pub(crate) async fn get(state: &AppState, id: Id, req: &Request) -> Result<Response, ApiError> {
    let media = stored_media(state, id)?;
    let digest: Sha256Digest = media.sha256.0;
    let etag = format!("\"{}\"", hex_digest(&digest));
    if let Some(response) = not_modified(req, &etag)? {
        return Ok(response);
    }
    let path = state.media.blob_path(&digest);
    let file = open_blob(id, &path, media.size_bytes).await?;
    let size = media.size_bytes;
    let range_header = if if_range_holds(req.header("if-range")?, &etag) {
        req.header("range")?
    } else {
        None
    };
    let range = match parse_range(range_header, size) {
        Ok(r) => r,
        Err(()) => return Ok(unsatisfiable(id, size)),
    };
    let verified = state.verified_blobs.lock().contains(&digest);
    if range.is_some() && !verified {
        // A part of a blob cannot be checked alone: check the whole once.
        verify_whole(id, path, digest, size).await?;
        state.verified_blobs.lock().insert(digest);
    }
    let (first, last) = range.map_or((0, size.saturating_sub(1)), |r| (r.first, r.last));
    let length = if size == 0 { 0 } else { last - first + 1 };
    let part = Part {
        first,
        length,
        whole: range.is_none(),
        expected: digest,
    };
    let rx = if req.method == Method::GET && length > 0 {
        stream_blob(file, part, Arc::clone(&state.verified_blobs), id)
    } else {
        mpsc::channel(1).1
    };
    let mut response = warp::reply::stream(BlobBody(rx)).into_response();
    *response.status_mut() = if range.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    set_header(&mut response, header::CONTENT_TYPE, &media.content_type);
    set_header(&mut response, header::CONTENT_LENGTH, &length.to_string());
    set_header(&mut response, header::ETAG, &etag);
    set_header(&mut response, header::ACCEPT_RANGES, "bytes");
    set_header(&mut response, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set_header(
        &mut response,
        header::CONTENT_SECURITY_POLICY,
        MEDIA_CONTENT_SECURITY_POLICY,
    );
    if !is_raster_image(&media.content_type) {
        set_header(&mut response, header::CONTENT_DISPOSITION, "attachment");
    }
    if range.is_some() {
        set_header(
            &mut response,
            header::CONTENT_RANGE,
            &format!("bytes {first}-{last}/{size}"),
        );
    }
    Ok(response)
}

/// The `Content-Security-Policy` of every media answer: a blob opened as
/// a document (an uploaded `text/html` or `image/svg+xml`, say) runs no
/// script, loads nothing and gets an origin of its own (`sandbox`), so an
/// upload cannot act as the engine's page (stored XSS, found by a
/// newcomer's break test, 2026-12-04). Shown by an `<img>`, a photo is
/// not affected.
pub const MEDIA_CONTENT_SECURITY_POLICY: &str = "default-src 'none'; sandbox";

/// Whether a media type is a raster image a browser shows inline (PNG,
/// JPEG, GIF, WebP, AVIF, HEIC/HEIF, BMP; parameters and case aside).
/// Every other type is answered with `Content-Disposition: attachment`, so
/// that opening it saves it instead of rendering it.
pub fn is_raster_image(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    RASTER_IMAGE_TYPES
        .iter()
        .any(|raster| raster.eq_ignore_ascii_case(essence))
}

/// The media types [`is_raster_image`] accepts.
const RASTER_IMAGE_TYPES: [&str; 9] = [
    "image/png",
    "image/jpeg",
    "image/jpg",
    "image/gif",
    "image/webp",
    "image/avif",
    "image/heic",
    "image/heif",
    "image/bmp",
];

/// The media record, unless it is unknown (`404`) or its moment is
/// deleted (`410`).
fn stored_media(state: &AppState, id: Id) -> Result<Media, ApiError> {
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
            wire::DELETED,
            format!("the moment of media {id} is deleted"),
        ));
    }
    Ok(media)
}

/// `304` when `If-None-Match` names the blob's `ETag` (or is `*`).
fn not_modified(req: &Request, etag: &str) -> Result<Option<Response>, ApiError> {
    let Some(tags) = req.header("if-none-match")? else {
        return Ok(None);
    };
    let matches = tags == "*"
        || tags
            .split(',')
            .any(|t| t.trim().trim_start_matches("W/") == etag);
    if !matches {
        return Ok(None);
    }
    let mut response = Response::new(Default::default());
    *response.status_mut() = StatusCode::NOT_MODIFIED;
    set_header(&mut response, header::ETAG, etag);
    Ok(Some(response))
}

/// `500 unavailable` for a blob that is not what its op recorded (logged).
fn damaged(id: Id, detail: String) -> ApiError {
    tracing::error!(media = %id, %detail, "blob damaged");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        wire::UNAVAILABLE,
        format!("media {id} is damaged on the server: {detail}"),
    )
}

/// Opens the blob and checks its length against the op's.
async fn open_blob(
    id: Id,
    path: &std::path::Path,
    size_bytes: u64,
) -> Result<tokio::fs::File, ApiError> {
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| damaged(id, format!("its blob cannot be opened ({})", e.kind())))?;
    let on_disk = file
        .metadata()
        .await
        .map_err(|e| damaged(id, format!("its blob cannot be read ({})", e.kind())))?
        .len();
    if on_disk != size_bytes {
        return Err(damaged(
            id,
            format!("{on_disk} bytes on disk, {size_bytes} recorded"),
        ));
    }
    Ok(file)
}

/// `416` with `Content-Range: bytes */<size>`.
fn unsatisfiable(id: Id, size: u64) -> Response {
    let mut response = ApiError::new(
        StatusCode::RANGE_NOT_SATISFIABLE,
        wire::INVALID_REQUEST,
        format!("the range is outside the {size} bytes of media {id}"),
    )
    .into_response();
    set_header(
        &mut response,
        header::CONTENT_RANGE,
        &format!("bytes */{size}"),
    );
    response
}

/// The whole blob against its op, with the one `verify`.
async fn verify_whole(
    id: Id,
    path: std::path::PathBuf,
    digest: Sha256Digest,
    size: u64,
) -> Result<(), ApiError> {
    let verified =
        tokio::task::spawn_blocking(move || spark_core::blob::verify(&path, &digest, size))
            .await
            .map_err(|e| damaged(id, e.to_string()))?;
    match verified {
        Ok(()) => Ok(()),
        Err(BlobFault::Hash { .. }) => Err(damaged(
            id,
            "its bytes no longer hash to the recorded sha256".into(),
        )),
        Err(fault) => Err(damaged(id, fault.to_string())),
    }
}

/// What part of a blob a download sends.
#[derive(Clone, Copy)]
struct Part {
    /// First byte.
    first: u64,
    /// Bytes to send.
    length: u64,
    /// True when the part is the whole blob (then it is hashed as it goes).
    whole: bool,
    /// The op's SHA-256.
    expected: Sha256Digest,
}

/// Streams a part of the blob in [`CHUNK_BYTES`] chunks. A whole blob is
/// hashed as it goes: one that no longer hashes to its op aborts the body
/// before its last chunk; one that does is remembered as verified.
fn stream_blob(
    mut file: tokio::fs::File,
    part: Part,
    verified_blobs: Arc<parking_lot::Mutex<std::collections::HashSet<Sha256Digest>>>,
    id: Id,
) -> mpsc::Receiver<Result<Bytes, std::io::Error>> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut hasher = Sha256::new();
        let Part {
            first,
            length,
            whole,
            expected,
        } = part;
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
                    if left == 0 && whole && <[u8; 32]>::from(hasher.clone().finalize()) != expected
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
    rx
}

fn set_header(response: &mut Response, name: header::HeaderName, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn photo_numbers() {
        for (text, photo) in [("0", 0), ("9", 9), ("01", 1), ("0009", 9), ("000", 0)] {
            assert_eq!(parse_photo(text), Some(photo), "{text:?}");
        }
        let long = "7".repeat(20_000);
        for text in ["", "10", "256", "-1", "+1", "1.0", "1 2", "٣", "０", &long] {
            assert_eq!(parse_photo(text), None, "{text:?}");
        }
    }

    #[test]
    fn a_detail_quotes_at_most_so_many_characters() {
        assert_eq!(clipped("abc", 2), "ab");
        assert_eq!(clipped("ab", 2), "ab");
        assert_eq!(clipped("äöü", 2), "äö");
        assert_eq!(clipped(&"7".repeat(20_000), 20).len(), 20);
    }

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

    #[test]
    fn if_range_honours_the_range_only_for_this_strong_tag() {
        let etag = "\"ab12\"";
        assert!(if_range_holds(None, etag));
        assert!(if_range_holds(Some("\"ab12\""), etag));
        assert!(if_range_holds(Some(" \"ab12\" "), etag));
        assert!(!if_range_holds(Some("\"nope\""), etag));
        assert!(!if_range_holds(Some("W/\"ab12\""), etag));
        assert!(!if_range_holds(Some("Tue, 01 Dec 2026 00:00:00 GMT"), etag));
    }
}
