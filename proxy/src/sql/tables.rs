//! The system tables: their columns (named as the reference server names them) and how their
//! rows are read.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, RecordBatch, StringBuilder, TimestampMillisecondBuilder,
    UInt32Builder, UInt64Builder, new_null_array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::error::{DataFusionError, Result};

use super::QuerySources;
use super::table::{Reader, SnapshotTable};
use crate::flow::Level;
use crate::flow::scheduler::BlockedOn;
use crate::invocation::store as invocations;
use crate::registry::Address;

fn timestamp() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
}

fn schema(fields: Vec<(&str, DataType, bool)>) -> SchemaRef {
    Arc::new(Schema::new(
        fields
            .into_iter()
            .map(|(name, ty, nullable)| Field::new(name, ty, nullable))
            .collect::<Vec<_>>(),
    ))
}

fn batch(schema: &SchemaRef, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
    RecordBatch::try_new(Arc::clone(schema), columns).map_err(DataFusionError::from)
}

fn internal(e: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(e.to_string())
}

fn service_type_name(ty: crate::discovery::manifest::ServiceType) -> &'static str {
    use crate::discovery::manifest::ServiceType;
    match ty {
        ServiceType::Service => "service",
        ServiceType::VirtualObject => "virtual_object",
        ServiceType::Workflow => "workflow",
    }
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Scope => "Scope",
        Level::L1 => "Level1",
        Level::L2 => "Level2",
    }
}

/// Every table, registered by name. The flow-control tables refuse to be read while flow
/// control is off.
pub fn all(sources: &Arc<QuerySources>) -> Vec<(&'static str, SnapshotTable)> {
    let flow = sources.config.flow_control_enabled();
    let flow_table = |name: &'static str, schema: SchemaRef, reader: Reader| {
        if flow {
            SnapshotTable::new(name, schema, reader)
        } else {
            SnapshotTable::unavailable(
                name,
                schema,
                format!(
                    "{name} exists only when flow control is enabled: set experimental-enable-protocol-v7 and experimental-enable-vqueues to true"
                ),
            )
        }
    };
    vec![
        (
            "sys_rules",
            flow_table("sys_rules", rules_schema(), rules(sources)),
        ),
        (
            "sys_user_limits",
            flow_table(
                "sys_user_limits",
                user_limits_schema(),
                user_limits(sources),
            ),
        ),
        (
            "sys_scheduler",
            flow_table("sys_scheduler", scheduler_schema(), scheduler(sources)),
        ),
        (
            "sys_vqueues",
            flow_table("sys_vqueues", vqueues_schema(), vqueues(sources)),
        ),
        (
            "sys_vqueue_meta",
            flow_table(
                "sys_vqueue_meta",
                vqueue_meta_schema(),
                vqueue_meta(sources),
            ),
        ),
        (
            "sys_invocation",
            SnapshotTable::new("sys_invocation", invocation_schema(), invocation(sources)),
        ),
        (
            "sys_deployment",
            SnapshotTable::new("sys_deployment", deployment_schema(), deployment(sources)),
        ),
        (
            "sys_service",
            SnapshotTable::new("sys_service", service_schema(), service(sources)),
        ),
        (
            "sys_journal",
            SnapshotTable::new("sys_journal", journal_schema(), journal(sources)),
        ),
        (
            "state",
            SnapshotTable::new("state", state_schema(), state(sources)),
        ),
        (
            "sys_locks",
            SnapshotTable::new("sys_locks", locks_schema(), locks(sources)),
        ),
    ]
}

/// Runs `read` against the store off the async threads.
async fn read_store<T: Send + 'static>(
    sources: &QuerySources,
    read: fn(&redb::Database) -> Result<T, crate::errors::CodedError>,
) -> Result<T> {
    let store = Arc::clone(&sources.store);
    tokio::task::spawn_blocking(move || store.with_db(read))
        .await
        .map_err(internal)?
        .map_err(internal)?
        .map_err(internal)
}

