//! `sys_weight_overrides`: the rule book's weight overrides, one row per counter.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StringBuilder, UInt32Builder};
use datafusion::arrow::datatypes::{DataType, SchemaRef};

use super::{QuerySources, Reader, batch, reader, schema};

pub(super) fn weight_overrides_schema() -> SchemaRef {
    schema(vec![
        ("counter", DataType::Utf8, false),
        ("weight", DataType::UInt32, false),
    ])
}

pub(super) fn weight_overrides(sources: &Arc<QuerySources>) -> Reader {
    reader(sources, |sources| async move {
        let book = sources.rules.book();
        let (mut counter, mut weight) = (StringBuilder::new(), UInt32Builder::new());
        for (name, w) in book.weight_overrides() {
            counter.append_value(name);
            weight.append_value(w.get());
        }
        batch(
            &weight_overrides_schema(),
            vec![
                Arc::new(counter.finish()) as ArrayRef,
                Arc::new(weight.finish()),
            ],
        )
    })
}
