//! What one query's functions may build, in all and in one value. Every scalar function of the
//! query's session is replaced by a bounded version of itself that shares one budget per query
//! (`admin.query-memory-limit`) and one cap per value (`admin.query-max-value-size`):
//! - functions whose output can be far larger than their input (`repeat`, `lpad`, `rpad`,
//!   `replace`, `regexp_replace`, `array_repeat`, `range`, `generate_series`) and those that
//!   join their inputs (`concat`, `concat_ws`, the `||` operator) estimate, before allocating,
//!   how many bytes their answer takes, and take them from the budget;
//! - every other function is charged what its answer really took, once it is built;
//! - any answer holding one value larger than the value cap is refused before the next
//!   function sees it, so no function is ever handed more than the cap: an `encode` of an
//!   `encode` of … builds at most a small multiple of the cap before the chain is stopped;
//! - each call first looks at the query's cancel flag, so a query past its timeout stops at
//!   its next function call even inside one huge row.
//!
//! The budget is the query's, not the call's, so `concat(repeat(…), repeat(…), …)` or a chain
//! of `||` cannot add up to more than the cap however each piece is sized. No memory pool sees
//! these values (DataFusion's pool covers operators that buffer, not expressions), so without
//! this one query could build gigabytes and abort the process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::array::{Array, ArrayRef};
use datafusion::arrow::compute::kernels::concat_elements::concat_elements_dyn;
use datafusion::arrow::compute::{cast, kernels::aggregate::max, kernels::aggregate::min};
use datafusion::arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::execution::FunctionRegistry as _;
use datafusion::logical_expr::expr::{BinaryExpr, ScalarFunction};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, LogicalPlan, Operator, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::prelude::SessionContext;

use crate::cancel::CancelFlag;

/// How a growing function's answer is sized from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Growth {
    /// `repeat(text, n)`: text length × n bytes.
    Repeat,
    /// `lpad(text, n [, fill])`: n characters, at most 4 bytes each.
    Pad,
    /// `replace(text, from, to)`, `regexp_replace(text, pattern, to [, flags])`: every
    /// character of the text may become `to` (an empty `from` or pattern matches between
    /// every two), so text length × (1 + `to` length) + `to` length bytes.
    Replace,
    /// `concat(a, b, …)` and `||`: the bytes of every argument.
    Join,
    /// `concat_ws(sep, a, b, …)`: the arguments' bytes, and the separator's once per gap.
    JoinWith,
    /// `array_repeat(value, n)`: the value's bytes × n.
    ArrayRepeat,
    /// `range(start, stop [, step])`, `generate_series`: 8 bytes per element.
    Range,
}

/// The growing functions and how each grows; every other function is charged after the fact.
const GROWING: [(&str, Growth); 10] = [
    ("repeat", Growth::Repeat),
    ("lpad", Growth::Pad),
    ("rpad", Growth::Pad),
    ("replace", Growth::Replace),
    ("regexp_replace", Growth::Replace),
    ("concat", Growth::Join),
    ("concat_ws", Growth::JoinWith),
    ("array_repeat", Growth::ArrayRepeat),
    ("range", Growth::Range),
    ("generate_series", Growth::Range),
];

/// One query's bounds, shared by all its functions.
#[derive(Debug)]
struct Budget {
    left: AtomicU64,
    cap: u64,
    /// Largest one value a function may answer.
    value_cap: u64,
    /// Set once the query must stop.
    cancel: CancelFlag,
}

