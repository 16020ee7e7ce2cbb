//! Path and query extractors whose rejections use the admin error shape with a code
//! (ADM0002), never axum's plain text. Named as axum's, so the OpenAPI generator still reads
//! the parameters they take.

use axum::extract::{FromRequestParts, rejection::PathRejection, rejection::QueryRejection};
use http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::AdminError;
use sluice_core::errors::Code;

/// Use instead of `axum::extract::Path` in admin handlers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(path_rejected(&rejection)),
        }
    }
}

fn path_rejected(rejection: &PathRejection) -> AdminError {
    AdminError::with_status(
        rejection.status(),
        Code::ADM0002,
        format!(
            "the request's path cannot be used: {}",
            rejection.body_text()
        ),
    )
}

/// Use instead of `axum::extract::Query` in admin handlers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(query_rejected(&rejection)),
        }
    }
}

fn query_rejected(rejection: &QueryRejection) -> AdminError {
    AdminError::coded(
        Code::ADM0002,
        format!("the query string cannot be used: {}", rejection.body_text()),
    )
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::{Body, to_bytes};
    use axum::routing::get;
    use http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;

    #[derive(serde::Deserialize)]
    struct Force {
        force: Option<bool>,
    }

    async fn echo(Path(n): Path<u32>, Query(q): Query<Force>) -> String {
        format!("{n} {:?}", q.force)
    }

    async fn send(uri: &str) -> (StatusCode, String) {
        let app = Router::new().route("/n/{n}", get(echo));
        let resp = app
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let body = to_bytes(resp.into_body(), 1 << 16).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn bad_paths_and_queries_are_coded_json() {
        assert_eq!(
            send("/n/7?force=true").await,
            (StatusCode::OK, "7 Some(true)".into())
        );
        let (status, body) = send("/n/7?force=maybe").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["restate_code"], "ADM0002", "{body}");
        assert!(
            body["message"].as_str().unwrap().contains("force"),
            "{body}"
        );
        let (status, body) = send("/n/seven").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["restate_code"], "ADM0002", "{body}");
    }
}
