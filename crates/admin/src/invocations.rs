//! Invocation routes: list, describe, control (cancel, kill, purge, purge-journal, pause,
//! resume). Restart-as-new is in `restart.rs`.

use std::sync::Arc;

use super::extract::{Path, Query};
use axum::extract::State;
use http::StatusCode;

use super::AdminState;
use super::error::AdminError;
use super::json::Json;
pub use sluice_api::invocations::{
    DeleteParams, InvocationResponse, ListInvocationsResponse, ListParams, RestartAsNewParams,
    RestartAsNewResponse, WaitingResponse,
};
use sluice_core::clock::rfc3339;
use sluice_core::errors::Code;
use sluice_core::ids::InvocationId;
use sluice_flow::scheduler::BlockedOn;
use sluice_runtime::partition::admission::Waiting;
use sluice_runtime::partition::model::operator::{Control, Controlled};
use sluice_store::invocation::record::RecordOf;
use sluice_store::invocation::store;
use sluice_store::invocation::{ListedRecord, Status, Summary};

/// How the admin API shows `Waiting`.
pub fn waiting_response(w: Waiting) -> WaitingResponse {
    let (level, limit, rule) = match &w.blocked_on {
        Some(BlockedOn::LimitKeyConcurrency { level, limit, rule }) => (
            Some(level.lower_name().to_owned()),
            limit.concurrency(),
            rule.as_ref().map(ToString::to_string),
        ),
        Some(
            BlockedOn::RateLimit { level, rule, .. }
            | BlockedOn::Quota { level, rule, .. }
            | BlockedOn::Budget { level, rule, .. },
        ) => (
            Some(level.lower_name().to_owned()),
            None,
            rule.as_ref().map(ToString::to_string),
        ),
        Some(BlockedOn::DeploymentConcurrency { limit, .. }) => (None, *limit, None),
        _ => (None, None, None),
    };
    let (deployment, running, closed_until) = match &w.blocked_on {
        Some(BlockedOn::DeploymentConcurrency {
            gate,
            running,
            closed_until_ms,
            ..
        }) => (
            Some(gate.clone()),
            Some(*running),
            closed_until_ms.map(time),
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
    let (quota, quota_resets_at) = match &w.blocked_on {
        Some(BlockedOn::Quota {
            quota,
            resets_at_ms,
            ..
        }) => (Some(quota.to_string()), Some(time(*resets_at_ms))),
        _ => (None, None),
    };
    let (budget, budget_resets_at) = match &w.blocked_on {
        Some(BlockedOn::Budget {
            budget,
            resets_at_ms,
            ..
        }) => (Some(budget.to_string()), Some(time(*resets_at_ms))),
        _ => (None, None),
    };
    let position = w.position;
    let eta_ms = position.and_then(|p| p.eta_ms);
    WaitingResponse {
        position: position.map(|p| p.position),
        drain_per_second: position.and_then(|p| p.drain_per_second),
        eta: eta_ms.map(|ms| time(sluice_core::clock::now_ms().saturating_add(ms))),
        eta_ms,
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
        quota,
        quota_resets_at,
        budget,
        budget_resets_at,
        deployment,
        running,
        closed_until,
    }
}

fn time(ms: u64) -> String {
    rfc3339(ms).unwrap_or_default()
}

/// How the admin API shows an invocation's record (with or without its output).
pub fn invocation_response<O: Summary>(r: &RecordOf<O>) -> InvocationResponse {
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
        completion: r.outcome.as_ref().map(Summary::summary),
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
    let limit = params.limit.unwrap_or(100).min(MAX_LISTED);
    let keep = move |r: &ListedRecord| {
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
    };
    let records = read(&state, move |db| store::load_listed(db, keep, limit)).await?;
    Ok(Json(ListInvocationsResponse {
        invocations: records.iter().map(invocation_response).collect(),
    }))
}

/// The most invocations one list answers (`limit` above it is lowered to it).
const MAX_LISTED: usize = 10_000;

/// Runs `read` on the store in the blocking pool: the admin listener has one thread, and a
/// read of every record there would stall every other request, `/health` included.
pub(super) async fn read<T: Send + 'static>(
    state: &AdminState,
    read: impl FnOnce(&redb::Database) -> Result<T, sluice_core::errors::CodedError> + Send + 'static,
) -> Result<T, AdminError> {
    let store = Arc::clone(&state.store);
    let read = tokio::task::spawn_blocking(move || store.with_db(read))
        .await
        .map_err(|e| AdminError::coded(Code::ADM0007, e.to_string()))?;
    Ok(read??)
}

pub(super) fn parse_id(id: &str) -> Result<InvocationId, AdminError> {
    id.parse().map_err(|e| {
        AdminError::coded(
            Code::ADM0002,
            format!("The request field 'invocation_id' is invalid. Reason: {e}"),
        )
    })
}

async fn apply(state: &AdminState, id: &str, op: Control) -> Result<StatusCode, AdminError> {
    let id = parse_id(id)?;
    match state.runtime.control(id, op).await? {
        Controlled::Done => Ok(StatusCode::OK),
        Controlled::Accepted => Ok(StatusCode::ACCEPTED),
        Controlled::NotFound => Err(AdminError::coded(
            Code::ADM0003,
            format!("The requested invocation '{id}' does not exist"),
        )),
        Controlled::Conflict(why) => Err(AdminError::coded(Code::ADM0004, why)),
    }
}

/// An operation on an invocation other than those routed by name: 404 naming the known ones.
#[utoipa::path(patch, path = "/invocations/{invocation_id}/{operation}", tag = "invocation", operation_id = "control_invocation",
    params(("invocation_id" = String, Path), ("operation" = String, Path, description = "cancel, kill, purge, purge-journal, pause, resume or restart-as-new")),
    responses((status = 404, description = "No such operation.")))]
pub async fn control(Path(path): Path<(String, String)>) -> AdminError {
    let operation = path.1;
    AdminError::coded(
        Code::ADM0003,
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
            AdminError::coded(
                Code::ADM0002,
                format!("unknown mode '{mode}': use cancel, kill or purge"),
            )
        })?;
    apply(&state, &id, op).await.map(|_| StatusCode::ACCEPTED)
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
    let record = read(&state, move |db| store::load_listed_one(db, id)).await?;
    let mut shown = record.as_ref().map(invocation_response).ok_or_else(|| {
        AdminError::coded(
            Code::ADM0003,
            format!("The requested invocation '{id}' does not exist"),
        )
    })?;
    if record.is_some_and(|r| r.status != Status::Completed) {
        shown.waiting = state.runtime.explain(id).await?.map(waiting_response);
    }
    Ok(Json(shown))
}
