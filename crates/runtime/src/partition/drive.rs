//! How a partition moves an invocation along: submit, attempt, journal what the deployment
//! sent, resolve run proposals and sleeps, stream notifications and acks to bidi attempts,
//! retry failures with back-off, complete.

use std::time::Duration;

use bytes::Bytes;
use prost::Message as _;

use super::journal::{has_completion, journal_message, notify, object};
use super::{Effect, Event, Live, Partition, promises};
use crate::discovery::ProtocolMode;
use crate::errors::{Code, CodedError};
use crate::ids::InvocationId;
use crate::invocation::store::{self, Purge, Timer};
use crate::invocation::{Failure, InvocationRecord, LastFailure, Outcome, Status, Target, state};
use crate::invoker::attempt::failure_code;
use crate::invoker::{AttemptError, AttemptRequest, Ending};
use crate::protocol::proto::{self, notification_template, output_command_message};
use crate::protocol::{Frame, Message, MessageType, ProtocolVersion};
use crate::registry::Address;
use crate::storage::writer::WriteSet;

/// The completion id of a timer that ends a completed invocation's retention (Sleep
/// completions never use it: SDKs count completion ids up from 1).
pub(super) const EXPIRY: u32 = u32::MAX;

impl Partition {
    pub(super) fn apply(
        &mut self,
        event: Event,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        self.rouse_for(&event);
        match event {
            Event::Submit {
                record,
                input,
                reply,
            } => {
                let id = record.id;
                // Handed in again after it completed and left memory (a child handed over
                // again after a restart, a Kafka record delivered again): the store says so,
                // and it does not run again.
                if !self.live.contains_key(&id)
                    && let Some(done) = self.stored(id)?
                {
                    if let (Some(caller), Some(outcome)) = (record.caller, done.outcome) {
                        effects.push(Effect::CallResult(caller, outcome));
                    }
                    effects.extend(reply.map(|r| Effect::Ack(r, false)));
                    return Ok(());
                }
                // A child submitted again after a restart, or an idempotent repeat: it exists
                // already. Another caller waiting on it gets its result too.
                if let Some(live) = self.live.get_mut(&id) {
                    if let Some(caller) = record.caller
                        && live.record.caller != Some(caller)
                        && !live.callers.contains(&caller)
                    {
                        match &live.record.outcome {
                            Some(outcome) => {
                                effects.push(Effect::CallResult(caller, outcome.clone()))
                            }
                            None => live.callers.push(caller),
                        }
                    }
                    effects.extend(reply.map(|r| Effect::Ack(r, false)));
                    return Ok(());
                }
                // Only new work from outside is refused; a handler's call always goes in.
                if reply.is_some()
                    && let Some(refused) = self.over_held_limits(&record)
                {
                    // Answered after earlier writes commit, like any answer.
                    if let Some(reply) = reply {
                        effects.push(Effect::Then(Box::new(move || {
                            let _ = reply.send(Err(refused));
                        })));
                    }
                    return Ok(());
                }
                let record = *record;
                store::put_record(writes, &record)?;
                store::put_entry(writes, id, 0, &input);
                match record.run_at_ms {
                    Some(at) if record.status == Status::Scheduled => {
                        effects.push(Effect::WakeAt(id, at, None))
                    }
                    _ => effects.push(Effect::Attempt(id)),
                }
                self.track(record, vec![input]);
                effects.extend(reply.map(|r| Effect::Ack(r, true)));
            }
            Event::Await { id, reply } => match self.live.get_mut(&id) {
                Some(live) => match &live.record.outcome {
                    Some(outcome) => effects.push(Effect::Notify(vec![reply], outcome.clone())),
                    None => live.waiters.push(reply),
                },
                // Completed invocations leave memory; their outcome is in the store.
                None => match self.stored(id)?.and_then(|r| r.outcome) {
                    Some(outcome) => effects.push(Effect::Notify(vec![reply], outcome)),
                    None => drop(reply),
                },
            },
            Event::SetObjectState {
                service,
                key,
                state,
                reply,
            } => {
                let object = state::Object {
                    scope: "",
                    service: &service,
                    key: &key,
                };
                state::clear_all(writes, object);
                for (name, value) in &state {
                    state::set(writes, object, name, value);
                }
                effects.push(Effect::Ack(reply, true));
            }
            // The batch's effects end with a dispatch, which takes the freed slots.
            Event::SlotsFree => {}
            Event::Queued { reply } => {
                let queued = self
                    .live
                    .iter()
                    .filter(|(_, live)| live.queued)
                    .filter_map(|(id, live)| {
                        Some(super::QueuedEntry {
                            queue: live.queue?,
                            invocation: *id,
                            attempts: live.record.attempts,
                            created_at_ms: live.record.created_at_ms,
                            run_at_ms: live.record.run_at_ms,
                        })
                    })
                    .chain(self.dormant.iter().filter_map(|(id, d)| d.listed(*id)))
                    .collect();
                let _ = reply.send(queued);
            }
            Event::Locks { reply } => {
                let held = self
                    .scheduler
                    .held_locks()
                    .into_iter()
                    .filter_map(|(lock, entry)| {
                        Some(super::HeldLock {
                            scope: lock.scope.map(|s| s.as_str().to_owned()),
                            service: lock.service.into(),
                            key: lock.object_key.into(),
                            holder: *self.entries.get(&entry)?,
                        })
                    })
                    .collect();
                let _ = reply.send(held);
            }
            Event::Queues { reply } => {
                let _ = reply.send(self.scheduler.queues());
            }
            Event::Counters { reply } => {
                let _ = reply.send(self.scheduler.counters());
            }
            Event::Explain { id, reply } => {
                let _ = reply.send(self.waiting(id));
            }
            Event::Peek { id, reply } => {
                let seen = match self.live.get(&id) {
                    Some(live) => Some((live.record.target.clone(), live.record.outcome.clone())),
                    None => self.stored(id)?.map(|r| (r.target, r.outcome)),
                };
                // After the commit: the outcome may belong to a batch still committing.
                effects.push(Effect::Then(Box::new(move || {
                    let _ = reply.send(seen);
                })));
            }
            Event::AttemptMessage {
                id,
                attempt,
                message,
                ack,
            } => {
                let promise = promises::is_promise_command(&message).then(|| message.clone());
                let checked = match (&promise, self.live.get(&id)) {
                    (Some(_), Some(live)) => self.check_promise_target(&live.record.target),
                    _ => Ok(()),
                };
                if let Some(live) = self.live.get_mut(&id)
                    && live.running
                    && live.attempt == attempt
                    && live.violation.is_none()
                {
                    if let Err(e) = checked {
                        live.violation = Some(e);
                        live.outbound = None;
                        return Ok(());
                    }
                    journal_message(
                        &self.store,
                        &self.registry,
                        self.config.flow_control_enabled(),
                        live,
                        writes,
                        message,
                        ack,
                        self.driver.now_ms(),
                        effects,
                    )?;
                    if let Some(promise) = promise {
                        self.promise_command(id, &promise, writes, effects)?;
                    }
                }
            }
            Event::AttemptDone {
                id,
                attempt,
                result,
            } => {
                if self.attempt_done(id, attempt, result, writes, effects)? {
                    // Only once this batch is durable may the next holder of the object's
                    // lock start: it reads the state this attempt wrote.
                    effects.push(Effect::Settle(id));
                }
            }
            Event::Wake { id, completion } => self.wake(id, completion, writes, effects),
            Event::CallResult {
                id,
                completion,
                outcome,
            } => self.call_result(id, completion, outcome, writes, effects),
            Event::Signal { signal, reply } => {
                let delivery = self.signal(signal, writes, effects);
                if let Some(reply) = reply {
                    effects.push(Effect::Then(Box::new(move || {
                        let _ = reply.send(delivery);
                    })));
                }
            }
            Event::Control { id, op, reply } => {
                let answer = self.control(id, op, writes, effects)?;
                effects.push(Effect::Then(Box::new(move || {
                    let _ = reply.send(Ok(answer));
                })));
            }
        }
        Ok(())
    }