fn locks_schema() -> SchemaRef {
    schema(vec![
        ("scope", DataType::Utf8, true),
        ("partition_key", DataType::UInt64, false),
        ("service_name", DataType::Utf8, false),
        ("service_key", DataType::Utf8, false),
        ("lock_name", DataType::Utf8, false),
        ("acquired_by", DataType::Utf8, false),
    ])
}

fn locks(sources: &Arc<QuerySources>) -> Reader {
    let sources = Arc::clone(sources);
    Arc::new(move || {
        let sources = Arc::clone(&sources);
        Box::pin(async move {
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
                ],
            )
        })
    })
}

fn journal_schema() -> SchemaRef {
    schema(vec![
        ("id", DataType::Utf8, false),
        ("index", DataType::UInt32, false),
        ("entry_type", DataType::Utf8, false),
        ("entry_type_id", DataType::UInt32, false),
        ("payload_length", DataType::UInt64, false),
    ])
}

fn journal(sources: &Arc<QuerySources>) -> Reader {
    let sources = Arc::clone(sources);
    Arc::new(move || {
        let sources = Arc::clone(&sources);
        Box::pin(async move {
            let entries = read_store(&sources, invocations::scan_journal).await?;
            let (mut id, mut entry_type) = (StringBuilder::new(), StringBuilder::new());
            let (mut index, mut type_id) = (UInt32Builder::new(), UInt32Builder::new());
            let mut length = UInt64Builder::new();
            for (invocation, i, ty, len) in entries {
                id.append_value(invocation.to_string());
                index.append_value(i);
                entry_type.append_value(
                    crate::protocol::MessageType::from_id(ty).map_or("Unknown", |t| t.name()),
                );
                type_id.append_value(u32::from(ty));
                length.append_value(len as u64);
            }
            batch(
                &journal_schema(),
                vec![
                    Arc::new(id.finish()),
                    Arc::new(index.finish()),
                    Arc::new(entry_type.finish()),
                    Arc::new(type_id.finish()),
                    Arc::new(length.finish()),
                ],
            )
        })
    })
}

