//! How a partition moves an invocation along: submit, attempt, journal what the deployment
//! sent, resolve run proposals and sleeps, stream notifications and acks to bidi attempts,
//! retry failures with back-off, complete.

use super::answer::Answer;
use super::journal::{Reads, has_completion, journal_message, needs_saved, notify, save};
use super::{Effect, Event, Partition, promises};
use crate::errors::CodedError;
use crate::ids::InvocationId;
use crate::invocation::store::{self, Timer};
use crate::invocation::{Failure, InvocationRecord, Outcome, Status, state};
use crate::protocol::Message;
use crate::protocol::proto::{self, notification_template};
use crate::storage::writer::WriteSet;
use sluice_core::metrics as names;

/// RT0031: a message of `len` bytes from a deployment, over the `limit` a log record allows.
pub(super) fn too_large_for_a_record(len: usize, limit: usize) -> CodedError {
    CodedError::new(
        crate::errors::Code::RT0031,
        format!(
            "the handler sent a value of {len} bytes; in cluster mode one value may be at most {limit} bytes ({})",
            crate::config::RECORD_VALUE_RULE
        ),
    )
}

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
        self.wake_journal_for(&event)?;
        // Whatever an operator, a signal, a timer or a callee does to an invocation that was
        // never stored depends on it: it is stored first, in the same write set.
        if matches!(
            event,
            Event::Control { .. }
                | Event::Signal { .. }
                | Event::Wake { .. }
                | Event::CallResult { .. }
        ) && let Some(live) = event.invocation().and_then(|id| self.live.get_mut(&id))
            && live.unsaved
        {
            save(live, writes)?;
        }
        match event {
            Event::Submit {
                record,
                input,
                reply,
                call,
            } => {
                let id = record.id;
                // A call with a fresh id (random: it cannot exist yet), not delayed and
                // keeping no result: stored at the first point anything depends on it.
                let deferred = call.is_some()
                    && reply.is_some()
                    && record.caller.is_none()
                    && record.retention_ms.is_none()
                    && record.run_at_ms.is_none()
                    && record.status == Status::Pending;
                // Handed in again after it completed and left memory (a child handed over
                // again after a restart, a Kafka record delivered again): the store says so,
                // and it does not run again.
                if !deferred
                    && !self.live.contains_key(&id)
                    && let Some(done) = self.stored(id)?
                {
                    if let (Some(caller), Some(outcome)) = (record.caller, done.outcome.clone()) {
                        effects.push(Effect::CallResult(caller, outcome));
                    }
                    if let (Some(call), Some(outcome)) = (call, done.outcome) {
                        effects.push(Effect::Notify(vec![call], outcome));
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
                    if let Some(call) = call {
                        match &live.record.outcome {
                            Some(outcome) => {
                                effects.push(Effect::Notify(vec![call], outcome.clone()))
                            }
                            None => {
                                let max = self.config.worker.max_waiters_per_invocation;
                                if let Err(refused) = live.wait(call, max) {
                                    if let Some(reply) = reply {
                                        effects
                                            .push(Effect::Answer(Answer::Refused(reply, refused)));
                                    }
                                    return Ok(());
                                }
                            }
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
                        effects.push(Effect::Answer(Answer::Refused(reply, refused)));
                    }
                    return Ok(());
                }
                // A rule's bounded queue or rejecting rate may refuse new work from outside
                // and a handler's calls; its one-way sends always go in.
                if (reply.is_some() || record.caller.is_some())
                    && let Some(refused) = self.flow_refusal(&record)
                {
                    match (reply, record.caller) {
                        (Some(reply), _) => {
                            effects.push(Effect::Answer(Answer::Refused(reply, refused)))
                        }
                        (None, Some(caller)) => effects.push(Effect::CallResult(
                            caller,
                            Outcome::Failure(Failure {
                                code: 429,
                                message: refused.to_string(),
                            }),
                        )),
                        (None, None) => {}
                    }
                    return Ok(());
                }
                self.create(*record, vec![input], deferred, writes, effects)?;
                if let Some(live) = self.live.get_mut(&id) {
                    live.waiters.extend(call);
                }
                match reply {
                    // Nothing is stored yet, and the caller is told nothing but the outcome.
                    Some(reply) if deferred => drop(reply.send(Ok(true))),
                    reply => effects.extend(reply.map(|r| Effect::Ack(r, true))),
                }
            }
            Event::Restart {
                record,
                journal,
                reply,
            } => {
                let id = record.id;
                if self.live.contains_key(&id) || self.stored(id)?.is_some() {
                    effects.push(Effect::Ack(reply, false));
                    return Ok(());
                }
                self.create(*record, journal, false, writes, effects)?;
                effects.push(Effect::Ack(reply, true));
            }
            Event::Await { id, reply } => {
                let (waiter, outcome) = tokio::sync::oneshot::channel();
                match self.live.get_mut(&id) {
                    Some(live) => match &live.record.outcome {
                        Some(done) => {
                            effects.push(Effect::Notify(vec![waiter], done.clone()));
                            let _ = reply.send(Ok(outcome));
                        }
                        None => {
                            let max = self.config.worker.max_waiters_per_invocation;
                            let _ = reply.send(live.wait(waiter, max).map(|()| outcome));
                        }
                    },
                    // At rest: it has no outcome yet, and stays at rest.
                    None if self.dormant.contains_key(&id) => {
                        let max = self.config.worker.max_waiters_per_invocation;
                        let _ = reply.send(self.wait_at_rest(id, waiter, max).map(|()| outcome));
                    }
                    // Completed invocations leave memory; their outcome is in the store.
                    None => {
                        if let Some(done) = self.stored(id)?.and_then(|r| r.outcome) {
                            effects.push(Effect::Notify(vec![waiter], done));
                            let _ = reply.send(Ok(outcome));
                        }
                    }
                }
            }
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
            Event::Barrier { reply } => effects.push(Effect::Answer(Answer::Barrier(reply))),
            Event::PauseQueue {
                queue,
                pause,
                reply,
            } => {
                let Some(key) = self.scheduler.queue_key(queue) else {
                    let _ = reply.send(false);
                    return Ok(());
                };
                if pause {
                    crate::invocation::paused::pause(writes, self.index, &key);
                } else {
                    crate::invocation::paused::resume(writes, self.index, &key);
                }
                effects.push(Effect::PauseQueue(Box::new(key), pause));
                effects.push(Effect::Answer(Answer::QueuePaused(reply)));
            }
            Event::Peek { id, reply } => {
                let seen = match (self.live.get(&id), self.dormant.get(&id)) {
                    (Some(live), _) => {
                        Some((live.record.target.clone(), live.record.outcome.clone()))
                    }
                    // At rest: never ran, no outcome; it stays at rest.
                    (None, Some(resting)) => Some((resting.target(), None)),
                    (None, None) => self.stored(id)?.map(|r| (r.target, r.outcome)),
                };
                // After the commit: the outcome may belong to a batch still committing.
                effects.push(Effect::Answer(Answer::Peeked(reply, seen)));
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
                    // Cluster mode: a value no log record can hold fails the invocation
                    // (RT0031), never the partition's next write.
                    let checked = checked.and_then(|()| match self.config.record_value_limit() {
                        Some(limit) => match message.encoded_len() {
                            len if len > limit => Err(too_large_for_a_record(len, limit)),
                            _ => Ok(()),
                        },
                        None => Ok(()),
                    });
                    if let Err(e) = checked {
                        live.violation = Some(e);
                        live.outbound = None;
                        return Ok(());
                    }
                    if live.unsaved && needs_saved(&message, ack) {
                        save(live, writes)?;
                    }
                    let reads = Reads {
                        store: &self.store,
                        registry: &self.registry,
                        flow_control: self.config.flow_control_enabled(),
                        now: self.driver.now_ms(),
                    };
                    journal_message(&reads, live, writes, message, ack, effects)?;
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
            Event::Wake { id, completion } => self.wake(id, completion, writes, effects)?,
            Event::CallResult {
                id,
                completion,
                outcome,
            } => self.call_result(id, completion, outcome, writes, effects),
            Event::Signal { signal, reply } => {
                let delivery = self.signal(signal, writes, effects);
                if let Some(reply) = reply {
                    effects.push(Effect::Answer(Answer::Signalled(reply, delivery)));
                }
            }
            Event::Control { id, op, reply } => {
                let answer = self.control(id, op, writes, effects)?;
                effects.push(Effect::Answer(Answer::Controlled(reply, answer)));
            }
        }
        Ok(())
    }

    /// Stores a new invocation with its journal (from the Input entry on) and tracks it: it
    /// waits for its time (a delayed send) or is attempted. An `unsaved` one is only tracked
    /// and queued at once: it is stored when anything first depends on it.
    fn create(
        &mut self,
        record: InvocationRecord,
        journal: Vec<crate::protocol::Frame>,
        unsaved: bool,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let id = record.id;
        metrics::counter!(names::INVOCATIONS_CREATED, "service" => record.target.service.clone())
            .increment(1);
        if unsaved {
            self.track(record, journal);
            if let Some(live) = self.live.get_mut(&id) {
                live.unsaved = true;
            }
            self.enqueue(id);
            return Ok(());
        }
        store::put_record(writes, &record)?;
        store::put_journal(writes, id, &journal);
        match record.run_at_ms {
            Some(at) if record.status == Status::Scheduled => {
                effects.push(Effect::WakeAt(id, at, None))
            }
            _ => effects.push(Effect::Attempt(id)),
        }
        self.track(record, journal);
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
    ) -> Result<(), CodedError> {
        if let Some(timer) = completion
            && timer.completion == EXPIRY
        {
            return self.expire(timer, writes);
        }
        let Some(live) = self.live.get_mut(&id) else {
            return Ok(());
        };
        if live.record.status == Status::Completed {
            return Ok(());
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
        Ok(())
    }

    /// A retained result's time is up: the invocation is purged and its idempotency key free.
    fn expire(&mut self, timer: Timer, writes: &mut WriteSet) -> Result<(), CodedError> {
        store::delete_timer(writes, timer);
        let id = timer.invocation;
        // Completed invocations leave memory; one still there waits for its eviction.
        let record = match self.live.get(&id) {
            Some(live) => live.record.clone(),
            None => match self.stored(id)? {
                Some(record) => record,
                None => return Ok(()),
            },
        };
        if record.status != Status::Completed {
            return Ok(());
        }
        let workflow_run = self.is_workflow_run(&record);
        let target = record.target;
        store::delete_invocation(writes, id);
        if let Some(live) = self.live.remove(&id) {
            self.entries.remove(&live.entry);
        }
        // A workflow run takes its key's state and promises with it.
        if workflow_run {
            self.forget_promises(&target, writes);
        }
        Ok(())
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
}
