//! String functions whose output can be far larger than their input (`repeat`, `lpad`, `rpad`,
//! `replace`, `regexp_replace`) are replaced by versions that refuse, before allocating, an
//! answer over the query's memory cap: `repeat('x', 200000000)` would otherwise build 200 MB,
//! and `replace(repeat('x', 40000), 'x', repeat('y', 40000))` 1.6 GB, that no memory pool sees.
//! Every other function's output is at most a small multiple of its inputs, which are bounded
//! already.

use datafusion::arrow::array::{Array, ArrayRef};
use datafusion::arrow::compute::{cast, kernels::aggregate::max};
use datafusion::arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::{Result, exec_err};
use datafusion::execution::FunctionRegistry as _;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature,
};
use datafusion::prelude::SessionContext;

/// Which argument says how long each output value is.
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
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Bounded {
    inner: ScalarUDF,
    growth: Growth,
    limit: usize,
}

/// Replaces the amplifying string functions of `ctx` with bounded ones.
pub fn register(ctx: &SessionContext, limit: usize) {
    for (name, growth) in [
        ("repeat", Growth::Repeat),
        ("lpad", Growth::Pad),
        ("rpad", Growth::Pad),
        ("replace", Growth::Replace),
        ("regexp_replace", Growth::Replace),
    ] {
        if let Ok(inner) = ctx.udf(name) {
            ctx.register_udf(ScalarUDF::new_from_impl(Bounded {
                inner: (*inner).clone(),
                growth,
                limit,
            }));
        }
    }
}

/// The largest value of `value` as an i64 (null and negative count as 0).
fn largest_count(value: &ColumnarValue) -> Result<u64> {
    let array = value.to_array(1)?;
    let ints = cast(&array, &DataType::Int64)?;
    let ints = ints
        .as_any()
        .downcast_ref::<datafusion::arrow::array::PrimitiveArray<Int64Type>>();
    Ok(ints
        .and_then(max)
        .map_or(0, |m| u64::try_from(m).unwrap_or(0)))
}

/// The longest text of `value`, in bytes.
fn longest_text(value: &ColumnarValue) -> Result<u64> {
    let array: ArrayRef = value.to_array(1)?;
    let lengths = datafusion::arrow::compute::kernels::length::length(&array)?;
    largest_count(&ColumnarValue::Array(lengths))
}

impl Bounded {
    fn check(&self, args: &ScalarFunctionArgs) -> Result<()> {
        let Some(count) = args.args.get(1) else {
            return Ok(());
        };
        let text = |at: usize| {
            args.args
                .get(at)
                .map(longest_text)
                .transpose()
                .map(Option::unwrap_or_default)
        };
        let per_row = match self.growth {
            Growth::Replace => {
                let to = text(2)?;
                text(0)?
                    .saturating_mul(to.saturating_add(1))
                    .saturating_add(to)
            }
            Growth::Repeat => {
                let text = args
                    .args
                    .first()
                    .map(longest_text)
                    .transpose()?
                    .unwrap_or(0);
                text.saturating_mul(largest_count(count)?)
            }
            Growth::Pad => largest_count(count)?.saturating_mul(4),
        };
        let rows = u64::try_from(args.number_rows.max(1)).unwrap_or(u64::MAX);
        let total = per_row.saturating_mul(rows);
        if total > u64::try_from(self.limit).unwrap_or(u64::MAX) {
            return exec_err!(
                "{}() would build about {total} bytes, over the query's memory cap of {} bytes (admin.query-memory-limit)",
                self.inner.name(),
                self.limit
            );
        }
        Ok(())
    }
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
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

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.check(&args)?;
        self.inner.invoke_with_args(args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(ctx: &SessionContext, sql: &str) -> Result<usize> {
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(batches.iter().map(|b| b.num_rows()).sum())
    }

    #[tokio::test]
    async fn amplifiers_are_refused_before_they_allocate_and_small_calls_work() {
        let ctx = SessionContext::new();
        register(&ctx, 1 << 20);
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
}