    /// A record only the store still holds (completed invocations leave memory).
    pub(super) fn stored(&self, id: InvocationId) -> Result<Option<InvocationRecord>, CodedError> {
        self.store.with_db(|db| store::load_record(db, id))?
    }

    fn wake(
        &mut self,
        id: InvocationId,
        completion: Option<Timer>,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) {
        if let Some(timer) = completion
            && timer.completion == EXPIRY
        {
            self.expire(timer, writes);
            return;
        }
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if live.record.status == Status::Completed {
            return;
        }
        if let Some(timer) = completion {
            store::delete_timer(writes, timer);
            let done = Message::SleepCompletion(proto::NotificationTemplate {
                id: Some(notification_template::Id::CompletionId(timer.completion)),
                result: Some(notification_template::Result::Void(proto::Void {})),
            });
            notify(
                live,
                writes,
                done.to_frame(false),
                timer.completion,
                effects,
            );
        }
        if !live.running && live.record.status != Status::Paused {
            effects.push(Effect::Attempt(id));
        }
    }

    /// A retained result's time is up: the invocation is purged and its idempotency key free.
    fn expire(&mut self, timer: Timer, writes: &mut WriteSet) {
        store::delete_timer(writes, timer);
        let Some(live) = self.live.get(&timer.invocation) else {
            return;
        };
        if live.record.status != Status::Completed {
            return;
        }
        let entry = live.entry;
        let workflow_run = self.is_workflow_run(&live.record);
        let target = live.record.target.clone();
        store::delete_invocation(writes, timer.invocation);
        self.live.remove(&timer.invocation);
        self.entries.remove(&entry);
        // A workflow run takes its key's state and promises with it.
        if workflow_run {
            self.forget_promises(&target, writes);
        }
    }

