//! The system tables: their columns (named as the reference server names them) and how their
//! rows are read.

mod cluster;
mod counters;
mod flow;
mod journal;
mod objects;
mod operations;
mod registry;
mod rules;
mod weights;

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::error::{DataFusionError, Result};

use super::QuerySources;
use super::reach::{Placed, Reach, Rows};
use super::table::{LedHere, Reader, Scan, SnapshotTable, counted};
use counters::{user_limits, user_limits_schema};
use flow::{scheduler, scheduler_schema, vqueue_meta, vqueue_meta_schema, vqueues, vqueues_schema};
use journal::{journal, journal_schema};
use objects::{invocation, invocation_schema, locks, locks_schema, state, state_schema};
use registry::{deployment, deployment_schema, service, service_schema};
use rules::{rules, rules_schema};

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

fn service_type_name(ty: sluice_runtime::discovery::manifest::ServiceType) -> &'static str {
    use sluice_runtime::discovery::manifest::ServiceType;
    match ty {
        ServiceType::Service => "service",
        ServiceType::VirtualObject => "virtual_object",
        ServiceType::Workflow => "workflow",
    }
}

/// A table as it is defined: its name, columns, reader and where its rows live.
type Definition = (&'static str, SchemaRef, Reader, Rows);

/// Every table, registered by name, read as far as `reach`.
pub fn all(sources: &Arc<QuerySources>, reach: &Reach) -> Vec<(&'static str, SnapshotTable)> {
    let placement = Arc::clone(sources.runtime.placement());
    let led_here: LedHere = Arc::new(move || placement.led());
    definitions(sources)
        .into_iter()
        .map(|(name, schema, reader, rows)| {
            let table = SnapshotTable::new(
                name,
                schema,
                reader,
                rows,
                reach.clone(),
                Arc::clone(&led_here),
            )
            .with_busiest(busiest_column(name))
            .with_exact(exact_columns(name));
            (name, table)
        })
        .collect()
}

/// The column by which a table's reader keeps the busiest rows for a limit (and keeps exactly
/// the scope a scan names): the live flow tables, read through a `ReadView`.
fn busiest_column(table: &str) -> Option<&'static str> {
    match table {
        "sys_user_limits" => Some("num_queued"),
        "sys_scheduler" | "sys_vqueue_meta" => Some("num_inbox"),
        _ => None,
    }
}

/// The columns whose `= '…'` a table's reader keeps exactly, so the plan need not filter
/// again (and a count needs no column): the scope of the live flow tables, read through a
/// `ReadView`; the scope and limit key of the invocations, kept as the store is read.
fn exact_columns(table: &str) -> &'static [&'static str] {
    match table {
        "sys_user_limits" | "sys_scheduler" | "sys_vqueue_meta" => &["scope"],
        "sys_invocation" => &["scope", "limit_key"],
        _ => &[],
    }
}

/// Every table there is.
fn definitions(sources: &Arc<QuerySources>) -> [Definition; 16] {
    let by_id = Rows::Stored(Placed::ById("id"));
    [
        (
            "sys_rules",
            rules_schema(),
            rules(sources),
            Rows::Everywhere,
        ),
        (
            "sys_user_limits",
            user_limits_schema(),
            user_limits(sources),
            Rows::Live,
        ),
        (
            "sys_scheduler",
            scheduler_schema(),
            scheduler(sources),
            Rows::Live,
        ),
        (
            "sys_vqueues",
            vqueues_schema(),
            vqueues(sources),
            Rows::Live,
        ),
        (
            "sys_vqueue_meta",
            vqueue_meta_schema(),
            vqueue_meta(sources),
            Rows::Live,
        ),
        (
            "sys_invocation",
            invocation_schema(),
            invocation(sources),
            by_id,
        ),
        // The reference's raw status table, which its CLI reads (`restate services status`):
        // the same rows, each status as that table spells it.
        (
            "sys_invocation_status",
            invocation_schema(),
            raw_status(invocation(sources)),
            by_id,
        ),
        // The reference's inboxes (its CLI counts them, `restate services status`): the
        // calls to a keyed handler that wait to start.
        (
            "sys_inbox",
            inbox_schema(),
            inbox(invocation(sources)),
            by_id,
        ),
        (
            "sys_deployment",
            deployment_schema(),
            deployment(sources),
            Rows::Everywhere,
        ),
        (
            "sys_service",
            service_schema(),
            service(sources),
            Rows::Everywhere,
        ),
        ("sys_journal", journal_schema(), journal(sources), by_id),
        (
            "state",
            state_schema(),
            state(sources),
            Rows::Stored(Placed::ByKey("partition_key")),
        ),
        ("sys_locks", locks_schema(), locks(sources), Rows::Live),
        (
            "sys_weight_overrides",
            weights::weight_overrides_schema(),
            weights::weight_overrides(sources),
            Rows::Everywhere,
        ),
        (
            "sys_bulk_cancels",
            operations::bulk_cancels_schema(),
            operations::bulk_cancels(sources),
            Rows::Everywhere,
        ),
        (
            "sys_cluster",
            cluster::cluster_schema(),
            cluster::cluster(sources),
            Rows::Everywhere,
        ),
    ]
}

