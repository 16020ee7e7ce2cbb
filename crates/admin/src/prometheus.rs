//! `GET /metrics`: the Prometheus text exposition (see `crate::scrape`).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::header;

use super::AdminState;
use super::error::AdminError;
use sluice_core::errors::Code;
use sluice_core::metrics as names;

/// Every metric in the Prometheus text format; 404 when `metrics.enabled` is false.
#[utoipa::path(get, path = "/metrics", tag = "metrics", operation_id = "metrics",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4.", content_type = "text/plain"),
        (status = 404, description = "Metrics are off (`metrics.enabled = false`).")))]
pub async fn metrics(State(state): State<Arc<AdminState>>) -> Result<Response, AdminError> {
    let Some(metrics) = &state.metrics else {
        return Err(AdminError::coded(
            Code::ADM0003,
            "metrics are off: set metrics.enabled = true to record and serve them",
        ));
    };
    if let Some(cluster) = state.cluster.get() {
        let view = cluster.view();
        let broken = view
            .partitions
            .iter()
            .filter(|p| p.broken.is_some())
            .count();
        metrics::gauge!(names::CLUSTER_BROKEN).set(broken as f64);
        let leaderless = view
            .partitions
            .iter()
            .filter(|p| p.leader.is_none())
            .count();
        metrics::gauge!(names::CLUSTER_LEADERLESS).set(leaderless as f64);
        metrics::gauge!(names::CLUSTER_POSTS_RETRYING).set(view.posts_retrying as f64);
        for p in &view.partitions {
            metrics::gauge!(names::CLUSTER_LAG, "partition" => p.partition.to_string())
                .set(p.lag as f64);
        }
    }
    let text = metrics
        .render(&state.runtime, &state.kafka, &state.registry)
        .await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}
