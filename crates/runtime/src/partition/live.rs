//! An invocation the partition drives: its record and journal in memory, its waits, and where
//! it stands (`phase.rs`).

use tokio::sync::oneshot;

use super::model::phase;
use sluice_core::errors::{Code, CodedError};
use sluice_flow::scheduler::{EntryId, LockId};
use sluice_protocol::message::Kind;
use sluice_protocol::{Frame, MessageType};
use sluice_store::invocation::{Caller, InvocationRecord, Outcome};

/// An invocation the partition is driving.
#[derive(Debug)]
pub(super) struct Live {
    /// Read through [`Live::record`]; every write of it is in this file (`set_status` and the
    /// setters beside [`Live::record`]).
    record: InvocationRecord,
    pub(super) journal: Vec<Frame>,
    pub(super) waiters: Vec<oneshot::Sender<Outcome>>,
    /// Where it stands: idle, queued, running (with its attempt) or ending (`phase.rs`).
    /// Changed only through [`Live::set_run`] and the moves beside [`Live::run`] (and its
    /// status through [`Live::set_status`]).
    run: phase::Run,
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
    /// What it holds reserved of its counters' budgets from its admission until it ends
    /// (`charges.rs`); in memory only, taken again at recovery.
    pub(super) reserved: Option<Box<sluice_flow::limiter::Reserved>>,
    /// Not in the store yet, nor any of its journal: a call stored at the first point anything
    /// depends on it ([`journal::save`]).
    pub(super) unsaved: bool,
    /// Debug builds: where it stood before its first move since the partition last checked
    /// (`None`: it has not moved, or stood in no state of the table).
    #[cfg(debug_assertions)]
    moved_from: Option<phase::State>,
}

