//! `/limits/rules`: the flow-control rule book. Changes are atomic batches; each one reaches
//! every partition as soon as it is stored.

use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;

use axum::extract::State;

use super::AdminState;
use super::error::AdminError;
use super::json::Json;
pub use sluice_api::limits::{
    AdaptiveBounds, ApplyRulesRequest, ApplyRulesResponse, BurstableBounds, Concurrency,
    CounterResponse, DeleteRuleRequest, FlowHistoryResponse, Limits, ListCountersResponse,
    ListRulesResponse, MODES, PreconditionRequest, ResetQuotaRequest, ResetQuotaResponse,
    RuleResponse, ShadowResponse, UpsertRuleRequest,
};
use sluice_core::errors::Code;
use sluice_flow::limiter::MAX_WEIGHT;
use sluice_flow::{
    AdaptiveLimit, Budget, Delete, Limit, Precondition, Quota, Rate, RateError, RateLimit, Rule,
    RuleError, RulePattern, Upsert,
};
use sluice_runtime::limits::RulesError;

/// How the admin API shows `Rule`.
pub fn rule_response(rule: &Rule) -> RuleResponse {
    RuleResponse {
        pattern: rule.pattern.to_string(),
        limits: Limits {
            concurrency: match (rule.limit, rule.guaranteed) {
                (Limit::Concurrency(max), Some(min)) => {
                    Some(Concurrency::Burstable(BurstableBounds {
                        min: min.get(),
                        max: max.get(),
                    }))
                }
                (Limit::Concurrency(n), None) => Some(Concurrency::Fixed(n.get())),
                (Limit::Unlimited, _) => None,
            },
            rate: rule.rate.map(|r| r.rate.to_string()),
            burst: rule.rate.map(|r| r.burst.get()),
            on_exceed: (rule.rejects() == Some(true)).then(|| "reject".to_owned()),
            max_queued: rule.max_queued.map(NonZeroU32::get),
            weight: rule.weight.map(NonZeroU32::get),
            adaptive: rule.adaptive.map(|a| AdaptiveBounds {
                min: a.min.get(),
                max: a.max.get(),
            }),
            max_wait: rule
                .max_wait_ms
                .map(|ms| sluice_config::FriendlyDuration::from_millis(ms.get()).to_string()),
            quota: rule.quota.map(|q| q.to_string()),
            budget: rule.budget.map(|b| b.to_string()),
            reserve: rule.budget.and_then(|b| b.reserve).map(NonZeroU64::get),
            budget_unit: rule.budget_unit.clone(),
            burst_budget: rule.burst_budget.map(|b| b.to_string()),
            on_full: rule.on_full.map(|o| o.to_string()),
            debounce: rule.debounce.map(|d| d.to_string()),
        },
        description: rule.description.clone(),
        disabled: rule.disabled,
        mode: MODES[usize::from(rule.shadow)].to_owned(),
        version: rule.version,
        last_modified_millis_since_epoch: rule.last_modified_ms,
    }
}

pub(crate) fn pattern(text: &str) -> Result<RulePattern, AdminError> {
    text.parse().map_err(|e: sluice_flow::PatternError| {
        AdminError::coded(Code::RUL0001, format!("invalid rule pattern '{text}': {e}"))
    })
}

/// The rate and burst of a rule's limits; a burst needs a rate.
fn rate_limit(pattern: &str, limits: &Limits) -> Result<Option<RateLimit>, AdminError> {
    let invalid =
        |why: String| AdminError::coded(Code::RUL0001, format!("rule '{pattern}': {why}"));
    let Some(text) = &limits.rate else {
        return match (limits.burst, &limits.on_exceed) {
            (None, None) => Ok(None),
            (None, Some(_)) if limits.quota.is_some() || limits.budget.is_some() => Ok(None),
            _ => Err(invalid(
                "burst and on_exceed need a rate (e.g. \"rate\": \"10/s\", \"burst\": 5); on_exceed also goes with a quota or a budget".into(),
            )),
        };
    };
    let rate: Rate = text
        .parse()
        .map_err(|e: RateError| invalid(e.to_string()))?;
    let burst = match limits.burst {
        None => NonZeroU32::MIN,
        Some(n) => NonZeroU32::new(n).ok_or_else(|| {
            invalid("burst must be at least 1 (1 spaces admissions evenly)".into())
        })?,
    };
    let reject = on_exceed(pattern, limits)?;
    Ok(Some(RateLimit {
        rate,
        burst,
        reject,
    }))
}

