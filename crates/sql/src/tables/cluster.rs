//! `sys_cluster`: each partition as this node sees it in cluster mode (who leads it, its epoch,
//! whether this node keeps it, how far its replica is behind). Empty on an embedded node.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Int64Builder, StringBuilder, UInt32Builder, UInt64Builder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};

use super::{QuerySources, Reader, batch, reader, schema};

pub(super) fn cluster_schema() -> SchemaRef {
    schema(vec![
        ("partition", DataType::UInt32, false),
        ("leader", DataType::Utf8, true),
        ("epoch", DataType::UInt64, false),
        ("led_here", DataType::Boolean, false),
        ("held_here", DataType::Boolean, false),
        ("node", DataType::Utf8, false),
        ("stored_offset", DataType::Int64, false),
        ("read_offset", DataType::Int64, false),
        ("log_end", DataType::Int64, false),
        ("lag", DataType::Int64, false),
        ("broken", DataType::Utf8, true),
    ])
}

pub(super) fn cluster(sources: &Arc<QuerySources>) -> Reader {
    reader(sources, |sources| async move {
        let mut partition = UInt32Builder::new();
        let (mut leader, mut node) = (StringBuilder::new(), StringBuilder::new());
        let mut epoch = UInt64Builder::new();
        let [mut led_here, mut held_here] = std::array::from_fn(|_| BooleanBuilder::new());
        let [mut stored, mut read, mut end, mut lag] = std::array::from_fn(|_| Int64Builder::new());
        let mut broken = StringBuilder::new();
        if let Some(view) = (sources.cluster)() {
            for p in &view.partitions {
                partition.append_value(p.partition);
                leader.append_option(p.leader.as_deref());
                epoch.append_value(p.epoch);
                led_here.append_value(p.led_here);
                held_here.append_value(p.held_here);
                node.append_value(&view.node);
                stored.append_value(p.stored_offset);
                read.append_value(p.read_offset);
                end.append_value(p.log_end);
                lag.append_value(p.lag);
                broken.append_option(p.broken.as_deref());
            }
        }
        batch(
            &cluster_schema(),
            vec![
                Arc::new(partition.finish()) as ArrayRef,
                Arc::new(leader.finish()),
                Arc::new(epoch.finish()),
                Arc::new(led_here.finish()),
                Arc::new(held_here.finish()),
                Arc::new(node.finish()),
                Arc::new(stored.finish()),
                Arc::new(read.finish()),
                Arc::new(end.finish()),
                Arc::new(lag.finish()),
                Arc::new(broken.finish()),
            ],
        )
    })
}
