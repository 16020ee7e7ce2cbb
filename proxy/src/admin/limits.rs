//! `/limits/rules`: the flow-control rule book. Changes are atomic batches; each one reaches
//! every partition as soon as it is stored.

use std::num::NonZeroU32;
use std::sync::Arc;

use axum::extract::State;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AdminState;
use super::error::AdminError;
use super::json::Json;
use crate::flow::{Delete, Limit, Precondition, Rule, RuleError, RulePattern, Upsert};
use crate::limits::RulesError;

/// A rule's limits; empty means unlimited.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct Limits {
    /// Invocations running at once, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

/// When an upsert applies.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PreconditionRequest {
    /// Always.
    None,
    /// Only if no rule has the pattern.
    DoesNotExist,
    /// Only if the rule is at this version.
    Matches {
        /// The expected version.
        version: u32,
    },
}

/// One rule to create or replace.
#[derive(Debug, Deserialize, ToSchema)]
pub struct UpsertRuleRequest {
    /// `*`, `scope`, `scope/l1`, `*/l1/l2`, …
    pub pattern: String,
    /// Its limits (`{}` = unlimited).
    #[serde(default)]
    pub limits: Limits,
    /// Free text.
    pub description: Option<String>,
    /// Kept but not applied.
    #[serde(default)]
    pub disabled: bool,
    /// Checked before it applies.
    pub precondition: Option<PreconditionRequest>,
}

/// A rule as stored.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RuleResponse {
    /// Its pattern.
    pub pattern: String,
    /// Its limits.
    pub limits: Limits,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Kept but not applied.
    pub disabled: bool,
    /// Bumps when limits or `disabled` change.
    pub version: u32,
    /// Last change, ms since the epoch.
    pub last_modified_millis_since_epoch: u64,
}

impl From<&Rule> for RuleResponse {
    fn from(rule: &Rule) -> Self {
        Self {
            pattern: rule.pattern.to_string(),
            limits: Limits {
                concurrency: match rule.limit {
                    Limit::Concurrency(n) => Some(n.get()),
                    Limit::Unlimited => None,
                },
            },
            description: rule.description.clone(),
            disabled: rule.disabled,
            version: rule.version,
            last_modified_millis_since_epoch: rule.last_modified_ms,
        }
    }
}

/// One rule to delete.
#[derive(Debug, Deserialize, ToSchema)]
pub struct DeleteRuleRequest {
    /// Its pattern.
    pub pattern: String,
    /// When set, the rule must be at this version.
    pub expected_version: Option<u32>,
}

/// `GET /limits/rules`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListRulesResponse {
    /// Every rule, by pattern.
    pub rules: Vec<RuleResponse>,
}

fn pattern(text: &str) -> Result<RulePattern, AdminError> {
    text.parse().map_err(|e: crate::flow::PatternError| {
        AdminError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("invalid rule pattern '{text}': {e}"),
        )
    })
}

fn refused(error: RulesError) -> AdminError {
    match error {
        RulesError::Rules(e @ RuleError::PreconditionFailed { .. }) => {
            AdminError::new(StatusCode::CONFLICT, e.to_string())
        }
        RulesError::Rules(e) => AdminError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
        RulesError::Storage(e) => e.into(),
    }
}

/// Creates or replaces rules, all or none.
#[utoipa::path(put, path = "/limits/rules", tag = "limits", operation_id = "upsert_rules",
    request_body = Vec<UpsertRuleRequest>,
    responses((status = 200, body = Vec<RuleResponse>), (status = 409, description = "A precondition failed; nothing changed."),
        (status = 422, description = "An invalid pattern or limit; nothing changed.")))]
