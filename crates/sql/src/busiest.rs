//! `ORDER BY <waiting> DESC LIMIT n` over a live flow table, read as a bounded read. The
//! partitions of such a table pick their busiest `n` rows by what waits there (`ReadView`), so
//! a query for the busiest few need not have every counter or queue of a million built, handed
//! over and sorted. This rule tells the scan it may stop at `n` when the sort asks for exactly
//! that order; the sort stays in the plan, so the answer is the same either way.

use std::sync::Arc;

use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, Sort, SubqueryAlias};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

use super::table::SnapshotTable;

/// The rule (`sluice_busiest_first`).
#[derive(Debug, Default)]
pub struct BusiestFirst;

impl OptimizerRule for BusiestFirst {
    fn name(&self) -> &str {
        "sluice_busiest_first"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Sort(sort) = &plan else {
            return Ok(Transformed::no(plan));
        };
        // One key, descending: ties on it are interchangeable, so any busiest `n` will do.
        let (Some(fetch), [key]) = (sort.fetch, sort.expr.as_slice()) else {
            return Ok(Transformed::no(plan));
        };
        let Expr::Column(column) = &key.expr else {
            return Ok(Transformed::no(plan));
        };
        if key.asc {
            return Ok(Transformed::no(plan));
        }
        match bounded(&sort.input, &column.name, fetch)? {
            Some(input) => Ok(Transformed::yes(LogicalPlan::Sort(Sort {
                expr: sort.expr.clone(),
                input: Arc::new(input),
                fetch: sort.fetch,
            }))),
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// `input` with its scan told to stop at `fetch`, when it is plain columns of a scan of a
/// table whose reader keeps the busiest by `column` and nothing filters between them.
fn bounded(input: &LogicalPlan, column: &str, fetch: usize) -> Result<Option<LogicalPlan>> {
    match input {
        // Plain columns keep their names: the sort's column is the scan's.
        LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => {
            let Some(inner) = bounded(&p.input, column, fetch)? else {
                return Ok(None);
            };
            let projection = Projection::try_new_with_schema(
                p.expr.clone(),
                Arc::new(inner),
                Arc::clone(&p.schema),
            )?;
            Ok(Some(LogicalPlan::Projection(projection)))
        }
        LogicalPlan::SubqueryAlias(a) => {
            let Some(inner) = bounded(&a.input, column, fetch)? else {
                return Ok(None);
            };
            let alias = SubqueryAlias::try_new(Arc::new(inner), a.alias.clone())?;
            Ok(Some(LogicalPlan::SubqueryAlias(alias)))
        }
        LogicalPlan::TableScan(scan) if scan.fetch.is_none() => {
            let provider = source_as_provider(&scan.source)?;
            let busiest = provider
                .downcast_ref::<SnapshotTable>()
                .and_then(SnapshotTable::busiest);
            if busiest != Some(column) {
                return Ok(None);
            }
            let mut scan = scan.clone();
            scan.fetch = Some(fetch);
            Ok(Some(LogicalPlan::TableScan(scan)))
        }
        _ => Ok(None),
    }
}
