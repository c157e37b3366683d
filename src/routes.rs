//! The route table: every (method, path template) the server answers. The
//! one list from which the `Allow` header of a `405`
//! ([`crate::api::ApiError::method_not_allowed_on`]) and the `route` label
//! of the request metrics ([`template_of`]) are derived, and against which
//! `tests/http/openapi.rs` checks the router and the OpenAPI document.

/// Every (method, path template) the router serves, in the spelling of the
/// document's `paths` (path parameters as `{id}`). A route added to
/// [`crate::api::routes`] or a method added to a handler goes here and in
/// `src/api/openapi.json`; `tests/http/openapi.rs` fails while the three
/// disagree.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/api/moments"),
    ("POST", "/api/moments"),
    ("GET", "/api/moments/{id}"),
    ("PATCH", "/api/moments/{id}"),
    ("DELETE", "/api/moments/{id}"),
    ("PUT", "/api/media/{id}"),
    ("GET", "/api/media/{id}"),
    ("HEAD", "/api/media/{id}"),
    ("POST", "/api/moments/{id}/turns"),
    ("GET", "/api/turns/{id}"),
    ("GET", "/api/phrases"),
    ("POST", "/api/phrases"),
    ("DELETE", "/api/phrases/{id}"),
    ("POST", "/api/recall"),
    ("POST", "/api/jobs"),
    ("GET", "/api/messages"),
    ("POST", "/api/messages"),
    ("GET", "/api/events"),
    ("GET", "/api/log/head"),
    ("GET", "/api/openapi.json"),
    ("GET", "/metrics"),
    ("GET", "/healthz"),
    ("HEAD", "/healthz"),
    ("GET", "/readyz"),
    ("HEAD", "/readyz"),
    ("POST", "/api/session"),
    ("DELETE", "/api/session"),
    ("GET", "/"),
    ("GET", "/assets/{id}"),
];

/// The template in [`ROUTES`] of a request path, for the request metrics'
/// `route` label: ULIDs and mark ids become `{id}`, so the label set stays
/// small. Unknown paths are `other`.
pub fn template_of(path: &str) -> &'static str {
    // The page and its assets (names are not ids).
    if path == "/" {
        return "/";
    }
    if path.starts_with("/assets/") {
        return "/assets/{id}";
    }
    // Compared part by part, without building the template: this runs for
    // every request.
    let fits = |template: &str| {
        let mut parts = path.split('/');
        let mut previous = "";
        for want in template.split('/') {
            let Some(part) = parts.next() else {
                return false;
            };
            let is_id = part.len() == crate::ids::ULID_LEN && crate::ids::Id::parse(part).is_ok();
            let is_mark = previous == "phrases" && !part.is_empty();
            let matched = if want == "{id}" {
                is_id || is_mark
            } else {
                part == want && !is_id && !is_mark
            };
            if !matched {
                return false;
            }
            previous = part;
        }
        parts.next().is_none()
    };
    // A path's methods stand together in ROUTES: each template is tried
    // once, not once per method (this runs for every request).
    let mut previous = "";
    ROUTES
        .iter()
        .map(|(_, template)| *template)
        .filter(|template| std::mem::replace(&mut previous, template) != *template)
        .find(|template| fits(template))
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_fold_ids() {
        assert_eq!(
            template_of("/api/moments/01M34QZRVNRE3CTR9Y63CF2TPZ/turns"),
            "/api/moments/{id}/turns"
        );
        assert_eq!(
            template_of("/api/phrases/keep:bitte%20nicht"),
            "/api/phrases/{id}"
        );
        assert_eq!(template_of("/api/moments"), "/api/moments");
        assert_eq!(template_of("/"), "/");
        assert_eq!(template_of("/assets/app.js"), "/assets/{id}");
        assert_eq!(template_of("/nope/x"), "other");
    }

    #[test]
    fn the_methods_of_a_path_stand_together() {
        // template_of tries each template once, relying on this.
        let mut seen: Vec<&str> = Vec::new();
        for (_, path) in ROUTES {
            if seen.last() != Some(path) {
                assert!(!seen.contains(path), "{path} apart from its other methods");
                seen.push(path);
            }
        }
    }
}
