//! `GET /health`: the admin listener is up.

use http::StatusCode;

/// Answers 200 with an empty body while the process serves.
#[utoipa::path(get, path = "/health", tag = "health", operation_id = "health",
    responses((status = 200, description = "The admin API is up.")))]
pub async fn health() -> StatusCode {
    StatusCode::OK
}
