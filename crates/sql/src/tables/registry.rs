//! Deployments and services.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, StringBuilder, TimestampMillisecondBuilder, UInt32Builder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};

use super::{QuerySources, Reader, batch, reader, schema, service_type_name, timestamp};
use sluice_runtime::registry::Address;

pub(super) fn deployment_schema() -> SchemaRef {
    schema(vec![
        ("id", DataType::Utf8, false),
        ("ty", DataType::Utf8, false),
        ("endpoint", DataType::Utf8, false),
        ("created_at", timestamp(), false),
        ("min_service_protocol_version", DataType::UInt32, false),
        ("max_service_protocol_version", DataType::UInt32, false),
        ("services", DataType::Utf8, false),
        // Its gate on this node: the limit its manifest declares, the window of its paced
        // drain while it recovers, what runs on it, and until when a `Retry-After` holds it.
        ("concurrency_limit", DataType::UInt32, true),
        ("drain_window", DataType::UInt32, true),
        ("running", DataType::UInt32, false),
        ("closed_until", timestamp(), true),
    ])
}

pub(super) fn deployment(sources: &Arc<QuerySources>) -> Reader {
    reader(sources, |sources| async move {
        let mut text: [StringBuilder; 4] = std::array::from_fn(|_| StringBuilder::new());
        let (mut min, mut max) = (UInt32Builder::new(), UInt32Builder::new());
        let mut created = TimestampMillisecondBuilder::new().with_timezone("UTC");
        let (mut declared, mut window, mut running) = (
            UInt32Builder::new(),
            UInt32Builder::new(),
            UInt32Builder::new(),
        );
        let mut closed = TimestampMillisecondBuilder::new().with_timezone("UTC");
        let gates = sources
            .registry
            .gates()
            .snapshot(sluice_core::clock::now_ms());
        for d in sources.registry.deployments() {
            let id = d.id.to_string();
            let gate = gates.iter().find(|g| g.name == id);
            declared.append_option(gate.and_then(|g| g.declared));
            window.append_option(gate.and_then(|g| g.window));
            running.append_value(gate.map_or(0, |g| g.used));
            closed.append_option(
                gate.and_then(|g| g.closed_until_ms)
                    .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
            );
            let (ty, endpoint) = match &d.address {
                Address::Http { uri, .. } => ("http", uri.as_str()),
                Address::Lambda { arn, .. } => ("lambda", arn.as_str()),
            };
            text[0].append_value(d.id.to_string());
            text[1].append_value(ty);
            text[2].append_value(endpoint);
            let names: Vec<&str> = d
                .manifest
                .services
                .iter()
                .map(|s| s.name.as_str())
                .collect();
            text[3].append_value(names.join(","));
            created.append_value(i64::try_from(d.created_at_ms).unwrap_or(i64::MAX));
            min.append_value(u32::try_from(d.min_protocol_version).unwrap_or(0));
            max.append_value(u32::try_from(d.max_protocol_version).unwrap_or(0));
        }
        let [id, ty, endpoint, services] = text.map(|mut b| Arc::new(b.finish()) as ArrayRef);
        batch(
            &deployment_schema(),
            vec![
                id,
                ty,
                endpoint,
                Arc::new(created.finish()),
                Arc::new(min.finish()),
                Arc::new(max.finish()),
                services,
                Arc::new(declared.finish()),
                Arc::new(window.finish()),
                Arc::new(running.finish()),
                Arc::new(closed.finish()),
            ],
        )
    })
}

pub(super) fn service_schema() -> SchemaRef {
    schema(vec![
        ("name", DataType::Utf8, false),
        ("revision", DataType::UInt32, false),
        ("public", DataType::Boolean, false),
        ("ty", DataType::Utf8, false),
        ("deployment_id", DataType::Utf8, false),
    ])
}

pub(super) fn service(sources: &Arc<QuerySources>) -> Reader {
    reader(sources, |sources| async move {
        let (mut name, mut ty, mut deployment) = (
            StringBuilder::new(),
            StringBuilder::new(),
            StringBuilder::new(),
        );
        let (mut revision, mut public) = (UInt32Builder::new(), BooleanBuilder::new());
        let mut services = sources.registry.services();
        services.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        for (s, _) in &services {
            name.append_value(&s.name);
            revision.append_value(s.revision);
            public.append_value(s.overrides.public.unwrap_or(true));
            ty.append_value(service_type_name(s.ty));
            deployment.append_value(s.deployment_id.to_string());
        }
        batch(
            &service_schema(),
            vec![
                Arc::new(name.finish()),
                Arc::new(revision.finish()),
                Arc::new(public.finish()),
                Arc::new(ty.finish()),
                Arc::new(deployment.finish()),
            ],
        )
    })
}
