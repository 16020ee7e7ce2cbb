//! SQL introspection (`POST /query`): DataFusion over system tables whose rows are read when a
//! query scans them, from live partition snapshots, the rule book, the registry and the store.

mod busiest;
mod cancel;
mod guards;
mod json;
pub mod reach;
mod table;
mod tables;

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::context::SQLOptions;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures_util::StreamExt as _;

pub use json::{rows, rows_document};
pub use reach::{Ask, Gather, Reach, Share};

use sluice_config::Config;
use sluice_runtime::limits::Rules;
use sluice_runtime::partition::Runtime;
use sluice_runtime::registry::Registry;
use sluice_store::storage::Store;

/// Reads this node's view of the cluster when `sys_cluster` is scanned.
pub type ClusterSource = Arc<dyn Fn() -> Option<sluice_api::version::ClusterView> + Send + Sync>;

/// Where the system tables read from.
pub struct QuerySources {
    /// This node's view of the cluster (`sys_cluster`): `None` on an embedded node, or before
    /// it joined.
    pub cluster: ClusterSource,
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
    /// Not one read-only statement, or over the length or operator bound (SEC0006).
    #[error("{0}")]
    NotAllowed(String),
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
    /// Its answer or its working memory grew past the configured cap.
    #[error(
        "the query needs more than {0} of memory: narrow it with WHERE or LIMIT (admin.query-memory-limit)"
    )]
    TooMuchMemory(sluice_config::ByteSize),
}

/// A query's answer.
pub struct QueryAnswer {
    /// Its columns.
    pub schema: SchemaRef,
    /// Its rows.
    pub batches: Vec<RecordBatch>,
    /// [`Reach::Led`]: the partitions whose rows it holds.
    pub led: Option<Vec<usize>>,
}

/// Runs SQL over the system tables, each query on a thread of its own: a query that burns CPU
/// or recurses deeply never stalls the admin listener, and one past its timeout is abandoned
/// (its cancel flag set, which it reads at its next batch or function call) while the next
/// query starts at once on a thread of its own. At most `admin.query-concurrency` run at once,
/// abandoned ones included until they stop.
pub struct QueryEngine {
    sources: Arc<QuerySources>,
    /// One permit a running query: held by its thread, so an abandoned query keeps its place
    /// until it really stops.
    slots: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for QueryEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryEngine").finish_non_exhaustive()
    }
}

/// Stack of a query thread; deep plans also grow onto the heap (DataFusion's recursion
/// protection), this is the first segment.
const QUERY_STACK: usize = 64 * 1024 * 1024;

impl QueryEngine {
    /// An engine over `sources`.
    pub fn new(sources: QuerySources) -> Self {
        let slots = Arc::new(tokio::sync::Semaphore::new(
            sources.config.admin.query_concurrency.max(1),
        ));
        Self {
            sources: Arc::new(sources),
            slots,
        }
    }

    /// Runs `sql` within the configured time, row and memory limits, over the rows `reach`
    /// names (see [`Reach`]). A cluster-wide query that met a leadership move (`CLU0001`: a
    /// partition led by no node or by two while it read) is run again, with pauses doubling
    /// from 100 ms, until it reads a stable cover or `admin.query-timeout` is spent: a
    /// takeover settles within the group's session timeout.
    pub async fn query(&self, sql: &str, reach: Reach) -> Result<QueryAnswer, QueryError> {
        let timeout = self.sources.config.admin.query_timeout.0;
        // No cap of its own: the pauses double within the query's timeout.
        let mut pauses = sluice_core::retry::Pauses::new(timeout, timeout);
        loop {
            match self.query_within(sql, reach.clone(), pauses.left()).await {
                Err(QueryError::Sql(why))
                    if matches!(reach, Reach::Cluster(_)) && why.contains("[CLU0001]") =>
                {
                    let Some(pause) = pauses.next_pause() else {
                        return Err(QueryError::Sql(why));
                    };
                    tracing::debug!(error = %why, "a cluster-wide query met a leadership move; running it again");
                    tokio::time::sleep(pause).await;
                }
                Err(QueryError::Timeout(_)) => return Err(QueryError::Timeout(timeout)),
                answered => return answered,
            }
        }
    }

