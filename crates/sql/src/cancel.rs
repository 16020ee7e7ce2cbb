//! Stops a query that has run out of time. Dropping a query's future only stops it at its next
//! yield, and a cross join of in-memory tables can run for minutes without one: every operator
//! of the physical plan is wrapped so that each batch it hands on first checks a flag, and
//! a set flag ends the query with an error at the next batch, wherever it is.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use datafusion::common::tree_node::{Transformed, TreeNode as _, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures_util::Stream;

/// Set when a query must stop.
pub type CancelFlag = Arc<AtomicBool>;

/// Sets its flag when dropped: a query whose caller stopped waiting (timeout, or the client went
/// away) stops too.
pub struct CancelOnDrop(pub CancelFlag);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `plan` with every operator checking `flag` before it hands on a batch.
pub fn cancellable(
    plan: Arc<dyn ExecutionPlan>,
    flag: &CancelFlag,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let wrapped: Arc<dyn ExecutionPlan> = Arc::new(Cancellable {
            inner: node,
            flag: Arc::clone(flag),
        });
        Ok(Transformed::yes(wrapped))
    })
    .map(|t| t.data)
}

#[derive(Debug)]
struct Cancellable {
    inner: Arc<dyn ExecutionPlan>,
    flag: CancelFlag,
}

impl DisplayAs for Cancellable {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt_as(t, f)
    }
}

#[allow(deprecated)] // `with_new_children` is still required by the trait in DataFusion 55.
impl ExecutionPlan for Cancellable {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn downcast_delegate(&self) -> Option<&dyn ExecutionPlan> {
        Some(self.inner.as_ref())
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.inner.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.inner]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let inner = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("a wrapper needs its child".into()))?;
        Ok(Arc::new(Self {
            inner,
            flag: Arc::clone(&self.flag),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let inner = self.inner.execute(partition, context)?;
        Ok(Box::pin(CheckedStream {
            inner,
            flag: Arc::clone(&self.flag),
        }))
    }
}

struct CheckedStream {
    inner: SendableRecordBatchStream,
    flag: CancelFlag,
}

impl Stream for CheckedStream {
    type Item = Result<datafusion::arrow::array::RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.flag.load(Ordering::Relaxed) {
            return Poll::Ready(Some(Err(DataFusionError::Execution(
                "the query was cancelled".into(),
            ))));
        }
        self.inner.as_mut().poll_next(cx)
    }
}

impl RecordBatchStream for CheckedStream {
    fn schema(&self) -> datafusion::arrow::datatypes::SchemaRef {
        self.inner.schema()
    }
}
