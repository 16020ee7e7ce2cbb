//! An invocation the partition drives: its record and journal in memory, its waits, and where
//! it stands (`phase.rs`).

use tokio::sync::oneshot;

use super::phase;
use crate::errors::{Code, CodedError};
use crate::flow::scheduler::{EntryId, LockId};
use crate::invocation::{Caller, InvocationRecord, Outcome};
use crate::protocol::message::Kind;
use crate::protocol::{Frame, MessageType};

/// An invocation the partition is driving.
#[derive(Debug)]
pub(super) struct Live {
    pub(super) record: InvocationRecord,
    pub(super) journal: Vec<Frame>,
    pub(super) waiters: Vec<oneshot::Sender<Outcome>>,
    /// Where it stands: idle, queued, running (with its attempt) or ending (`phase.rs`).
    pub(super) run: phase::Run,
    /// Number of the current (or last) attempt of this process.
    pub(super) attempt: u32,
    /// Commands in the journal (the next command's `command_index`).
    pub(super) commands: u32,
    /// Its id in the scheduler.
    pub(super) entry: EntryId,
    /// The object lock it holds from its first admission until it completes, across
    /// suspensions and back-offs (so not part of `run`).
    pub(super) lock: Option<LockId>,
    /// Entries at the start of its journal that rest in the store only (`suspended.rs`);
    /// `journal` holds those after them.
    pub(super) rested: u32,
    /// Callers that reached it through an idempotency key after the first one.
    pub(super) callers: Vec<Caller>,
    /// Not in the store yet, nor any of its journal: a call stored at the first point anything
    /// depends on it ([`journal::save`]).
    pub(super) unsaved: bool,
}

impl Live {
    /// Bytes it holds in memory: itself, its record, its journal (client bytes: the input,
    /// outputs, state values, completions), its waits and its run phase. Each state's share
    /// is known (`sluice_invocation_memory_bytes{state}`).
    pub(super) fn footprint(&self) -> u64 {
        use std::mem::size_of;
        let journal: usize = self
            .journal
            .iter()
            .map(|f| size_of::<Frame>() + f.payload.len())
            .sum();
        let bytes = size_of::<Self>()
            + self.record.heap_bytes()
            + journal
            + self.waiters.capacity() * size_of::<oneshot::Sender<Outcome>>()
            + self.callers.capacity() * size_of::<Caller>()
            + self.run.heap_bytes();
        bytes as u64
    }

    pub(super) fn running(&self) -> bool {
        self.run.is_running()
    }

    /// Its running attempt if that is attempt `attempt` and it broke no rule: the one whose
    /// messages count.
    pub(super) fn current(&mut self, attempt: u32) -> Option<&mut phase::Attempt> {
        let number = self.attempt;
        self.run
            .attempt()
            .filter(|running| number == attempt && running.violation.is_none())
    }

    /// Its running attempt broke a rule: it fails with `error` when it ends, and nothing more
    /// of it is journaled or sent to it.
    pub(super) fn violate(&mut self, error: CodedError) {
        if let Some(running) = self.run.attempt() {
            running.violation = Some(error);
            running.outbound = None;
        }
    }

    /// Adds a wait for the outcome, first pruning waits whose requester left; past `max`
    /// live ones the wait is refused (SEC0008).
    pub(super) fn wait(
        &mut self,
        waiter: oneshot::Sender<Outcome>,
        max: usize,
    ) -> Result<(), CodedError> {
        // Pruned now and then, not on every push: a closed wait costs a few bytes until then.
        if self.waiters.len() >= max || self.waiters.len() % 64 == 63 {
            self.waiters.retain(|w| !w.is_closed());
        }
        if self.waiters.len() >= max {
            return Err(CodedError::new(
                Code::SEC0008,
                format!(
                    "{} requests already wait for invocation {}, the most worker.max-waiters-per-invocation allows",
                    self.waiters.len(),
                    self.record.id
                ),
            )
            .retry_after(1));
        }
        self.waiters.push(waiter);
        Ok(())
    }
}

impl Live {
    pub(super) fn new(record: InvocationRecord, journal: Vec<Frame>, entry: EntryId) -> Self {
        let commands = journal
            .iter()
            .filter(|f| MessageType::from_id(f.ty).map(MessageType::kind) == Some(Kind::Command))
            .count();
        Self {
            record,
            journal,
            waiters: Vec::new(),
            run: phase::Run::IDLE,
            attempt: 0,
            commands: u32::try_from(commands).expect("journals are shorter than 2^32"),
            entry,
            lock: None,
            rested: 0,
            callers: Vec::new(),
            unsaved: false,
        }
    }
}
