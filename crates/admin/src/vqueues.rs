//! `/vqueues`: the schedulers' queues, and pausing or resuming one. A pause is stored before
//! it is answered, applies at once (nothing more of the queue starts; running attempts go on)
//! and outlives a restart; the queue keeps its entries.

use std::sync::Arc;

use super::extract::Path;
use axum::extract::State;
use http::StatusCode;

use super::AdminState;
use super::error::AdminError;
use super::extract::Query;
use super::json::Json;
use super::view_params::ViewParams;
pub use sluice_api::vqueues::{ListVQueuesResponse, VQueueResponse};
use sluice_core::errors::Code;

/// Parses a virtual queue id (`vq_1…`, or the older `vq_{partition}_{queue}`).
fn parse_vqueue_id(text: &str) -> Result<(u64, u32), AdminError> {
    let id: sluice_core::ids::VQueueId = text.parse().map_err(|e| {
        let text: String = text.chars().take(64).collect();
        AdminError::coded(
            Code::ADM0002,
            format!(
                "'{text}' is not a virtual queue id ({e}); see GET /vqueues or `sluice queues list`"
            ),
        )
    })?;
    Ok((id.partition, id.queue))
}

async fn pause_or_resume(
    state: &AdminState,
    vqueue_id: &str,
    pause: bool,
) -> Result<StatusCode, AdminError> {
    let (partition, queue) = parse_vqueue_id(vqueue_id)?;
    if state.runtime.pause_queue(partition, queue, pause).await? {
        Ok(StatusCode::ACCEPTED)
    } else {
        Err(AdminError::coded(
            Code::ADM0003,
            format!("no virtual queue '{vqueue_id}' (an empty queue goes away unless paused)"),
        ))
    }
}

/// Pauses a virtual queue: it keeps its entries and starts none until resumed.
#[utoipa::path(post, path = "/vqueues/{vqueue_id}/pause", tag = "vqueue", operation_id = "pause_vqueue",
    params(("vqueue_id" = String, Path, description = "The virtual queue ID.")),
    responses((status = 202, description = "Paused (stored)."), (status = 400, description = "Not a virtual queue id."),
        (status = 404, description = "No such queue.")))]
pub async fn pause(
    State(state): State<Arc<AdminState>>,
    Path(vqueue_id): Path<String>,
) -> Result<StatusCode, AdminError> {
    pause_or_resume(&state, &vqueue_id, true).await
}

/// Resumes a paused virtual queue.
#[utoipa::path(post, path = "/vqueues/{vqueue_id}/resume", tag = "vqueue", operation_id = "resume_vqueue",
    params(("vqueue_id" = String, Path, description = "The virtual queue ID.")),
    responses((status = 202, description = "Resumed (stored)."), (status = 400, description = "Not a virtual queue id."),
        (status = 404, description = "No such queue.")))]
pub async fn resume(
    State(state): State<Arc<AdminState>>,
    Path(vqueue_id): Path<String>,
) -> Result<StatusCode, AdminError> {
    pause_or_resume(&state, &vqueue_id, false).await
}

/// The live queues of every partition holding the most (waiting, then scheduled): the busiest
/// `limit` (1,000 by default), of one `scope` if given, by id; `total` says how many matched.
#[utoipa::path(get, path = "/vqueues", tag = "vqueue", operation_id = "list_vqueues",
    params(ViewParams),
    responses((status = 200, body = ListVQueuesResponse)))]
pub async fn list(
    State(state): State<Arc<AdminState>>,
    Query(params): Query<ViewParams>,
) -> Result<Json<ListVQueuesResponse>, AdminError> {
    let (total, queues) = state.runtime.queue_page(params.view()?).await?;
    let vqueues = queues
        .into_iter()
        .map(|(partition, q)| VQueueResponse {
            id: sluice_core::ids::VQueueId {
                partition,
                queue: q.id.index(),
            }
            .to_string(),
            scope: q.key.scope.as_ref().map(|s| s.as_str().to_owned()),
            limit_key: q.key.limit_key.as_ref().map(|k| k.as_str().to_owned()),
            service: q.key.service.to_string(),
            object_key: q.key.object_key.as_deref().map(str::to_owned),
            priority: q.key.priority.get(),
            status: q.status.name().to_owned(),
            blocked_on: q.blocked_on.as_ref().map(|on| on.name().to_owned()),
            queued: q.queued as u64,
            scheduled: u64::from(q.delayed),
        })
        .collect();
    Ok(Json(ListVQueuesResponse { vqueues, total }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vqueue_ids_parse_or_say_what_they_look_like() {
        assert_eq!(parse_vqueue_id("vq_3_17").unwrap(), (3, 17));
        for bad in ["", "vq_", "vq_1", "q_1_2", "vq_-1_2", "vq_1_99999999999"] {
            let e = parse_vqueue_id(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
