//! `POST /invocations/bulk-cancel`: cancel what waits (queued, behind an object's lock), what is
//! scheduled (delayed sends) and what is suspended, by scope, limit key, service, handler and
//! creation time, with a dry run that counts and a record of each one (`sys_bulk_cancels`).
//! Each partition goes through its share in batches of `worker.bulk-cancel-batch`, one
//! partition command each (`runtime::partition::commands::bulk_cancel`); in cluster mode the node
//! asked does its partitions and asks every other leader for theirs, as a quota reset does.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;

use crate::AdminState;
use crate::error::AdminError;
use crate::every_leader::{RESET_PAUSE_CAP, RESET_WITHIN, ask_other_leaders, missing_partitions};
use sluice_api::invocations::{BulkCancelRequest, BulkCancelResponse, BulkCancelled};
use sluice_core::errors::{Code, CodedError};
use sluice_runtime::partition::model::bulk::CancelFilter;
use sluice_store::operations::{BulkCancelRecord, BulkCancelState};

/// Cancels the invocations `request` names (see the module).
#[utoipa::path(post, path = "/invocations/bulk-cancel", tag = "invocation", operation_id = "bulk_cancel_invocations",
    request_body = BulkCancelRequest,
    responses((status = 200, body = BulkCancelResponse),
        (status = 422, description = "ADM0001: a field is not valid, or neither scope nor service is given"),
        (status = 503, description = "ADM0010: a partition had no leader, or answered from none, for 30 s")))]
pub async fn bulk_cancel(
    State(state): State<Arc<AdminState>>,
    headers: http::HeaderMap,
    Json(request): Json<BulkCancelRequest>,
) -> Result<Json<BulkCancelResponse>, AdminError> {
    let filter = filter_of(&request).map_err(|why| AdminError::coded(Code::ADM0001, why))?;
    let placement = state.runtime.placement();
    let batch = state.config.worker.bulk_cancel_batch.get() as usize;
    // Another node's share of a cluster-wide one: the partitions here, no record.
    if placement.is_clustered()
        && sluice_runtime::replication::relay::from_node(placement, &headers)
    {
        let partitions = state
            .runtime
            .bulk_cancel(filter, request.dry_run, batch)
            .await?;
        return Ok(Json(answer(None, request.dry_run, shares(partitions))));
    }
    let mut record = (!request.dry_run).then(|| started(&state, &request));
    if let Some(record) = &record {
        sluice_store::operations::put_bulk_cancel(&state.store, record)?;
    }
    let done = if placement.is_clustered() {
        everywhere(&state, &headers, &request, filter, batch).await
    } else {
        state
            .runtime
            .bulk_cancel(filter, request.dry_run, batch)
            .await
            .map(shares)
            .map_err(AdminError::from)
    };
    let Some(record) = record.as_mut() else {
        return done.map(|partitions| Json(answer(None, true, partitions)));
    };
    record.finished_at_ms = Some(sluice_core::clock::now_ms());
    match &done {
        Ok(partitions) => {
            record.state = BulkCancelState::Done;
            record.named = partitions.values().map(|p| p.named).sum();
            record.cancelled = partitions.values().map(|p| p.cancelled).sum();
        }
        Err(e) => {
            record.state = BulkCancelState::Failed;
            record.error = Some(e.error.to_string());
        }
    }
    sluice_store::operations::put_bulk_cancel(&state.store, record)?;
    let partitions = done?;
    Ok(Json(answer(Some(record.id.clone()), false, partitions)))
}

/// The record of a bulk cancel starting now on this node.
fn started(state: &AdminState, request: &BulkCancelRequest) -> BulkCancelRecord {
    BulkCancelRecord {
        id: format!("bc_{}", ulid::Ulid::new()),
        // The node's start marks its own running ones interrupted by this name.
        node: state.config.cluster.node_id.clone(),
        filter: serde_json::to_value(request).unwrap_or_default(),
        state: BulkCancelState::Running,
        started_at_ms: sluice_core::clock::now_ms(),
        finished_at_ms: None,
        named: 0,
        cancelled: 0,
        error: None,
    }
}

/// Cluster mode: this node's partitions and every other leader's, again for the partitions no
/// node answered for (leadership moved while it asked) until each answered once, for up to
/// [`RESET_WITHIN`]. Canceling again is harmless: what was canceled is named no more.
async fn everywhere(
    state: &AdminState,
    headers: &http::HeaderMap,
    request: &BulkCancelRequest,
    filter: CancelFilter,
    batch: usize,
) -> Result<BTreeMap<u32, BulkCancelled>, AdminError> {
    let placement = state.runtime.placement();
    let authorization = headers.get(http::header::AUTHORIZATION);
    let client =
        sluice_runtime::replication::relay::client(Some(std::time::Duration::from_secs(600)));
    let mut pauses = sluice_core::retry::Pauses::new(RESET_WITHIN, RESET_PAUSE_CAP);
    let mut partitions = BTreeMap::new();
    loop {
        for (p, share) in shares(
            state
                .runtime
                .bulk_cancel(filter.clone(), request.dry_run, batch)
                .await?,
        ) {
            partitions.entry(p).or_insert(share);
        }
        let elsewhere = ask_other_leaders::<BulkCancelResponse>(
            placement,
            &client,
            &placement.leaders_elsewhere(),
            "/invocations/bulk-cancel",
            request,
            authorization,
        )
        .await;
        let missing = match elsewhere {
            Ok(answers) => {
                for (p, share) in answers.into_iter().flat_map(|a| a.partitions) {
                    partitions.entry(p).or_insert(share);
                }
                let missing = missing_partitions(&partitions, placement.len());
                if missing.is_empty() {
                    return Ok(partitions);
                }
                format!(
                    "partition(s) {missing:?} were answered for by no node (their leadership moved while it asked)"
                )
            }
            Err(why) => why,
        };
        let Some(pause) = pauses.next_pause() else {
            return Err(AdminError::coded(
                Code::ADM0010,
                format!(
                    "[CLU0001] the bulk cancel is incomplete after {:?}: {missing}; what it canceled stays canceled, and the same request cancels the rest",
                    pauses.elapsed()
                ),
            ));
        };
        tracing::debug!(why = %missing, "a bulk cancel met a leadership move; asking again");
        tokio::time::sleep(pause).await;
    }
}

