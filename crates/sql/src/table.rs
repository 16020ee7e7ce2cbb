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

/// Reads a table's rows as one batch of its full schema, or of the scan's columns alone
/// ([`Scan::wanted`], in that order) when it builds only those; the [`Scan`] says what it may
/// leave out.
pub type Reader = Arc<
    dyn Fn(Scan) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<RecordBatch>> + Send>>
        + Send
        + Sync,
>;

/// What a query lets a reader leave out: rows of other scopes, rows past a limit. A hint only:
/// the plan still filters and limits what is read, so a reader may ignore it (most do; the
/// live counters use it, where a million keys make reading them all cost seconds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// `WHERE scope = '…'`: only that scope's rows are wanted.
    pub scope: Option<String>,
    /// `WHERE limit_key = '…'` (tables with that column): only that key's rows are wanted.
    pub limit_key: Option<String>,
    /// `LIMIT n` with no filter in between: any `n` rows will do.
    pub limit: Option<usize>,
    /// The columns the query reads (indexes into the schema); `None`: every one. When it
    /// reads none (`COUNT(*)`), a reader may answer [`counted`] rows instead of building them.
    pub columns: Option<Vec<usize>>,
}

impl Scan {
    /// The hint in a scan's `filters`, `limit` and `projection`; `None` when they ask for two
    /// scopes (or two limit keys) at once, which no row is.
    fn of(filters: &[Expr], limit: Option<usize>, projection: Option<&Vec<usize>>) -> Option<Self> {
        // One value the column must equal, or `Err` when the filters ask for two at once.
        let only = |column: &str| {
            let mut values = filters.iter().filter_map(|f| column_equals(f, column));
            let first = values.next();
            match values.any(|other| Some(&other) != first.as_ref()) {
                true => Err(()),
                false => Ok(first),
            }
        };
        Some(Scan {
            scope: only("scope").ok()?,
            limit_key: only("limit_key").ok()?,
            limit,
            columns: projection.cloned(),
        })
    }

    /// The query reads no column, only how many rows there are.
    pub fn counts_only(&self) -> bool {
        self.columns.as_ref().is_some_and(Vec::is_empty)
    }

    /// The columns of `schema` the query reads, in the order it reads them: every one when it
    /// names none.
    pub fn wanted(&self, schema: &SchemaRef) -> Vec<usize> {
        match &self.columns {
            Some(columns) => columns.clone(),
            None => (0..schema.fields().len()).collect(),
        }
    }

    /// How many rows a reader that counted `total` answers: no more than the limit asks for.
    pub fn rows_of(&self, total: usize) -> usize {
        self.limit.map_or(total, |limit| total.min(limit))
    }
}

/// A batch of `rows` rows and no column: a reader's answer to a scan that
/// [`Scan::counts_only`], without building what no one reads.
pub fn counted(rows: usize) -> Result<RecordBatch> {
    let options = datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        Arc::new(datafusion::arrow::datatypes::Schema::empty()),
        Vec::new(),
        &options,
    )?)
}

/// `batch` (of `schema`, of its `wanted` columns already, or [`counted`]) as the `wanted`
/// columns of it (a projection keeps the row count, so a counted batch is its own projection
/// on no column).
fn shaped(batch: RecordBatch, schema: &SchemaRef, wanted: &[usize]) -> Result<RecordBatch> {
    if batch.schema().fields() == schema.fields() {
        return Ok(batch.project(wanted)?);
    }
    if batch.schema().fields() == schema.project(wanted)?.fields() {
        return Ok(batch);
    }
    Err(datafusion::error::DataFusionError::Internal(
        match batch.num_columns() {
            0 => "a reader counted rows a query reads columns of".to_owned(),
            n => format!("a reader answered {n} columns, neither the table's nor those asked for"),
        },
    ))
}

/// The value `filter` asks `column` to equal, if it is `column = '…'` (either way round).
fn column_equals(filter: &Expr, column: &str) -> Option<String> {
    use datafusion::logical_expr::{BinaryExpr, Operator};
    use datafusion::scalar::ScalarValue;
    let Expr::BinaryExpr(BinaryExpr {
        left,
        op: Operator::Eq,
        right,
    }) = filter
    else {
        return None;
    };
    match (left.as_ref(), right.as_ref()) {
        (Expr::Column(c), Expr::Literal(ScalarValue::Utf8(Some(v)), _))
        | (Expr::Literal(ScalarValue::Utf8(Some(v)), _), Expr::Column(c))
            if c.name == column =>
        {
            Some(v.clone())
        }
        _ => None,
    }
}