/// Whether `on_exceed` says `reject`.
fn on_exceed(pattern: &str, limits: &Limits) -> Result<bool, AdminError> {
    match limits.on_exceed.as_deref() {
        None | Some("throttle") => Ok(false),
        Some("reject") => Ok(true),
        Some(other) => Err(AdminError::coded(
            Code::RUL0001,
            format!(
                "rule '{pattern}': on_exceed is 'throttle' (wait for a token or the next window) or 'reject' (answer 429), not '{other}'"
            ),
        )),
    }
}

/// A rule's quota (`10000/day`), rejecting with `on_exceed: reject`.
fn quota(pattern: &str, limits: &Limits) -> Result<Option<Quota>, AdminError> {
    let Some(text) = &limits.quota else {
        return Ok(None);
    };
    let quota: Quota = text.parse().map_err(|e: sluice_flow::QuotaError| {
        AdminError::coded(Code::RUL0001, format!("rule '{pattern}': {e}"))
    })?;
    Ok(Some(Quota {
        reject: on_exceed(pattern, limits)?,
        ..quota
    }))
}

/// Longest budget unit name.
const MAX_UNIT: usize = 32;

/// A rule's budget (`1000000/day`) with its `reserve`, rejecting with `on_exceed: reject`,
/// and its unit.
fn budget(pattern: &str, limits: &Limits) -> Result<(Option<Budget>, Option<String>), AdminError> {
    let invalid =
        |why: String| AdminError::coded(Code::RUL0001, format!("rule '{pattern}': {why}"));
    let Some(text) = &limits.budget else {
        return match (limits.reserve, &limits.budget_unit) {
            (None, None) => Ok((None, None)),
            _ => Err(invalid(
                "reserve and budget_unit need a budget (e.g. \"budget\": \"1000000/day\")".into(),
            )),
        };
    };
    let budget: Budget = text
        .parse()
        .map_err(|e: sluice_flow::QuotaError| invalid(e.to_string()))?;
    let reserve = match limits.reserve {
        None => None,
        Some(n) => Some(
            NonZeroU64::new(n)
                .filter(|n| n.get() <= budget.limit.amount.get())
                .ok_or_else(|| {
                    invalid(format!(
                        "reserve must be 1 to the budget's amount ({}), not {n}: a call needs its reservation free to start",
                        budget.limit.amount
                    ))
                })?,
        ),
    };
    if let Some(unit) = &limits.budget_unit
        && (unit.is_empty()
            || unit.len() > MAX_UNIT
            || !unit
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
    {
        return Err(invalid(format!(
            "budget_unit is a name of 1-{MAX_UNIT} letters, digits, '-', '_' or '.' (e.g. tokens)"
        )));
    }
    let budget = Budget {
        limit: Quota {
            reject: on_exceed(pattern, limits)?,
            ..budget.limit
        },
        reserve,
    };
    Ok((Some(budget), limits.budget_unit.clone()))
}

/// A rule's burst budget (`2x 10m/day`): over a fixed concurrency only.
fn burst_budget(
    pattern: &str,
    limits: &Limits,
) -> Result<Option<sluice_flow::BurstBudget>, AdminError> {
    let Some(text) = &limits.burst_budget else {
        return Ok(None);
    };
    let invalid =
        |why: String| AdminError::coded(Code::RUL0001, format!("rule '{pattern}': {why}"));
    if !matches!(limits.concurrency, Some(Concurrency::Fixed(_))) {
        return Err(invalid(
            "burst_budget raises a fixed concurrency: give the rule one (e.g. \"concurrency\": 10), not a burstable {min, max} or an adaptive limit".into(),
        ));
    }
    text.parse()
        .map(Some)
        .map_err(|e: sluice_flow::QuotaError| invalid(e.to_string()))
}

/// A rule's `on_full`: under a concurrency (fixed or adaptive), never on a shadow rule.
fn on_full(
    pattern: &str,
    limits: &Limits,
    mode: Option<&str>,
) -> Result<Option<sluice_flow::OnFull>, AdminError> {
    let text = match limits.on_full.as_deref().map(str::trim) {
        None | Some("queue") => return Ok(None),
        Some(text) => text,
    };
    let invalid =
        |why: String| AdminError::coded(Code::RUL0001, format!("rule '{pattern}': {why}"));
    let on_full = text
        .parse()
        .map_err(|e: sluice_flow::OnFullError| invalid(e.to_string()))?;
    if limits.concurrency.is_none() && limits.adaptive.is_none() {
        return Err(invalid(format!(
            "on_full = {on_full} acts when the counter is full: give the rule a concurrency (e.g. \"concurrency\": 1 for one active run per key)"
        )));
    }
    if mode == Some("shadow") {
        return Err(invalid(
            "a shadow rule is never enforced: on_full drops, replaces or cancels calls, so it needs mode = enforce".into(),
        ));
    }
    Ok(Some(on_full))
}

/// A rule's `debounce`: never on a shadow rule.
fn debounce(
    pattern: &str,
    limits: &Limits,
    mode: Option<&str>,
) -> Result<Option<sluice_flow::Debounce>, AdminError> {
    let Some(text) = &limits.debounce else {
        return Ok(None);
    };
    let invalid =
        |why: String| AdminError::coded(Code::RUL0001, format!("rule '{pattern}': {why}"));
    if mode == Some("shadow") {
        return Err(invalid(
            "a shadow rule is never enforced: debounce delays and merges calls, so it needs mode = enforce".into(),
        ));
    }
    text.parse()
        .map(Some)
        .map_err(|e: sluice_flow::DebounceError| invalid(e.to_string()))
}

/// A burstable rule's guaranteed slots: 1 ≤ min ≤ max, at a key level (a scope has no
/// level above it to borrow from).
fn guaranteed(pattern: &RulePattern, limits: &Limits) -> Result<Option<NonZeroU32>, AdminError> {
    let Some(Concurrency::Burstable(b)) = limits.concurrency else {
        return Ok(None);
    };
    if b.min == 0 || b.min > b.max {
        return Err(AdminError::coded(
            Code::RUL0001,
            format!(
                "rule '{pattern}': a burstable concurrency needs 1 <= min <= max, not min {} and max {}",
                b.min, b.max
            ),
        ));
    }
    if pattern.level() == sluice_flow::Level::Scope {
        return Err(AdminError::coded(
            Code::RUL0001,
            format!(
                "rule '{pattern}': a burstable concurrency needs a key level to borrow from its \
                 scope (`{pattern}/*`); give the scope a plain number"
            ),
        ));
    }
    Ok(NonZeroU32::new(b.min))
}

/// A rule's adaptive bounds: 1 ≤ min ≤ max.
fn adaptive(pattern: &str, limits: &Limits) -> Result<Option<AdaptiveLimit>, AdminError> {
    let Some(bounds) = limits.adaptive else {
        return Ok(None);
    };
    let min = NonZeroU32::new(bounds.min);
    let max = NonZeroU32::new(bounds.max).filter(|max| min.is_some_and(|min| *max >= min));
    match (min, max) {
        (Some(min), Some(max)) => Ok(Some(AdaptiveLimit { min, max })),
        _ => Err(AdminError::coded(
            Code::RUL0001,
            format!(
                "rule '{pattern}': adaptive needs 1 <= min <= max, not min {} and max {}",
                bounds.min, bounds.max
            ),
        )),
    }
}

/// A rule's `max_wait` as milliseconds: a duration of at least 1 ms.
fn max_wait(pattern: &str, limits: &Limits) -> Result<Option<NonZeroU64>, AdminError> {
    let Some(text) = &limits.max_wait else {
        return Ok(None);
    };
    let invalid =
        |why: String| AdminError::coded(Code::RUL0001, format!("rule '{pattern}': max_wait {why}"));
    let duration: sluice_config::FriendlyDuration = text.parse().map_err(invalid)?;
    let ms = u64::try_from(duration.0.as_millis()).unwrap_or(u64::MAX);
    NonZeroU64::new(ms).map(Some).ok_or_else(|| {
        invalid(format!(
            "'{text}' is under 1 ms (leave it out for no bound)"
        ))
    })
}

/// `n` as a weight, if it is one (1 to [`MAX_WEIGHT`]): a rule's or an override's.
pub(crate) fn valid_weight(n: u32) -> Option<NonZeroU32> {
    NonZeroU32::new(n).filter(|n| n.get() <= MAX_WEIGHT)
}

pub(crate) fn refused(error: RulesError) -> AdminError {
    match error {
        RulesError::Rules(e @ RuleError::PreconditionFailed { .. }) => {
            AdminError::coded(Code::RUL0002, e.to_string())
        }
        RulesError::Rules(e) => AdminError::coded(Code::RUL0001, e.to_string()),
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
    let upserts = upserts_of(&requests)?;
    let rules = state.rules.upsert(&upserts).map_err(refused)?;
    Ok(Json(rules.iter().map(rule_response).collect()))
}

/// Upserts and deletes as one change: all or nothing (`sluice rules apply`).
#[utoipa::path(post, path = "/limits/rules/apply", tag = "limits", operation_id = "apply_rules",
    request_body = ApplyRulesRequest,
    responses((status = 200, body = ApplyRulesResponse), (status = 409, description = "A precondition or version failed; nothing changed."),
        (status = 422, description = "An invalid pattern or limit; nothing changed.")))]