    fn is_workflow_run(&self, record: &InvocationRecord) -> bool {
        let target = &record.target;
        self.registry
            .handler_kind(record.deployment, &target.service, &target.handler)
            == Some((
                crate::discovery::ServiceType::Workflow,
                Some(crate::discovery::HandlerType::Workflow),
            ))
    }

    /// A callee finished: its result joins the caller's journal (once) and the caller goes on.
    fn call_result(
        &mut self,
        id: InvocationId,
        completion: u32,
        outcome: Outcome,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) {
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if live.record.status == Status::Completed || has_completion(&live.journal, completion) {
            return;
        }
        let result = match outcome {
            Outcome::Value(content) => notification_template::Result::Value(proto::Value {
                content: content.into(),
            }),
            Outcome::Failure(f) => notification_template::Result::Failure(proto::Failure {
                code: u32::from(f.code),
                message: f.message,
                metadata: Vec::new(),
            }),
        };
        let done = Message::CallCompletion(proto::NotificationTemplate {
            id: Some(notification_template::Id::CompletionId(completion)),
            result: Some(result),
        });
        notify(live, writes, done.to_frame(false), completion, effects);
        if !live.running && live.record.status != Status::Paused {
            effects.push(Effect::Attempt(id));
        }
    }

    /// Records how attempt `attempt` of `id` ended; false when it was not the current one.
    fn attempt_done(
        &mut self,
        id: InvocationId,
        attempt: u32,
        result: Result<Ending, AttemptError>,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<bool, CodedError> {
        let retry = self.config.worker.invoker.retry_policy.clone();
        let now = self.driver.now_ms();
        let Some(retention) = self.live.get(&id).map(|l| self.retention(&l.record.target)) else {
            return Ok(false);
        };
        let Some(live) = self.live.get_mut(&id) else {
            return Ok(false);
        };
        if !live.running || live.attempt != attempt {
            return Ok(false);
        }
        live.running = false;
        live.outbound = None;
        live.record.attempts += 1;
        let fresh = std::mem::take(&mut live.fresh);
        let result = match live.violation.take() {
            Some(violation) => Err(AttemptError::from(violation)),
            None => result,
        };
        match result {
            Ok(Ending::End) => {
                let outcome = last_output(&live.journal).unwrap_or(Outcome::Value(Vec::new()));
                complete(live, outcome, retention, now, writes, effects);
            }
            Ok(Ending::Suspended(message)) => {
                live.record.retry_count = 0;
                live.record.status = Status::Suspended;
                let awaited = awaited(&message);
                let signalled = std::mem::take(&mut live.signalled);
                if signalled
                    || fresh
                        .iter()
                        .any(|c| awaited.is_empty() || awaited.contains(c))
                {
                    effects.push(Effect::Attempt(id));
                }
            }
            Ok(Ending::Failed(error)) => {
                let failure = LastFailure::new(Some(failure_code(&error)), error.message.clone());
                match proto::ErrorBehavior::try_from(error.behavior) {
                    Ok(proto::ErrorBehavior::Pause) => pause(live, failure),
                    Ok(proto::ErrorBehavior::Fail) => {
                        let code = u16::try_from(error.code).unwrap_or(500);
                        live.record.last_failure = Some(failure);
                        let outcome = Outcome::Failure(Failure {
                            code,
                            message: error.message,
                        });
                        complete(live, outcome, retention, now, writes, effects);
                    }
                    _ => {
                        let delay = error.next_retry_delay.map(Duration::from_millis);
                        back_off(live, &retry, failure, delay, now, effects);
                    }
                }
            }
            Err(e) => {
                let failure = LastFailure::new(e.error.code, e.error.message.clone());
                back_off(live, &retry, failure, e.retry_after, now, effects);
            }
        }
        store::put_record(writes, &live.record)?;
        Ok(true)
    }

    /// Starts an attempt of `id` on its (pinned) deployment.
    pub(super) fn start_attempt(&mut self, id: InvocationId) {
        let enable_v7 = self.config.experimental_enable_protocol_v7;
        let invoker = &self.config.worker.invoker;
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if live.running || live.record.status == Status::Completed {
            self.settle(id);
            return;
        }
        let target = live.record.target.clone();
        let limit = usize::try_from(invoker.message_size_limit.0).unwrap_or(usize::MAX);
        let eager = invoker
            .eager_state_size_limit
            .map_or(limit / 2, |l| usize::try_from(l.0).unwrap_or(usize::MAX));
        // Keyed targets get their state eagerly, as much as the eager limit allows.
        let (state, partial_state) = match object(&live.record) {
            Some(object) => self
                .store
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
            Some(pinned) => self.registry.deployment(pinned).ok(),
            None => self.registry.service(&target.service).ok().map(|(_, d)| d),
        };
        let mut bidi = false;
        let request = deployment.and_then(|d| {
            let version = match live.record.protocol {
                Some(pinned) => ProtocolVersion::from_number(pinned)?,
                None => ProtocolVersion::pick(
                    d.min_protocol_version,
                    d.max_protocol_version,
                    enable_v7,
                )?,
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
                uri: uri.parse().ok()?,
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
                scope: live.record.scope.as_ref().map(|s| s.as_str().to_owned()),
                limit_key: live
                    .record
                    .limit_key
                    .as_ref()
                    .map(|k| k.as_str().to_owned()),
                retry_count: live.record.retry_count,
                abort_timeout: invoker.abort_timeout.0,
                inactivity_timeout: invoker.inactivity_timeout.0,
                message_size_limit: limit,
            })
        });
        live.attempt += 1;
        live.running = true;
        live.record.status = Status::Running;
        live.fresh.clear();
        live.signalled = false;
        // The pinned deployment must be durable before the journal grows on it, and the
        // status is what the admin API shows. The writer keeps this partition's sets in
        // order, so later batches commit after this one.
        let mut pin = WriteSet::default();
        match store::put_record(&mut pin, &live.record) {
            Ok(()) => drop(self.writer.commit(pin)),
            Err(e) => tracing::error!(invocation = %id, error = %e, "cannot record the attempt"),
        }
        let (outbound, inbound) = if bidi {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        live.outbound = outbound;
        let request = request.ok_or_else(|| {
            CodedError::new(
                Code::RT0011,
                format!(
                    "no usable deployment for service '{}' (none registered, removed, or out of protocol range)",
                    target.service
                ),
            )
        });
        self.driver.start(super::driver::Started {
            id,
            attempt: live.attempt,
            request,
            inbound,
        });
    }
}

/// The completion ids a suspension waits on (empty when it names none).
fn awaited(message: &Message) -> Vec<u32> {
    fn walk(future: &proto::Future, out: &mut Vec<u32>) {
        out.extend_from_slice(&future.waiting_completions);
        for nested in &future.nested_futures {
            walk(nested, out);
        }
    }
    let mut out = Vec::new();
    match message {
        Message::SuspensionV6(s) => out.extend_from_slice(&s.waiting_completions),
        Message::Suspension(s) => {
            if let Some(future) = &s.awaiting_on {
                walk(future, &mut out);
            }
        }
        _ => {}
    }
    out
}

/// How long what a completed invocation leaves behind stays in the store, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Retention {
    /// The record and outcome (`worker.completion-retention`), unless an idempotency key or a
    /// workflow keeps them (the record's own `retention_ms`).
    pub completion_ms: u64,
    /// The journal (`journal_retention`, at most `worker.max-journal-retention`).
    pub journal_ms: u64,
}

