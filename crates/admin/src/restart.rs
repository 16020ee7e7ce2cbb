//! `PATCH /invocations/{id}/restart-as-new`: a completed invocation started again as a new
//! one, from the start or from a journal prefix.

use std::sync::Arc;

use super::extract::{Path, Query};
use axum::extract::State;
use http::StatusCode;

use super::AdminState;
use super::error::AdminError;
use super::invocations::parse_id;
use super::invocations::read;
use super::json::Json;
pub use sluice_api::invocations::{RestartAsNewParams, RestartAsNewResponse};
use sluice_core::errors::Code;
use sluice_store::invocation::store;
use sluice_store::invocation::{InvocationRecord, Status};

/// A new invocation of a completed one's target, with the same input, scope, limit key and
/// priority, and a new id: from the start (only the input kept), or from journal entry `from`
/// (the entries up to it kept, with the completions of their commands).
#[utoipa::path(patch, path = "/invocations/{invocation_id}/restart-as-new", tag = "invocation", operation_id = "restart_as_new_invocation",
    params(("invocation_id" = String, Path), RestartAsNewParams),
    responses((status = 200, body = RestartAsNewResponse, description = "The new invocation is stored."),
        (status = 400, description = "Not an invocation id, or `deployment` without `from`."),
        (status = 404, description = "No such invocation."),
        (status = 410, description = "Its journal (and so its input) was purged."),
        (status = 409, description = "It is still running, or a command up to `from` was never completed."),
        (status = 422, description = "A workflow run."),
        (status = 425, description = "It has not started yet.")))]
pub async fn restart_as_new(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    Query(params): Query<RestartAsNewParams>,
) -> Result<Json<RestartAsNewResponse>, AdminError> {
    use sluice_runtime::discovery::ServiceType;
    let id = parse_id(&id)?;
    if params.deployment.is_some() && params.from.unwrap_or(0) == 0 {
        return Err(AdminError::coded(
            Code::ADM0002,
            "'deployment' applies only with 'from' above 0: a restart from the start runs on the latest deployment",
        ));
    }
    let record = read(&state, move |db| store::load_record(db, id))
        .await?
        .ok_or_else(|| {
            AdminError::coded(
                Code::ADM0003,
                format!("The requested invocation '{id}' does not exist"),
            )
        })?;
    if record.status != Status::Completed {
        let (status, why) = if matches!(record.status, Status::Pending | Status::Scheduled) {
            (StatusCode::TOO_EARLY, "has not started yet")
        } else {
            (StatusCode::CONFLICT, "is still running")
        };
        return Err(AdminError::with_status(
            status,
            Code::ADM0004,
            format!("invocation {id} {why}: only a completed invocation can be restarted as new"),
        ));
    }
    let target = &record.target;
    let kind = state
        .registry
        .handler_kind(record.deployment, &target.service, &target.handler);
    if kind.is_some_and(|(ty, _)| ty == ServiceType::Workflow) {
        return Err(AdminError::coded(
            Code::ADM0009,
            format!("invocation {id} is a workflow run: a workflow cannot be restarted as new"),
        ));
    }
    let from = params.from.unwrap_or(0);
    if from > 0 {
        return restart_from(&state, record, from, params.deployment.as_deref()).await;
    }
    let input = read(&state, move |db| store::load_entry(db, id, 0))
        .await?
        .ok_or_else(|| purged(id))?;
    let new = renewed(&record);
    let new_id = new.id;
    state.runtime.submit(new, input).await?;
    Ok(Json(RestartAsNewResponse {
        new_invocation_id: new_id.to_string(),
    }))
}

/// Restart-as-new from journal entry `from` (above 0), on the `deployment` asked for.
async fn restart_from(
    state: &AdminState,
    old: InvocationRecord,
    from: u32,
    deployment: Option<&str>,
) -> Result<Json<RestartAsNewResponse>, AdminError> {
    use sluice_protocol::ProtocolVersion;
    let id = old.id;
    let version = old
        .protocol
        .and_then(ProtocolVersion::from_number)
        .ok_or_else(|| {
            AdminError::coded(
                Code::ADM0004,
                format!("invocation {id} never ran on a deployment: restart it from the start"),
            )
        })?;
    let pinned = match deployment.map(str::to_ascii_lowercase).as_deref() {
        None | Some("latest") => None,
        Some("keep") => old.deployment,
        Some(other) => {
            let wanted: sluice_core::ids::DeploymentId = other.parse().map_err(|e| {
                AdminError::coded(
                    Code::ADM0002,
                    format!("'deployment' is 'latest', 'keep' or a deployment id: {e}"),
                )
            })?;
            let found = state.registry.deployment(wanted).map_err(|_| {
                AdminError::coded(Code::ADM0002, format!("deployment {wanted} does not exist"))
            })?;
            let number = version.number();
            if number < found.min_protocol_version || number > found.max_protocol_version {
                return Err(AdminError::coded(
                    Code::ADM0002,
                    format!(
                        "deployment {wanted} speaks protocol V{}-V{}, not V{number} which the journal was written in",
                        found.min_protocol_version, found.max_protocol_version
                    ),
                ));
            }
            Some(wanted)
        }
    };
    let journal = read(state, move |db| store::load_journal(db, id)).await?;
    if journal.is_empty() {
        return Err(purged(id));
    }
    let prefix = sluice_runtime::partition::model::restart::journal_prefix(&journal, from, version)
        .map_err(|why| AdminError::coded(Code::ADM0004, why))?;
    let mut new = renewed(&old);
    // The journal is in `version`'s encoding: the new invocation keeps it.
    new.protocol = old.protocol;
    new.deployment = pinned;
    let new_id = new.id;
    state.runtime.restart(new, prefix).await?;
    Ok(Json(RestartAsNewResponse {
        new_invocation_id: new_id.to_string(),
    }))
}

/// A new invocation of `old`'s target with a fresh id, and its scope, limit key and priority.
fn renewed(old: &InvocationRecord) -> InvocationRecord {
    use sluice_store::invocation::new::{Identity, NewInvocation};
    NewInvocation::new(old.target.clone(), Identity::Fresh)
        .in_scope(old.scope.clone(), old.limit_key.clone())
        .with_priority(old.priority)
        .into_record(sluice_core::clock::now_ms())
}

/// 410: the journal, and the input in it, is gone.
fn purged(id: sluice_core::ids::InvocationId) -> AdminError {
    AdminError::coded(
        Code::ADM0008,
        format!(
            "the journal of invocation {id} was purged, and its input with it: raise the handler's journal retention to keep it"
        ),
    )
}
