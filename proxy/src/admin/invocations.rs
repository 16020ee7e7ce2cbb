//! Invocation routes: list, describe, control (cancel, kill, purge, purge-journal, pause,
//! resume) and restart-as-new.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use http::StatusCode;

use super::AdminState;
use super::error::AdminError;
use super::json::Json;
use crate::clock::rfc3339;
use crate::flow::scheduler::BlockedOn;
use crate::ids::InvocationId;
use crate::invocation::store;
use crate::invocation::{InvocationRecord, Outcome, Status};
use crate::partition::admission::Waiting;
use crate::partition::control::{Control, Controlled};
pub use sluice_api::invocations::{
    DeleteParams, InvocationResponse, ListInvocationsResponse, ListParams, RestartAsNewParams,
    RestartAsNewResponse, WaitingResponse,
};

/// How the admin API shows `Waiting`.
pub fn waiting_response(w: Waiting) -> WaitingResponse {
    let (level, limit, rule) = match &w.blocked_on {
        Some(BlockedOn::LimitKeyConcurrency { level, limit, rule }) => (
            Some(level.as_str().to_ascii_lowercase()),
            limit.concurrency(),
            rule.as_ref().map(ToString::to_string),
        ),
        Some(BlockedOn::RateLimit { level, rule, .. }) => (
            Some(level.as_str().to_ascii_lowercase()),
            None,
            rule.as_ref().map(ToString::to_string),
        ),
        _ => (None, None, None),
    };
    let (rate, next_token_at) = match &w.blocked_on {
        Some(BlockedOn::RateLimit {
            rate,
            next_token_ms,
            ..
        }) => (Some(rate.rate.to_string()), Some(time(*next_token_ms))),
        _ => (None, None),
    };
    WaitingResponse {
        status: w.status.name().to_owned(),
        queued: w.queued,
        scope: w.scope.map(|s| s.to_string()),
        limit_key: w.limit_key.map(|k| k.to_string()),
        blocked_on: w.blocked_on.as_ref().map(|on| on.name().to_owned()),
        level,
        limit,
        rule,
        rate,
        next_token_at,
    }
}

fn time(ms: u64) -> String {
    rfc3339(ms).unwrap_or_default()
}

/// How the admin API shows `InvocationRecord`.
pub fn invocation_response(r: &InvocationRecord) -> InvocationResponse {
    let t = &r.target;
    InvocationResponse {
        id: r.id.to_string(),
        target: t.path(),
        service: t.service.clone(),
        handler: t.handler.clone(),
        key: t.key.clone(),
        status: r.status.name().to_owned(),
        deployment_id: r.deployment.map(|d| d.to_string()),
        protocol_version: r.protocol,
        attempts: r.attempts,
        retry_count: r.retry_count,
        last_failure_error_code: r.last_failure.as_ref().and_then(|f| f.code.clone()),
        last_failure: r.last_failure.as_ref().map(|f| f.message.clone()),
        completion: r.outcome.as_ref().map(Outcome::summary),
        created_at: time(r.created_at_ms),
        next_attempt_at: r.run_at_ms.map(time),
        scope: r.scope.as_ref().map(|s| s.as_str().to_owned()),
        limit_key: r.limit_key.as_ref().map(|k| k.as_str().to_owned()),
        waiting: None,
    }
}

/// Invocations, newest first.
#[utoipa::path(get, path = "/invocations", tag = "invocation", operation_id = "list_invocations",
    params(ListParams), responses((status = 200, body = ListInvocationsResponse)))]
pub async fn list(
    State(state): State<Arc<AdminState>>,
    Query(params): Query<ListParams>,
) -> Result<Json<ListInvocationsResponse>, AdminError> {
    let mut records = state.store.with_db(store::load_records)??;
    records.retain(|r| {
        params
            .status
            .as_deref()
            .is_none_or(|s| r.status.name() == s)
            && params
                .service
                .as_deref()
                .is_none_or(|s| r.target.service == s)
            && params
                .scope
                .as_deref()
                .is_none_or(|s| r.scope.as_ref().is_some_and(|scope| scope.as_str() == s))
    });
    records.sort_by_key(|r| std::cmp::Reverse(r.created_at_ms));
    records.truncate(params.limit.unwrap_or(100));
    Ok(Json(ListInvocationsResponse {
        invocations: records.iter().map(invocation_response).collect(),
    }))
}

fn parse_id(id: &str) -> Result<InvocationId, AdminError> {
    id.parse().map_err(|e| {
        AdminError::new(
            StatusCode::BAD_REQUEST,
            format!("The request field 'invocation_id' is invalid. Reason: {e}"),
        )
    })
}