/// A system table.
pub struct SnapshotTable {
    name: &'static str,
    schema: SchemaRef,
    reader: Reader,
    rows: Rows,
    /// How far this query reaches, and (cluster mode) which partitions are led here now.
    reach: Reach,
    led_here: LedHere,
    /// Set when its reader keeps, for a limit, the rows greatest in this column (the calls
    /// waiting): `crate::busiest`. Such a reader keeps the scope a scan names exactly.
    busiest: Option<&'static str>,
    /// The columns (`scope`, `limit_key`) whose `= '…'` its reader keeps exactly.
    exact: &'static [&'static str],
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
            busiest: None,
            exact: &[],
        }
    }

    /// The same table, its reader keeping exactly the rows whose `columns` equal what a scan
    /// names (of `scope` and `limit_key`): the plan does not filter them again.
    pub fn with_exact(mut self, columns: &'static [&'static str]) -> Self {
        self.exact = columns;
        self
    }

    /// The same table, its reader keeping the busiest by `column` for a limit and exactly the
    /// scope a scan names (see [`Self::busiest`]).
    pub fn with_busiest(mut self, column: Option<&'static str>) -> Self {
        self.busiest = column;
        self
    }

    /// The column by which a limit keeps the greatest rows, when the reader keeps them so.
    pub fn busiest(&self) -> Option<&str> {
        self.busiest
    }

    /// This node's rows: in cluster mode only those of the partitions in `led`, the ones it
    /// answers for (a stored table also holds the partitions this node stands by for).
    async fn read_here(&self, led: Option<&[bool]>, mut scan: Scan) -> Result<RecordBatch> {
        if matches!((self.rows, led), (Rows::Stored(_), Some(_))) {
            // Rows are dropped after the read by their partition column: a limit before it
            // could keep too few, and a count has no column to drop them by.
            scan.limit = None;
            scan.columns = None;
        }
        let batch = (self.reader)(scan).await?;
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
        scan: Scan,
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
            self.read_here(Some(&led), scan.clone()),
            gather(Ask {
                table: self.name,
                columns,
                scope: scan.scope,
                limit_key: scan.limit_key,
                limit: scan.limit,
            }),
        )
        .await;
        let here = here?;
        let shares = shares.map_err(|why| {
            datafusion::error::DataFusionError::Execution(format!("[CLU0001] {why}"))
        })?;
        reach::check_cover(&led, &shares)?;
        let schema = Arc::new(self.schema.project(wanted)?);
        let mut batches = vec![shaped(here, &self.schema, wanted)?];
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

    /// `scope = '…'` and `limit_key = '…'` are handed to the reader: kept exactly by those that
    /// say so ([`Self::with_exact`]: a limit may follow them into the scan, a count needs no
    /// column), a hint to the others (the plan applies it again).
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<datafusion::logical_expr::TableProviderFilterPushDown>> {
        use datafusion::logical_expr::TableProviderFilterPushDown::{Exact, Inexact, Unsupported};
        let pushed = |column: &str| {
            if self.exact.contains(&column) {
                Exact
            } else if self.schema.column_with_name(column).is_some() {
                Inexact
            } else {
                Unsupported
            }
        };
        Ok(filters
            .iter()
            .map(|f| {
                ["scope", "limit_key"]
                    .into_iter()
                    .find(|column| column_equals(f, column).is_some())
                    .map_or(Unsupported, pushed)
            })
            .collect())
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(scan) = Scan::of(filters, limit, projection) else {
            return Ok(MemorySourceConfig::try_new_exec(
                &[Vec::new()],
                Arc::clone(&self.schema),
                projection.cloned(),
            )?);
        };
        match (&self.reach, self.rows) {
            (Reach::Cluster(gather), Rows::Live | Rows::Stored(_)) => {
                let (schema, batches) = self.read_cluster(gather, projection, scan).await?;
                Ok(MemorySourceConfig::try_new_exec(&[batches], schema, None)?)
            }
            (reach, _) => {
                let led = match reach {
                    Reach::Led(led) => Some(led.as_slice()),
                    _ => None,
                };
                let batch = self.read_here(led, scan).await?;
                let all: Vec<usize> = (0..self.schema.fields().len()).collect();
                let batch = shaped(batch, &self.schema, projection.unwrap_or(&all))?;
                let schema = batch.schema();
                Ok(MemorySourceConfig::try_new_exec(
                    &[vec![batch]],
                    schema,
                    None,
                )?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use datafusion::arrow::array::{StringArray, UInt64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::prelude::SessionContext;

    use super::*;

    /// A table of rows (`scope`, `n`) a 1, b 5, c 3 whose reader records the hint of every
    /// scan; one that keeps the busiest (by `n`) keeps the scope and the limit a scan names, as
    /// the flow tables' readers do, the other ignores them.
    fn recording(busiest: bool) -> (Arc<SnapshotTable>, Arc<Mutex<Vec<Scan>>>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("scope", DataType::Utf8, false),
            Field::new("n", DataType::UInt64, false),
        ]));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (into, rows) = (Arc::clone(&seen), Arc::clone(&schema));
        let reader: Reader = Arc::new(move |scan: Scan| {
            into.lock().unwrap().push(scan.clone());
            let mut kept = vec![("a", 1u64), ("b", 5), ("c", 3)];
            if busiest {
                kept.retain(|(s, _)| scan.scope.as_deref().is_none_or(|want| want == *s));
                kept.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
                kept.truncate(scan.limit.unwrap_or(usize::MAX));
                if scan.counts_only() {
                    let rows = counted(kept.len());
                    return Box::pin(async move { rows });
                }
            }
            let (names, ns): (Vec<&str>, Vec<u64>) = kept.into_iter().unzip();
            let batch = RecordBatch::try_new(
                Arc::clone(&rows),
                vec![
                    Arc::new(StringArray::from(names)),
                    Arc::new(UInt64Array::from(ns)),
                ],
            );
            Box::pin(async move { Ok(batch?) })
        });
        let led: LedHere = Arc::new(Vec::new);
        let table = SnapshotTable::new("t", schema, reader, Rows::Live, Reach::Here, led)
            .with_busiest(busiest.then_some("n"))
            .with_exact(if busiest { &["scope"] } else { &[] });
        (Arc::new(table), seen)
    }

    async fn scopes(ctx: &SessionContext, sql: &str) -> Vec<String> {
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        batches
            .iter()
            .flat_map(|b| {
                let column = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
                column
                    .iter()
                    .map(|v| v.unwrap().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[tokio::test]
    async fn a_scope_filter_and_a_bare_limit_reach_the_reader_and_the_plan_still_applies_them() {
        let (table, seen) = recording(false);
        let ctx = SessionContext::new();
        ctx.register_table("t", table).unwrap();
        assert_eq!(
            scopes(&ctx, "SELECT scope FROM t WHERE scope = 'b'").await,
            vec!["b"],
            "the reader ignored the hint; the plan filtered"
        );
        assert_eq!(
            scopes(
                &ctx,
                "SELECT scope FROM t WHERE 'c' = scope AND scope <> 'a'"
            )
            .await,
            vec!["c"]
        );
        assert_eq!(scopes(&ctx, "SELECT scope FROM t LIMIT 2").await.len(), 2);
        assert_eq!(
            scopes(&ctx, "SELECT scope FROM t WHERE scope > 'a'")
                .await
                .len(),
            2
        );
        let seen = seen.lock().unwrap().clone();
        let hints: Vec<(Option<&str>, Option<usize>)> =
            seen.iter().map(|s| (s.scope.as_deref(), s.limit)).collect();
        assert_eq!(
            hints,
            vec![
                (Some("b"), None),
                (Some("c"), None),
                (None, Some(2)),
                (None, None)
            ]
        );
    }

    #[tokio::test]
    async fn the_busiest_few_are_read_as_such_only_when_the_sort_asks_for_exactly_that() {
        let (table, seen) = recording(true);
        let ctx = SessionContext::new();
        ctx.add_optimizer_rule(Arc::new(crate::busiest::BusiestFirst));
        ctx.register_table("t", table).unwrap();
        // The query, the scopes it answers, and the hint its one read got (none: not read).
        type Case = (
            &'static str,
            Vec<&'static str>,
            Option<(Option<&'static str>, Option<usize>)>,
        );
        let cases: [Case; 8] = [
            (
                "SELECT scope FROM t ORDER BY n DESC LIMIT 2",
                vec!["b", "c"],
                Some((None, Some(2))),
            ),
            (
                "SELECT scope FROM t u ORDER BY u.n DESC LIMIT 1",
                vec!["b"],
                Some((None, Some(1))),
            ),
            (
                "SELECT scope FROM t WHERE scope = 'c' ORDER BY n DESC LIMIT 1",
                vec!["c"],
                Some((Some("c"), Some(1))),
            ),
            (
                "SELECT scope FROM t WHERE scope = 'a' LIMIT 5",
                vec!["a"],
                Some((Some("a"), Some(5))),
            ),
            (
                "SELECT scope FROM t ORDER BY n ASC LIMIT 1",
                vec!["a"],
                Some((None, None)),
            ),
            (
                "SELECT scope FROM t ORDER BY n DESC, scope LIMIT 1",
                vec!["b"],
                Some((None, None)),
            ),
            (
                "SELECT scope FROM t WHERE n < 5 ORDER BY n DESC LIMIT 1",
                vec!["c"],
                Some((None, None)),
            ),
            (
                "SELECT scope FROM t WHERE scope = 'a' AND scope = 'b'",
                vec![],
                None,
            ),
        ];
        for (sql, want, hint) in cases {
            seen.lock().unwrap().clear();
            assert_eq!(scopes(&ctx, sql).await, want, "{sql}");
            let read: Vec<(Option<String>, Option<usize>)> = seen
                .lock()
                .unwrap()
                .iter()
                .map(|s| (s.scope.clone(), s.limit))
                .collect();
            let hint: Vec<(Option<String>, Option<usize>)> = hint
                .into_iter()
                .map(|(s, l)| (s.map(str::to_owned), l))
                .collect();
            assert_eq!(read, hint, "{sql}");
        }
    }

    #[tokio::test]
    async fn a_count_reads_no_column_and_a_reader_may_answer_how_many_rows_alone() {
        let count = |ctx: SessionContext, sql: &'static str| async move {
            let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
            batches[0]
                .column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Int64Array>()
                .unwrap()
                .value(0)
        };
        for busiest in [false, true] {
            let (table, seen) = recording(busiest);
            let ctx = SessionContext::new();
            ctx.register_table("t", table).unwrap();
            let cases = [
                ("SELECT count(*) FROM t", 3, Some(vec![])),
                // Kept exactly by a reader of the busiest; filtered again by the plan else.
                (
                    "SELECT count(*) FROM t WHERE scope = 'b'",
                    1,
                    Some(if busiest { vec![] } else { vec![0] }),
                ),
                (
                    "SELECT count(*) FROM (SELECT scope FROM t LIMIT 2)",
                    2,
                    Some(vec![]),
                ),
                ("SELECT count(*) FROM t WHERE n > 1", 2, Some(vec![1])),
                ("SELECT count(scope) FROM t", 3, Some(vec![0])),
            ];
            for (sql, n, columns) in cases {
                seen.lock().unwrap().clear();
                assert_eq!(count(ctx.clone(), sql).await, n, "{sql}, busiest {busiest}");
                let read: Vec<Option<Vec<usize>>> = seen
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|s| s.columns.clone())
                    .collect();
                assert_eq!(read, vec![columns], "{sql}");
            }
        }
    }

    #[tokio::test]
    async fn a_reader_may_answer_only_the_columns_asked_for_and_no_other_shape() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("scope", DataType::Utf8, false),
            Field::new("n", DataType::UInt64, false),
        ]));
        let full = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(StringArray::from(vec!["a", "b", "c"])),
                Arc::new(UInt64Array::from(vec![1, 5, 3])),
            ],
        )
        .unwrap();
        // Answers the scan's columns alone, in its order; or, `wrong`, always column `n`.
        let table = |wrong: bool| {
            let (full, all) = (full.clone(), Arc::clone(&schema));
            let reader: Reader = Arc::new(move |scan: Scan| {
                let wanted = if wrong { vec![1] } else { scan.wanted(&all) };
                let batch = full.project(&wanted).map_err(Into::into);
                Box::pin(async move { batch })
            });
            let led: LedHere = Arc::new(Vec::new);
            let t = SnapshotTable::new(
                "t",
                Arc::clone(&schema),
                reader,
                Rows::Live,
                Reach::Here,
                led,
            );
            Arc::new(t)
        };
        let ctx = SessionContext::new();
        ctx.register_table("t", table(false)).unwrap();
        assert_eq!(
            scopes(&ctx, "SELECT scope FROM t ORDER BY n DESC").await,
            ["b", "c", "a"]
        );
        assert_eq!(
            scopes(&ctx, "SELECT scope, n FROM t WHERE n < 4 ORDER BY n").await,
            ["a", "c"]
        );
        ctx.deregister_table("t").unwrap();
        ctx.register_table("t", table(true)).unwrap();
        let refused = match ctx.sql("SELECT scope FROM t").await {
            Ok(frame) => frame.collect().await.unwrap_err(),
            Err(e) => e,
        };
        assert!(
            refused
                .to_string()
                .contains("neither the table's nor those asked for"),
            "{refused}"
        );
    }
}
