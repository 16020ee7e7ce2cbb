//! The dashboard at `/ui`: three static files compiled into the binary. The page holds no data
//! of its own: it reads the admin API with the token it is given (kept in the tab's session
//! storage), so the files are served without one and everything they show still needs it.

use axum::Router;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use http::{HeaderValue, header};

/// Each file's path, body and content type.
const FILES: [(&str, &str, &str); 3] = [
    (
        "/ui/",
        include_str!("ui/index.html"),
        "text/html; charset=utf-8",
    ),
    (
        "/ui/app.js",
        include_str!("ui/app.js"),
        "text/javascript; charset=utf-8",
    ),
    (
        "/ui/style.css",
        include_str!("ui/style.css"),
        "text/css; charset=utf-8",
    ),
];

/// Paths under which the dashboard's static files are served without a token.
pub fn is_static(path: &str) -> bool {
    path == "/ui" || FILES.iter().any(|(file, ..)| *file == path)
}

/// The dashboard's routes.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    FILES.iter().fold(
        Router::new().route("/ui", get(|| async { Redirect::permanent("/ui/") })),
        |router, &(path, body, content_type)| {
            router.route(path, get(move || async move { file(body, content_type) }))
        },
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
