//! `sys_bulk_cancels`: each bulk cancel an operator ran (`POST /invocations/bulk-cancel`), its
//! filter, where it stands and what it canceled; the newest 1,000, on every node.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, StringBuilder, TimestampMillisecondBuilder, UInt64Builder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};

use super::{QuerySources, Reader, batch, internal, reader, schema, timestamp};

pub(super) fn bulk_cancels_schema() -> SchemaRef {
    schema(vec![
        ("id", DataType::Utf8, false),
        ("node", DataType::Utf8, false),
        ("filter", DataType::Utf8, false),
        ("state", DataType::Utf8, false),
        ("started_at", timestamp(), false),
        ("finished_at", timestamp(), true),
        ("named", DataType::UInt64, false),
        ("cancelled", DataType::UInt64, false),
        ("error", DataType::Utf8, true),
    ])
}

pub(super) fn bulk_cancels(sources: &Arc<QuerySources>) -> Reader {
    reader(sources, |sources| async move {
        let records = sluice_store::operations::bulk_cancels(&sources.store).map_err(internal)?;
        let mut id = StringBuilder::new();
        let mut node = StringBuilder::new();
        let mut filter = StringBuilder::new();
        let mut state = StringBuilder::new();
        let mut started = TimestampMillisecondBuilder::new().with_timezone("UTC");
        let mut finished = TimestampMillisecondBuilder::new().with_timezone("UTC");
        let (mut named, mut cancelled) = (UInt64Builder::new(), UInt64Builder::new());
        let mut error = StringBuilder::new();
        let ms = |at: u64| i64::try_from(at).unwrap_or(i64::MAX);
        for record in records {
            id.append_value(&record.id);
            node.append_value(&record.node);
            filter.append_value(record.filter.to_string());
            state.append_value(record.state.name());
            started.append_value(ms(record.started_at_ms));
            finished.append_option(record.finished_at_ms.map(ms));
            named.append_value(record.named);
            cancelled.append_value(record.cancelled);
            error.append_option(record.error.as_deref());
        }
        batch(
            &bulk_cancels_schema(),
            vec![
                Arc::new(id.finish()) as ArrayRef,
                Arc::new(node.finish()),
                Arc::new(filter.finish()),
                Arc::new(state.finish()),
                Arc::new(started.finish()),
                Arc::new(finished.finish()),
                Arc::new(named.finish()),
                Arc::new(cancelled.finish()),
                Arc::new(error.finish()),
            ],
        )
    })
}