    /// [`Self::query`] once, within `timeout`.
    async fn query_within(
        &self,
        sql: &str,
        reach: Reach,
        timeout: Duration,
    ) -> Result<QueryAnswer, QueryError> {
        let admin = &self.sources.config.admin;
        if sql.len() > admin.query_max_length.as_usize() {
            return Err(QueryError::NotAllowed(format!(
                "the query is {} bytes long, over admin.query-max-length ({})",
                sql.len(),
                admin.query_max_length
            )));
        }
        check_operators(sql, admin.query_max_operators)?;
        let flag = cancel::CancelFlag::default();
        let _cancel = cancel::CancelOnDrop(Arc::clone(&flag));
        let started = tokio::time::Instant::now();
        let slot =
            match tokio::time::timeout(timeout, Arc::clone(&self.slots).acquire_owned()).await {
                Ok(Ok(slot)) => slot,
                Ok(Err(_)) => return Err(QueryError::Sql("the query engine stopped".into())),
                Err(_) => return Err(QueryError::Timeout(timeout)),
            };
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel();
        let (sources, sql, thread_flag) =
            (Arc::clone(&self.sources), sql.to_owned(), Arc::clone(&flag));
        let spawned = std::thread::Builder::new()
            .name("sluice-sql".into())
            .stack_size(QUERY_STACK)
            .spawn(move || {
                let _slot = slot;
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = answer_tx.send(Err(QueryError::Sql(format!(
                            "the query's runtime did not start: {e}"
                        ))));
                        return;
                    }
                };
                let answer = runtime.block_on(run(sources, sql, reach, thread_flag));
                let _ = answer_tx.send(answer);
            });
        if let Err(e) = spawned {
            return Err(QueryError::Sql(format!(
                "the query's thread did not start: {e}"
            )));
        }
        let left = timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, answer_rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(QueryError::Sql(
                "the query's thread ended without an answer".into(),
            )),
            // `_cancel` sets the flag as it drops: the thread stops at its next batch or
            // function call and gives its slot back then.
            Err(_) => Err(QueryError::Timeout(timeout)),
        }
    }
}

/// Refuses a statement with more than `max` operators and opening parentheses. Expressions are
/// trees, and parts of planning (naming columns, cloning, comparing) walk them recursively: a
/// `1+1+…+1` of thousands of terms would exhaust any stack. The count bounds the depth.
fn check_operators(sql: &str, max: usize) -> Result<(), QueryError> {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::keywords::Keyword;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        // The parser reports the error with its position.
        return Ok(());
    };
    let operators = tokens
        .iter()
        .filter(|t| match t {
            Token::Word(w) => matches!(w.keyword, Keyword::AND | Keyword::OR | Keyword::NOT),
            Token::Whitespace(_)
            | Token::Number(..)
            | Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::Comma
            | Token::Period
            | Token::RParen
            | Token::SemiColon
            | Token::EOF => false,
            _ => true,
        })
        .count();
    if operators > max {
        return Err(QueryError::NotAllowed(format!(
            "the query has {operators} operators and parentheses, over admin.query-max-operators ({max})"
        )));
    }
    Ok(())
}

/// Plans `sql` if it is one read-only statement: the parse is checked by kind, and the plan again
/// by DataFusion's own verifier (no DDL, DML, `COPY` or `SET` anywhere in it).
async fn read_only_plan(
    ctx: &SessionContext,
    sql: &str,
) -> Result<datafusion::logical_expr::LogicalPlan, QueryError> {
    use datafusion::sql::parser::Statement as DfStatement;
    use datafusion::sql::sqlparser::ast::Statement;
    let state = ctx.state();
    let statement = state
        .sql_to_statement(sql, &state.config().options().sql_parser.dialect)
        .map_err(|e| QueryError::Sql(e.to_string()))?;
    let read_only = |s: &DfStatement| matches!(s, DfStatement::Statement(inner) if matches!(**inner, Statement::Query(_)));
    let allowed = match &statement {
        DfStatement::Explain(explain) => read_only(&explain.statement),
        DfStatement::Statement(inner) => match &**inner {
            Statement::Query(_) => true,
            Statement::Explain { statement, .. } => matches!(**statement, Statement::Query(_)),
            // Reads of the catalogue and the settings, planned as queries.
            Statement::ShowTables { .. }
            | Statement::ShowColumns { .. }
            | Statement::ShowVariable { .. } => true,
            _ => false,
        },
        _ => false,
    };
    if !allowed {
        return Err(QueryError::NotAllowed(
            "Statement not supported: only SELECT, EXPLAIN and SHOW run here (DDL, DML, COPY, SET, transactions and PREPARE/EXECUTE are refused)".into(),
        ));
    }
    let plan = state
        .statement_to_plan(statement)
        .await
        .map_err(|e| QueryError::Sql(e.to_string()))?;
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
        .verify_plan(&plan)
        .map_err(|e| QueryError::NotAllowed(e.to_string()))?;
    Ok(plan)
}

