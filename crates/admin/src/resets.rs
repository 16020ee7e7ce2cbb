//! `/limits/rules/reset-quota`, `reset-budget` and `reset-burst`: an operator starts what
//! counters matching a pattern used of their quota, budget or burst budget again from 0, in the
//! current window, on every partition (in cluster mode through every leader, `every_leader.rs`).

use std::sync::Arc;

use axum::extract::State;

use super::AdminState;
use super::error::AdminError;
use super::every_leader::{RESET_PAUSE_CAP, RESET_WITHIN, ask_other_leaders, missing_partitions};
use super::json::Json;
use super::limits::pattern;
use sluice_api::limits::{ResetQuotaRequest, ResetQuotaResponse};
use sluice_core::errors::Code;
use sluice_flow::Measure;

/// Starts the quota count of every counter a pattern matches again from 0, in the current
/// window, on every partition; answered once stored. In cluster mode the node asked resets the
/// partitions it leads and asks every other leading node to reset theirs; until every partition
/// was reset by the node leading it (leadership can move while it asks), it resets again, with
/// pauses doubling from 100 ms, for up to [`RESET_WITHIN`].
#[utoipa::path(post, path = "/limits/rules/reset-quota", tag = "limits", operation_id = "reset_quota",
    request_body = ResetQuotaRequest,
    responses((status = 200, body = ResetQuotaResponse), (status = 400, description = "RUL0001: not a pattern"),
        (status = 503, description = "ADM0010: a partition had no leader, or was reset by none, for 30 s")))]
pub async fn reset_quota(
    State(state): State<Arc<AdminState>>,
    headers: http::HeaderMap,
    Json(request): Json<ResetQuotaRequest>,
) -> Result<Json<ResetQuotaResponse>, AdminError> {
    reset_uses(&state, &headers, &request, Measure::Calls).await
}

/// Starts the budget's spend of every counter a pattern matches again from 0, in the current
/// window, on every partition; answered once stored (in cluster mode as
/// `/limits/rules/reset-quota` does).
#[utoipa::path(post, path = "/limits/rules/reset-budget", tag = "limits", operation_id = "reset_budget",
    request_body = ResetQuotaRequest,
    responses((status = 200, body = ResetQuotaResponse), (status = 400, description = "RUL0001: not a pattern"),
        (status = 503, description = "ADM0010: a partition had no leader, or was reset by none, for 30 s")))]
pub async fn reset_budget(
    State(state): State<Arc<AdminState>>,
    headers: http::HeaderMap,
    Json(request): Json<ResetQuotaRequest>,
) -> Result<Json<ResetQuotaResponse>, AdminError> {
    reset_uses(&state, &headers, &request, Measure::Cost).await
}

/// Starts the time spent above their concurrency of every counter with a burst budget a
/// pattern matches again from 0, in the current window, on every partition; answered once
/// stored (in cluster mode as `/limits/rules/reset-quota` does).
#[utoipa::path(post, path = "/limits/rules/reset-burst", tag = "limits", operation_id = "reset_burst",
    request_body = ResetQuotaRequest,
    responses((status = 200, body = ResetQuotaResponse), (status = 400, description = "RUL0001: not a pattern"),
        (status = 503, description = "ADM0010: a partition had no leader, or was reset by none, for 30 s")))]
pub async fn reset_burst(
    State(state): State<Arc<AdminState>>,
    headers: http::HeaderMap,
    Json(request): Json<ResetQuotaRequest>,
) -> Result<Json<ResetQuotaResponse>, AdminError> {
    reset_uses(&state, &headers, &request, Measure::Burst).await
}

/// The path that resets what `m` counts.
fn reset_path(m: Measure) -> &'static str {
    match m {
        Measure::Calls => "/limits/rules/reset-quota",
        Measure::Cost => "/limits/rules/reset-budget",
        Measure::Burst => "/limits/rules/reset-burst",
    }
}

/// Resets the quotas (or budgets) `request` names on every partition (see [`reset_quota`]).
async fn reset_uses(
    state: &AdminState,
    headers: &http::HeaderMap,
    request: &ResetQuotaRequest,
    m: Measure,
) -> Result<Json<ResetQuotaResponse>, AdminError> {
    let pattern = pattern(&request.pattern)?;
    let placement = state.runtime.placement();
    if !placement.is_clustered()
        || sluice_runtime::replication::relay::from_node(placement, headers)
    {
        let partitions = state.runtime.reset_uses(m, &pattern).await?;
        return Ok(Json(ResetQuotaResponse {
            reset: partitions.values().sum(),
            partitions,
        }));
    }
    let authorization = headers.get(http::header::AUTHORIZATION);
    // One client for every try: it keeps its connections to the other nodes.
    let client =
        sluice_runtime::replication::relay::client(Some(std::time::Duration::from_secs(30)));
    let mut pauses = sluice_core::retry::Pauses::new(RESET_WITHIN, RESET_PAUSE_CAP);
    loop {
        let mut partitions = state.runtime.reset_uses(m, &pattern).await?;
        let elsewhere = ask_other_leaders::<ResetQuotaResponse>(
            placement,
            &client,
            &placement.leaders_elsewhere(),
            reset_path(m),
            request,
            authorization,
        )
        .await;
        let missing = match elsewhere {
            Ok(answers) => {
                for answer in answers {
                    partitions.extend(answer.partitions);
                }
                let missing = missing_partitions(&partitions, placement.len());
                if missing.is_empty() {
                    return Ok(Json(ResetQuotaResponse {
                        reset: partitions.values().sum(),
                        partitions,
                    }));
                }
                format!(
                    "partition(s) {missing:?} were reset by no node (their leadership moved while it asked)"
                )
            }
            Err(why) => why,
        };
        let Some(pause) = pauses.next_pause() else {
            return Err(AdminError::coded(
                Code::ADM0010,
                format!(
                    "[CLU0001] the {} reset is incomplete after {:?}: {missing}; retry (resetting again is harmless)",
                    m.as_str(),
                    pauses.elapsed()
                ),
            ));
        };
        tracing::debug!(why = %missing, "a quota reset met a leadership move; resetting again");
        tokio::time::sleep(pause).await;
    }
}