pub async fn upsert(
    State(state): State<Arc<AdminState>>,
    Json(requests): Json<Vec<UpsertRuleRequest>>,
) -> Result<Json<Vec<RuleResponse>>, AdminError> {
    let upserts = requests
        .iter()
        .map(|r| {
            let limit = match r.limits.concurrency {
                None => Limit::Unlimited,
                Some(n) => Limit::Concurrency(NonZeroU32::new(n).ok_or_else(|| {
                    AdminError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        format!(
                            "rule '{}': concurrency must be at least 1 (leave limits empty for unlimited)",
                            r.pattern
                        ),
                    )
                })?),
            };
            Ok(Upsert {
                pattern: pattern(&r.pattern)?,
                limit,
                description: r.description.clone(),
                disabled: r.disabled,
                precondition: match r.precondition {
                    None | Some(PreconditionRequest::None) => Precondition::None,
                    Some(PreconditionRequest::DoesNotExist) => Precondition::DoesNotExist,
                    Some(PreconditionRequest::Matches { version }) => Precondition::Matches(version),
                },
            })
        })
        .collect::<Result<Vec<_>, AdminError>>()?;
    let rules = state.rules.upsert(&upserts).map_err(refused)?;
    Ok(Json(rules.iter().map(RuleResponse::from).collect()))
}

/// Deletes rules, all or none; answers the patterns removed.
#[utoipa::path(post, path = "/limits/rules/bulk-delete", tag = "limits", operation_id = "delete_rules",
    request_body = Vec<DeleteRuleRequest>,
    responses((status = 200, body = Vec<String>), (status = 409, description = "A version did not match; nothing changed.")))]
pub async fn bulk_delete(
    State(state): State<Arc<AdminState>>,
    Json(requests): Json<Vec<DeleteRuleRequest>>,
) -> Result<Json<Vec<String>>, AdminError> {
    let deletes = requests
        .iter()
        .map(|r| {
            Ok(Delete {
                pattern: pattern(&r.pattern)?,
                expected_version: r.expected_version,
            })
        })
        .collect::<Result<Vec<_>, AdminError>>()?;
    let removed = state.rules.delete(&deletes).map_err(refused)?;
    Ok(Json(removed.iter().map(ToString::to_string).collect()))
}

/// Every rule, sorted by pattern.
#[utoipa::path(get, path = "/limits/rules", tag = "limits", operation_id = "list_rules",
    responses((status = 200, body = ListRulesResponse)))]
pub async fn list(State(state): State<Arc<AdminState>>) -> Json<ListRulesResponse> {
    let book = state.rules.book();
    let mut rules: Vec<RuleResponse> = book.rules().map(RuleResponse::from).collect();
    rules.sort_by(|a, b| a.pattern.cmp(&b.pattern));
    Json(ListRulesResponse { rules })
}

/// One flow-control counter.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CounterResponse {
    /// `scope`, `l1` or `l2`.
    pub level: String,
    /// The scope.
    pub scope: String,
    /// L1 key (L1 and L2 counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l1: Option<String>,
    /// L2 key (L2 counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2: Option<String>,
    /// Invocations running under it.
    pub usage: u32,
    /// Its limit; absent when unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Free slots; absent when unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<u32>,
    /// Queues waiting on it.
    pub waiters: usize,
    /// The rule that set the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// `GET /limits/counters`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListCountersResponse {
    /// Every live counter, by scope, L1, L2.
    pub counters: Vec<CounterResponse>,
}

/// Live flow-control counters: usage, limit, free slots, waiters and the rule, per level.
#[utoipa::path(get, path = "/limits/counters", tag = "limits", operation_id = "list_counters",
    responses((status = 200, body = ListCountersResponse)))]
pub async fn counters(
    State(state): State<Arc<AdminState>>,
) -> Result<Json<ListCountersResponse>, AdminError> {
    let mut counters: Vec<CounterResponse> = state
        .runtime
        .counters()
        .await?
        .into_iter()
        .map(|c| {
            let limit = match c.limit {
                Limit::Concurrency(n) => Some(n.get()),
                Limit::Unlimited => None,
            };
            CounterResponse {
                level: c.level.to_string().to_ascii_lowercase(),
                scope: c.scope,
                l1: c.l1,
                l2: c.l2,
                usage: c.usage,
                available: limit.map(|_| c.available),
                limit,
                waiters: c.waiters,
                rule: c.rule.map(|r| r.to_string()),
            }
        })
        .collect();
    counters.sort_by(|a, b| (&a.scope, &a.l1, &a.l2).cmp(&(&b.scope, &b.l1, &b.l2)));
    Ok(Json(ListCountersResponse { counters }))
}
