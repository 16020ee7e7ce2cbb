//! Submit: a new invocation from the ingress, a handler's call or send, a Kafka record or a
//! child handed over again. An id that exists (an idempotent repeat, a child submitted again
//! after a restart) is answered from what exists; new work from outside may be refused by the
//! held limits or a rule's bounded queue or rejecting rate; the rest is stored with its batch
//! (a call with a fresh id: once anything depends on it) and queued once that commits.

use tokio::sync::oneshot;

use super::super::model::answer::Answer;
use super::super::model::effect::Effect;
use super::super::task::Partition;
use sluice_core::errors::CodedError;
use sluice_core::ids::InvocationId;
use sluice_flow::scheduler::QueueKey;
use sluice_protocol::Frame;
use sluice_store::invocation::store;
use sluice_store::invocation::{Failure, InvocationRecord, Outcome, Status};
use sluice_store::storage::writer::WriteSet;

impl Partition {
    pub(in super::super) fn submit(
        &mut self,
        record: Box<InvocationRecord>,
        input: Frame,
        reply: Option<oneshot::Sender<Result<bool, CodedError>>>,
        call: Option<oneshot::Sender<Outcome>>,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
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
        if self.live.contains_key(&id) {
            self.join_existing(id, record.caller, call, reply, effects);
            return Ok(());
        }
        // Only new work from outside is refused; a handler's call always goes in.
        if reply.is_some()
            && let Some(refused) = self.resting.over_limits(
                &record,
                &self.outside.config.worker,
                &self.outside.config.flow,
            )
        {
            // Answered after earlier writes commit, like any answer.
            if let Some(reply) = reply {
                effects.push(Effect::Answer(Answer::Refused(reply, refused)));
            }
            return Ok(());
        }
        // A rule's bounded queue or rejecting rate may refuse new work from outside
        // and a handler's calls; its one-way sends always go in.
        // Its queue is looked up once: for the check, and for queueing a call at once.
        let key = self.checked_queue(&record);
        if (reply.is_some() || record.caller.is_some())
            && let Some(key) = &key
            && let Some(refused) = self.flow_refusal(key)
        {
            match (reply, record.caller) {
                (Some(reply), _) => effects.push(Effect::Answer(Answer::Refused(reply, refused))),
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
        // A rule's debounce may delay it, or absorb it into a burst's run (`debounce.rs`).
        let mut record = record;
        let absorbed = self.debounce_arrival(&mut record, writes, effects)?;
        let deferred = deferred && absorbed.is_none() && record.run_at_ms.is_none();
        self.create(*record, vec![input], deferred, key, writes, effects)?;
        if let Some(live) = self.live.get_mut(&id) {
            live.waiters.extend(call);
        }
        if let Some(into) = absorbed {
            self.observe();
            self.absorb(id, into, writes, effects)?;
        }
        // Deferred, nothing is stored yet, and the caller learns nothing from the ack but that
        // its outcome will come; it is answered after the batch all the same, as every answer.
        effects.extend(reply.map(|r| Effect::Ack(r, true)));
        Ok(())
    }

    /// A submission of `id`, which is live already: its caller and call wait for its outcome
    /// too (or get it, if it has one).
    fn join_existing(
        &mut self,
        id: InvocationId,
        caller: Option<sluice_store::invocation::Caller>,
        call: Option<oneshot::Sender<Outcome>>,
        reply: Option<oneshot::Sender<Result<bool, CodedError>>>,
        effects: &mut Vec<Effect>,
    ) {
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if let Some(caller) = caller
            && live.record().caller != Some(caller)
            && !live.callers.contains(&caller)
        {
            match &live.record().outcome {
                Some(outcome) => effects.push(Effect::CallResult(caller, outcome.clone())),
                None => live.callers.push(caller),
            }
        }
        if let Some(call) = call {
            match &live.record().outcome {
                Some(outcome) => effects.push(Effect::Notify(vec![call], outcome.clone())),
                None => {
                    let max = self.outside.config.worker.max_waiters_per_invocation;
                    if let Err(refused) = live.wait(call, max) {
                        if let Some(reply) = reply {
                            effects.push(Effect::Answer(Answer::Refused(reply, refused)));
                        }
                        return;
                    }
                }
            }
        }
        effects.extend(reply.map(|r| Effect::Ack(r, false)));
    }

    /// Stores a new invocation with its journal (from the Input entry on) and tracks it: it
    /// waits for its time (a delayed send) or is attempted. An `unsaved` one is only tracked
    /// and queued at once: it is stored when anything first depends on it.
    pub(in super::super) fn create(
        &mut self,
        record: InvocationRecord,
        journal: Vec<sluice_protocol::Frame>,
        unsaved: bool,
        key: Option<QueueKey>,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let id = record.id;
        crate::partition::service_metrics::of(&record.target.service)
            .created
            .increment(1);
        if unsaved {
            self.track(record, journal);
            if let Some(live) = self.live.get_mut(&id) {
                live.unsaved = true;
            }
            self.enqueue_keyed(id, key);
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
    pub(in super::super) fn stored(
        &self,
        id: InvocationId,
    ) -> Result<Option<InvocationRecord>, CodedError> {
        self.outside
            .store
            .with_db(|db| store::load_record(db, id))?
    }
}
