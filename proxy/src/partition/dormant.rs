//! Held invocations that never ran wait in a compact form: a queued send under a full limit
//! may wait for minutes behind thousands of others, and a full in-memory record with its
//! journal costs several times what the scheduler needs to know about it. While it waits,
//! only its scheduler entry and one allocation holding its encoded record and input stay in
//! memory; it is decoded again the moment anything touches it (its turn comes, an operator
//! asks, a repeat of its idempotency key arrives).

use bytes::Bytes;

use super::{Event, Live, Partition, QueuedEntry};
use crate::flow::scheduler::{EntryId, QueueId};
use crate::ids::InvocationId;
use crate::invocation::InvocationRecord;
use crate::protocol::Frame;

/// A held invocation at rest.
#[derive(Debug)]
pub(super) struct Dormant {
    entry: EntryId,
    queue: QueueId,
    /// Message type of its one journal entry (the input).
    input_ty: u16,
    /// Where the record's encoding ends and the input's payload begins in `packed`.
    split: u32,
    /// The record as the store encodes it, then the input's payload.
    packed: Box<[u8]>,
}

impl Dormant {
    /// `live` at rest, if it is only waiting for its first attempt.
    fn of(live: &Live) -> Option<Self> {
        let [input] = live.journal.as_slice() else {
            return None;
        };
        let idle = live.queued
            && !live.running
            && !live.started()
            && live.waiters.is_empty()
            && live.callers.is_empty()
            && live.outbound.is_none()
            && live.fresh.is_empty()
            && live.permit.is_none()
            && live.lock.is_none()
            && live.violation.is_none()
            && !live.signalled
            && !input.ack;
        let queue = live.queue.filter(|_| idle)?;
        let mut packed = serde_json::to_vec(&live.record).ok()?;
        let split = u32::try_from(packed.len()).ok()?;
        packed.extend_from_slice(&input.payload);
        Some(Self {
            entry: live.entry,
            queue,
            input_ty: input.ty,
            split,
            packed: packed.into_boxed_slice(),
        })
    }

    fn record(&self) -> InvocationRecord {
        serde_json::from_slice(&self.packed[..self.split as usize])
            .expect("a dormant record decodes: it was encoded by the same code")
    }

    /// Back to a queued live invocation.
    fn wake(self) -> Live {
        let input = Frame {
            ty: self.input_ty,
            ack: false,
            payload: Bytes::copy_from_slice(&self.packed[self.split as usize..]),
        };
        let mut live = Live::new(self.record(), vec![input], self.entry);
        live.queued = true;
        live.queue = Some(self.queue);
        live
    }

    /// Its line in the partition's list of queued invocations.
    pub(super) fn listed(&self, id: InvocationId) -> QueuedEntry {
        let record = self.record();
        QueuedEntry {
            queue: self.queue,
            invocation: id,
            attempts: record.attempts,
            created_at_ms: record.created_at_ms,
            run_at_ms: record.run_at_ms,
        }
    }

    /// Its scheduler queue.
    pub(super) fn queue(&self) -> QueueId {
        self.queue
    }
}

impl Event {
    /// The invocation whose live state the event reads or changes, if it names one.
    fn invocation(&self) -> Option<InvocationId> {
        match self {
            Event::Submit { record, .. } => Some(record.id),
            Event::Control { id, .. }
            | Event::CallResult { id, .. }
            | Event::Await { id, .. }
            | Event::Peek { id, .. }
            | Event::Wake { id, .. } => Some(*id),
            Event::Signal { signal, .. } => Some(signal.target),
            // Running invocations are never at rest; the rest read no invocation's state or
            // look at it in either form.
            Event::AttemptMessage { .. }
            | Event::AttemptDone { .. }
            | Event::SetObjectState { .. }
            | Event::Counters { .. }
            | Event::Explain { .. }
            | Event::SlotsFree
            | Event::Queued { .. }
            | Event::Locks { .. }
            | Event::Queues { .. } => None,
        }
    }
}

impl Partition {
    /// Makes the invocation `event` names live again if it is at rest.
    pub(super) fn rouse_for(&mut self, event: &Event) {
        if let Some(id) = event.invocation() {
            self.rouse(id);
        }
    }

    /// Makes `id` live again if it is at rest; it goes back to rest after the next dispatch if
    /// it still only waits.
    pub(super) fn rouse(&mut self, id: InvocationId) {
        if let Some(dormant) = self.dormant.remove(&id) {
            self.live.insert(id, Box::new(dormant.wake()));
            self.just_queued.push(id);
        }
    }

    /// Puts the invocations queued since the last call to rest if they still wait.
    pub(super) fn rest_waiting(&mut self) {
        for id in self.just_queued.drain(..) {
            let Some(dormant) = self.live.get(&id).and_then(|live| Dormant::of(live)) else {
                continue;
            };
            self.live.remove(&id);
            self.dormant.insert(id, dormant);
        }
    }
}
