//! Invocations and what hangs off them: journals, object state, object locks.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, StringBuilder, TimestampMillisecondArray, TimestampMillisecondBuilder, UInt32Builder,
    UInt64Builder, new_null_array,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};

use super::{
    QuerySources, Reader, batch, counted, internal, read_store, reader, scanned, schema,
    service_type_name, timestamp,
};
use sluice_store::invocation::ListedRecord;
use sluice_store::invocation::store as invocations;

pub(super) fn locks_schema() -> SchemaRef {
    schema(vec![
        ("scope", DataType::Utf8, true),
        ("partition_key", DataType::UInt64, false),
        ("service_name", DataType::Utf8, false),
        ("service_key", DataType::Utf8, false),
        ("lock_name", DataType::Utf8, false),
        ("acquired_by", DataType::Utf8, false),
        // When the holder took it; for a lock held across a restart, when it was claimed back.
        ("acquired_at", timestamp(), true),
    ])
}

pub(super) fn locks(sources: &Arc<QuerySources>) -> Reader {
    reader(sources, |sources| async move {
        let held = sources.runtime.locks().await.map_err(internal)?;
        let mut partition = UInt64Builder::new();
        let mut text: [StringBuilder; 5] = std::array::from_fn(|_| StringBuilder::new());
        for (index, lock) in &held {
            partition.append_value(*index);
            text[0].append_option(lock.scope.as_deref());
            text[1].append_value(&lock.service);
            text[2].append_value(&lock.key);
            text[3].append_value(format!("{}/{}", lock.service, lock.key));
            text[4].append_value(lock.holder.to_string());
        }
        let [scope, service, key, name, holder] =
            text.map(|mut b| Arc::new(b.finish()) as ArrayRef);
        batch(
            &locks_schema(),
            vec![
                scope,
                Arc::new(partition.finish()),
                service,
                key,
                name,
                holder,
                Arc::new(
                    TimestampMillisecondArray::from_iter(held.iter().map(|(_, lock)| {
                        (lock.acquired_at_ms > 0)
                            .then(|| i64::try_from(lock.acquired_at_ms).unwrap_or(i64::MAX))
                    }))
                    .with_timezone("UTC"),
                ),
            ],
        )
    })
}

pub(super) fn state_schema() -> SchemaRef {
    schema(vec![
        ("partition_key", DataType::UInt64, false),
        ("scope", DataType::Utf8, true),
        ("service_name", DataType::Utf8, false),
        ("service_key", DataType::Utf8, false),
        ("key", DataType::Utf8, false),
        ("key_length", DataType::UInt64, false),
        ("value_utf8", DataType::Utf8, true),
        ("value", DataType::Utf8, false),
        ("value_length", DataType::UInt64, false),
    ])
}

pub(super) fn state(sources: &Arc<QuerySources>) -> Reader {
    reader(sources, |sources| async move {
        let rows = read_store(&sources, sluice_store::invocation::state::scan).await?;
        let mut partition = UInt64Builder::new();
        let mut text: [StringBuilder; 6] = std::array::from_fn(|_| StringBuilder::new());
        let (mut key_length, mut value_length) = (UInt64Builder::new(), UInt64Builder::new());
        for row in &rows {
            // Where the object lives: a scoped object on its scope's partition.
            partition.append_value(if row.scope.is_empty() {
                sluice_store::invocation::identity::partition_key(&[&row.service, &row.key])
            } else {
                sluice_store::invocation::identity::partition_key(&[&row.scope])
            });
            text[0].append_option((!row.scope.is_empty()).then_some(row.scope.as_str()));
            text[1].append_value(&row.service);
            text[2].append_value(&row.key);
            text[3].append_value(String::from_utf8_lossy(&row.name));
            key_length.append_value(row.name.len() as u64);
            text[4].append_option(std::str::from_utf8(&row.value).ok());
            text[5].append_value(
                row.value
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>(),
            );
            value_length.append_value(row.value.len() as u64);
        }
        let [scope, service, object, key, utf8, hex] =
            text.map(|mut b| Arc::new(b.finish()) as ArrayRef);
        batch(
            &state_schema(),
            vec![
                Arc::new(partition.finish()),
                scope,
                service,
                object,
                key,
                Arc::new(key_length.finish()),
                utf8,
                hex,
                Arc::new(value_length.finish()),
            ],
        )
    })
}

