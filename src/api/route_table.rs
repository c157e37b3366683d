//! The route table: every path the server answers, the methods it takes
//! there and the handler of each. The one list from which the router
//! ([`crate::api::routes`], with warp's method filters), the `Allow` header
//! of a `405` ([`Resource::allow`]) and the
//! `route` label of the request metrics ([`template_of`]) are derived, and
//! against which `tests/http/openapi.rs` checks the OpenAPI document.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use warp::reply::Response;

use crate::api::{
    events, health, jobs, log, media, messages, moments, openapi, phrases, recall, session, turns,
    web, ApiError, AppState, Request,
};

/// What a handler answers: a response, or an error the router turns into
/// problem+json.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Response, ApiError>> + Send>>;

/// One (method, path) handler: the state, the path's `{id}` segment as
/// sent (still percent-encoded; empty for a path without one) and the
/// request.
pub type Handler = fn(Arc<AppState>, String, Request) -> HandlerFuture;

/// A check of a path's `{id}` segment that answers before the method is
/// looked at: a malformed id is refused with its own problem whatever the
/// method (`400 invalid_id` on `/api/moments/{id}`, say), as its handlers
/// refuse it.
pub type PathCheck = fn(&str) -> Result<(), ApiError>;

/// Who may call a path (SPEC section 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A bearer token or a session cookie when tokens are configured; the
    /// repeated-header, cross-site, replica and `min_seq` checks and the
    /// request timeout apply (`crate::api::guarded`).
    Token,
    /// Answers without a token (liveness, readiness, the page and its
    /// assets, SPEC sections 9 and 12), with none of those checks.
    Public,
}

/// One path of the table and what it takes.
pub struct Resource {
    /// The path template in the spelling of the document's `paths` (a
    /// path parameter is `{id}`; a path has at most one).
    pub template: &'static str,
    /// Who may call it.
    pub access: Access,
    /// Checked before a method the path does not take is answered `405`.
    pub path_check: Option<PathCheck>,
    /// Each method the path takes (upper case, as on the wire) and its
    /// handler. Any other method is `405` with these in `Allow`.
    pub methods: &'static [(&'static str, Handler)],
}