/// A reader running `read` with the sources on every scan.
fn reader<F, Fut>(sources: &Arc<QuerySources>, read: F) -> Reader
where
    F: Fn(Arc<QuerySources>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<RecordBatch>> + Send + 'static,
{
    let sources = Arc::clone(sources);
    Arc::new(move |_| Box::pin(read(Arc::clone(&sources))))
}

/// A reader running `read` with the sources and what the scan lets it leave out.
fn scanned<F, Fut>(sources: &Arc<QuerySources>, read: F) -> Reader
where
    F: Fn(Arc<QuerySources>, Scan) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<RecordBatch>> + Send + 'static,
{
    let sources = Arc::clone(sources);
    Arc::new(move |scan| Box::pin(read(Arc::clone(&sources), scan)))
}

/// The reference's `sys_invocation_status` spelling of a status: a call that waits to start is
/// `inboxed`, one running or backing off between attempts is `invoked`.
fn raw_status_name(status: &str) -> &str {
    match status {
        "pending" => "inboxed",
        "running" | "backing-off" => "invoked",
        other => other,
    }
}

/// A table whose rows are `read`'s, made over by `derive`.
fn derived(read: Reader, derive: fn(RecordBatch) -> Result<RecordBatch>) -> Reader {
    // The derived rows are not the read ones: what the query leaves out of them is no hint
    // about what to read.
    Arc::new(move |_| {
        let read = Arc::clone(&read);
        Box::pin(async move { derive(read(Scan::default()).await?) })
    })
}

/// Column `name` of `rows`: where it is, and its values.
fn column_of<'a>(rows: &'a RecordBatch, name: &str) -> Result<(usize, &'a ArrayRef)> {
    let at = rows.schema().index_of(name).map_err(internal)?;
    Ok((at, rows.column(at)))
}

/// The `status` column of invocation rows: where it is, and its text.
fn statuses(rows: &RecordBatch) -> Result<(usize, &datafusion::arrow::array::StringArray)> {
    let (at, column) = column_of(rows, "status")?;
    let text = column
        .as_any()
        .downcast_ref()
        .ok_or_else(|| internal("the status column is text"))?;
    Ok((at, text))
}

/// `read`'s rows with their `status` column as [`raw_status_name`] spells it.
fn raw_status(read: Reader) -> Reader {
    derived(read, |rows| {
        use datafusion::arrow::array::{Array as _, StringArray};
        let (at, statuses) = statuses(&rows)?;
        let renamed: StringArray = (0..statuses.len())
            .map(|i| (!statuses.is_null(i)).then(|| raw_status_name(statuses.value(i))))
            .collect();
        let mut columns = rows.columns().to_vec();
        columns[at] = Arc::new(renamed);
        batch(&rows.schema(), columns)
    })
}

fn inbox_schema() -> SchemaRef {
    schema(vec![
        ("service_name", DataType::Utf8, false),
        ("service_key", DataType::Utf8, false),
        ("id", DataType::Utf8, false),
        ("sequence_number", DataType::UInt64, false),
        ("created_at", timestamp(), false),
    ])
}

/// The rows of `sys_inbox` from `read`'s invocations: the pending ones with a key, numbered
/// in the order read.
fn inbox(read: Reader) -> Reader {
    derived(read, |rows| {
        use datafusion::arrow::array::{Array as _, BooleanArray, UInt64Array};
        use datafusion::arrow::compute::filter_record_batch;
        let (_, status) = statuses(&rows)?;
        let (_, key) = column_of(&rows, "target_service_key")?;
        let waiting: BooleanArray = (0..status.len())
            .map(|i| Some(status.value(i) == "pending" && !key.is_null(i)))
            .collect();
        let kept = filter_record_batch(&rows, &waiting).map_err(internal)?;
        let pick = |name: &str| column_of(&kept, name).map(|(_, column)| Arc::clone(column));
        let sequence: UInt64Array = (0..kept.num_rows() as u64).map(Some).collect();
        batch(
            &inbox_schema(),
            vec![
                pick("target_service_name")?,
                pick("target_service_key")?,
                pick("id")?,
                Arc::new(sequence),
                pick("created_at")?,
            ],
        )
    })
}

/// Runs `read` against the store off the async threads.
async fn read_store<T: Send + 'static>(
    sources: &QuerySources,
    read: impl FnOnce(&redb::Database) -> Result<T, sluice_core::errors::CodedError> + Send + 'static,
) -> Result<T> {
    let store = Arc::clone(&sources.store);
    tokio::task::spawn_blocking(move || store.with_db(read))
        .await
        .map_err(internal)?
        .map_err(internal)?
        .map_err(internal)
}
