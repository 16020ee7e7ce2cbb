//! A table whose rows are read when a query scans it: live partition snapshots, the rule book,
//! the registry or the store. Only the projected columns are handed to the plan.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

/// Reads a table's rows as one batch of its full schema.
pub type Reader = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<RecordBatch>> + Send>>
        + Send
        + Sync,
>;

/// A system table.
pub struct SnapshotTable {
    name: &'static str,
    schema: SchemaRef,
    reader: Reader,
}

impl fmt::Debug for SnapshotTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotTable")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl SnapshotTable {
    /// Table `name` of `schema`, read by `reader`.
    pub fn new(name: &'static str, schema: SchemaRef, reader: Reader) -> Self {
        Self {
            name,
            schema,
            reader,
        }
    }
}

#[async_trait]
impl TableProvider for SnapshotTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let batch = (self.reader)().await?;
        let exec = MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            Arc::clone(&self.schema),
            projection.cloned(),
        )?;
        Ok(exec)
    }
}
