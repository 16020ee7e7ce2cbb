//! `GET /limits/counters`: the live flow-control counters, bounded at each partition by a
//! scope and a limit.

use std::sync::Arc;

use axum::extract::State;

use super::AdminState;
use super::error::AdminError;
use super::extract::Query;
use super::json::Json;
use super::view_params::ViewParams;
use sluice_api::limits::{AdaptiveBounds, CounterResponse, ListCountersResponse, ShadowResponse};
use sluice_flow::Limit;
use sluice_flow::limiter::CounterControls;

/// Live flow-control counters: usage, limit, free slots, waiters and the rule, per level.
/// The busiest `limit` (1,000 by default) of them, of one `scope` if given: a read bounded at
/// each partition, whatever the number of live keys (`flow/limiter/view.rs`).
#[utoipa::path(get, path = "/limits/counters", tag = "limits", operation_id = "list_counters",
    params(ViewParams),
    responses((status = 200, body = ListCountersResponse)))]
pub async fn counters(
    State(state): State<Arc<AdminState>>,
    Query(params): Query<ViewParams>,
) -> Result<Json<ListCountersResponse>, AdminError> {
    let view = params.view()?;
    let page = state.runtime.counter_page(view).await?;
    let mut counters: Vec<CounterResponse> = page
        .counters
        .into_iter()
        .map(|c| {
            let controls = c.controls.map_or(CounterControls::NONE, |c| *c);
            let limit = match c.limit {
                Limit::Concurrency(n) => Some(n.get()),
                Limit::Unlimited => None,
            };
            CounterResponse {
                level: c.level.lower_name().to_owned(),
                scope: c.scope,
                l1: c.l1,
                l2: c.l2,
                usage: c.usage,
                available: limit.map(|_| c.available),
                limit,
                waiters: c.waiters,
                rule: c.rule.map(|r| r.to_string()),
                rate: controls.rate.map(|r| r.rate.to_string()),
                burst: controls.rate.map(|r| r.burst.get()),
                tokens: controls.tokens,
                queued: c.queued,
                max_queued: controls.max_queued,
                adaptive: controls
                    .adaptive
                    .map(|(min, max)| AdaptiveBounds { min, max }),
                guaranteed: controls.guaranteed,
                quota: controls.quota.map(|(q, _)| q.to_string()),
                quota_used: controls.quota.map(|(_, u)| u.used),
                quota_resets_at: controls
                    .quota
                    .and_then(|(_, u)| sluice_core::clock::rfc3339(u.window_end)),
                budget: controls.budget.map(|(b, _, _)| b.to_string()),
                budget_spent: controls.budget.map(|(_, u, _)| u.used),
                budget_reserved: controls.budget.map(|(_, _, r)| r),
                budget_resets_at: controls
                    .budget
                    .and_then(|(_, u, _)| sluice_core::clock::rfc3339(u.window_end)),
                burst_budget: controls.burst_budget.map(|(b, _)| b.to_string()),
                burst_spent_ms: controls.burst_budget.map(|(_, u)| u.used),
                burst_left_ms: controls
                    .burst_budget
                    .map(|(b, u)| b.budget.amount.get().saturating_sub(u.used)),
                next_token_at: controls.next_token_ms.and_then(sluice_core::clock::rfc3339),
                weight: c.weight,
                shadow: controls.shadow.map(|(rule, counts)| ShadowResponse {
                    rule: rule.pattern.to_string(),
                    would_wait: counts.would_wait,
                    would_reject: counts.would_reject,
                    would_wait_ms: counts.would_wait_ms,
                }),
            }
        })
        .collect();
    counters.sort_by(|a, b| (&a.scope, &a.l1, &a.l2).cmp(&(&b.scope, &b.l1, &b.l2)));
    Ok(Json(ListCountersResponse {
        counters,
        total: page.total,
    }))
}