pub async fn apply(
    State(state): State<Arc<AdminState>>,
    Json(request): Json<ApplyRulesRequest>,
) -> Result<Json<ApplyRulesResponse>, AdminError> {
    let upserts = upserts_of(&request.upserts)?;
    let deletes = deletes_of(&request.deletes)?;
    let (rules, deleted) = state.rules.apply(&upserts, &deletes).map_err(refused)?;
    Ok(Json(ApplyRulesResponse {
        rules: rules.iter().map(rule_response).collect(),
        deleted: deleted.iter().map(ToString::to_string).collect(),
    }))
}

fn upserts_of(requests: &[UpsertRuleRequest]) -> Result<Vec<Upsert>, AdminError> {
    requests
        .iter()
        .map(|r| {
            let pattern = pattern(&r.pattern)?;
            let limit = match r.limits.concurrency.map(Concurrency::max) {
                None => Limit::Unlimited,
                Some(n) => Limit::Concurrency(NonZeroU32::new(n).ok_or_else(|| {
                    AdminError::coded(Code::RUL0001, format!(
                            "rule '{}': concurrency must be at least 1 (leave limits empty for unlimited)",
                            r.pattern
                        ),
                    )
                })?),
            };
            let (budget, budget_unit) = budget(&r.pattern, &r.limits)?;
            Ok(Upsert {
                budget,
                budget_unit,
                burst_budget: burst_budget(&r.pattern, &r.limits)?,
                on_full: on_full(&r.pattern, &r.limits, r.mode.as_deref())?,
                debounce: debounce(&r.pattern, &r.limits, r.mode.as_deref())?,
                guaranteed: guaranteed(&pattern, &r.limits)?,
                quota: quota(&r.pattern, &r.limits)?,
                pattern,
                limit,
                rate: rate_limit(&r.pattern, &r.limits)?,
                max_queued: match r.limits.max_queued {
                    None => None,
                    Some(n) => Some(NonZeroU32::new(n).ok_or_else(|| {
                        AdminError::coded(Code::RUL0001, format!("rule '{}': max_queued must be at least 1", r.pattern),
                        )
                    })?),
                },
                max_wait_ms: max_wait(&r.pattern, &r.limits)?,
                adaptive: adaptive(&r.pattern, &r.limits)?,
                weight: match r.limits.weight {
                    None => None,
                    Some(n) => Some(
                        valid_weight(n)
                            .ok_or_else(|| {
                                AdminError::coded(Code::RUL0001, format!(
                                        "rule '{}': weight must be 1-{MAX_WEIGHT}, not {n}",
                                        r.pattern
                                    ),
                                )
                            })?,
                    ),
                },
                shadow: match r.mode.as_deref() {
                    None | Some("enforce") => false,
                    Some("shadow") => true,
                    Some(other) => {
                        return Err(AdminError::coded(Code::RUL0001, format!(
                                "rule '{}': mode is 'enforce' or 'shadow' (counted, never enforced), not '{other}'",
                                r.pattern
                            ),
                        ));
                    }
                },
                description: r.description.clone(),
                disabled: r.disabled,
                precondition: match r.precondition {
                    None | Some(PreconditionRequest::None) => Precondition::None,
                    Some(PreconditionRequest::DoesNotExist) => Precondition::DoesNotExist,
                    Some(PreconditionRequest::Matches { version }) => Precondition::Matches(version),
                },
            })
        })
        .collect()
}

