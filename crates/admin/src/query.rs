//! `POST /query`: SQL over the system tables. `accept: application/json` answers
//! `{"rows": [...]}`; anything else an Arrow IPC stream.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use datafusion::arrow::ipc::writer::StreamWriter;
use http::{HeaderMap, header};

use super::json::Json;
use super::{AdminError, AdminState};
pub use sluice_api::query::QueryRequest;
use sluice_core::errors::Code;
use sluice_sql::{QueryAnswer, QueryError, rows};

/// The code of each way a query fails.
fn refused(e: &QueryError) -> Response {
    let code = match e {
        QueryError::Sql(_) => Code::SQL0001,
        QueryError::NotAllowed(_) => Code::SEC0006,
        QueryError::Timeout(_) => Code::SQL0002,
        QueryError::TooManyRows(_) => Code::SQL0003,
        QueryError::TooMuchMemory(_) => Code::SQL0004,
    };
    AdminError::coded(code, e.to_string()).into_response()
}

fn arrow_stream(answer: &QueryAnswer) -> Result<Vec<u8>, String> {
    let mut writer =
        StreamWriter::try_new(Vec::new(), &answer.schema).map_err(|e| e.to_string())?;
    for batch in &answer.batches {
        writer.write(batch).map_err(|e| e.to_string())?;
    }
    writer.into_inner().map_err(|e| e.to_string())
}

/// Runs a query over `sys_rules`, `sys_user_limits`, `sys_scheduler` (flow control only),
/// `sys_invocation`, `sys_deployment` and `sys_service`.
#[utoipa::path(post, path = "/query", tag = "introspection", operation_id = "query",
    request_body = QueryRequest,
    responses((status = 200, description = "`{\"rows\": [...]}` (accept: application/json, null columns left out) or an Arrow IPC stream"),
        (status = 400, description = "`{\"message\": ..., \"restate_code\": ...}`: bad SQL or an unknown table or column (SQL0001), a timeout (SQL0002), too many rows (SQL0003), too much memory (SQL0004), a statement that is not one read-only query (SEC0006)")))]
pub async fn query(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Json(request): Json<QueryRequest>,
) -> Response {
    let answer = match state.query.query(&request.query).await {
        Ok(answer) => answer,
        Err(e) => return refused(&e),
    };
    let wants_json = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"));
    if wants_json {
        return axum::Json(serde_json::json!({ "rows": rows(&answer.batches) })).into_response();
    }
    match arrow_stream(&answer) {
        Ok(bytes) => (
            [(header::CONTENT_TYPE, "application/vnd.apache.arrow.stream")],
            bytes,
        )
            .into_response(),
        Err(e) => AdminError::coded(
            Code::SQL0005,
            format!("cannot encode the answer as Arrow IPC: {e}"),
        )
        .into_response(),
    }
}
