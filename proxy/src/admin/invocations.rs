//! Invocation routes: list and describe.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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

/// An invocation as the admin API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct InvocationResponse {
    /// `inv_1…`
    pub id: String,
    /// `service/handler` or `service/key/handler`.
    pub target: String,
    /// Service name.
    pub service: String,
    /// Handler name.
    pub handler: String,
    /// Object or workflow key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `pending`, `scheduled`, `running`, `suspended`, `backing-off`, `paused` or `completed`.
    pub status: String,
    /// Pinned deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_id: Option<String>,
    /// Pinned protocol version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<i32>,
    /// Attempts made.
    pub attempts: u32,
    /// Failed attempts since the last progress.
    pub retry_count: u32,
    /// Code of the last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_error_code: Option<String>,
    /// Message of the last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
    /// `value` or `failure` once completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// Next attempt (scheduled, backing off), RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
    /// Flow-control scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Limit key under the scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_key: Option<String>,
    /// For a queued invocation (`GET /invocations/{id}` only): its queue and what it waits on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<WaitingResponse>,
}

/// Why a queued invocation has not started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WaitingResponse {
    /// Its queue's status: `ready` (its turn comes), `blocked`, `scheduled`.
    pub status: String,
    /// Entries in its queue, itself included.
    pub queued: usize,
    /// Flow-control scope of the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Limit key of the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_key: Option<String>,
    /// `limit-key-concurrency`, `lock` or `invoker-concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_on: Option<String>,
    /// For `limit-key-concurrency`: the full level (`scope`, `level1`, `level2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    /// For `limit-key-concurrency`: the limit (absent when unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// For `limit-key-concurrency`: the rule that set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

impl From<Waiting> for WaitingResponse {
    fn from(w: Waiting) -> Self {
        let (level, limit, rule) = match &w.blocked_on {
            Some(BlockedOn::LimitKeyConcurrency { level, limit, rule }) => (
                Some(level.as_str().to_ascii_lowercase()),
                limit.concurrency(),
                rule.as_ref().map(ToString::to_string),
            ),
            _ => (None, None, None),
        };
        Self {
            status: w.status.name().to_owned(),
            queued: w.queued,
            scope: w.scope.map(|s| s.to_string()),
            limit_key: w.limit_key.map(|k| k.to_string()),
            blocked_on: w.blocked_on.as_ref().map(|on| on.name().to_owned()),
            level,
            limit,
            rule,
        }
    }
}

fn time(ms: u64) -> String {
    rfc3339(ms).unwrap_or_default()
}

impl From<&InvocationRecord> for InvocationResponse {
    fn from(r: &InvocationRecord) -> Self {
        let t = &r.target;
        Self {
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
}

/// `GET /invocations` filters.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
pub struct ListParams {
    /// Only this status.
    pub status: Option<String>,
    /// Only this service.
    pub service: Option<String>,
    /// At most this many (newest first), default 100.
    pub limit: Option<usize>,
}

/// `GET /invocations`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListInvocationsResponse {
    /// Matching invocations, newest first.
    pub invocations: Vec<InvocationResponse>,
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
    });
    records.sort_by_key(|r| std::cmp::Reverse(r.created_at_ms));
    records.truncate(params.limit.unwrap_or(100));
    Ok(Json(ListInvocationsResponse {
        invocations: records.iter().map(InvocationResponse::from).collect(),
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

/// Cancels, kills, purges, pauses or resumes an invocation.
#[utoipa::path(patch, path = "/invocations/{invocation_id}/{operation}", tag = "invocation", operation_id = "control_invocation",
    params(("invocation_id" = String, Path), ("operation" = String, Path, description = "cancel, kill, purge, pause or resume")),
    responses((status = 200, description = "Done."), (status = 202, description = "Cancel signal appended, or a running attempt is being paused."),
        (status = 404, description = "No such invocation or operation."), (status = 409, description = "Not possible in its state.")))]
pub async fn control(
    State(state): State<Arc<AdminState>>,
    Path((id, operation)): Path<(String, String)>,
) -> Result<StatusCode, AdminError> {
    let op = Control::parse(&operation).ok_or_else(|| {
        AdminError::new(
            StatusCode::NOT_FOUND,
            format!("unknown operation '{operation}': use cancel, kill, purge, pause or resume"),
        )
    })?;
    apply(&state, &id, op).await
}

/// `DELETE /invocations/{id}?mode=`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
pub struct DeleteParams {
    /// cancel (default), kill or purge.
    pub mode: Option<String>,
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
    let mut shown = record
        .as_ref()
        .map(InvocationResponse::from)
        .ok_or_else(|| {
            AdminError::new(
                StatusCode::NOT_FOUND,
                format!("The requested invocation '{id}' does not exist"),
            )
        })?;
    if record.is_some_and(|r| r.status != Status::Completed) {
        shown.waiting = state.runtime.explain(id).await?.map(WaitingResponse::from);
    }
    Ok(Json(shown))
}