fn shares(
    partitions: BTreeMap<u32, sluice_runtime::partition::model::bulk::Cancelled>,
) -> BTreeMap<u32, BulkCancelled> {
    partitions
        .into_iter()
        .map(|(p, done)| {
            (
                p,
                BulkCancelled {
                    named: done.named,
                    cancelled: done.cancelled,
                },
            )
        })
        .collect()
}

fn answer(
    id: Option<String>,
    dry_run: bool,
    partitions: BTreeMap<u32, BulkCancelled>,
) -> BulkCancelResponse {
    BulkCancelResponse {
        id,
        dry_run,
        named: partitions.values().map(|p| p.named).sum(),
        cancelled: partitions.values().map(|p| p.cancelled).sum(),
        partitions,
    }
}

/// The filter `request` gives, or what is wrong with it.
pub fn filter_of(request: &BulkCancelRequest) -> Result<CancelFilter, String> {
    if request.scope.is_none() && request.service.is_none() {
        return Err(
            "a bulk cancel needs `scope` or `service` (so that no request cancels everything by a slip)".into(),
        );
    }
    let coded = |field: &str, e: CodedError| format!("`{field}`: {}", e.message);
    let scope = request
        .scope
        .as_deref()
        .map(sluice_flow::Scope::parse)
        .transpose()
        .map_err(|e| coded("scope", e))?;
    let limit_key = request
        .limit_key
        .as_deref()
        .map(sluice_flow::LimitKey::parse)
        .transpose()
        .map_err(|e| coded("limit_key", e))?;
    if limit_key.is_some() && scope.is_none() {
        return Err("`limit_key` needs `scope` (a limit key lives under a scope)".into());
    }
    let time = |field: &str, text: &Option<String>| {
        text.as_deref()
            .map(sluice_core::clock::parse_time_ms)
            .transpose()
            .map_err(|why| format!("`{field}`: {why}"))
    };
    let mut filter = CancelFilter {
        scope,
        limit_key,
        service: request.service.clone(),
        handler: request.handler.clone(),
        created_from_ms: time("created_after", &request.created_after)?,
        created_until_ms: time("created_before", &request.created_before)?,
        ..CancelFilter::default()
    };
    let statuses = request.statuses.clone().unwrap_or_else(|| {
        ["pending", "scheduled", "suspended"]
            .map(str::to_owned)
            .to_vec()
    });
    if statuses.is_empty() {
        return Err("`statuses` is empty: name pending, scheduled or suspended, or leave it out for all three".into());
    }
    for status in &statuses {
        match status.as_str() {
            "pending" => filter.pending = true,
            "scheduled" => filter.scheduled = true,
            "suspended" => filter.suspended = true,
            other => {
                return Err(format!(
                    "`statuses`: '{other}' is none of pending, scheduled, suspended"
                ));
            }
        }
    }
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_needs_a_scope_or_service_and_valid_fields() {
        let bad = |request: BulkCancelRequest| filter_of(&request).unwrap_err();
        assert!(bad(BulkCancelRequest::default()).contains("`scope` or `service`"));
        assert!(
            bad(BulkCancelRequest {
                service: Some("S".into()),
                limit_key: Some("gold".into()),
                ..Default::default()
            })
            .contains("needs `scope`")
        );
        assert!(
            bad(BulkCancelRequest {
                scope: Some("a b".into()),
                ..Default::default()
            })
            .starts_with("`scope`")
        );
        assert!(
            bad(BulkCancelRequest {
                service: Some("S".into()),
                statuses: Some(vec!["running".into()]),
                ..Default::default()
            })
            .contains("'running'")
        );
        assert!(
            bad(BulkCancelRequest {
                service: Some("S".into()),
                created_before: Some("soon".into()),
                ..Default::default()
            })
            .starts_with("`created_before`")
        );
        let filter = filter_of(&BulkCancelRequest {
            scope: Some("acme".into()),
            limit_key: Some("gold".into()),
            created_after: Some("1970-01-01T00:00:01Z".into()),
            statuses: Some(vec!["scheduled".into()]),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(filter.created_from_ms, Some(1_000));
        assert!(filter.scheduled && !filter.pending && !filter.suspended);
    }
}
