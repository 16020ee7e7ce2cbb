//! The spans of an invocation's life, exported through OpenTelemetry once `tracing.endpoint`
//! is set (the server installs the exporter and calls [`enable`]):
//!
//! ```text
//! caller's span (traceparent)
//! └─ ingress                      the request, until its answer
//!    └─ invocation S/h            created → completed (emitted at completion)
//!       ├─ queue wait             created → first attempt
//!       └─ attempt n              one attempt; its id is the traceparent the deployment gets
//! ```
//!
//! An invocation outlives processes, so its spans are built with explicit ids and times and
//! emitted when they end: the invocation's span id derives from its id, and its trace (the
//! ingress span) is stored with it, so an attempt after a restart still has the right parent.
//! Without an exporter nothing here runs, and a caller's `traceparent` is passed on to the
//! deployment unchanged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue, global};
use sluice_core::trace::{TraceParent, derived_span_id};

use sluice_core::ids::InvocationId;
use sluice_store::invocation::InvocationRecord;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Spans are exported from now on (a tracer provider is installed).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether spans are exported.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// One finished span.
#[derive(Debug)]
pub struct Finished {
    /// Its name.
    pub name: String,
    /// Server for the ingress, internal for the rest.
    pub kind: SpanKind,
    /// Its trace.
    pub trace_id: [u8; 16],
    /// Its id.
    pub span_id: [u8; 8],
    /// Its parent in the same trace (`None`: a root).
    pub parent: Option<[u8; 8]>,
    /// When it started and ended.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// What it was about.
    pub attributes: Vec<KeyValue>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// Hands `span` to the exporter (a no-op while spans are off).
pub fn emit(span: Finished) {
    if !enabled() {
        return;
    }
    let tracer = global::tracer("sluice");
    let trace_id = TraceId::from_bytes(span.trace_id);
    let cx = match span.parent {
        Some(parent) => Context::new().with_remote_span_context(SpanContext::new(
            trace_id,
            SpanId::from_bytes(parent),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        )),
        None => Context::new(),
    };
    let mut builder = tracer
        .span_builder(span.name)
        .with_kind(span.kind)
        .with_start_time(span.start)
        .with_attributes(span.attributes);
    builder.trace_id = Some(trace_id);
    builder.span_id = Some(SpanId::from_bytes(span.span_id));
    if let Some(error) = span.error {
        builder = builder.with_status(Status::error(error));
    }
    tracer
        .build_with_context(builder, &cx)
        .end_with_timestamp(span.end);
}

/// The span id of invocation `id` (the parent of its attempts and queue wait).
pub fn invocation_span(id: InvocationId) -> [u8; 8] {
    derived_span_id(id.to_bytes())
}

/// The span id of the queue wait of `id`.
pub fn queue_wait_span(id: InvocationId) -> [u8; 8] {
    derived_span_id(id.to_bytes().into_iter().chain(*b"queue"))
}

/// The span id of an attempt of `id`: `attempts` made before it, `attempt` of this process.
pub fn attempt_span(id: InvocationId, attempts: u32, attempt: u32) -> [u8; 8] {
    derived_span_id(
        id.to_bytes()
            .into_iter()
            .chain(attempts.to_be_bytes())
            .chain(attempt.to_be_bytes()),
    )
}

/// The trace `record`'s spans are exported into: `None` while spans are off, or when it has
/// no trace or its caller did not sample it.
pub fn trace_of(record: &InvocationRecord) -> Option<TraceParent> {
    if !enabled() {
        return None;
    }
    record
        .trace
        .as_deref()
        .and_then(TraceParent::parse)
        .filter(|t| t.sampled())
}

/// The trace an invocation `caller` calls or sends to joins: under the caller's invocation
/// span while spans are exported, else the caller's own trace.
pub fn trace_for_child(caller: &InvocationRecord) -> Option<TraceParent> {
    let trace = caller.trace.as_deref().and_then(TraceParent::parse)?;
    Some(if enabled() && trace.sampled() {
        trace.child(invocation_span(caller.id))
    } else {
        trace
    })
}

/// `ms` since the epoch as a time.
pub fn at_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// What every span of an invocation carries.
pub fn attributes(record: &InvocationRecord) -> Vec<KeyValue> {
    let t = &record.target;
    let mut attributes = vec![
        KeyValue::new("restate.invocation.id", record.id.to_string()),
        KeyValue::new("restate.invocation.target", t.path()),
        KeyValue::new("rpc.service", t.service.clone()),
        KeyValue::new("rpc.method", t.handler.clone()),
    ];
    if let Some(scope) = &record.scope {
        attributes.push(KeyValue::new("sluice.scope", scope.as_str().to_owned()));
    }
    if let Some(key) = &record.limit_key {
        attributes.push(KeyValue::new("sluice.limit_key", key.as_str().to_owned()));
    }
    attributes
}

/// An internal span of `record`'s, child of its invocation span.
pub fn child_of_invocation(
    record: &InvocationRecord,
    trace: TraceParent,
    name: &str,
    span_id: [u8; 8],
    (start, end): (SystemTime, SystemTime),
    extra: Vec<KeyValue>,
    error: Option<String>,
) {
    let mut attributes = attributes(record);
    attributes.extend(extra);
    emit(Finished {
        name: name.to_owned(),
        kind: SpanKind::Internal,
        trace_id: trace.trace_id,
        span_id,
        parent: Some(invocation_span(record.id)),
        start,
        end,
        attributes,
        error,
    });
}
