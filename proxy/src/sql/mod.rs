//! SQL introspection (`POST /query`): DataFusion over system tables whose rows are read when a
//! query scans them, from live partition snapshots, the rule book, the registry and the store.

mod json;
mod table;
mod tables;

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::prelude::{SessionConfig, SessionContext};

pub use json::rows;

use crate::config::Config;
use crate::limits::Rules;
use crate::partition::Runtime;
use crate::registry::Registry;
use crate::storage::Store;

/// Where the system tables read from.
pub struct QuerySources {
    /// The effective configuration (flow control on or off).
    pub config: Arc<Config>,
    /// The rule book.
    pub rules: Arc<Rules>,
    /// The partitions (counters, queues).
    pub runtime: Runtime,
    /// Deployments and services.
    pub registry: Arc<Registry>,
    /// Invocations.
    pub store: Arc<Store>,
}

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// Bad SQL, an unknown table or column, or a table that cannot be read now.
    #[error("{0}")]
    Sql(String),
    /// It ran longer than the configured timeout.
    #[error(
        "the query ran longer than {0:?} and was stopped: narrow it with WHERE or LIMIT (admin.query-timeout)"
    )]
    Timeout(Duration),
    /// It returned more rows than the configured cap.
    #[error(
        "the query returned more than {0} rows: add a LIMIT or a WHERE (admin.query-row-limit)"
    )]
    TooManyRows(usize),
}

/// A query's answer.
pub struct QueryAnswer {
    /// Its columns.
    pub schema: SchemaRef,
    /// Its rows.
    pub batches: Vec<RecordBatch>,
}

/// Runs SQL over the system tables.
pub struct QueryEngine {
    sources: Arc<QuerySources>,
}

impl std::fmt::Debug for QueryEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryEngine").finish_non_exhaustive()
    }
}

impl QueryEngine {
    /// An engine over `sources`.
    pub fn new(sources: QuerySources) -> Self {
        Self {
            sources: Arc::new(sources),
        }
    }

    /// Runs `sql` within the configured time and row limits.
    pub async fn query(&self, sql: &str) -> Result<QueryAnswer, QueryError> {
        let admin = &self.sources.config.admin;
        let timeout = admin.query_timeout.0;
        let cap = admin.query_row_limit;
        let run = async {
            let ctx = SessionContext::new_with_config(
                SessionConfig::new()
                    .with_information_schema(true)
                    .with_target_partitions(1),
            );
            for (name, table) in tables::all(&self.sources) {
                ctx.register_table(name, Arc::new(table))
                    .map_err(|e| QueryError::Sql(e.to_string()))?;
            }
            let frame = ctx
                .sql(sql)
                .await
                .map_err(|e| QueryError::Sql(e.to_string()))?;
            let schema = Arc::clone(frame.schema().inner());
            // One row past the cap tells "too many" from "exactly the cap".
            let frame = frame
                .limit(0, Some(cap + 1))
                .map_err(|e| QueryError::Sql(e.to_string()))?;
            let batches = frame
                .collect()
                .await
                .map_err(|e| QueryError::Sql(e.to_string()))?;
            if batches.iter().map(RecordBatch::num_rows).sum::<usize>() > cap {
                return Err(QueryError::TooManyRows(cap));
            }
            Ok(QueryAnswer { schema, batches })
        };
        tokio::time::timeout(timeout, run)
            .await
            .map_err(|_| QueryError::Timeout(timeout))?
    }
}
