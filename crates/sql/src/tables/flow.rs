//! Flow-control tables of the schedulers' queues (the counters' are in `counters.rs`, the rule
//! book's in `rules.rs`).

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float64Array, StringBuilder, TimestampMillisecondBuilder,
    UInt32Builder, UInt64Array, UInt64Builder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};

use super::{QuerySources, Reader, Scan, batch, counted, internal, scanned, schema, timestamp};
use sluice_flow::scheduler::{BlockedOn, QueueStatus};

pub(super) fn scheduler_schema() -> SchemaRef {
    schema(vec![
        ("partition_key", DataType::UInt64, false),
        ("id", DataType::Utf8, false),
        ("scope", DataType::Utf8, true),
        ("limit_key", DataType::Utf8, true),
        ("service_name", DataType::Utf8, false),
        ("lock_name", DataType::Utf8, true),
        ("status", DataType::Utf8, false),
        ("num_inbox", DataType::UInt64, false),
        ("num_scheduled", DataType::UInt64, false),
        ("blocked_on", DataType::Utf8, true),
        ("blocked_on_json", DataType::Utf8, true),
        ("status_since", timestamp(), false),
    ])
}

/// `blocked_on` and its JSON form, as the admin API's "why is it waiting" says it.
pub(super) fn blocked(
    on: &BlockedOn,
    scope: Option<&str>,
    limit_key: Option<&str>,
) -> (String, String) {
    let json = match on {
        BlockedOn::Lock | BlockedOn::InvokerConcurrency | BlockedOn::QueuePaused => {
            serde_json::json!({ "type": on.name() })
        }
        BlockedOn::LimitKeyConcurrency { level, limit, rule } => serde_json::json!({
            "type": on.name(),
            "scope": scope,
            "limit_key": limit_key,
            "level": level.as_str(),
            "limit": limit.concurrency(),
            "rule": rule.as_ref().map(|p| p.to_string()),
        }),
        BlockedOn::Quota {
            level,
            quota: amount,
            resets_at_ms,
            rule,
        }
        | BlockedOn::Budget {
            level,
            budget: amount,
            resets_at_ms,
            rule,
        } => {
            // `quota` or `budget`: the amount per window used up, under its own name.
            let what = if matches!(on, BlockedOn::Quota { .. }) {
                "quota"
            } else {
                "budget"
            };
            let mut json = serde_json::json!({
                "type": on.name(),
                "scope": scope,
                "limit_key": limit_key,
                "level": level.as_str(),
                "resets_at": sluice_core::clock::rfc3339(*resets_at_ms),
                "rule": rule.as_ref().map(|p| p.to_string()),
            });
            json[what] = amount.to_string().into();
            json
        }
        BlockedOn::RateLimit {
            level,
            rate,
            next_token_ms,
            rule,
        } => serde_json::json!({
            "type": on.name(),
            "scope": scope,
            "limit_key": limit_key,
            "level": level.as_str(),
            "rate": rate.rate.to_string(),
            "burst": rate.burst.get(),
            "next_token_at": sluice_core::clock::rfc3339(*next_token_ms),
            "rule": rule.as_ref().map(|p| p.to_string()),
        }),
        BlockedOn::DeploymentConcurrency {
            gate,
            limit,
            running,
            closed_until_ms,
        } => serde_json::json!({
            "type": on.name(),
            "deployment": gate,
            "limit": limit,
            "running": running,
            "closed_until": closed_until_ms.and_then(sluice_core::clock::rfc3339),
        }),
    };
    (on.name().to_owned(), json.to_string())
}

/// The live queues a scan wants: of one scope when the query names it, the busiest `limit`
/// when it asks for no more.
async fn queues(
    sources: &QuerySources,
    scan: Scan,
) -> datafusion::error::Result<Vec<(u64, sluice_flow::scheduler::QueueSnapshot)>> {
    let view = sluice_flow::ReadView {
        scope: scan.scope,
        limit: scan.limit,
    };
    let (_, queues) = sources.runtime.queue_page(view).await.map_err(internal)?;
    Ok(queues)
}

/// The rows of a scan of queues that only counts them: how many, from the walk that picks a
/// page, with no queue's snapshot.
async fn counted_queues(
    sources: &QuerySources,
    scan: &Scan,
) -> datafusion::error::Result<RecordBatch> {
    let view = sluice_flow::ReadView {
        scope: scan.scope.clone(),
        limit: Some(0),
    };
    let (total, _) = sources.runtime.queue_page(view).await.map_err(internal)?;
    counted(scan.rows_of(total))
}

