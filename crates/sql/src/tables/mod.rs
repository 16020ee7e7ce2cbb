//! The system tables: their columns (named as the reference server names them) and how their
//! rows are read.

mod cluster;
mod flow;
mod objects;
mod registry;

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::error::{DataFusionError, Result};

use super::QuerySources;
use super::reach::{Placed, Reach, Rows};
use super::table::{LedHere, Reader, SnapshotTable};
use flow::{
    rules, rules_schema, scheduler, scheduler_schema, user_limits, user_limits_schema, vqueue_meta,
    vqueue_meta_schema, vqueues, vqueues_schema,
};
use objects::{
    invocation, invocation_schema, journal, journal_schema, locks, locks_schema, state,
    state_schema,
};
use registry::{deployment, deployment_schema, service, service_schema};

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

/// Every table, registered by name, read as far as `reach`.
pub fn all(sources: &Arc<QuerySources>, reach: &Reach) -> Vec<(&'static str, SnapshotTable)> {
    let placement = Arc::clone(sources.runtime.placement());
    let led_here: LedHere = Arc::new(move || placement.led());
    let by_id = Rows::Stored(Placed::ById("id"));
    let tables: [(&'static str, SchemaRef, Reader, Rows); 12] = [
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
            "sys_cluster",
            cluster::cluster_schema(),
            cluster::cluster(sources),
            Rows::Everywhere,
        ),
    ];
    tables
        .into_iter()
        .map(|(name, schema, reader, rows)| {
            let table = SnapshotTable::new(
                name,
                schema,
                reader,
                rows,
                reach.clone(),
                Arc::clone(&led_here),
            );
            (name, table)
        })
        .collect()
}

/// A reader running `read` with the sources on every scan.
fn reader<F, Fut>(sources: &Arc<QuerySources>, read: F) -> Reader
where
    F: Fn(Arc<QuerySources>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<RecordBatch>> + Send + 'static,
{
    let sources = Arc::clone(sources);
    Arc::new(move || Box::pin(read(Arc::clone(&sources))))
}

/// Runs `read` against the store off the async threads.
async fn read_store<T: Send + 'static>(
    sources: &QuerySources,
    read: fn(&redb::Database) -> Result<T, sluice_core::errors::CodedError>,
) -> Result<T> {
    let store = Arc::clone(&sources.store);
    tokio::task::spawn_blocking(move || store.with_db(read))
        .await
        .map_err(internal)?
        .map_err(internal)?
        .map_err(internal)
}