pub(super) fn invocation_schema() -> SchemaRef {
    schema(
        vec![
            ("id", DataType::Utf8, false),
            ("target", DataType::Utf8, false),
            ("target_service_name", DataType::Utf8, false),
            ("target_service_key", DataType::Utf8, true),
            ("target_handler_name", DataType::Utf8, false),
            ("scope", DataType::Utf8, true),
            ("limit_key", DataType::Utf8, true),
            ("idempotency_key", DataType::Utf8, true),
            ("invoked_by_id", DataType::Utf8, true),
            ("status", DataType::Utf8, false),
            ("pinned_deployment_id", DataType::Utf8, true),
            ("pinned_service_protocol_version", DataType::UInt32, true),
            ("retry_count", DataType::UInt64, false),
            ("attempts", DataType::UInt64, false),
            ("last_failure", DataType::Utf8, true),
            ("last_failure_error_code", DataType::Utf8, true),
            ("completion_result", DataType::Utf8, true),
            ("created_at", timestamp(), false),
            ("scheduled_at", timestamp(), true),
            ("target_service_ty", DataType::Utf8, true),
            ("invoked_by", DataType::Utf8, false),
            ("last_attempt_deployment_id", DataType::Utf8, true),
            // What it spent by its handler's reports (`sluice:cost` runs), once completed.
            ("cost", DataType::UInt64, true),
        ]
        .into_iter()
        .chain(
            untracked_invocation_columns()
                .into_iter()
                .map(|(n, t)| (n, t, true)),
        )
        .collect(),
    )
}

/// Columns of the reference's `sys_invocation` that Sluice does not track: present (so the
/// `restate` CLI's queries run), always null.
pub(super) fn untracked_invocation_columns() -> Vec<(&'static str, DataType)> {
    vec![
        ("modified_at", timestamp()),
        ("inboxed_at", timestamp()),
        ("running_at", timestamp()),
        ("completed_at", timestamp()),
        ("next_retry_at", timestamp()),
        ("last_start_at", timestamp()),
        ("vqueue_id", DataType::Utf8),
        ("invoked_by_service_name", DataType::Utf8),
        ("invoked_by_target", DataType::Utf8),
        ("trace_id", DataType::Utf8),
        ("journal_size", DataType::UInt32),
        ("journal_commands_size", DataType::UInt32),
        ("last_attempt_server", DataType::Utf8),
        ("last_failure_related_entry_index", DataType::UInt64),
        ("last_failure_related_entry_name", DataType::Utf8),
        ("last_failure_related_entry_type", DataType::Utf8),
        ("last_failure_related_command_index", DataType::UInt64),
        ("last_failure_related_command_name", DataType::Utf8),
        ("last_failure_related_command_type", DataType::Utf8),
        ("completion_failure", DataType::Utf8),
        ("created_using_restate_version", DataType::Utf8),
    ]
}

