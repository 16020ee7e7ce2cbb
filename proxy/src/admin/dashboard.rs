//! The dashboard at `/ui`: three static files compiled into the binary. The page holds no data
//! of its own: it reads the admin API with the token it is given (kept in the tab's session
//! storage), so the files are served without one and everything they show still needs it.

use axum::Router;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use http::{HeaderValue, header};

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/style.css");

/// Paths under which the dashboard's static files are served without a token.
pub fn is_static(path: &str) -> bool {
    matches!(path, "/ui" | "/ui/" | "/ui/app.js" | "/ui/style.css")
}

/// The dashboard's routes.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route(
            "/ui/",
            get(|| async { file(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/ui/app.js",
            get(|| async { file(SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/ui/style.css",
            get(|| async { file(STYLE, "text/css; charset=utf-8") }),
        )
}

fn file(body: &'static str, content_type: &'static str) -> Response {
    let mut resp = body.into_response();
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Only our own files and the admin API: no inline script, nothing from elsewhere.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        ),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}
