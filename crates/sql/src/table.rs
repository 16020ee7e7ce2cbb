//! A table whose rows are read when a query scans it: live partition snapshots, the rule book,
//! the registry or the store. Only the projected columns are handed to the plan. In cluster
//! mode a partitioned table's rows come from each partition's leader ([`super::reach`]).

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

use super::reach::{self, Ask, Reach, Rows};

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
    rows: Rows,
    /// How far this query reaches, and (cluster mode) which partitions are led here now.
    reach: Reach,
    led_here: LedHere,
}

/// Which partitions this node leads right now (`true` at their index).
pub type LedHere = Arc<dyn Fn() -> Vec<bool> + Send + Sync>;

impl fmt::Debug for SnapshotTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotTable")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl SnapshotTable {
    /// Table `name` of `schema`, whose `rows` are read by `reader`, as far as `reach`.
    pub fn new(
        name: &'static str,
        schema: SchemaRef,
        reader: Reader,
        rows: Rows,
        reach: Reach,
        led_here: LedHere,
    ) -> Self {
        Self {
            name,
            schema,
            reader,
            rows,
            reach,
            led_here,
        }
    }

    /// This node's rows: in cluster mode only those of the partitions in `led`, the ones it
    /// answers for (a stored table also holds the partitions this node stands by for).
    async fn read_here(&self, led: Option<&[bool]>) -> Result<RecordBatch> {
        let batch = (self.reader)().await?;
        match (self.rows, led) {
            (Rows::Stored(placed), Some(led)) => reach::only_led(&batch, placed, led),
            _ => Ok(batch),
        }
    }

    /// This node's rows and every other leader's, of the projected columns.
    async fn read_cluster(
        &self,
        gather: &reach::Gather,
        projection: Option<&Vec<usize>>,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let all: Vec<usize> = (0..self.schema.fields().len()).collect();
        let wanted = projection.unwrap_or(&all);
        // A scan that needs no column (`COUNT(*)`) still needs the rows: ask for the first
        // column and drop it here.
        let asked = if wanted.is_empty() { &vec![0] } else { wanted };
        let columns = asked
            .iter()
            .map(|&i| self.schema.field(i).name().clone())
            .collect();
        let led = (self.led_here)();
        // This node's rows and the others' at once: the others' are a network round trip.
        let (here, shares) = futures_util::future::join(
            self.read_here(Some(&led)),
            gather(Ask {
                table: self.name,
                columns,
            }),
        )
        .await;
        let here = here?;
        let shares = shares.map_err(|why| {
            datafusion::error::DataFusionError::Execution(format!("[CLU0001] {why}"))
        })?;
        reach::check_cover(&led, &shares)?;
        let schema = Arc::new(self.schema.project(wanted)?);
        let mut batches = vec![here.project(wanted)?];
        for share in shares {
            for batch in share.batches {
                // Same columns, but the other node's batch names its own schema: rebuild it
                // on ours so a node of another version cannot slip in other types.
                let columns = if wanted.is_empty() {
                    Vec::new()
                } else {
                    batch.columns().to_vec()
                };
                let options = datafusion::arrow::array::RecordBatchOptions::new()
                    .with_row_count(Some(batch.num_rows()));
                batches.push(
                    RecordBatch::try_new_with_options(Arc::clone(&schema), columns, &options)
                        .map_err(|e| {
                            datafusion::error::DataFusionError::Execution(format!(
                                "[CLU0001] {} answered {} in another shape: {e}",
                                share.node, self.name
                            ))
                        })?,
                );
            }
        }
        Ok((schema, batches))
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
        match (&self.reach, self.rows) {
            (Reach::Cluster(gather), Rows::Live | Rows::Stored(_)) => {
                let (schema, batches) = self.read_cluster(gather, projection).await?;
                Ok(MemorySourceConfig::try_new_exec(&[batches], schema, None)?)
            }
            (reach, _) => {
                let led = match reach {
                    Reach::Led(led) => Some(led.as_slice()),
                    _ => None,
                };
                let batch = self.read_here(led).await?;
                Ok(MemorySourceConfig::try_new_exec(
                    &[vec![batch]],
                    Arc::clone(&self.schema),
                    projection.cloned(),
                )?)
            }
        }
    }
}
