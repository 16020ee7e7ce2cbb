//! Invocations: list, describe, cancel, kill, purge.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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
    /// `limit-key-concurrency`, `rate-limit`, `quota`, `budget-exhausted`,
    /// `deployment-concurrency`, `lock`,
    /// `queue-paused` or `invoker-concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_on: Option<String>,
    /// For `limit-key-concurrency` and `rate-limit`: the full level (`scope`, `level1`, `level2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    /// For `limit-key-concurrency`: the limit (absent when unlimited). For
    /// `deployment-concurrency`: what may run on the deployment now (its declared limit, or
    /// the smaller window of its paced drain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// For `limit-key-concurrency` and `rate-limit`: the rule that set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// For `rate-limit`: the rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// For `rate-limit`: when the next token is there (for a queue behind others waiting for
    /// tokens, the earliest it could be), RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_token_at: Option<String>,
    /// For `quota`: the quota used up (`10000/day`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<String>,
    /// For `quota`: when its next window starts, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_resets_at: Option<String>,
    /// For `budget-exhausted`: the budget spent (`1000000/day`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// For `budget-exhausted`: when its next window starts, RFC 3339 (running calls that end
    /// and give back their reservations may make room sooner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_resets_at: Option<String>,
    /// For `deployment-concurrency`: the deployment id (`deployment/service` when a service's
    /// own limit holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// For `deployment-concurrency`: attempts running on it (on this node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<u32>,
    /// For `deployment-concurrency`: the deployment answered `Retry-After`; nothing starts on
    /// it before then, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_until: Option<String>,
    /// Its place in its queue: 1 is next (resumed entries go before new ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
    /// Entries its queue started per second lately (absent before the queue started two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_per_second: Option<f64>,
    /// When it should start at that rate: its position times the gap between the queue's
    /// starts (or the time since the last one, when longer), RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<String>,
    /// The same, in milliseconds from now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_ms: Option<u64>,
}

/// `GET /invocations` filters.
#[derive(Debug, Default, Serialize, Deserialize, utoipa::IntoParams)]
pub struct ListParams {
    /// Only this status.
    pub status: Option<String>,
    /// Only this service.
    pub service: Option<String>,
    /// Only this flow-control scope.
    pub scope: Option<String>,
    /// At most this many (newest first), default 100.
    pub limit: Option<usize>,
}

/// `GET /invocations`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListInvocationsResponse {
    /// Matching invocations, newest first.
    pub invocations: Vec<InvocationResponse>,
}

/// `DELETE /invocations/{id}?mode=`.
#[derive(Debug, Default, Serialize, Deserialize, utoipa::IntoParams)]
pub struct DeleteParams {
    /// cancel (default), kill or purge.
    pub mode: Option<String>,
}

/// Query of `PATCH /invocations/{id}/restart-as-new`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RestartAsNewParams {
    /// The journal index to restart from: 0 (the default) keeps only the input.
    pub from: Option<u32>,
    /// Which deployment a restart from a journal prefix runs on (`latest`, `keep` or an id).
    pub deployment: Option<String>,
}

/// What `PATCH /invocations/{id}/restart-as-new` answers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RestartAsNewResponse {
    /// The id of the new invocation.
    pub new_invocation_id: String,
}

/// `POST /invocations/bulk-cancel`: cancel what waits, is scheduled or is suspended, by filter.
/// Every field given must match; at least a scope or a service is needed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkCancelRequest {
    /// The invocations' flow-control scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Their limit key, or one under it (`gold` names `gold` and `gold/eu`); needs `scope`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_key: Option<String>,
    /// Their target service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// Their target handler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    /// Created at or after this time (RFC 3339, or ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_after: Option<String>,
    /// Created before this time (RFC 3339, or ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_before: Option<String>,
    /// Which of `pending` (waiting for a first attempt: queued, or behind its object's lock),
    /// `scheduled` (a delayed send) and `suspended` (started, waiting); default all three.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statuses: Option<Vec<String>>,
    /// Count what it names and cancel nothing (no record is kept).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// What one partition's share of a bulk cancel did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BulkCancelled {
    /// Invocations the filter named.
    pub named: u64,
    /// Of those, how many were canceled (0 in a dry run).
    pub cancelled: u64,
}

/// What a bulk cancel did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BulkCancelResponse {
    /// Its record's id (`sys_bulk_cancels`); none for a dry run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Whether it only counted.
    pub dry_run: bool,
    /// Invocations the filter named, on every partition.
    pub named: u64,
    /// Of those, how many were canceled: never started ones completed with 409 `FLO0006`,
    /// suspended ones sent the cancel signal.
    pub cancelled: u64,
    /// Each partition's share: every partition, whichever node was asked (in cluster mode
    /// each by the node leading it).
    #[serde(default)]
    pub partitions: std::collections::BTreeMap<u32, BulkCancelled>,
}