async fn apply(state: &AdminState, id: &str, op: Control) -> Result<StatusCode, AdminError> {
    let id = parse_id(id)?;
    match state.runtime.control(id, op).await? {
        Controlled::Done => Ok(StatusCode::OK),
        Controlled::Accepted => Ok(StatusCode::ACCEPTED),
        Controlled::NotFound => Err(AdminError::new(
            StatusCode::NOT_FOUND,
            format!("The requested invocation '{id}' does not exist"),
        )),
        Controlled::Conflict(why) => Err(AdminError::new(StatusCode::CONFLICT, why)),
    }
}

/// An operation on an invocation other than those routed by name: 404 naming the known ones.
#[utoipa::path(patch, path = "/invocations/{invocation_id}/{operation}", tag = "invocation", operation_id = "control_invocation",
    params(("invocation_id" = String, Path), ("operation" = String, Path, description = "cancel, kill, purge, purge-journal, pause, resume or restart-as-new")),
    responses((status = 404, description = "No such operation.")))]
pub async fn control(Path(path): Path<(String, String)>) -> AdminError {
    let operation = path.1;
    AdminError::new(
        StatusCode::NOT_FOUND,
        format!(
            "unknown operation '{operation}': use cancel, kill, purge, purge-journal, pause, resume or restart-as-new"
        ),
    )
}

/// One control route per operation, so each is listed in `/openapi` under the reference's
/// path and operation id.
macro_rules! control_route {
    ($name:ident, $op:literal, $variant:ident, $operation_id:literal, $doc:literal, $accepted:literal) => {
        #[doc = $doc]
        #[utoipa::path(patch, path = concat!("/invocations/{invocation_id}/", $op), tag = "invocation",
            operation_id = $operation_id, params(("invocation_id" = String, Path)),
            responses((status = 200, description = "Done."), (status = 202, description = $accepted),
                (status = 400, description = "Not an invocation id."),
                (status = 404, description = "No such invocation."), (status = 409, description = "Not possible in its state.")))]
        pub async fn $name(
            State(state): State<Arc<AdminState>>,
            Path(id): Path<String>,
        ) -> Result<StatusCode, AdminError> {
            apply(&state, &id, Control::$variant).await
        }
    };
}

control_route!(
    cancel,
    "cancel",
    Cancel,
    "cancel_invocation",
    "Appends the CANCEL signal: the handler sees a terminal 409 \"canceled\" at its next await.",
    "Cancel signal appended."
);
control_route!(
    kill,
    "kill",
    Kill,
    "kill_invocation",
    "Ends it now with 409 \"killed\", with the children it called.",
    "Never."
);
control_route!(
    purge,
    "purge",
    Purge,
    "purge_invocation",
    "Forgets a completed invocation: its record and journal.",
    "Never."
);
control_route!(
    purge_journal,
    "purge-journal",
    PurgeJournal,
    "purge_journal",
    "Deletes a completed invocation's journal and keeps its record and result.",
    "Never."
);
control_route!(
    pause,
    "pause",
    Pause,
    "pause_invocation",
    "No more attempts until resumed.",
    "A running attempt is being stopped."
);
control_route!(
    resume,
    "resume",
    Resume,
    "resume_invocation",
    "A paused or backing-off invocation is attempted again now.",
    "Never."
);

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
    use crate::discovery::ServiceType;
    use crate::invocation::new::{Identity, NewInvocation};
    let id = parse_id(&id)?;
    if params.deployment.is_some() && params.from.unwrap_or(0) == 0 {
        return Err(AdminError::new(
            StatusCode::BAD_REQUEST,
            "'deployment' applies only with 'from' above 0: a restart from the start runs on the latest deployment",
        ));
    }
    let record = state
        .store
        .with_db(|db| store::load_record(db, id))??
        .ok_or_else(|| {
            AdminError::new(
                StatusCode::NOT_FOUND,
                format!("The requested invocation '{id}' does not exist"),
            )
        })?;
    if record.status != Status::Completed {
        let (status, why) = if matches!(record.status, Status::Pending | Status::Scheduled) {
            (StatusCode::TOO_EARLY, "has not started yet")
        } else {
            (StatusCode::CONFLICT, "is still running")
        };
        return Err(AdminError::new(
            status,
            format!("invocation {id} {why}: only a completed invocation can be restarted as new"),
        ));
    }
    let target = &record.target;
    let kind = state
        .registry
        .handler_kind(record.deployment, &target.service, &target.handler);
    if kind.is_some_and(|(ty, _)| ty == ServiceType::Workflow) {
        return Err(AdminError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("invocation {id} is a workflow run: a workflow cannot be restarted as new"),
        ));
    }
    let from = params.from.unwrap_or(0);
    if from > 0 {
        return restart_from(&state, record, from, params.deployment.as_deref()).await;
    }
    let input = state
        .store
        .with_db(|db| store::load_entry(db, id, 0))??
        .ok_or_else(|| {
            AdminError::new(
                StatusCode::GONE,
                format!(
                    "the journal of invocation {id} was purged, and its input with it: raise the handler's journal retention to keep it"
                ),
            )
        })?;
    let new = NewInvocation::new(record.target.clone(), Identity::Fresh)
        .in_scope(record.scope.clone(), record.limit_key.clone())
        .with_priority(record.priority)
        .into_record(crate::clock::now_ms());
    let new_id = new.id;
    state.runtime.submit(new, input).await?;
    Ok(Json(RestartAsNewResponse {
        new_invocation_id: new_id.to_string(),
    }))
}

