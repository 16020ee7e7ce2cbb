//! Attempts: starting one (with its journal, state and deadlines), and what its end means:
//! a suspension, a retry after back-off, a pause, or the invocation's completion.

use super::journal::object;
use super::live::Live;
use super::model::phase::{Attempt, Run};
use super::task::Partition;
use crate::discovery::ProtocolMode;
use crate::invoker::AttemptRequest;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_flow::scheduler::Permit;
use sluice_store::invocation::store::{self};
use sluice_store::invocation::{Status, state};

use crate::registry::{Address, Deployment};
use sluice_protocol::ProtocolVersion;

impl Partition {
    /// Starts an attempt of `id` on its (pinned) deployment.
    pub(super) fn start_attempt(&mut self, id: InvocationId, mut permit: Permit) {
        if let Err(e) = self.wake_journal(id) {
            // The store cannot give back what it acknowledged: nothing more is safe.
            tracing::error!(invocation = %id, error.code = ?e.code, error = %e, "cannot read a suspended journal back");
            self.outside.store.health().fail(e);
            self.admission
                .scheduler
                .release(permit, self.outside.driver.now_ms());
            return;
        }
        let invoker = &self.outside.config.worker.invoker;
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if live.running() || live.record().status == Status::Completed {
            // Canceled while it waited in its queue: its slots and lock go back.
            self.admission
                .scheduler
                .release(permit, self.outside.driver.now_ms());
            self.settle(id);
            return;
        }
        let target = live.record().target.clone();
        permit.classify(handler_class(&target.service, &target.handler));
        let eager = eager_state(&self.outside.store, live, invoker);
        let deployment = match live.record().deployment {
            Some(pinned) => self.outside.registry.deployment(pinned).ok(),
            None => self
                .outside
                .registry
                .service(&target.service)
                .ok()
                .map(|(_, d)| d),
        };
        // The deployment continues the caller's trace: through this attempt's span when spans
        // are exported, else straight from the caller's.
        let trace = crate::spans::trace_of(live.record());
        let attempt_span = crate::spans::attempt_span(id, live.record().attempts, live.attempt + 1);
        let traceparent = match trace {
            Some(trace) => Some(trace.child(attempt_span).to_string()),
            None => live.record().trace.clone(),
        };
        let (request, bidi) = match deployment {
            Some(d) => attempt_request(live, &d, invoker, eager, traceparent),
            None => (None, false),
        };
        live.attempt += 1;
        let mut running = Box::new(Attempt::new(permit));
        if let Some(trace) = trace {
            running.span = Some((attempt_span, traced_start(live, trace)));
        }
        super::service_metrics::of(&target.service)
            .attempts
            .increment(1);
        live.set_status(Status::Running);
        // The pinned deployment must be durable before the journal grows on it, and the
        // status is what the admin API shows. The writer keeps this partition's sets in
        // order, so later batches commit after this one.
        // An invocation never stored has no journal in the store to grow: its record is
        // stored with its first entry.
        // The attempts one dispatch starts are recorded in one write set (`dispatch`).
        if !live.unsaved
            && let Err(e) = store::put_record(&mut self.starting.pins, live.record())
        {
            tracing::error!(invocation = %id, error = %e, "cannot record the attempt");
        }
        let (outbound, inbound) = if bidi {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        running.outbound = outbound;
        live.set_run(Run::Running(running));
        let request = request.ok_or_else(|| {
            CodedError::new(
                Code::RT0011,
                format!(
                    "no usable deployment for service '{}' (none registered, removed, or out of protocol range)",
                    target.service
                ),
            )
        });
        self.outside.driver.start(super::driver::Started {
            id,
            attempt: live.attempt,
            request,
            inbound,
        });
    }
}

/// When `live`'s attempt starts, in its trace; its first attempt also records how long it
/// waited in its queue, as a span of the invocation.
fn traced_start(live: &Live, trace: sluice_core::trace::TraceParent) -> std::time::SystemTime {
    let now = std::time::SystemTime::now();
    if live.record().attempts == 0 && live.attempt == 1 {
        let queued = crate::spans::at_ms(live.record().created_at_ms);
        crate::spans::child_of_invocation(
            live.record(),
            trace,
            "queue wait",
            crate::spans::queue_wait_span(live.record().id),
            (queued, now),
            Vec::new(),
            None,
        );
    }
    now
}

/// What a keyed target's attempt is given of its state eagerly (as much as the eager limit
/// allows), and whether that is only part of it; nothing for other targets.
fn eager_state(
    store: &sluice_store::storage::Store,
    live: &Live,
    invoker: &sluice_config::InvokerConfig,
) -> (Vec<(bytes::Bytes, bytes::Bytes)>, bool) {
    let Some(object) = object(live.record()) else {
        return (Vec::new(), true);
    };
    let limit = usize::try_from(invoker.message_size_limit.0).unwrap_or(usize::MAX);
    let eager = invoker
        .eager_state_size_limit
        .map_or(limit / 2, |l| usize::try_from(l.0).unwrap_or(usize::MAX));
    store
        .with_db(|db| state::entries(db, object, eager))
        .and_then(|r| r)
        .map(|(entries, complete)| (entries, !complete))
        .unwrap_or_else(|e| {
            tracing::warn!(invocation = %live.record().id, error = %e, "cannot read eager state; the SDK reads it lazily");
            (Vec::new(), true)
        })
}

/// The request of `live`'s next attempt on deployment `d`, which it is pinned to (with the
/// protocol version both speak), and whether it streams both ways; no request when they share
/// no protocol version or `d` is not reached over HTTP.
fn attempt_request(
    live: &mut Live,
    d: &Deployment,
    invoker: &sluice_config::InvokerConfig,
    (state, partial_state): (Vec<(bytes::Bytes, bytes::Bytes)>, bool),
    traceparent: Option<String>,
) -> (Option<AttemptRequest>, bool) {
    let version = match live.record().protocol {
        Some(pinned) => ProtocolVersion::from_number(pinned),
        None => ProtocolVersion::pick(d.min_protocol_version, d.max_protocol_version),
    };
    let (
        Some(version),
        Address::Http {
            uri, use_http_11, ..
        },
    ) = (version, &d.address)
    else {
        return (None, false);
    };
    live.pin(d.id, version.number());
    // As the reference does: an inactivity timeout of zero means request/response.
    let bidi =
        d.protocol_mode == ProtocolMode::BidiStream && !invoker.inactivity_timeout.0.is_zero();
    let target = &live.record().target;
    let request = AttemptRequest {
        uri: uri.clone(),
        use_http_11: *use_http_11,
        additional_headers: d.additional_headers.clone(),
        service: target.service.clone(),
        handler: target.handler.clone(),
        key: target.key.clone(),
        invocation_id: live.record().id,
        protocol: version,
        journal: live.journal.clone(),
        state,
        partial_state,
        random_seed: live.record().random_seed,
        scope: live.record().scope.clone(),
        limit_key: live.record().limit_key.clone(),
        retry_count: live.record().retry_count,
        abort_timeout: invoker.abort_timeout.0,
        inactivity_timeout: invoker.inactivity_timeout.0,
        message_size_limit: usize::try_from(invoker.message_size_limit.0).unwrap_or(usize::MAX),
        traceparent,
    };
    (Some(request), bidi)
}

/// A number standing for one handler, for adaptive limits' per-handler baselines: the same
/// handler always gets the same one (`DefaultHasher::new` is unseeded).
fn handler_class(service: &str, handler: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    service.hash(&mut hasher);
    handler.hash(&mut hasher);
    hasher.finish()
}