pub(super) fn scheduler(sources: &Arc<QuerySources>) -> Reader {
    scanned(sources, |sources, scan| async move {
        if scan.counts_only() {
            return counted_queues(&sources, &scan).await;
        }
        let queues = queues(&sources, scan).await?;
        let mut partition = UInt64Builder::new();
        let mut text: [StringBuilder; 8] = std::array::from_fn(|_| StringBuilder::new());
        let (mut inbox, mut scheduled) = (UInt64Builder::new(), UInt64Builder::new());
        let mut since = TimestampMillisecondBuilder::new().with_timezone("UTC");
        for (index, q) in &queues {
            let scope = q.key.scope.as_ref().map(|s| s.as_str());
            let limit_key = q.key.limit_key.as_ref().map(|k| k.to_string());
            partition.append_value(*index);
            text[0].append_value(
                sluice_core::ids::VQueueId {
                    partition: *index,
                    queue: q.id.index(),
                }
                .to_string(),
            );
            text[1].append_option(scope);
            text[2].append_option(limit_key.as_deref());
            text[3].append_value(&*q.key.service);
            text[4].append_option(q.key.object_key.as_deref());
            text[5].append_value(q.status.name());
            let why = q
                .blocked_on
                .as_ref()
                .map(|on| blocked(on, scope, limit_key.as_deref()));
            text[6].append_option(why.as_ref().map(|w| w.0.as_str()));
            text[7].append_option(why.as_ref().map(|w| w.1.as_str()));
            inbox.append_value(q.queued as u64);
            scheduled.append_value(u64::from(q.delayed));
            since.append_value(i64::try_from(q.since).unwrap_or(i64::MAX));
        }
        let [id, scope, limit_key, service, lock, status, on, on_json] =
            text.map(|mut b| Arc::new(b.finish()) as ArrayRef);
        batch(
            &scheduler_schema(),
            vec![
                Arc::new(partition.finish()),
                id,
                scope,
                limit_key,
                service,
                lock,
                status,
                Arc::new(inbox.finish()),
                Arc::new(scheduled.finish()),
                on,
                on_json,
                Arc::new(since.finish()),
            ],
        )
    })
}

pub(super) fn vqueues_schema() -> SchemaRef {
    schema(vec![
        ("partition_key", DataType::UInt64, false),
        ("id", DataType::Utf8, false),
        ("stage", DataType::Utf8, false),
        ("status", DataType::Utf8, false),
        ("has_lock", DataType::Boolean, false),
        ("run_at", timestamp(), true),
        ("entry_kind", DataType::Utf8, false),
        ("entry_id", DataType::Utf8, false),
        ("created_at", timestamp(), false),
        ("num_attempts", DataType::UInt32, false),
        ("deployment", DataType::Utf8, true),
    ])
}

