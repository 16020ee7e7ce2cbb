//! Query answers as JSON rows, the way the reference server writes them: null columns left
//! out, timestamps RFC 3339 with milliseconds, durations ISO 8601.

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use serde_json::{Map, Value};

use datafusion::arrow::array::cast::AsArray;
use datafusion::arrow::datatypes::{
    DurationMicrosecondType, DurationMillisecondType, DurationNanosecondType, DurationSecondType,
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};

/// Milliseconds as `2026-11-22T09:31:25.659Z`.
fn timestamp(ms: i64) -> Value {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| Value::String(format!("{t:.3}")))
        .unwrap_or(Value::Null)
}

/// Milliseconds as `PT0.857S`, `P0D` for zero.
fn duration(ms: i64) -> Value {
    if ms == 0 {
        return Value::String("P0D".into());
    }
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    let (secs, frac) = (ms / 1000, ms % 1000);
    let text = if frac == 0 {
        format!("{sign}PT{secs}S")
    } else {
        let frac = format!("{frac:03}");
        format!("{sign}PT{secs}.{}S", frac.trim_end_matches('0'))
    };
    Value::String(text)
}

/// The value of row `i` of `column`; `None` for null.
fn value(column: &dyn Array, i: usize) -> Option<Value> {
    if column.is_null(i) {
        return None;
    }
    let number = |n: serde_json::Number| Some(Value::Number(n));
    Some(match column.data_type() {
        DataType::Boolean => Value::Bool(column.as_boolean().value(i)),
        DataType::Utf8 => Value::String(column.as_string::<i32>().value(i).to_owned()),
        DataType::LargeUtf8 => Value::String(column.as_string::<i64>().value(i).to_owned()),
        DataType::Utf8View => Value::String(column.as_string_view().value(i).to_owned()),
        DataType::Int8 => return number(column.as_primitive::<Int8Type>().value(i).into()),
        DataType::Int16 => return number(column.as_primitive::<Int16Type>().value(i).into()),
        DataType::Int32 => return number(column.as_primitive::<Int32Type>().value(i).into()),
        DataType::Int64 => return number(column.as_primitive::<Int64Type>().value(i).into()),
        DataType::UInt8 => return number(column.as_primitive::<UInt8Type>().value(i).into()),
        DataType::UInt16 => return number(column.as_primitive::<UInt16Type>().value(i).into()),
        DataType::UInt32 => return number(column.as_primitive::<UInt32Type>().value(i).into()),
        DataType::UInt64 => return number(column.as_primitive::<UInt64Type>().value(i).into()),
        DataType::Float32 => {
            serde_json::Number::from_f64(f64::from(column.as_primitive::<Float32Type>().value(i)))
                .map_or(Value::Null, Value::Number)
        }
        DataType::Float64 => {
            serde_json::Number::from_f64(column.as_primitive::<Float64Type>().value(i))
                .map_or(Value::Null, Value::Number)
        }
        DataType::Timestamp(unit, _) => timestamp(match unit {
            TimeUnit::Second => column.as_primitive::<TimestampSecondType>().value(i) * 1000,
            TimeUnit::Millisecond => column.as_primitive::<TimestampMillisecondType>().value(i),
            TimeUnit::Microsecond => {
                column.as_primitive::<TimestampMicrosecondType>().value(i) / 1000
            }
            TimeUnit::Nanosecond => {
                column.as_primitive::<TimestampNanosecondType>().value(i) / 1_000_000
            }
        }),
        DataType::Duration(unit) => duration(match unit {
            TimeUnit::Second => column.as_primitive::<DurationSecondType>().value(i) * 1000,
            TimeUnit::Millisecond => column.as_primitive::<DurationMillisecondType>().value(i),
            TimeUnit::Microsecond => {
                column.as_primitive::<DurationMicrosecondType>().value(i) / 1000
            }
            TimeUnit::Nanosecond => {
                column.as_primitive::<DurationNanosecondType>().value(i) / 1_000_000
            }
        }),
        _ => {
            let formatter = ArrayFormatter::try_new(column, &FormatOptions::default()).ok()?;
            Value::String(formatter.value(i).to_string())
        }
    })
}

/// Row `i` of `batch` as a JSON object, null columns left out.
fn row(batch: &RecordBatch, i: usize) -> Value {
    let schema = batch.schema();
    let mut row = Map::new();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if let Some(v) = value(column.as_ref(), i) {
            row.insert(field.name().clone(), v);
        }
    }
    Value::Object(row)
}

/// Every row of `batches` as a JSON object, null columns left out.
pub fn rows(batches: &[RecordBatch]) -> Vec<Value> {
    batches
        .iter()
        .flat_map(|batch| (0..batch.num_rows()).map(move |i| row(batch, i)))
        .collect()
}

/// `{"rows": [...]}` of `batches` written one row at a time, so no row outlives its writing;
/// `None` once the text would pass `cap` bytes.
pub fn rows_document(batches: &[RecordBatch], cap: usize) -> Option<Vec<u8>> {
    let mut out = b"{\"rows\":[".to_vec();
    let mut first = true;
    for batch in batches {
        for i in 0..batch.num_rows() {
            if !first {
                out.push(b',');
            }
            first = false;
            serde_json::to_writer(&mut out, &row(batch, i)).ok()?;
            if out.len() > cap {
                return None;
            }
        }
    }
    out.extend_from_slice(b"]}");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_of_rows_is_the_rows_and_stops_at_its_cap() {
        use datafusion::arrow::array::{Int64Array, StringArray};
        use std::sync::Arc;
        let batch = RecordBatch::try_from_iter([
            (
                "n",
                Arc::new(Int64Array::from(vec![Some(1), None])) as Arc<dyn Array>,
            ),
            (
                "s",
                Arc::new(StringArray::from(vec!["a", "b"])) as Arc<dyn Array>,
            ),
        ])
        .unwrap();
        let text = rows_document(std::slice::from_ref(&batch), 1 << 20).unwrap();
        let parsed: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            parsed,
            serde_json::json!({"rows": rows(std::slice::from_ref(&batch))})
        );
        assert_eq!(
            parsed,
            serde_json::json!({"rows": [{"n": 1, "s": "a"}, {"s": "b"}]})
        );
        assert!(rows_document(&[batch], 16).is_none());
    }

    #[test]
    fn values_are_written_like_the_reference() {
        assert_eq!(timestamp(1_795_339_885_659), "2026-11-22T09:31:25.659Z");
        assert_eq!(duration(0), "P0D");
        assert_eq!(duration(857), "PT0.857S");
        assert_eq!(duration(1500), "PT1.5S");
        assert_eq!(duration(60_000), "PT60S");
    }
}