/// The older spelling of cancel, kill and purge.
#[utoipa::path(delete, path = "/invocations/{invocation_id}", tag = "invocation", operation_id = "delete_invocation",
    params(("invocation_id" = String, Path), DeleteParams),
    responses((status = 202, description = "Done or under way."), (status = 400, description = "Unknown mode."),
        (status = 404, description = "No such invocation."), (status = 409, description = "Not possible in its state.")))]
pub async fn delete(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    Query(params): Query<DeleteParams>,
) -> Result<StatusCode, AdminError> {
    let mode = params.mode.as_deref().unwrap_or("cancel");
    let op = Control::parse(mode)
        .filter(|op| matches!(op, Control::Cancel | Control::Kill | Control::Purge))
        .ok_or_else(|| {
            AdminError::new(
                StatusCode::BAD_REQUEST,
                format!("unknown mode '{mode}': use cancel, kill or purge"),
            )
        })?;
    apply(&state, &id, op).await.map(|_| StatusCode::ACCEPTED)
}

/// Restart-as-new from journal entry `from` (above 0), on the `deployment` asked for.
async fn restart_from(
    state: &AdminState,
    old: InvocationRecord,
    from: u32,
    deployment: Option<&str>,
) -> Result<Json<RestartAsNewResponse>, AdminError> {
    use crate::invocation::new::{Identity, NewInvocation};
    use crate::protocol::ProtocolVersion;
    let id = old.id;
    let version = old
        .protocol
        .and_then(ProtocolVersion::from_number)
        .ok_or_else(|| {
            AdminError::new(
                StatusCode::CONFLICT,
                format!("invocation {id} never ran on a deployment: restart it from the start"),
            )
        })?;
    let pinned = match deployment.map(str::to_ascii_lowercase).as_deref() {
        None | Some("latest") => None,
        Some("keep") => old.deployment,
        Some(other) => {
            let wanted: crate::ids::DeploymentId = other.parse().map_err(|e| {
                AdminError::new(
                    StatusCode::BAD_REQUEST,
                    format!("'deployment' is 'latest', 'keep' or a deployment id: {e}"),
                )
            })?;
            let found = state.registry.deployment(wanted).map_err(|_| {
                AdminError::new(
                    StatusCode::BAD_REQUEST,
                    format!("deployment {wanted} does not exist"),
                )
            })?;
            let number = version.number();
            if number < found.min_protocol_version || number > found.max_protocol_version {
                return Err(AdminError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "deployment {wanted} speaks protocol V{}-V{}, not V{number} which the journal was written in",
                        found.min_protocol_version, found.max_protocol_version
                    ),
                ));
            }
            Some(wanted)
        }
    };
    let journal = state.store.with_db(|db| store::load_journal(db, id))??;
    if journal.is_empty() {
        return Err(AdminError::new(
            StatusCode::GONE,
            format!(
                "the journal of invocation {id} was purged: raise the handler's journal retention to keep it"
            ),
        ));
    }
    let prefix = crate::partition::restart::journal_prefix(&journal, from, version)
        .map_err(|why| AdminError::new(StatusCode::CONFLICT, why))?;
    let mut new = NewInvocation::new(old.target.clone(), Identity::Fresh)
        .in_scope(old.scope.clone(), old.limit_key.clone())
        .with_priority(old.priority)
        .into_record(crate::clock::now_ms());
    // The journal is in `version`'s encoding: the new invocation keeps it.
    new.protocol = old.protocol;
    new.deployment = pinned;
    let new_id = new.id;
    state.runtime.restart(new, prefix).await?;
    Ok(Json(RestartAsNewResponse {
        new_invocation_id: new_id.to_string(),
    }))
}

/// One invocation.
#[utoipa::path(get, path = "/invocations/{invocation_id}", tag = "invocation", operation_id = "get_invocation",
    params(("invocation_id" = String, Path)),
    responses((status = 200, body = InvocationResponse), (status = 404, description = "No such invocation.")))]
pub async fn get(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
) -> Result<Json<InvocationResponse>, AdminError> {
    let id = parse_id(&id)?;
    let record = state.store.with_db(|db| store::load_record(db, id))??;
    let mut shown = record.as_ref().map(invocation_response).ok_or_else(|| {
        AdminError::new(
            StatusCode::NOT_FOUND,
            format!("The requested invocation '{id}' does not exist"),
        )
    })?;
    if record.is_some_and(|r| r.status != Status::Completed) {
        shown.waiting = state.runtime.explain(id).await?.map(waiting_response);
    }
    Ok(Json(shown))
}