impl Partition {
    /// The retention of a completed invocation of `target`.
    pub(super) fn retention(&self, target: &Target) -> Retention {
        let worker = &self.config.worker;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Retention {
            completion_ms: ms(worker.completion_retention.0),
            journal_ms: ms(self.registry.journal_retention(
                &target.service,
                &target.handler,
                worker.max_journal_retention.0,
            )),
        }
    }
}

pub(super) fn complete(
    live: &mut Live,
    outcome: Outcome,
    retention: Retention,
    now: u64,
    writes: &mut WriteSet,
    effects: &mut Vec<Effect>,
) {
    live.record.status = Status::Completed;
    live.record.outcome = Some(outcome.clone());
    live.record.run_at_ms = None;
    // Retained results (idempotency, workflows) leave memory and store on their expiry timer;
    // every other completed invocation through a purge row the purger works off.
    let kept = match live.record.retention_ms {
        Some(retained) => {
            let timer = Timer {
                at_ms: now.saturating_add(retained),
                invocation: live.record.id,
                completion: EXPIRY,
            };
            store::put_timer(writes, timer);
            effects.push(Effect::WakeAt(timer.invocation, timer.at_ms, Some(timer)));
            retained
        }
        None => {
            let at = now.saturating_add(retention.completion_ms);
            store::put_purge(writes, at, live.record.id, Purge::Invocation);
            retention.completion_ms
        }
    };
    if retention.journal_ms < kept {
        let at = now.saturating_add(retention.journal_ms);
        store::put_purge(writes, at, live.record.id, Purge::Journal);
    }
    for caller in live.record.caller.iter().chain(&live.callers) {
        effects.push(Effect::CallResult(*caller, outcome.clone()));
    }
    // The journal is in the store; nothing in memory reads it again.
    live.journal = Vec::new();
    // Without a retained result (idempotency, workflows) nothing looks the invocation up in
    // memory again: it leaves once the batch commits and its waiters have their answer.
    if live.record.retention_ms.is_none() {
        effects.push(Effect::Evict(live.record.id));
    }
    effects.push(Effect::Notify(std::mem::take(&mut live.waiters), outcome));
}

