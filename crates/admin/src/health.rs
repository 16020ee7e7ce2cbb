//! `GET /health` (liveness: the process can keep its promises) and `GET /ready` (readiness: it
//! has recovered its partitions and accepts work). Both are open without a token, for probes.
//! `GET /cluster-health` answers the reference server's shape, with this node's view of the
//! cluster in cluster mode.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use super::AdminState;
use super::error::AdminError;
use sluice_core::errors::Code;

/// 200 with an empty body while the process serves; 503 with the failure once a store write
/// failed or a partition stopped (the process is then shutting down, to be restarted).
#[utoipa::path(get, path = "/health", tag = "health", operation_id = "health",
    responses(
        (status = 200, description = "The admin API is up and the store is writable."),
        (status = 503, description = "A store write failed or a partition stopped (STO0001); the process is shutting down. In cluster mode also: this node stopped following a partition (CLU0003, CLU0004).")))]
pub async fn health(State(state): State<Arc<AdminState>>) -> Response {
    if let Some(failure) = state.store.health().failure() {
        return unhealthy(failure);
    }
    match broken_partitions(&state) {
        Some(broken) => unhealthy(&broken),
        None => StatusCode::OK.into_response(),
    }
}

/// In cluster mode, why this node stopped following a partition (a gap in its log, a damaged
/// record): it keeps serving the others, but cannot be trusted with that one, and says so.
fn broken_partitions(state: &AdminState) -> Option<sluice_core::errors::CodedError> {
    let (why, count) = state.cluster.get()?.broken()?;
    let mut failure = why;
    failure.message = format!(
        "{} ({count} partition(s) not followed by this node; GET /cluster-health lists them)",
        failure.message
    );
    Some(failure)
}

/// 200 once every partition has recovered and while the store is writable; 503 before (still
/// recovering) and after a failure.
#[utoipa::path(get, path = "/ready", tag = "health", operation_id = "ready",
    responses(
        (status = 200, description = "Every partition recovered; new work is accepted."),
        (status = 503, description = "Still recovering, or failed (STO0001).")))]
pub async fn ready(State(state): State<Arc<AdminState>>) -> Response {
    let health = state.store.health();
    if let Some(broken) = broken_partitions(&state) {
        return unhealthy(&broken);
    }
    match health.failure() {
        Some(failure) => unhealthy(failure),
        None if health.is_ready() => StatusCode::OK.into_response(),
        None => AdminError::coded(
            Code::ADM0010,
            "partitions are still recovering from the store",
        )
        .into_response(),
    }
}

/// The cluster's name and its metadata members: a single node is the whole cluster.
#[utoipa::path(get, path = "/cluster-health", tag = "cluster_health", operation_id = "cluster_health",
    responses(
        (status = 200, description = "Cluster health information.", body = sluice_api::version::ClusterHealthResponse),
        (status = 503, description = "A store write failed or a partition stopped (STO0001).")))]
pub async fn cluster_health(State(state): State<Arc<AdminState>>) -> Response {
    use sluice_api::version::{ClusterHealthResponse, MetadataClusterHealth};
    if let Some(failure) = state.store.health().failure() {
        return unhealthy(failure);
    }
    super::json::Json(ClusterHealthResponse {
        cluster_name: state.config.cluster_name.clone(),
        metadata_cluster_health: Some(MetadataClusterHealth { members: vec![1] }),
        sluice_cluster: state.cluster.get().map(|cluster| cluster.view()),
    })
    .into_response()
}

fn unhealthy(failure: &sluice_core::errors::CodedError) -> Response {
    AdminError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        error: failure.clone(),
    }
    .into_response()
}