impl Budget {
    /// Takes `bytes` for a call of `name`, or refuses it with what is left.
    fn take(&self, name: &str, bytes: u64) -> Result<()> {
        let taken = self
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(bytes)
            });
        match taken {
            Ok(_) => Ok(()),
            Err(left) => exec_err!(
                "{name}() would build about {bytes} bytes; the query's functions have {left} of its memory cap of {} bytes left (admin.query-memory-limit)",
                self.cap
            ),
        }
    }

    /// Refuses one value of `bytes` from `name` when it is over the value cap.
    fn value(&self, name: &str, bytes: u64) -> Result<()> {
        if bytes > self.value_cap {
            return exec_err!(
                "{name}() would answer a value of about {bytes} bytes, over the cap of {} bytes on one value (admin.query-max-value-size)",
                self.value_cap
            );
        }
        Ok(())
    }

    /// Refuses any call once the query was cancelled (its timeout passed, or its caller left).
    fn running(&self) -> Result<()> {
        if self.cancel.load(Ordering::Relaxed) {
            return exec_err!("the query was cancelled");
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Bounded {
    inner: ScalarUDF,
    /// The inner function's, but volatile: a call on constants is not folded into a literal
    /// while the query is planned, where its bytes would be copied into every expression's
    /// name (minutes for a 100 MB value) before the budget could refuse anything.
    signature: Signature,
    /// How it grows, for the functions sized before they run.
    growth: Option<Growth>,
    budget: Arc<Budget>,
}

impl Bounded {
    fn new(inner: ScalarUDF, growth: Option<Growth>, budget: Arc<Budget>) -> Self {
        let mut signature = inner.signature().clone();
        signature.volatility = Volatility::Volatile;
        Self {
            inner,
            signature,
            growth,
            budget,
        }
    }
}

impl PartialEq for Bounded {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner && self.growth == other.growth
    }
}

impl Eq for Bounded {}

impl std::hash::Hash for Bounded {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.hash(state);
        self.growth.hash(state);
    }
}

/// The name `||` is planned under once it is bounded (it shows in `EXPLAIN`).
const CONCAT_OPERATOR: &str = "string_concat";

/// The bounds of one query: `limit` bytes its functions may build in all, `value_cap` bytes
/// one value may take, and the flag that stops it.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// `admin.query-memory-limit`.
    pub limit: usize,
    /// `admin.query-max-value-size`.
    pub value_cap: usize,
    /// Set when the query must stop.
    pub cancel: CancelFlag,
}

/// Replaces every scalar function of `ctx` (and the `||` operator) with a bounded one, all
/// sharing one [`Bounds`]: `ctx` must serve one query.
pub fn register(ctx: &SessionContext, bounds: Bounds) {
    let cap = u64::try_from(bounds.limit).unwrap_or(u64::MAX);
    let budget = Arc::new(Budget {
        left: AtomicU64::new(cap),
        cap,
        value_cap: u64::try_from(bounds.value_cap).unwrap_or(u64::MAX),
        cancel: bounds.cancel,
    });
    let mut names: Vec<String> = ctx.state().scalar_functions().keys().cloned().collect();
    names.sort_unstable();
    for name in names {
        let Ok(inner) = ctx.udf(&name) else { continue };
        // Aliases map to the function already wrapped under its own name.
        if inner.inner().downcast_ref::<Bounded>().is_some() {
            continue;
        }
        let growth = GROWING
            .iter()
            .find(|(grows, _)| *grows == inner.name())
            .map(|(_, growth)| *growth);
        ctx.register_udf(ScalarUDF::new_from_impl(Bounded::new(
            (*inner).clone(),
            growth,
            Arc::clone(&budget),
        )));
    }
    let operator = Arc::new(ScalarUDF::new_from_impl(Bounded::new(
        ScalarUDF::new_from_impl(ConcatOperator::default()),
        Some(Growth::Join),
        budget,
    )));
    ctx.add_analyzer_rule(Arc::new(BoundConcatOperator { udf: operator }));
}

/// `value` as 64-bit integers (`None` when it does not cast to them).
fn integers(
    value: &ColumnarValue,
) -> Result<Option<datafusion::arrow::array::PrimitiveArray<Int64Type>>> {
    let array = value.to_array(1)?;
    let ints = cast(&array, &DataType::Int64)?;
    Ok(ints
        .as_any()
        .downcast_ref::<datafusion::arrow::array::PrimitiveArray<Int64Type>>()
        .cloned())
}

/// The largest value of `value` as an i64 (null and negative count as 0).
fn largest_count(value: &ColumnarValue) -> Result<u64> {
    Ok(integers(value)?
        .and_then(|ints| max(&ints))
        .map_or(0, |m| u64::try_from(m).unwrap_or(0)))
}