fn pause(live: &mut Live, failure: LastFailure) {
    tracing::warn!(
        invocation = %live.record.id,
        error.code = failure.code.as_deref().unwrap_or("-"),
        error = %failure.message,
        "invocation paused; resume it once the cause is fixed"
    );
    live.record.last_failure = Some(failure);
    live.record.status = Status::Paused;
    live.record.run_at_ms = None;
}

fn back_off(
    live: &mut Live,
    policy: &crate::config::RetryPolicy,
    failure: LastFailure,
    requested: Option<Duration>,
    now: u64,
    effects: &mut Vec<Effect>,
) {
    tracing::warn!(
        invocation = %live.record.id,
        error.code = failure.code.as_deref().unwrap_or("-"),
        error = %failure.message,
        attempt = live.record.attempts,
        "attempt failed"
    );
    live.record.retry_count = live.record.retry_count.saturating_add(1);
    live.record.last_failure = Some(failure);
    if live.record.retry_count >= policy.max_attempts.get() {
        live.record.status = Status::Paused;
        live.record.run_at_ms = None;
        return;
    }
    let delay = retry_delay(policy, live.record.retry_count, requested);
    let at = now.saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
    live.record.status = Status::BackingOff;
    live.record.run_at_ms = Some(at);
    effects.push(Effect::WakeAt(live.record.id, at, None));
}