/// The waiting invocations, one row each, with their queue's status.
pub(super) fn vqueues(sources: &Arc<QuerySources>) -> Reader {
    scanned(sources, |sources, scan| async move {
        if scan.counts_only() {
            let waiting = sources.runtime.queued_count().await.map_err(internal)?;
            return counted(scan.rows_of(waiting));
        }
        let queued = sources.runtime.queued().await.map_err(internal)?;
        let status: std::collections::HashMap<(u64, u32), (&'static str, bool)> = sources
            .runtime
            .queues()
            .await
            .map_err(internal)?
            .into_iter()
            .map(|(p, q)| {
                (
                    (p, q.id.index()),
                    (q.status.name(), q.key.object_key.is_some()),
                )
            })
            .collect();
        let mut partition = UInt64Builder::new();
        let mut text: [StringBuilder; 5] = std::array::from_fn(|_| StringBuilder::new());
        let mut has_lock = BooleanBuilder::new();
        let mut run_at = TimestampMillisecondBuilder::new().with_timezone("UTC");
        let mut created = TimestampMillisecondBuilder::new().with_timezone("UTC");
        let mut attempts = UInt32Builder::new();
        let mut deployment = StringBuilder::new();
        for (index, entry) in &queued {
            let queue = entry.queue.index();
            let (state, locked) = status
                .get(&(*index, queue))
                .copied()
                .unwrap_or(("ready", false));
            partition.append_value(*index);
            text[0].append_value(
                sluice_core::ids::VQueueId {
                    partition: *index,
                    queue,
                }
                .to_string(),
            );
            text[1].append_value("inbox");
            text[2].append_value(state);
            has_lock.append_value(locked);
            run_at.append_option(entry.run_at_ms.and_then(|at| i64::try_from(at).ok()));
            text[3].append_value("invocation");
            text[4].append_value(entry.invocation.to_string());
            created.append_value(i64::try_from(entry.created_at_ms).unwrap_or(i64::MAX));
            attempts.append_value(entry.attempts);
            deployment.append_option(entry.deployment.map(|d| d.to_string()));
        }
        let [id, stage, state, kind, entry] = text.map(|mut b| Arc::new(b.finish()) as ArrayRef);
        batch(
            &vqueues_schema(),
            vec![
                Arc::new(partition.finish()),
                id,
                stage,
                state,
                Arc::new(has_lock.finish()),
                Arc::new(run_at.finish()),
                kind,
                entry,
                Arc::new(created.finish()),
                Arc::new(attempts.finish()),
                Arc::new(deployment.finish()),
            ],
        )
    })
}

pub(super) fn vqueue_meta_schema() -> SchemaRef {
    schema(
        vec![
            ("partition_key", DataType::UInt64, false),
            ("id", DataType::Utf8, false),
            ("service_name", DataType::Utf8, false),
            ("scope", DataType::Utf8, true),
            ("limit_key", DataType::Utf8, true),
            ("lock_name", DataType::Utf8, true),
            ("is_active", DataType::Boolean, false),
            ("queue_is_paused", DataType::Boolean, false),
            ("num_inbox", DataType::UInt64, false),
            ("num_scheduled", DataType::UInt64, false),
            ("created_at", timestamp(), false),
            ("last_enqueued_at", timestamp(), true),
            ("last_start_at", timestamp(), true),
            ("last_attempt_at", timestamp(), true),
            ("num_running", DataType::UInt64, false),
            ("num_suspended", DataType::UInt64, false),
            ("num_paused", DataType::UInt64, false),
            ("num_finished", DataType::UInt64, false),
        ]
        .into_iter()
        .chain(
            untracked_vqueue_meta_columns()
                .into_iter()
                .map(|(n, t)| (n, t, true)),
        )
        .chain([("drain_per_second", DataType::Float64, true)])
        .collect(),
    )
}

/// Columns of the reference's `sys_vqueue_meta` that Sluice's queues do not keep (a queue holds
/// only what waits in it, not what ran from it): present, so the `restate` CLI's
/// `vqueues list|describe` and queries written for the reference run; always null.
fn untracked_vqueue_meta_columns() -> Vec<(&'static str, DataType)> {
    let mut columns = vec![("last_finish_at", timestamp())];
    for name in [
        "avg_queue_duration",
        "avg_inbox_duration",
        "avg_run_duration",
        "avg_suspension_duration",
        "avg_end_to_end_duration",
        "avg_blocked_on_concurrency_rules",
        "avg_blocked_on_invoker_concurrency",
        "avg_blocked_on_invoker_throttling",
        "avg_blocked_on_lock",
    ] {
        columns.push((name, DataType::Duration(TimeUnit::Millisecond)));
    }
    columns
}

pub(super) fn vqueue_meta(sources: &Arc<QuerySources>) -> Reader {
    scanned(sources, |sources, scan| async move {
        if scan.counts_only() {
            return counted_queues(&sources, &scan).await;
        }
        let queues = queues(&sources, scan).await?;
        let mut partition = UInt64Builder::new();
        let mut text: [StringBuilder; 5] = std::array::from_fn(|_| StringBuilder::new());
        let (mut active, mut paused) = (BooleanBuilder::new(), BooleanBuilder::new());
        let (mut inbox, mut scheduled) = (UInt64Builder::new(), UInt64Builder::new());
        let mut times: [TimestampMillisecondBuilder; 4] =
            std::array::from_fn(|_| TimestampMillisecondBuilder::new().with_timezone("UTC"));
        for (index, q) in &queues {
            partition.append_value(*index);
            text[0].append_value(
                sluice_core::ids::VQueueId {
                    partition: *index,
                    queue: q.id.index(),
                }
                .to_string(),
            );
            text[1].append_value(&*q.key.service);
            text[2].append_option(q.key.scope.as_ref().map(|s| s.as_str()));
            text[3].append_option(q.key.limit_key.as_ref().map(|k| k.as_str()));
            text[4].append_option(q.key.object_key.as_deref());
            active.append_value(q.status != QueueStatus::Empty);
            paused.append_value(q.status == QueueStatus::Paused);
            inbox.append_value(q.queued as u64);
            scheduled.append_value(u64::from(q.delayed));
            let at = |ms: u64| (ms > 0).then(|| i64::try_from(ms).unwrap_or(i64::MAX));
            times[0].append_value(i64::try_from(q.times.created_at).unwrap_or(i64::MAX));
            times[1].append_option(at(q.times.last_enqueued_at));
            times[2].append_option(at(q.times.last_start_at));
            times[3].append_option(at(q.times.last_attempt_at));
        }
        let [created, enqueued, started, attempted] =
            times.map(|mut b| Arc::new(b.finish()) as ArrayRef);
        let stage = |count: fn(&sluice_flow::scheduler::StageCounts) -> u64| {
            Arc::new(UInt64Array::from_iter_values(
                queues.iter().map(|(_, q)| count(&q.stages)),
            )) as ArrayRef
        };
        let [id, service, scope, limit_key, lock] =
            text.map(|mut b| Arc::new(b.finish()) as ArrayRef);
        batch(
            &vqueue_meta_schema(),
            [
                Arc::new(partition.finish()) as ArrayRef,
                id,
                service,
                scope,
                limit_key,
                lock,
                Arc::new(active.finish()),
                Arc::new(paused.finish()),
                Arc::new(inbox.finish()),
                Arc::new(scheduled.finish()),
                created,
                enqueued,
                started,
                attempted,
                stage(|s| s.running),
                stage(|s| s.suspended),
                stage(|s| s.paused),
                stage(|s| s.finished),
            ]
            .into_iter()
            .chain(
                untracked_vqueue_meta_columns()
                    .into_iter()
                    .map(|(_, ty)| datafusion::arrow::array::new_null_array(&ty, queues.len())),
            )
            .chain([Arc::new(Float64Array::from_iter(
                queues
                    .iter()
                    .map(|(_, q)| q.drain_gap_ms.map(|gap| 1000.0 / gap as f64)),
            )) as ArrayRef])
            .collect(),
        )
    })
}