/// How many times `admin.query-row-limit` one node's share of a cluster-wide query may hold.
const SHARE_ROWS: usize = 10;

/// One query's session: its memory budget, the system tables as far as `reach`, the rule
/// that reads the busiest few bounded, and the guards.
fn session(
    sources: &Arc<QuerySources>,
    reach: &Reach,
    flag: &cancel::CancelFlag,
) -> Result<SessionContext, QueryError> {
    let admin = &sources.config.admin;
    let memory = admin.query_memory_limit;
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(memory.as_usize(), 1.0)
        .build_arc()
        .map_err(|e| QueryError::Sql(e.to_string()))?;
    let ctx = SessionContext::new_with_config_rt(
        SessionConfig::new()
            .with_information_schema(true)
            .with_target_partitions(1),
        runtime,
    );
    ctx.add_optimizer_rule(Arc::new(busiest::BusiestFirst));
    for (name, table) in tables::all(sources, reach) {
        ctx.register_table(name, Arc::new(table))
            .map_err(|e| QueryError::Sql(e.to_string()))?;
    }
    guards::register(
        &ctx,
        guards::Bounds {
            limit: memory.as_usize(),
            value_cap: admin.query_max_value_size.as_usize(),
            cancel: Arc::clone(flag),
        },
    );
    Ok(ctx)
}

/// Runs one query on its thread.
async fn run(
    sources: Arc<QuerySources>,
    sql: String,
    reach: Reach,
    flag: cancel::CancelFlag,
) -> Result<QueryAnswer, QueryError> {
    let admin = &sources.config.admin;
    // A node's share of a cluster-wide query is not the answer: the asking node caps the
    // rows of what the query returns, and a share (a scan the asking node may still filter
    // or count) has a cap of its own, ten times the answer's, beside the memory cap.
    let cap = match reach {
        Reach::Led(_) => admin.query_row_limit.saturating_mul(SHARE_ROWS),
        _ => admin.query_row_limit,
    };
    let memory = admin.query_memory_limit;
    let memory_error = |e: datafusion::error::DataFusionError| {
        if matches!(
            e.find_root(),
            datafusion::error::DataFusionError::ResourcesExhausted(_)
        ) {
            QueryError::TooMuchMemory(memory)
        } else {
            QueryError::Sql(e.to_string())
        }
    };
    let ctx = session(&sources, &reach, &flag)?;
    let led = match &reach {
        Reach::Led(led) => Some(
            led.iter()
                .enumerate()
                .filter_map(|(i, &here)| here.then_some(i))
                .collect(),
        ),
        _ => None,
    };
    let plan = read_only_plan(&ctx, &sql).await?;
    // EXPLAIN must stay the plan's root; its answer is a few rows anyway.
    let explain = matches!(
        plan,
        datafusion::logical_expr::LogicalPlan::Explain(_)
            | datafusion::logical_expr::LogicalPlan::Analyze(_)
    );
    let frame = ctx
        .execute_logical_plan(plan)
        .await
        .map_err(|e| QueryError::Sql(e.to_string()))?;
    let schema = Arc::clone(frame.schema().inner());
    // One row past the cap tells "too many" from "exactly the cap".
    let frame = if explain {
        frame
    } else {
        frame
            .limit(0, Some(cap.saturating_add(1)))
            .map_err(|e| QueryError::Sql(e.to_string()))?
    };
    let task = frame.task_ctx();
    let plan = frame.create_physical_plan().await.map_err(memory_error)?;
    let plan = cancel::cancellable(plan, &flag).map_err(|e| QueryError::Sql(e.to_string()))?;
    let mut stream =
        datafusion::physical_plan::execute_stream(plan, Arc::new(task)).map_err(memory_error)?;
    let (mut batches, mut rows, mut bytes) = (Vec::new(), 0usize, 0usize);
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(memory_error)?;
        rows = rows.saturating_add(batch.num_rows());
        bytes = bytes.saturating_add(batch.get_array_memory_size());
        if rows > cap {
            return Err(QueryError::TooManyRows(cap));
        }
        if bytes > memory.as_usize() {
            return Err(QueryError::TooMuchMemory(memory));
        }
        batches.push(batch);
    }
    Ok(QueryAnswer {
        schema,
        batches,
        led,
    })
}