/// Longest wait before a retry, whatever a deployment asks for (`Retry-After`,
/// `next_retry_delay`): a retry scheduled further out looks like a lost invocation.
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

/// The wait before retry number `retry` (1 for the first): `initial × factor^(retry-1)`, at most
/// `max_interval`; or the delay the deployment asked for, at most [`MAX_RETRY_DELAY`]. Never
/// panics: the exponential is computed in floating point and clamped before it becomes a
/// `Duration` (after enough retries it is infinite).
pub(crate) fn retry_delay(
    policy: &crate::config::RetryPolicy,
    retry: u32,
    requested: Option<Duration>,
) -> Duration {
    if let Some(requested) = requested {
        return requested.min(MAX_RETRY_DELAY);
    }
    let exponent = i32::try_from(retry.saturating_sub(1)).unwrap_or(i32::MAX);
    let max = policy.max_interval.0;
    let secs =
        policy.initial_interval.0.as_secs_f64() * policy.exponentiation_factor.powi(exponent);
    Duration::try_from_secs_f64(secs).map_or(max, |d| d.min(max))
}

/// The outcome in the last Output command of the journal.
fn last_output(journal: &[Frame]) -> Option<Outcome> {
    let frame = journal
        .iter()
        .rev()
        .find(|f| f.ty == MessageType::Output.id())?;
    let output = proto::OutputCommandMessage::decode(Bytes::clone(&frame.payload)).ok()?;
    Some(match output.result? {
        output_command_message::Result::Value(v) => Outcome::Value(v.content.to_vec()),
        output_command_message::Result::Failure(f) => Outcome::Failure(Failure {
            code: u16::try_from(f.code).unwrap_or(500),
            message: f.message,
        }),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{MAX_RETRY_DELAY, retry_delay};
    use crate::config::{FriendlyDuration, RetryPolicy};

    #[test]
    fn retry_delays_grow_to_the_cap_and_never_panic() {
        let policy = RetryPolicy::default();
        assert_eq!(retry_delay(&policy, 1, None), Duration::from_millis(500));
        assert_eq!(retry_delay(&policy, 2, None), Duration::from_secs(1));
        // Retry 66 of the defaults used to panic converting 2^65 × 0.5 s.
        for retry in [66, 75, 1_100, u32::MAX] {
            assert_eq!(retry_delay(&policy, retry, None), policy.max_interval.0);
        }
        let fast = RetryPolicy {
            initial_interval: FriendlyDuration::from_millis(1),
            max_interval: FriendlyDuration::from_secs(u64::MAX),
            ..RetryPolicy::default()
        };
        assert_eq!(retry_delay(&fast, 75, None), fast.max_interval.0);
        let odd = RetryPolicy {
            exponentiation_factor: f64::NAN,
            ..RetryPolicy::default()
        };
        assert_eq!(retry_delay(&odd, 3, None), odd.max_interval.0);
        // A deployment's own delay (Retry-After: 18446744073709551615) is capped.
        let huge = Some(Duration::from_secs(u64::MAX));
        assert_eq!(retry_delay(&policy, 1, huge), MAX_RETRY_DELAY);
        let small = Some(Duration::from_secs(3));
        assert_eq!(retry_delay(&policy, 1, small), Duration::from_secs(3));
    }
}