#[cfg(debug_assertions)]
thread_local! {
    /// Debug builds: invocations moved on this thread since their partition last checked
    /// ([`Live::check_moves`]). A partition applies a batch on one thread without awaiting, so
    /// its moves and its check meet here.
    static MOVED: std::cell::RefCell<Vec<sluice_core::ids::InvocationId>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The one door for where an invocation stands: every change of its status or run phase goes
/// through [`Live::set_status`] or [`Live::set_run`], and in every debug build the partition
/// checks each invocation that moved against `phase::TRANSITIONS` once it is done with an
/// event ([`check_moves`]).
impl Live {
    /// Changes its durable status (stored with the batch that changes it).
    pub(super) fn set_status(&mut self, status: sluice_store::invocation::Status) {
        self.moving();
        self.record.status = status;
    }

    /// Changes its run phase.
    pub(super) fn set_run(&mut self, run: phase::Run) {
        self.moving();
        self.run = run;
    }

    /// Woken from rest: its next check compares with `Resting`, not with `Gone`.
    pub(super) fn woken(&mut self) {
        #[cfg(debug_assertions)]
        {
            self.moved_from = Some(phase::State::Resting);
            MOVED.with(|moved| moved.borrow_mut().push(self.record.id));
        }
    }

    fn moving(&mut self) {
        #[cfg(debug_assertions)]
        if self.moved_from.is_none() {
            self.moved_from = phase::state_of(self.record.status, &self.run).ok();
            MOVED.with(|moved| moved.borrow_mut().push(self.record.id));
        }
    }
}

/// Its record and run phase, read by the partition's files and written only here.
impl Live {
    /// Its record.
    pub(super) fn record(&self) -> &InvocationRecord {
        &self.record
    }

    /// Where it stands.
    pub(super) fn run(&self) -> &phase::Run {
        &self.run
    }

    /// Completed with `outcome`, having spent `cost`: nothing left to run at a time.
    pub(super) fn set_outcome(&mut self, outcome: Outcome, cost: Option<u64>) {
        self.record.outcome = Some(outcome);
        self.record.run_at_ms = None;
        self.record.cost = cost;
    }

    /// When it runs next (`None`: not at a time of its own).
    pub(super) fn set_run_at(&mut self, at_ms: Option<u64>) {
        self.record.run_at_ms = at_ms;
    }

    /// Why its last attempt failed (`None`: cleared by a resume or a success).
    pub(super) fn set_last_failure(
        &mut self,
        failure: Option<sluice_store::invocation::LastFailure>,
    ) {
        self.record.last_failure = failure;
    }

    /// Failed attempts in a row.
    pub(super) fn set_retry_count(&mut self, count: u32) {
        self.record.retry_count = count;
    }

    /// One more attempt started.
    pub(super) fn count_attempt(&mut self) {
        self.record.attempts += 1;
    }

    /// Pinned to `deployment`, speaking `protocol`, from its first attempt on.
    pub(super) fn pin(&mut self, deployment: sluice_core::ids::DeploymentId, protocol: i32) {
        self.record.deployment = Some(deployment);
        self.record.protocol = Some(protocol);
    }

    /// Its running attempt, if any ([`phase::Run::attempt`]).
    pub(super) fn attempt_mut(&mut self) -> Option<&mut phase::Attempt> {
        self.run.attempt()
    }

    /// Its record and journal, as it comes to rest.
    pub(super) fn into_record_and_journal(self) -> (InvocationRecord, Vec<Frame>) {
        (self.record, self.journal)
    }

    /// [`phase::Run::stop`].
    pub(super) fn stop(&mut self) -> bool {
        self.run.stop()
    }

    /// [`phase::Run::end`].
    pub(super) fn end(&mut self) -> Option<phase::Ended> {
        self.run.end()
    }

    /// [`phase::Run::await_on`].
    pub(super) fn await_on(&mut self, awaited: phase::Awaited) {
        self.run.await_on(awaited);
    }

    /// [`phase::Run::settle`].
    pub(super) fn settle(&mut self) -> Option<sluice_flow::scheduler::Permit> {
        self.run.settle()
    }
}

/// Debug builds: checks every invocation of `live` that moved since the last check against
/// `phase::TRANSITIONS`; panics naming both states on a move the table does not list, or on a
/// status and run phase that make no state. Invocations moved by another partition on this
/// thread wait for their own partition's check.
pub(super) fn check_moves(
    live: &mut std::collections::HashMap<sluice_core::ids::InvocationId, Box<Live>>,
) {
    #[cfg(debug_assertions)]
    {
        let moved = MOVED.with(|moved| std::mem::take(&mut *moved.borrow_mut()));
        let mut others = Vec::new();
        for id in moved {
            let Some(invocation) = live.get_mut(&id) else {
                others.push(id);
                continue;
            };
            let Some(from) = invocation.moved_from.take() else {
                continue;
            };
            let to = phase::state_of(invocation.record.status, &invocation.run)
                .unwrap_or_else(|e| panic!("invocation {id} holds {e}, no state of the table"));
            assert!(
                phase::allowed(from, to),
                "invocation {id} moved from {from:?} to {to:?}, a move phase::TRANSITIONS does not list"
            );
        }
        if !others.is_empty() {
            MOVED.with(|moved| moved.borrow_mut().extend(others));
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = live;
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
            reserved: None,
            unsaved: false,
            #[cfg(debug_assertions)]
            moved_from: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use sluice_store::invocation::new::{Identity, NewInvocation};
    use sluice_store::invocation::{Status, Target};

    fn accepted() -> (
        sluice_core::ids::InvocationId,
        HashMap<sluice_core::ids::InvocationId, Box<Live>>,
    ) {
        let record = NewInvocation::new(
            Target {
                service: "Svc".into(),
                handler: "run".into(),
                key: None,
            },
            Identity::Fresh,
        )
        .into_record(1);
        let id = record.id;
        let live = Live::new(record, Vec::new(), 1);
        (id, HashMap::from([(id, Box::new(live))]))
    }

    #[test]
    fn a_move_the_table_lists_passes_the_door() {
        let (id, mut live) = accepted();
        live.get_mut(&id).unwrap().set_status(Status::Paused);
        check_moves(&mut live);
        // Checked once: the next move starts from where it stands now.
        live.get_mut(&id).unwrap().set_status(Status::Completed);
        check_moves(&mut live);
    }

    #[test]
    #[should_panic(
        expected = "moved from Accepted to Suspended, a move phase::TRANSITIONS does not list"
    )]
    fn a_move_the_table_does_not_list_panics_in_a_debug_build() {
        let (id, mut live) = accepted();
        live.get_mut(&id).unwrap().set_status(Status::Suspended);
        check_moves(&mut live);
    }
}
