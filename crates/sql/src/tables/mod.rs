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
use super::table::{Reader, SnapshotTable};
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

/// Every table, registered by name.
pub fn all(sources: &Arc<QuerySources>) -> Vec<(&'static str, SnapshotTable)> {
    vec![
        (
            "sys_rules",
            SnapshotTable::new("sys_rules", rules_schema(), rules(sources)),
        ),
        (
            "sys_user_limits",
            SnapshotTable::new(
                "sys_user_limits",
                user_limits_schema(),
                user_limits(sources),
            ),
        ),
        (
            "sys_scheduler",
            SnapshotTable::new("sys_scheduler", scheduler_schema(), scheduler(sources)),
        ),
        (
            "sys_vqueues",
            SnapshotTable::new("sys_vqueues", vqueues_schema(), vqueues(sources)),
        ),
        (
            "sys_vqueue_meta",
            SnapshotTable::new(
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
        (
            "sys_cluster",
            SnapshotTable::new(
                "sys_cluster",
                cluster::cluster_schema(),
                cluster::cluster(sources),
            ),
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
