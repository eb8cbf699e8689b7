//! The operator's console: `GET /console`, a page (HTML, CSS and plain JavaScript built into
//! the binary, nothing fetched from elsewhere) that shows `GET /v1/admin/overview` every two
//! seconds and approves or denies the runs waiting for network (`POST /v1/approvals/{id}`).
//!
//! The page itself holds no data and needs no key. The operator types an admin key into it;
//! the page keeps it in the tab's `sessionStorage` and sends it as `Authorization: Bearer`,
//! so no cookie authenticates anything and a cross-site request cannot act for the operator.
//! What the page shows (key ids, languages, destinations) is text a client chose: the script
//! writes it with `textContent` only, and the content security policy allows no inline script
//! or style and nothing from another origin, so that text can never become markup or code.

use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::state::AppState;

const INDEX: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const STYLE: &str = include_str!("style.css");

/// Scripts and styles from this origin only (no inline ones), requests to this origin only,
/// no framing, no forms, no `<base>`.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                       img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; \
                       base-uri 'none'; form-action 'none'";

/// `/console` and its two assets: path, content type, body. The router is built from this
/// table, and the generated reference (`runcell __reference names`) lists it.
const ASSETS: [(&str, &str, &str); 3] = [
    ("/console", "text/html; charset=utf-8", INDEX),
    ("/console/app.js", "text/javascript; charset=utf-8", APP_JS),
    ("/console/style.css", "text/css; charset=utf-8", STYLE),
];

/// The console's routes (each a `GET`).
pub fn routes() -> Vec<&'static str> {
    ASSETS.iter().map(|(path, _, _)| *path).collect()
}

/// `/console` and its two assets.
pub(crate) fn router() -> Router<AppState> {
    ASSETS
        .into_iter()
        .fold(Router::new(), |r, (path, content_type, body)| {
            r.route(path, get(move || async move { asset(content_type, body) }))
        })
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            (CONTENT_SECURITY_POLICY, CSP),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (REFERRER_POLICY, "no-referrer"),
            (CACHE_CONTROL, "no-store"),
            (X_FRAME_OPTIONS, "DENY"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page loads its script and style from files (the policy refuses inline ones), and
    /// the script never turns text into markup.
    #[test]
    fn nothing_inline_and_no_markup_from_text() {
        assert!(INDEX.contains(r#"<script src="/console/app.js" defer></script>"#));
        assert!(INDEX.contains(r#"<link rel="stylesheet" href="/console/style.css">"#));
        assert_eq!(INDEX.matches("<script").count(), 1);
        assert!(!INDEX.contains("<style") && !INDEX.contains("style="));
        for handler in ["onclick", "onload", "onerror", "onsubmit", "javascript:"] {
            assert!(!INDEX.contains(handler), "index.html has {handler}");
        }
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!APP_JS.contains(sink), "app.js uses {sink}");
        }
        let js = APP_JS.replace("http://www.w3.org/2000/svg", "");
        assert!(!js.contains("http://") && !js.contains("https://"));
        assert!(!STYLE.contains("url(") && !STYLE.contains("@import"));
    }
}
