//! A JSON body extractor whose rejections use the admin error shape, never axum's plain text.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::AdminError;

/// Use instead of `axum::Json` in every admin handler that takes or returns JSON.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json<T>(pub T);

impl<T, S> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(reject(rejection)),
        }
    }
}

fn reject(rejection: JsonRejection) -> AdminError {
    let message = match &rejection {
        JsonRejection::MissingJsonContentType(_) => {
            "expected a JSON body: send the header 'content-type: application/json'".to_owned()
        }
        JsonRejection::JsonSyntaxError(e) => {
            format!("the body is not valid JSON: {}", e.body_text())
        }
        JsonRejection::JsonDataError(e) => {
            format!(
                "the JSON body does not have the expected shape: {}",
                e.body_text()
            )
        }
        other => other.body_text(),
    };
    AdminError {
        status: rejection.status(),
        error: sluice_core::errors::CodedError::new(sluice_core::errors::Code::ADM0001, message),
    }
}

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::{Body, to_bytes};
    use axum::routing::post;
    use http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;

    #[derive(serde::Deserialize, Serialize)]
    struct Echo {
        name: String,
    }

    async fn echo(Json(body): Json<Echo>) -> Json<Echo> {
        Json(body)
    }

    async fn send(content_type: Option<&str>, body: &str) -> (StatusCode, serde_json::Value) {
        let app = Router::new().route("/echo", post(echo));
        let mut req = Request::post("/echo");
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let resp = app
            .oneshot(req.body(Body::from(body.to_owned())).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        assert_eq!(resp.headers()["content-type"], "application/json");
        let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn good_json_passes() {
        let (status, body) = send(Some("application/json"), r#"{"name":"a"}"#).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["name"], "a");
    }

    #[tokio::test]
    async fn malformed_json_is_a_json_400() {
        let (status, body) = send(Some("application/json"), r#"{"name":"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("the body is not valid JSON")
        );
        assert_eq!(body["restate_code"], "ADM0001");
    }

    #[tokio::test]
    async fn wrong_shape_is_a_json_422() {
        let (status, body) = send(Some("application/json"), r#"{"nom":"a"}"#).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("missing field `name`"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn missing_content_type_is_a_json_415() {
        let (status, body) = send(None, r#"{"name":"a"}"#).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("content-type: application/json")
        );
    }
}