/// Every path the router serves, with its methods and handlers. A route
/// added here is served, is named in a `405`'s `Allow` and gets its metrics
/// label; it goes in `src/api/openapi.json` too, which
/// `tests/http/openapi.rs` holds equal to [`routes`].
pub const RESOURCES: &[Resource] = &[
    Resource {
        template: "/api/moments",
        access: Access::Token,
        path_check: None,
        methods: &[
            ("GET", |s, _, r| {
                Box::pin(async move { moments::list(&s, &r) })
            }),
            ("POST", |s, _, mut r| {
                Box::pin(async move { moments::create(&s, &mut r).await })
            }),
        ],
    },
    Resource {
        template: "/api/moments/{id}",
        access: Access::Token,
        path_check: Some(|id| moments::path_id(id).map(drop)),
        methods: &[
            ("GET", |s, id, _| {
                Box::pin(async move { moments::get(&s, moments::path_id(&id)?) })
            }),
            ("PATCH", |s, id, mut r| {
                Box::pin(async move { moments::edit(&s, moments::path_id(&id)?, &mut r).await })
            }),
            ("DELETE", |s, id, mut r| {
                Box::pin(async move { moments::delete(&s, moments::path_id(&id)?, &mut r).await })
            }),
        ],
    },
    Resource {
        template: "/api/media/{id}",
        access: Access::Token,
        path_check: Some(|id| media::path_id(id).map(drop)),
        methods: &[
            ("PUT", |s, id, r| {
                Box::pin(async move { media::put(&s, media::path_id(&id)?, r).await })
            }),
            ("GET", |s, id, r| {
                Box::pin(async move { media::get(&s, media::path_id(&id)?, &r).await })
            }),
            ("HEAD", |s, id, r| {
                Box::pin(async move { media::get(&s, media::path_id(&id)?, &r).await })
            }),
        ],
    },
    Resource {
        template: "/api/moments/{id}/turns",
        access: Access::Token,
        path_check: None,
        methods: &[("POST", |s, id, r| Box::pin(turns::start(s, id, r)))],
    },
    Resource {
        template: "/api/turns/{id}",
        access: Access::Token,
        path_check: None,
        methods: &[("GET", |s, id, r| Box::pin(turns::get(s, id, r)))],
    },
    Resource {
        template: "/api/phrases",
        access: Access::Token,
        path_check: None,
        methods: &[
            ("GET", |s, _, r| {
                Box::pin(async move { phrases::list(&s, &r) })
            }),
            ("POST", |s, _, mut r| {
                Box::pin(async move { phrases::keep(&s, &mut r).await })
            }),
        ],
    },
    Resource {
        template: "/api/phrases/{id}",
        access: Access::Token,
        path_check: None,
        methods: &[("DELETE", |s, id, r| Box::pin(phrases::forget(s, id, r)))],
    },
    Resource {
        template: "/api/recall",
        access: Access::Token,
        path_check: None,
        methods: &[("POST", |s, _, r| Box::pin(recall::start(s, r)))],
    },
    Resource {
        template: "/api/jobs",
        access: Access::Token,
        path_check: None,
        methods: &[("POST", |s, _, r| Box::pin(jobs::start(s, r)))],
    },
    Resource {
        template: "/api/messages",
        access: Access::Token,
        path_check: None,
        methods: &[
            ("GET", |s, _, r| {
                Box::pin(async move { messages::list(&s, &r) })
            }),
            ("POST", |s, _, mut r| {
                Box::pin(async move { messages::post(&s, &mut r).await })
            }),
        ],
    },
    Resource {
        template: "/api/events",
        access: Access::Token,
        path_check: None,
        methods: &[("GET", |s, _, r| Box::pin(events::stream(s, r)))],
    },
    Resource {
        template: "/api/log/head",
        access: Access::Token,
        path_check: None,
        methods: &[("GET", |s, _, r| Box::pin(log::head(s, r)))],
    },
    Resource {
        template: "/api/openapi.json",
        access: Access::Token,
        path_check: None,
        methods: &[("GET", |s, _, r| Box::pin(openapi::get(s, r)))],
    },
    Resource {
        template: "/metrics",
        access: Access::Token,
        path_check: None,
        methods: &[("GET", |s, _, r| Box::pin(health::metrics(s, r)))],
    },
    Resource {
        template: "/healthz",
        access: Access::Public,
        path_check: None,
        methods: &[
            ("GET", |s, _, r| Box::pin(health::healthz(s, r))),
            ("HEAD", |s, _, r| Box::pin(health::healthz(s, r))),
        ],
    },
    Resource {
        template: "/readyz",
        access: Access::Public,
        path_check: None,
        methods: &[
            ("GET", |s, _, r| Box::pin(health::readyz(s, r))),
            ("HEAD", |s, _, r| Box::pin(health::readyz(s, r))),
        ],
    },
    Resource {
        template: "/api/session",
        access: Access::Token,
        path_check: None,
        methods: &[
            ("POST", |s, _, r| Box::pin(session::start(s, r))),
            ("DELETE", |s, _, r| Box::pin(session::end(s, r))),
        ],
    },
    Resource {
        template: "/",
        access: Access::Public,
        path_check: None,
        methods: &[("GET", |s, _, r| Box::pin(web::page(s, r)))],
    },
    Resource {
        template: "/assets/{id}",
        access: Access::Public,
        path_check: Some(web::asset_name),
        methods: &[("GET", |s, name, r| Box::pin(web::asset(s, name, r)))],
    },
    Resource {
        template: "/sw.js",
        access: Access::Public,
        path_check: None,
        methods: &[("GET", |s, _, r| Box::pin(web::service_worker(s, r)))],
    },
    Resource {
        template: "/app.webmanifest",
        access: Access::Public,
        path_check: None,
        methods: &[("GET", |s, _, r| Box::pin(web::app_manifest(s, r)))],
    },
];

/// Every (method, path template) the router serves, in the order of
/// [`RESOURCES`].
pub fn routes() -> impl Iterator<Item = (&'static str, &'static str)> {
    RESOURCES.iter().flat_map(|resource| {
        resource
            .methods
            .iter()
            .map(|(method, _)| (*method, resource.template))
    })
}

impl Resource {
    /// The methods this path takes, as an `Allow` header's value
    /// (`GET, PATCH, DELETE`), in the table's order.
    pub fn allow(&self) -> String {
        let methods: Vec<&str> = self.methods.iter().map(|(method, _)| *method).collect();
        methods.join(", ")
    }
}

/// The template in [`RESOURCES`] of a request path, for the request metrics'
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
            let is_id =
                part.len() == spark_core::ids::ULID_LEN && spark_core::ids::Id::parse(part).is_ok();
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
    RESOURCES
        .iter()
        .map(|resource| resource.template)
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
        assert_eq!(template_of("/sw.js"), "/sw.js");
        assert_eq!(template_of("/app.webmanifest"), "/app.webmanifest");
        assert_eq!(template_of("/nope/x"), "other");
    }

    #[test]
    fn each_path_once_each_method_once() {
        let mut templates: Vec<&str> = RESOURCES.iter().map(|r| r.template).collect();
        templates.sort_unstable();
        templates.dedup();
        assert_eq!(templates.len(), RESOURCES.len(), "a path listed twice");
        for resource in RESOURCES {
            let mut methods: Vec<&str> = resource.methods.iter().map(|(m, _)| *m).collect();
            assert!(!methods.is_empty(), "{} takes no method", resource.template);
            methods.sort_unstable();
            methods.dedup();
            assert_eq!(
                methods.len(),
                resource.methods.len(),
                "{}: a method listed twice",
                resource.template
            );
            assert!(
                resource.template.matches("{id}").count() <= 1,
                "{}: one path parameter at most",
                resource.template
            );
        }
    }
}