fn deletes_of(requests: &[DeleteRuleRequest]) -> Result<Vec<Delete>, AdminError> {
    requests
        .iter()
        .map(|r| {
            Ok(Delete {
                pattern: pattern(&r.pattern)?,
                expected_version: r.expected_version,
            })
        })
        .collect()
}

/// Deletes rules, all or none; answers the patterns removed.
#[utoipa::path(post, path = "/limits/rules/bulk-delete", tag = "limits", operation_id = "delete_rules",
    request_body = Vec<DeleteRuleRequest>,
    responses((status = 200, body = Vec<String>), (status = 409, description = "A version did not match; nothing changed.")))]
pub async fn bulk_delete(
    State(state): State<Arc<AdminState>>,
    Json(requests): Json<Vec<DeleteRuleRequest>>,
) -> Result<Json<Vec<String>>, AdminError> {
    let deletes = deletes_of(&requests)?;
    let removed = state.rules.delete(&deletes).map_err(refused)?;
    Ok(Json(removed.iter().map(ToString::to_string).collect()))
}

/// Every rule, sorted by pattern.
#[utoipa::path(get, path = "/limits/rules", tag = "limits", operation_id = "list_rules",
    responses((status = 200, body = ListRulesResponse)))]
pub async fn list(State(state): State<Arc<AdminState>>) -> Json<ListRulesResponse> {
    let book = state.rules.book();
    let mut rules: Vec<RuleResponse> = book.rules().map(rule_response).collect();
    rules.sort_by(|a, b| a.pattern.cmp(&b.pattern));
    Json(ListRulesResponse { rules })
}

