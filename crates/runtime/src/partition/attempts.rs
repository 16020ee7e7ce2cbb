//! Attempts: starting one (with its journal, state and deadlines), and what its end means:
//! a suspension, a retry after back-off, a pause, or the invocation's completion.

use super::journal::object;
use super::model::phase::{Attempt, Run};
use super::task::Partition;
use crate::discovery::ProtocolMode;
use crate::errors::{Code, CodedError};
use crate::flow::scheduler::Permit;
use crate::ids::InvocationId;
use crate::invocation::store::{self};
use crate::invocation::{Status, state};
use crate::invoker::AttemptRequest;

use crate::protocol::ProtocolVersion;
use crate::registry::Address;

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
        if live.running() || live.record.status == Status::Completed {
            // Canceled while it waited in its queue: its slots and lock go back.
            self.admission
                .scheduler
                .release(permit, self.outside.driver.now_ms());
            self.settle(id);
            return;
        }
        let target = live.record.target.clone();
        permit.classify(handler_class(&target.service, &target.handler));
        let limit = usize::try_from(invoker.message_size_limit.0).unwrap_or(usize::MAX);
        let eager = invoker
            .eager_state_size_limit
            .map_or(limit / 2, |l| usize::try_from(l.0).unwrap_or(usize::MAX));
        // Keyed targets get their state eagerly, as much as the eager limit allows.
        let (state, partial_state) = match object(&live.record) {
            Some(object) => self
                .outside.store
                .with_db(|db| state::entries(db, object, eager))
                .and_then(|r| r)
                .map(|(entries, complete)| (entries, !complete))
                .unwrap_or_else(|e| {
                    tracing::warn!(invocation = %id, error = %e, "cannot read eager state; the SDK reads it lazily");
                    (Vec::new(), true)
                }),
            None => (Vec::new(), true),
        };
        let deployment = match live.record.deployment {
            Some(pinned) => self.outside.registry.deployment(pinned).ok(),
            None => self
                .outside
                .registry
                .service(&target.service)
                .ok()
                .map(|(_, d)| d),
        };
        let mut bidi = false;
        // The deployment continues the caller's trace: through this attempt's span when spans
        // are exported, else straight from the caller's.
        let trace = crate::spans::trace_of(&live.record);
        let attempt_span = crate::spans::attempt_span(id, live.record.attempts, live.attempt + 1);
        let traceparent = match trace {
            Some(trace) => Some(trace.child(attempt_span).to_string()),
            None => live.record.trace.clone(),
        };
        let request = deployment.and_then(|d| {
            let version = match live.record.protocol {
                Some(pinned) => ProtocolVersion::from_number(pinned)?,
                None => ProtocolVersion::pick(d.min_protocol_version, d.max_protocol_version)?,
            };
            let Address::Http {
                uri, use_http_11, ..
            } = &d.address
            else {
                return None;
            };
            live.record.deployment = Some(d.id);
            live.record.protocol = Some(version.number());
            // As the reference does: an inactivity timeout of zero means request/response.
            bidi = d.protocol_mode == ProtocolMode::BidiStream
                && !invoker.inactivity_timeout.0.is_zero();
            Some(AttemptRequest {
                uri: uri.clone(),
                use_http_11: *use_http_11,
                additional_headers: d.additional_headers.clone(),
                service: target.service.clone(),
                handler: target.handler.clone(),
                key: target.key.clone(),
                invocation_id: id,
                protocol: version,
                journal: live.journal.clone(),
                state,
                partial_state,
                random_seed: live.record.random_seed,
                scope: live.record.scope.clone(),
                limit_key: live.record.limit_key.clone(),
                retry_count: live.record.retry_count,
                abort_timeout: invoker.abort_timeout.0,
                inactivity_timeout: invoker.inactivity_timeout.0,
                message_size_limit: limit,
                traceparent,
            })
        });
        live.attempt += 1;
        let mut running = Box::new(Attempt::new(permit));
        if let Some(trace) = trace {
            let now = std::time::SystemTime::now();
            running.span = Some((attempt_span, now));
            if live.record.attempts == 0 && live.attempt == 1 {
                let queued = crate::spans::at_ms(live.record.created_at_ms);
                crate::spans::child_of_invocation(
                    &live.record,
                    trace,
                    "queue wait",
                    crate::spans::queue_wait_span(id),
                    (queued, now),
                    Vec::new(),
                    None,
                );
            }
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
            && let Err(e) = store::put_record(&mut self.starting.pins, &live.record)
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

/// A number standing for one handler, for adaptive limits' per-handler baselines: the same
/// handler always gets the same one (`DefaultHasher::new` is unseeded).
fn handler_class(service: &str, handler: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    service.hash(&mut hasher);
    handler.hash(&mut hasher);
    hasher.finish()
}