pub(super) fn invocation(sources: &Arc<QuerySources>) -> Reader {
    scanned(sources, |sources, scan| async move {
        // Every record of the scope and key a query names, none of their outputs (the table
        // shows only the outcome's kind); only how many when the query reads no column. A
        // scope or key named is read through the index by scope and key: its records alone.
        let (scope, limit_key) = (scan.scope.clone(), scan.limit_key.clone());
        if scan.counts_only() {
            let n = read_store(&sources, move |db| match (&scope, &limit_key) {
                (None, None) => invocations::count_all(db),
                (scope, key) => invocations::count_named(db, scope.as_deref(), key.as_deref()),
            })
            .await?;
            return counted(scan.rows_of(n));
        }
        let records = read_store(&sources, move |db| match (&scope, &limit_key) {
            (None, None) => invocations::load_listed(db, |_| true, usize::MAX),
            (scope, key) => invocations::load_named(db, scope.as_deref(), key.as_deref()),
        })
        .await?;
        let service_ty = service_types(&sources, &records);
        let [
            id,
            target,
            service,
            key,
            handler,
            scope,
            limit_key,
            ik,
            by,
            status,
            pinned,
        ] = named_columns(&records);
        let [failure, code, completion] = outcome_columns(&records);
        let mut protocol = UInt32Builder::new();
        let (mut retries, mut attempts) = (UInt64Builder::new(), UInt64Builder::new());
        let mut cost = UInt64Builder::new();
        let mut created = TimestampMillisecondBuilder::new().with_timezone("UTC");
        let mut scheduled = TimestampMillisecondBuilder::new().with_timezone("UTC");
        let (mut invoked_by, mut last_deployment) = (StringBuilder::new(), StringBuilder::new());
        for r in &records {
            protocol.append_option(r.protocol.and_then(|v| u32::try_from(v).ok()));
            retries.append_value(u64::from(r.retry_count));
            attempts.append_value(u64::from(r.attempts));
            created.append_value(i64::try_from(r.created_at_ms).unwrap_or(i64::MAX));
            scheduled.append_option(r.run_at_ms.and_then(|at| i64::try_from(at).ok()));
            invoked_by.append_value(if r.caller.is_some() {
                "service"
            } else {
                "ingress"
            });
            last_deployment.append_option(r.deployment.map(|d| d.to_string()));
            cost.append_option(r.cost);
        }
        batch(
            &invocation_schema(),
            vec![
                id,
                target,
                service,
                key,
                handler,
                scope,
                limit_key,
                ik,
                by,
                status,
                pinned,
                Arc::new(protocol.finish()),
                Arc::new(retries.finish()),
                Arc::new(attempts.finish()),
                failure,
                code,
                completion,
                Arc::new(created.finish()),
                Arc::new(scheduled.finish()),
                service_ty,
                Arc::new(invoked_by.finish()),
                Arc::new(last_deployment.finish()),
                Arc::new(cost.finish()),
            ]
            .into_iter()
            .chain(
                untracked_invocation_columns()
                    .iter()
                    .map(|(_, ty)| new_null_array(ty, records.len())),
            )
            .collect(),
        )
    })
}

/// Each record's service type, looked up once per service, not once per row.
fn service_types(sources: &QuerySources, records: &[ListedRecord]) -> ArrayRef {
    let mut types = std::collections::HashMap::new();
    let mut column = StringBuilder::new();
    for r in records {
        let ty = types.entry(r.target.service.as_str()).or_insert_with(|| {
            sources
                .registry
                .service(&r.target.service)
                .ok()
                .map(|(s, _)| service_type_name(s.ty))
        });
        column.append_option(*ty);
    }
    Arc::new(column.finish())
}

/// The columns that name an invocation, its target, scope and key, who called it, its status
/// and the deployment it is pinned to.
fn named_columns(records: &[ListedRecord]) -> [ArrayRef; 11] {
    let mut text: [StringBuilder; 11] = std::array::from_fn(|_| StringBuilder::new());
    for r in records {
        text[0].append_value(r.id.to_string());
        text[1].append_value(r.target.path());
        text[2].append_value(&r.target.service);
        text[3].append_option(r.target.key.as_deref());
        text[4].append_value(&r.target.handler);
        text[5].append_option(r.scope.as_ref().map(|s| s.as_str()));
        text[6].append_option(r.limit_key.as_ref().map(|k| k.as_str()));
        text[7].append_option(r.idempotency_key.as_deref());
        text[8].append_option(r.caller.as_ref().map(|c| c.id.to_string()));
        text[9].append_value(r.status.name());
        text[10].append_option(r.deployment.map(|d| d.to_string()));
    }
    text.map(|mut b| Arc::new(b.finish()) as ArrayRef)
}

/// The last failure's message and code, and the kind of outcome.
fn outcome_columns(records: &[ListedRecord]) -> [ArrayRef; 3] {
    let mut text: [StringBuilder; 3] = std::array::from_fn(|_| StringBuilder::new());
    for r in records {
        let failure = r.last_failure.as_ref();
        text[0].append_option(failure.map(|f| f.message.as_str()));
        text[1].append_option(failure.and_then(|f| f.code.as_deref()));
        let outcome = r.outcome.as_ref();
        text[2].append_option(outcome.map(sluice_store::invocation::Summary::summary));
    }
    text.map(|mut b| Arc::new(b.finish()) as ArrayRef)
}