/// The flow charts' data over the last `flow.history`: per rule and level admitted/s,
/// refused/s, running, waiting, p99 wait, the adaptive limit and shadow tallies; per busy
/// queue, what it held. Empty (`interval_ms` 0) when `flow.history` is `0s`.
#[utoipa::path(get, path = "/limits/history", tag = "limits", operation_id = "flow_history",
    responses((status = 200, body = FlowHistoryResponse)))]
pub async fn history(State(state): State<Arc<AdminState>>) -> Json<FlowHistoryResponse> {
    Json(
        state
            .history
            .as_ref()
            .map(|h| h.response())
            .unwrap_or_default(),
    )
}

/// Deployment gates on this node: the concurrency each deployment's manifest declares, its
/// paced-drain window after an outage, what runs through it, and until when it is closed.
#[utoipa::path(get, path = "/limits/deployments", tag = "limits", operation_id = "list_deployment_gates",
    responses((status = 200, body = sluice_api::limits::ListDeploymentGatesResponse)))]
pub async fn deployment_gates(
    State(state): State<Arc<AdminState>>,
) -> Json<sluice_api::limits::ListDeploymentGatesResponse> {
    let gates = state
        .registry
        .gates()
        .snapshot(sluice_core::clock::now_ms())
        .into_iter()
        .map(|g| sluice_api::limits::DeploymentGateResponse {
            deployment: g.name,
            declared: g.declared,
            drain_window: g.window,
            running: g.used,
            closed_until: g.closed_until_ms.and_then(sluice_core::clock::rfc3339),
        })
        .collect();
    Json(sluice_api::limits::ListDeploymentGatesResponse { gates })
}