/// The largest magnitude of an integer argument (null counts as 0).
fn largest_magnitude(value: &ColumnarValue) -> Result<u64> {
    let (low, high) = integers(value)?.map_or((0, 0), |ints| {
        (min(&ints).unwrap_or(0), max(&ints).unwrap_or(0))
    });
    Ok(low.unsigned_abs().max(high.unsigned_abs()))
}

/// The smallest magnitude of a step argument other than 0 (a 0 step is the function's own
/// error), 1 if there is none.
fn smallest_step(value: &ColumnarValue) -> Result<u64> {
    Ok(integers(value)?
        .and_then(|ints| {
            ints.iter()
                .flatten()
                .map(i64::unsigned_abs)
                .filter(|s| *s > 0)
                .min()
        })
        .unwrap_or(1))
}

/// The longest text of `value`, in bytes.
fn longest_text(value: &ColumnarValue) -> Result<u64> {
    if let ColumnarValue::Scalar(
        ScalarValue::Utf8(text) | ScalarValue::LargeUtf8(text) | ScalarValue::Utf8View(text),
    ) = value
    {
        return Ok(text
            .as_ref()
            .map_or(0, |t| u64::try_from(t.len()).unwrap_or(u64::MAX)));
    }
    let array: ArrayRef = value.to_array(1)?;
    let lengths = datafusion::arrow::compute::kernels::length::length(&array)?;
    largest_count(&ColumnarValue::Array(lengths))
}

/// The bytes `value` takes over `rows` rows (a scalar is repeated on each).
fn bytes_over(value: &ColumnarValue, rows: u64) -> u64 {
    match value {
        ColumnarValue::Array(array) => {
            u64::try_from(array.get_array_memory_size()).unwrap_or(u64::MAX)
        }
        ColumnarValue::Scalar(scalar) => u64::try_from(scalar.size())
            .unwrap_or(u64::MAX)
            .saturating_mul(rows),
    }
}

impl Bounded {
    /// An upper bound of the bytes this call's answer takes, when it grows as `growth`.
    fn estimate(&self, growth: Growth, args: &ScalarFunctionArgs) -> Result<u64> {
        let rows = u64::try_from(args.number_rows.max(1)).unwrap_or(u64::MAX);
        let text = |at: usize| {
            args.args
                .get(at)
                .map(longest_text)
                .transpose()
                .map(Option::unwrap_or_default)
        };
        let count = |at: usize| {
            args.args
                .get(at)
                .map(largest_count)
                .transpose()
                .map(Option::unwrap_or_default)
        };
        let per_row = match growth {
            Growth::Join => {
                return Ok(args
                    .args
                    .iter()
                    .fold(0u64, |sum, arg| sum.saturating_add(bytes_over(arg, rows))));
            }
            Growth::JoinWith => {
                let gaps = u64::try_from(args.args.len().saturating_sub(2)).unwrap_or(u64::MAX);
                let separators = args
                    .args
                    .first()
                    .map_or(0, |sep| bytes_over(sep, rows).saturating_mul(gaps));
                return Ok(args.args.iter().skip(1).fold(separators, |sum, arg| {
                    sum.saturating_add(bytes_over(arg, rows))
                }));
            }
            Growth::ArrayRepeat => {
                let value = args
                    .args
                    .first()
                    .map_or(0, |value| bytes_over(value, rows) / rows)
                    .max(16);
                value.saturating_mul(count(1)?)
            }
            Growth::Range => {
                if args
                    .args
                    .iter()
                    .any(|arg| !arg.data_type().is_integer() && !arg.data_type().is_null())
                {
                    return exec_err!(
                        "{}() takes whole numbers in a query (dates and timestamps are not bounded here)",
                        self.inner.name()
                    );
                }
                let (start, stop, step) = match args.args.as_slice() {
                    [stop] => (0, largest_magnitude(stop)?, 1),
                    [start, stop] => (largest_magnitude(start)?, largest_magnitude(stop)?, 1),
                    [start, stop, step, ..] => (
                        largest_magnitude(start)?,
                        largest_magnitude(stop)?,
                        smallest_step(step)?,
                    ),
                    [] => (0, 0, 1),
                };
                (start.saturating_add(stop) / step)
                    .saturating_add(1)
                    .saturating_mul(8)
            }
            Growth::Replace => {
                let to = text(2)?;
                text(0)?
                    .saturating_mul(to.saturating_add(1))
                    .saturating_add(to)
            }
            Growth::Repeat => text(0)?.saturating_mul(count(1)?),
            Growth::Pad => count(1)?.saturating_mul(4),
        };
        Ok(per_row.saturating_mul(rows))
    }
}