fn state_schema() -> SchemaRef {
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

fn state(sources: &Arc<QuerySources>) -> Reader {
    let sources = Arc::clone(sources);
    Arc::new(move || {
        let sources = Arc::clone(&sources);
        Box::pin(async move {
            let rows = read_store(&sources, crate::invocation::state::scan).await?;
            let mut partition = UInt64Builder::new();
            let mut text: [StringBuilder; 6] = std::array::from_fn(|_| StringBuilder::new());
            let (mut key_length, mut value_length) = (UInt64Builder::new(), UInt64Builder::new());
            for row in &rows {
                partition.append_value(crate::partition::partition_key(&[&row.service, &row.key]));
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
    })
}

fn rules_schema() -> SchemaRef {
    schema(vec![
        ("pattern", DataType::Utf8, false),
        ("concurrency", DataType::UInt32, true),
        ("description", DataType::Utf8, true),
        ("disabled", DataType::Boolean, false),
        ("version", DataType::UInt32, false),
        ("last_modified", timestamp(), false),
    ])
}

fn rules(sources: &Arc<QuerySources>) -> Reader {
    let sources = Arc::clone(sources);
    Arc::new(move || {
        let sources = Arc::clone(&sources);
        Box::pin(async move {
            let book = sources.rules.book();
            let mut rules: Vec<_> = book.rules().collect();
            rules.sort_by_key(|r| r.pattern.to_string());
            let (mut pattern, mut concurrency, mut description) = (
                StringBuilder::new(),
                UInt32Builder::new(),
                StringBuilder::new(),
            );
            let (mut disabled, mut version) = (BooleanBuilder::new(), UInt32Builder::new());
            let mut modified = TimestampMillisecondBuilder::new().with_timezone("UTC");
            for rule in rules {
                pattern.append_value(rule.pattern.to_string());
                concurrency.append_option(rule.limit.concurrency());
                description.append_option(rule.description.as_deref());
                disabled.append_value(rule.disabled);
                version.append_value(rule.version);
                modified.append_value(i64::try_from(rule.last_modified_ms).unwrap_or(i64::MAX));
            }
            batch(
                &rules_schema(),
                vec![
                    Arc::new(pattern.finish()),
                    Arc::new(concurrency.finish()),
                    Arc::new(description.finish()),
                    Arc::new(disabled.finish()),
                    Arc::new(version.finish()),
                    Arc::new(modified.finish()),
                ],
            )
        })
    })
}

fn user_limits_schema() -> SchemaRef {
    schema(vec![
        ("partition_key", DataType::UInt64, false),
        ("scope", DataType::Utf8, false),
        ("l1", DataType::Utf8, true),
        ("l2", DataType::Utf8, true),
        ("level", DataType::Utf8, false),
        ("usage", DataType::UInt32, false),
        ("concurrency_limit", DataType::UInt32, true),
        ("rule_pattern", DataType::Utf8, true),
        ("available", DataType::UInt32, true),
        ("num_waiters", DataType::UInt64, false),
    ])
}

fn user_limits(sources: &Arc<QuerySources>) -> Reader {
    let sources = Arc::clone(sources);
    Arc::new(move || {
        let sources = Arc::clone(&sources);
        Box::pin(async move {
            let counters = sources.runtime.counters().await.map_err(internal)?;
            let mut partition = UInt64Builder::new();
            let (mut scope, mut l1, mut l2, mut level) = (
                StringBuilder::new(),
                StringBuilder::new(),
                StringBuilder::new(),
                StringBuilder::new(),
            );
            let (mut usage, mut limit, mut available) = (
                UInt32Builder::new(),
                UInt32Builder::new(),
                UInt32Builder::new(),
            );
            let (mut rule, mut waiters) = (StringBuilder::new(), UInt64Builder::new());
            for c in &counters {
                partition.append_value(crate::partition::partition_key(&[&c.scope]));
                scope.append_value(&c.scope);
                l1.append_option(c.l1.as_deref());
                l2.append_option(c.l2.as_deref());
                level.append_value(level_name(c.level));
                usage.append_value(c.usage);
                limit.append_option(c.limit.concurrency());
                rule.append_option(c.rule.as_ref().map(|p| p.to_string()));
                available.append_option(c.limit.concurrency().map(|_| c.available));
                waiters.append_value(c.waiters as u64);
            }
            batch(
                &user_limits_schema(),
                vec![
                    Arc::new(partition.finish()),
                    Arc::new(scope.finish()),
                    Arc::new(l1.finish()),
                    Arc::new(l2.finish()),
                    Arc::new(level.finish()),
                    Arc::new(usage.finish()),
                    Arc::new(limit.finish()),
                    Arc::new(rule.finish()),
                    Arc::new(available.finish()),
                    Arc::new(waiters.finish()),
                ],
            )
        })
    })
}

fn scheduler_schema() -> SchemaRef {
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
fn blocked(on: &BlockedOn, scope: Option<&str>, limit_key: Option<&str>) -> (String, String) {
    match on {
        BlockedOn::Lock => ("lock".into(), r#"{"type":"lock"}"#.into()),
        BlockedOn::InvokerConcurrency => (
            "invoker-concurrency".into(),
            r#"{"type":"invoker-concurrency"}"#.into(),
        ),
        BlockedOn::LimitKeyConcurrency { level, limit, rule } => {
            let json = serde_json::json!({
                "type": "limit-key-concurrency",
                "scope": scope,
                "limit_key": limit_key,
                "level": level_name(*level),
                "limit": limit.concurrency(),
                "rule": rule.as_ref().map(|p| p.to_string()),
            });
            ("limit-key-concurrency".into(), json.to_string())
        }
    }
}

fn scheduler(sources: &Arc<QuerySources>) -> Reader {
    let sources = Arc::clone(sources);
    Arc::new(move || {
        let sources = Arc::clone(&sources);
        Box::pin(async move {
            let queues = sources.runtime.queues().await.map_err(internal)?;
            let mut partition = UInt64Builder::new();
            let mut text: [StringBuilder; 8] = std::array::from_fn(|_| StringBuilder::new());
            let (mut inbox, mut scheduled) = (UInt64Builder::new(), UInt64Builder::new());
            let mut since = TimestampMillisecondBuilder::new().with_timezone("UTC");
            for (index, q) in &queues {
                let scope = q.key.scope.as_ref().map(|s| s.as_str());
                let limit_key = q.key.limit_key.as_ref().map(|k| k.to_string());
                partition.append_value(*index);
                text[0].append_value(format!("vq_{index}_{}", q.id.index()));
                text[1].append_option(scope);
                text[2].append_option(limit_key.as_deref());
                text[3].append_value(&*q.key.service);
                text[4].append_option(q.key.object_key.as_deref());
                text[5].append_value(q.status);
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
    })
}

fn vqueues_schema() -> SchemaRef {
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
    ])
}

/// The waiting invocations, one row each, with their queue's status.
fn vqueues(sources: &Arc<QuerySources>) -> Reader {
    let sources = Arc::clone(sources);
    Arc::new(move || {
        let sources = Arc::clone(&sources);
        Box::pin(async move {
            let queued = sources.runtime.queued().await.map_err(internal)?;
            let status: std::collections::HashMap<(u64, u32), (&'static str, bool)> = sources
                .runtime
                .queues()
                .await
                .map_err(internal)?
                .into_iter()
                .map(|(p, q)| ((p, q.id.index()), (q.status, q.key.object_key.is_some())))
                .collect();
            let mut partition = UInt64Builder::new();
            let mut text: [StringBuilder; 5] = std::array::from_fn(|_| StringBuilder::new());
            let mut has_lock = BooleanBuilder::new();
            let mut run_at = TimestampMillisecondBuilder::new().with_timezone("UTC");
            let mut created = TimestampMillisecondBuilder::new().with_timezone("UTC");
            let mut attempts = UInt32Builder::new();
            for (index, entry) in &queued {
                let queue = entry.queue.index();
                let (state, locked) = status
                    .get(&(*index, queue))
                    .copied()
                    .unwrap_or(("ready", false));
                partition.append_value(*index);
                text[0].append_value(format!("vq_{index}_{queue}"));
                text[1].append_value("inbox");
                text[2].append_value(state);
                has_lock.append_value(locked);
                run_at.append_option(entry.run_at_ms.and_then(|at| i64::try_from(at).ok()));
                text[3].append_value("invocation");
                text[4].append_value(entry.invocation.to_string());
                created.append_value(i64::try_from(entry.created_at_ms).unwrap_or(i64::MAX));
                attempts.append_value(entry.attempts);
            }
            let [id, stage, state, kind, entry] =
                text.map(|mut b| Arc::new(b.finish()) as ArrayRef);
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
                ],
            )
        })
    })
}

fn vqueue_meta_schema() -> SchemaRef {
    schema(vec![
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
    ])
}

fn vqueue_meta(sources: &Arc<QuerySources>) -> Reader {
    let sources = Arc::clone(sources);
    Arc::new(move || {
        let sources = Arc::clone(&sources);
        Box::pin(async move {
            let queues = sources.runtime.queues().await.map_err(internal)?;
            let mut partition = UInt64Builder::new();
            let mut text: [StringBuilder; 5] = std::array::from_fn(|_| StringBuilder::new());
            let (mut active, mut paused) = (BooleanBuilder::new(), BooleanBuilder::new());
            let (mut inbox, mut scheduled) = (UInt64Builder::new(), UInt64Builder::new());
            for (index, q) in &queues {
                partition.append_value(*index);
                text[0].append_value(format!("vq_{index}_{}", q.id.index()));
                text[1].append_value(&*q.key.service);
                text[2].append_option(q.key.scope.as_ref().map(|s| s.as_str()));
                text[3].append_option(q.key.limit_key.as_ref().map(|k| k.as_str()));
                text[4].append_option(q.key.object_key.as_deref());
                active.append_value(q.status != "empty");
                paused.append_value(false);
                inbox.append_value(q.queued as u64);
                scheduled.append_value(u64::from(q.delayed));
            }
            let [id, service, scope, limit_key, lock] =
                text.map(|mut b| Arc::new(b.finish()) as ArrayRef);
            batch(
                &vqueue_meta_schema(),
                vec![
                    Arc::new(partition.finish()),
                    id,
                    service,
                    scope,
                    limit_key,
                    lock,
                    Arc::new(active.finish()),
                    Arc::new(paused.finish()),
                    Arc::new(inbox.finish()),
                    Arc::new(scheduled.finish()),
                ],
            )
        })
    })
}

fn invocation_schema() -> SchemaRef {
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
fn untracked_invocation_columns() -> Vec<(&'static str, DataType)> {
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

fn invocation(sources: &Arc<QuerySources>) -> Reader {
    let sources = Arc::clone(sources);
    Arc::new(move || {
        let sources = Arc::clone(&sources);
        Box::pin(async move {
            let store = Arc::clone(&sources.store);
            let records =
                tokio::task::spawn_blocking(move || store.with_db(invocations::load_records))
                    .await
                    .map_err(internal)?
                    .map_err(internal)?
                    .map_err(internal)?;
            let mut text: [StringBuilder; 15] = std::array::from_fn(|_| StringBuilder::new());
            let mut protocol = UInt32Builder::new();
            let (mut retries, mut attempts) = (UInt64Builder::new(), UInt64Builder::new());
            let mut created = TimestampMillisecondBuilder::new().with_timezone("UTC");
            let mut scheduled = TimestampMillisecondBuilder::new().with_timezone("UTC");
            let (mut service_ty, mut invoked_by, mut last_deployment) = (
                StringBuilder::new(),
                StringBuilder::new(),
                StringBuilder::new(),
            );
            for r in &records {
                let shown = crate::admin::invocations::InvocationResponse::from(r);
                text[0].append_value(&shown.id);
                text[1].append_value(&shown.target);
                text[2].append_value(&shown.service);
                text[3].append_option(shown.key.as_deref());
                text[4].append_value(&shown.handler);
                text[5].append_option(r.scope.as_deref());
                text[6].append_option(r.limit_key.as_deref());
                text[7].append_option(r.idempotency_key.as_deref());
                text[8].append_option(r.caller.as_ref().map(|c| c.id.to_string()));
                text[9].append_value(&shown.status);
                text[10].append_option(shown.deployment_id.as_deref());
                protocol.append_option(shown.protocol_version.and_then(|v| u32::try_from(v).ok()));
                retries.append_value(u64::from(shown.retry_count));
                attempts.append_value(u64::from(shown.attempts));
                text[11].append_option(shown.last_failure.as_deref());
                text[12].append_option(shown.last_failure_error_code.as_deref());
                text[13].append_option(shown.completion.as_deref());
                text[14].append_null();
                created.append_value(i64::try_from(r.created_at_ms).unwrap_or(i64::MAX));
                scheduled.append_option(r.run_at_ms.and_then(|at| i64::try_from(at).ok()));
                service_ty.append_option(
                    sources
                        .registry
                        .service(&r.target.service)
                        .ok()
                        .map(|(s, _)| service_type_name(s.ty)),
                );
                invoked_by.append_value(if r.caller.is_some() {
                    "service"
                } else {
                    "ingress"
                });
                last_deployment.append_option(shown.deployment_id.as_deref());
            }
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
                failure,
                code,
                completion,
                _,
            ] = text.map(|mut b| Arc::new(b.finish()) as ArrayRef);
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
                    Arc::new(service_ty.finish()),
                    Arc::new(invoked_by.finish()),
                    Arc::new(last_deployment.finish()),
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
    })
}

fn deployment_schema() -> SchemaRef {
    schema(vec![
        ("id", DataType::Utf8, false),
        ("ty", DataType::Utf8, false),
        ("endpoint", DataType::Utf8, false),
        ("created_at", timestamp(), false),
        ("min_service_protocol_version", DataType::UInt32, false),
        ("max_service_protocol_version", DataType::UInt32, false),
        ("services", DataType::Utf8, false),
    ])
}

fn deployment(sources: &Arc<QuerySources>) -> Reader {
    let sources = Arc::clone(sources);
    Arc::new(move || {
        let sources = Arc::clone(&sources);
        Box::pin(async move {
            let mut text: [StringBuilder; 4] = std::array::from_fn(|_| StringBuilder::new());
            let (mut min, mut max) = (UInt32Builder::new(), UInt32Builder::new());
            let mut created = TimestampMillisecondBuilder::new().with_timezone("UTC");
            for d in sources.registry.deployments() {
                let (ty, endpoint) = match &d.address {
                    Address::Http { uri, .. } => ("http", uri.as_str()),
                    Address::Lambda { arn, .. } => ("lambda", arn.as_str()),
                };
                text[0].append_value(d.id.to_string());
                text[1].append_value(ty);
                text[2].append_value(endpoint);
                let names: Vec<&str> = d
                    .manifest
                    .services
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect();
                text[3].append_value(names.join(","));
                created.append_value(i64::try_from(d.created_at_ms).unwrap_or(i64::MAX));
                min.append_value(u32::try_from(d.min_protocol_version).unwrap_or(0));
                max.append_value(u32::try_from(d.max_protocol_version).unwrap_or(0));
            }
            let [id, ty, endpoint, services] = text.map(|mut b| Arc::new(b.finish()) as ArrayRef);
            batch(
                &deployment_schema(),
                vec![
                    id,
                    ty,
                    endpoint,
                    Arc::new(created.finish()),
                    Arc::new(min.finish()),
                    Arc::new(max.finish()),
                    services,
                ],
            )
        })
    })
}

fn service_schema() -> SchemaRef {
    schema(vec![
        ("name", DataType::Utf8, false),
        ("revision", DataType::UInt32, false),
        ("public", DataType::Boolean, false),
        ("ty", DataType::Utf8, false),
        ("deployment_id", DataType::Utf8, false),
    ])
}

fn service(sources: &Arc<QuerySources>) -> Reader {
    let sources = Arc::clone(sources);
    Arc::new(move || {
        let sources = Arc::clone(&sources);
        Box::pin(async move {
            let (mut name, mut ty, mut deployment) = (
                StringBuilder::new(),
                StringBuilder::new(),
                StringBuilder::new(),
            );
            let (mut revision, mut public) = (UInt32Builder::new(), BooleanBuilder::new());
            let mut services = sources.registry.services();
            services.sort_by(|a, b| a.0.name.cmp(&b.0.name));
            for (s, _) in &services {
                name.append_value(&s.name);
                revision.append_value(s.revision);
                public.append_value(s.overrides.public.unwrap_or(true));
                ty.append_value(service_type_name(s.ty));
                deployment.append_value(s.deployment_id.to_string());
            }
            batch(
                &service_schema(),
                vec![
                    Arc::new(name.finish()),
                    Arc::new(revision.finish()),
                    Arc::new(public.finish()),
                    Arc::new(ty.finish()),
                    Arc::new(deployment.finish()),
                ],
            )
        })
    })
}
