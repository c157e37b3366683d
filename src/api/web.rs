//! The engine's page (SPEC section 12): `GET /`, `GET /assets/{name}`,
//! the service worker `GET /sw.js` and the web app manifest
//! `GET /app.webmanifest`, served from `web/dist/`, which `web/build.mjs`
//! builds from `web/page/` and `web/client/src/` and which is committed and
//! compiled into the binary ([`DIST`]), so `cargo run` needs no Node.
//! `tests/http/web.rs` fails when the committed build is older than its
//! sources ([`sources_sha256`] against `web/dist/manifest.json`).
//!
//! Every file answers with its SHA-256 as a strong `ETag` and
//! `Cache-Control: no-cache` (a browser revalidates and gets `304 Not
//! Modified` while the binary is the same; for the worker this is what
//! lets a browser see a new build at once); the page is public, so that it
//! can ask for a token when one is needed (SPEC section 9 holds for every
//! `/api/` route). The worker is served at the root so that its scope is
//! the whole origin (`Service-Worker-Allowed: /` says so too); what it
//! caches and what it never does is said in `web/page/src/sw.ts` and
//! `docs/web.md`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use include_dir::{include_dir, Dir};
use warp::http::{header, HeaderName, HeaderValue, StatusCode};
use warp::reply::Response;

use super::{ApiError, AppState, Request};

/// The built page: `index.html`, `assets/*`, `sw.js`, `app.webmanifest`
/// and `manifest.json` (the build's own record, not served).
pub static DIST: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/web/dist");

/// The `Content-Security-Policy` of the page: its own scripts, styles,
/// images (and `blob:` previews), requests to its own origin only, never
/// framed.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' blob: data:; \
     connect-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The media type of a built file, by its extension.
pub fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        Some("webmanifest") => "application/manifest+json",
        _ => "application/octet-stream",
    }
}

/// The strong ETag of each built file: `"<SHA-256 hex>"`, computed once.
fn etags() -> &'static HashMap<&'static str, String> {
    static ETAGS: OnceLock<HashMap<&'static str, String>> = OnceLock::new();
    ETAGS.get_or_init(|| {
        let mut map = HashMap::new();
        let mut stack: Vec<&'static Dir<'static>> = vec![&DIST];
        while let Some(dir) = stack.pop() {
            stack.extend(dir.dirs());
            for file in dir.files() {
                if let Some(path) = file.path().to_str() {
                    let digest = <sha2::Sha256 as sha2::Digest>::digest(file.contents());
                    map.insert(path, format!("\"{}\"", hex::encode(digest)));
                }
            }
        }
        map
    })
}

/// Whether `If-None-Match` names `etag` (or is `*`).
fn not_modified(req: &Request, etag: &str) -> bool {
    req.headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .map(|t| t.trim().trim_start_matches("W/"))
                .any(|t| t == "*" || t == etag)
        })
}

/// Answers one built file: `200` with its bytes, or `304` when the
/// browser's copy is current; `404 not_found` when there is no such file.
fn serve(req: &Request, path: &str) -> Result<Response, ApiError> {
    let file = DIST
        .get_file(path)
        .ok_or_else(|| ApiError::not_found(format!("no asset {path}")))?;
    let etag = etags()
        .get(path)
        .cloned()
        .unwrap_or_else(|| "\"\"".to_owned());
    let mut response = if not_modified(req, &etag) {
        let mut r = Response::new(Vec::new().into());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        let mut r = Response::new(file.contents().into());
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(path)),
        );
        r
    };
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if path == SERVICE_WORKER_FILE {
        headers.insert(
            HeaderName::from_static("service-worker-allowed"),
            HeaderValue::from_static("/"),
        );
    }
    if path == "index.html" {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        );
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
    Ok(response)
}

/// `GET /`: the page.
pub async fn page(_state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    serve(&req, "index.html")
}

/// The service worker's file in [`DIST`], served at `/sw.js`.
pub const SERVICE_WORKER_FILE: &str = "sw.js";

/// The web app manifest's file in [`DIST`], served at `/app.webmanifest`.
pub const APP_MANIFEST_FILE: &str = "app.webmanifest";

/// `GET /sw.js`: the page's service worker (`text/javascript`, with
/// `Service-Worker-Allowed: /`), at the root so that it serves the whole
/// origin.
pub async fn service_worker(_state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    serve(&req, SERVICE_WORKER_FILE)
}

/// `GET /app.webmanifest`: the web app manifest
/// (`application/manifest+json`): name, icons, colours, `display:
/// standalone`, `start_url` and `scope` `/`.
pub async fn app_manifest(_state: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    serve(&req, APP_MANIFEST_FILE)
}

/// `GET /assets/{name}`: a script, style sheet or image of the page.
/// Names are plain file names (no `/`, no `..`): anything else is `404`.
pub async fn asset(
    _state: Arc<AppState>,
    name: String,
    req: Request,
) -> Result<Response, ApiError> {
    asset_name(&name)?;
    serve(&req, &format!("assets/{name}"))
}

/// Refuses an asset name that is not a plain file name (empty, with a
/// `/` or a backslash, or starting with `.`): `404 not_found`, whatever the method.
pub(crate) fn asset_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
        return Err(ApiError::not_found(format!("no asset {name}")));
    }
    Ok(())
}

/// The SHA-256 (hex) over the page's sources, as `web/build.mjs` computes
/// it into `manifest.json`: for each file under `web/page/` and
/// `web/client/src/`, plus `web/client/package-lock.json` and
/// `web/build.mjs`, sorted by their path relative to `web/` (byte order),
/// the text `<path>\n<length>\n` and then the bytes. Read from the source
/// tree at `web_dir` (tests compare it with the embedded manifest).
pub fn sources_sha256(web_dir: &std::path::Path) -> std::io::Result<String> {
    fn walk(root: &std::path::Path, rel: &str, out: &mut Vec<String>) -> std::io::Result<()> {
        for item in std::fs::read_dir(root.join(rel))? {
            let item = item?;
            let name = item.file_name().to_string_lossy().into_owned();
            let path = format!("{rel}/{name}");
            if item.file_type()?.is_dir() {
                walk(root, &path, out)?;
            } else {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(web_dir, "page", &mut files)?;
    walk(web_dir, "client/src", &mut files)?;
    files.push("client/package-lock.json".to_owned());
    files.push("build.mjs".to_owned());
    files.sort();
    let mut hash = <sha2::Sha256 as sha2::Digest>::new();
    for file in &files {
        let bytes = std::fs::read(web_dir.join(file))?;
        sha2::Digest::update(&mut hash, format!("{file}\n{}\n", bytes.len()).as_bytes());
        sha2::Digest::update(&mut hash, &bytes);
    }
    Ok(hex::encode(sha2::Digest::finalize(hash)))
}