/// The largest one value of `value` in bytes: a scalar's size, or the longest element of an
/// array (its whole size when its elements have no length to read).
fn largest_value(value: &ColumnarValue) -> u64 {
    match value {
        ColumnarValue::Scalar(scalar) => u64::try_from(scalar.size()).unwrap_or(u64::MAX),
        ColumnarValue::Array(array) => {
            let whole = bytes_over(value, 1);
            if array.len() <= 1 {
                return whole;
            }
            // Most answers are far below the cap in all: no element can be over it then.
            if whole <= 1 << 20 {
                return whole;
            }
            datafusion::arrow::compute::kernels::length::length(array)
                .ok()
                .and_then(|lengths| largest_count(&ColumnarValue::Array(lengths)).ok())
                .unwrap_or(whole)
        }
    }
}

/// Whether every function call in `expr` is a bounded one.
fn all_bounded(expr: &Expr) -> bool {
    !expr
        .exists(|e| {
            Ok(
                matches!(e, Expr::ScalarFunction(ScalarFunction { func, .. })
                if func.inner().downcast_ref::<Bounded>().is_none()),
            )
        })
        .unwrap_or(true)
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        self.inner.schema_name(args)
    }

    fn short_circuits(&self) -> bool {
        self.inner.short_circuits()
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> Result<SortProperties> {
        self.inner.output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> Result<bool> {
        self.inner.preserves_lex_ordering(inputs)
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let inner = self.inner.inner().with_updated_config(config)?;
        Some(ScalarUDF::new_from_impl(Self::new(
            inner,
            self.growth,
            Arc::clone(&self.budget),
        )))
    }

    /// The inner function's simplification (`now()` to a literal, `coalesce` to `CASE`), kept
    /// only when it calls no function that escapes the bounds (`concat` rebuilds itself from
    /// the unbounded one): the arguments it is given are already bounded calls.
    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        let kept = args.clone();
        match self.inner.simplify(args, info)? {
            ExprSimplifyResult::Simplified(expr) if all_bounded(&expr) => {
                Ok(ExprSimplifyResult::Simplified(expr))
            }
            _ => Ok(ExprSimplifyResult::Original(kept)),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let budget = &self.budget;
        budget.running()?;
        let name = self.inner.name();
        let Some(growth) = self.growth else {
            let answer = self.inner.invoke_with_args(args)?;
            budget.value(name, largest_value(&answer))?;
            // A scalar answer is charged once: it is not copied per row until a later step
            // asks for an array, and that step is a function charged in turn.
            budget.take(name, bytes_over(&answer, 1))?;
            return Ok(answer);
        };
        let rows = u64::try_from(args.number_rows.max(1)).unwrap_or(u64::MAX);
        let bytes = self.estimate(growth, &args)?;
        // The estimate is per row times the rows (joins: their inputs in all): more than the
        // query has left, or a value over the cap on every row, is refused before it is built.
        budget.take(name, bytes)?;
        budget.value(name, bytes / rows)?;
        let answer = self.inner.invoke_with_args(args)?;
        budget.value(name, largest_value(&answer))?;
        Ok(answer)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

/// `left || right` on two values of one string or binary type (type coercion has made them
/// so), as a function the budget can see: null if either side is.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ConcatOperator {
    signature: Signature,
}

impl Default for ConcatOperator {
    fn default() -> Self {
        Self {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for ConcatOperator {
    fn name(&self) -> &str {
        CONCAT_OPERATOR
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(arg_types.first().cloned().unwrap_or(DataType::Utf8))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [left, right] = args.args.as_slice() else {
            return exec_err!("{CONCAT_OPERATOR} takes two values");
        };
        let scalar = matches!(
            (left, right),
            (ColumnarValue::Scalar(_), ColumnarValue::Scalar(_))
        );
        let rows = if scalar { 1 } else { args.number_rows };
        let joined = concat_elements_dyn(&left.to_array(rows)?, &right.to_array(rows)?)?;
        if scalar {
            Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                &joined, 0,
            )?))
        } else {
            Ok(ColumnarValue::Array(joined))
        }
    }
}

/// Plans every `||` of strings as the bounded [`ConcatOperator`]; runs after type coercion,
/// so both sides have one type. (`||` of lists is planned as `array_concat` before this.)
#[derive(Debug)]
struct BoundConcatOperator {
    udf: Arc<ScalarUDF>,
}

impl AnalyzerRule for BoundConcatOperator {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|plan| {
            let names = NamePreserver::new(&plan);
            plan.map_expressions(|expr| {
                let name = names.save(&expr);
                expr.transform_up(|expr| match expr {
                    Expr::BinaryExpr(BinaryExpr {
                        left,
                        op: Operator::StringConcat,
                        right,
                    }) => Ok(Transformed::yes(self.udf.call(vec![*left, *right]))),
                    other => Ok(Transformed::no(other)),
                })
                .map(|done| done.update_data(|expr| name.restore(expr)))
            })
        })
        .map(|done| done.data)
    }

    fn name(&self) -> &str {
        "bound_concat_operator"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bounds `ctx` at `limit` bytes in all and `value_cap` per value.
    fn bounded_values(ctx: &SessionContext, limit: usize, value_cap: usize) -> CancelFlag {
        let cancel = CancelFlag::default();
        register(
            ctx,
            Bounds {
                limit,
                value_cap,
                cancel: Arc::clone(&cancel),
            },
        );
        cancel
    }

    /// Bounds `ctx` at `limit` bytes in all, and as much per value.
    fn bounded(ctx: &SessionContext, limit: usize) -> CancelFlag {
        bounded_values(ctx, limit, limit)
    }

    async fn run(ctx: &SessionContext, sql: &str) -> Result<usize> {
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(batches.iter().map(|b| b.num_rows()).sum())
    }

    #[tokio::test]
    async fn amplifiers_are_refused_before_they_allocate_and_small_calls_work() {
        let ctx = SessionContext::new();
        bounded(&ctx, 1 << 20);
        assert_eq!(run(&ctx, "SELECT repeat('ab', 3) AS r").await.unwrap(), 1);
        assert_eq!(
            run(&ctx, "SELECT replace('abc', 'b', 'xyz') AS r")
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            run(&ctx, "SELECT regexp_replace('abc', 'b', 'x', 'g') AS r")
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            run(&ctx, "SELECT lpad('a', 10, '-') AS r").await.unwrap(),
            1
        );
        for sql in [
            "SELECT repeat('x', 200000000)",
            "SELECT lpad('x', 200000000)",
            "SELECT rpad('x', 200000000, 'y')",
            "SELECT replace(repeat('x', 40000), 'x', repeat('y', 40000))",
            "SELECT regexp_replace(repeat('x', 40000), 'x', repeat('y', 40000), 'g')",
            "SELECT replace(repeat('x', 40000), '', repeat('y', 40000))",
        ] {
            let err = run(&ctx, sql).await.unwrap_err().to_string();
            assert!(err.contains("admin.query-memory-limit"), "{sql}: {err}");
        }
    }

    async fn one_text(ctx: &SessionContext, sql: &str) -> Option<String> {
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let column = cast(batches[0].column(0), &DataType::Utf8).unwrap();
        let texts = column
            .as_any()
            .downcast_ref::<datafusion::arrow::array::StringArray>()
            .unwrap();
        (!texts.is_null(0)).then(|| texts.value(0).to_owned())
    }

    /// Pieces each under the cap cannot add up past it: the budget is the query's.
    #[tokio::test]
    async fn joined_pieces_share_one_budget_per_query() {
        let refused = [
            // Each repeat is 300 KiB, under the 1 MiB cap; four of them are not.
            "SELECT concat(repeat('x', 300000), repeat('x', 300000), repeat('x', 300000), repeat('x', 300000))",
            "SELECT repeat('x', 300000) || repeat('x', 300000) || repeat('x', 300000) || repeat('x', 300000)",
            // One value, built once, joined to itself: each join builds its bytes again.
            "WITH t AS (SELECT repeat('x', 300000) AS s) SELECT s || s || s || s FROM t",
            "WITH t AS (SELECT repeat('x', 300000) AS s) SELECT concat_ws(s, s, s) FROM t",
            "SELECT concat_ws(repeat('x', 300000), 'a', 'b', 'c', 'd')",
        ];
        for sql in refused {
            let ctx = SessionContext::new();
            bounded(&ctx, 1 << 20);
            let err = run(&ctx, sql).await.unwrap_err().to_string();
            assert!(err.contains("admin.query-memory-limit"), "{sql}: {err}");
        }
        // Small joins keep their meaning: `||` is null when a side is, concat skips nulls.
        let ctx = SessionContext::new();
        bounded(&ctx, 1 << 20);
        assert_eq!(
            one_text(&ctx, "SELECT 'a' || 'b' || 'c'").await.as_deref(),
            Some("abc")
        );
        let ctx = SessionContext::new();
        bounded(&ctx, 1 << 20);
        assert_eq!(one_text(&ctx, "SELECT 'a' || NULL").await, None);
        let ctx = SessionContext::new();
        bounded(&ctx, 1 << 20);
        assert_eq!(
            one_text(&ctx, "SELECT concat('a', NULL, 'c')")
                .await
                .as_deref(),
            Some("ac")
        );
        let ctx = SessionContext::new();
        bounded(&ctx, 1 << 20);
        assert_eq!(
            one_text(
                &ctx,
                "SELECT v || '!' AS shout FROM (VALUES ('hi'), ('yo')) AS t(v) ORDER BY shout"
            )
            .await
            .as_deref(),
            Some("hi!")
        );
    }

    /// A function that doubles its input, applied to itself, is stopped at the value cap
    /// before the next call sees it, and the budget counts what each call really built.
    #[tokio::test]
    async fn every_function_is_charged_and_no_value_passes_the_cap() {
        let ctx = SessionContext::new();
        bounded_values(&ctx, 1 << 20, 1 << 18);
        let err = run(
            &ctx,
            "SELECT length(encode(encode(encode(encode(repeat('x', 100000), 'hex'), 'hex'), 'hex'), 'hex'))",
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("encode()") && err.contains("admin.query-max-value-size"),
            "{err}"
        );
        // Values under the cap that add up past the budget are refused by the budget.
        let ctx = SessionContext::new();
        bounded(&ctx, 1 << 20);
        let err = run(
            &ctx,
            "SELECT encode(s, 'hex') FROM (SELECT repeat('x', 100000) AS s) CROSS JOIN generate_series(1, 10)",
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("encode()") && err.contains("admin.query-memory-limit"),
            "{err}"
        );
    }

    /// Functions that must be simplified before they run (`now()`, `coalesce`) and aliases
    /// keep working once wrapped, and keep their column names.
    #[tokio::test]
    async fn wrapped_functions_keep_their_meaning_and_names() {
        let ctx = SessionContext::new();
        bounded(&ctx, 1 << 20);
        assert_eq!(
            one_text(&ctx, "SELECT coalesce(NULL, upper('a'), 'b')")
                .await
                .as_deref(),
            Some("A")
        );
        let ctx = SessionContext::new();
        bounded(&ctx, 1 << 20);
        assert!(one_text(&ctx, "SELECT now()").await.is_some());
        let ctx = SessionContext::new();
        bounded(&ctx, 1 << 20);
        let batches = ctx
            .sql("SELECT lower('A'), char_length('abc')")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let schema = batches[0].schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["lower(Utf8(\"A\"))", "char_length(Utf8(\"abc\"))"]);
    }

    /// Once the flag is set, the next function call ends the query.
    #[tokio::test]
    async fn a_cancelled_query_stops_at_its_next_function() {
        let ctx = SessionContext::new();
        let cancel = bounded(&ctx, 1 << 20);
        cancel.store(true, Ordering::Relaxed);
        let err = run(&ctx, "SELECT upper('a')")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("cancelled"), "{err}");
    }
}
