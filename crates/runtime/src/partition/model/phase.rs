//! Where an invocation the partition drives stands, typed: its run phase carries exactly the
//! data that phase has (a queued invocation has its queue, a running one its attempt, an
//! ended attempt its slots until the ending is stored), so "running but not holding slots" or
//! "queued and running" cannot be written down. The durable status (`record.status`) and the
//! phase together name the invocation's [`State`]; [`TRANSITIONS`] lists every move between
//! states the partition makes, the partition simulator checks that no step makes another, and
//! `docs/partition.md` prints the table.

use std::time::{Instant, SystemTime};

use crate::invoker::Outbound;
use sluice_core::errors::CodedError;
use sluice_flow::scheduler::{Permit, QueueId};
use sluice_protocol::{Message, proto};
use sluice_store::invocation::Status;

/// What the partition holds for an invocation in memory, beyond its record and journal.
#[derive(Debug)]
pub(in crate::partition) enum Run {
    /// No attempt and not queued: it waits for its time (delayed, backing off), a completion
    /// or signal (suspended: what it waits on, if its suspension said), an operator (paused),
    /// its first attempt's commit (accepted), or its eviction (completed).
    Idle { awaiting: Option<Box<Awaited>> },
    /// In a scheduler queue, waiting to be admitted.
    Queued { queue: QueueId },
    /// An attempt runs and holds its slots.
    Running(Box<Attempt>),
    /// Its attempt ended or was stopped; its slots go back once that is stored (`Settle`).
    Ending {
        permit: Permit,
        awaiting: Option<Box<Awaited>>,
    },
}

/// A running attempt: what exists only while it runs.
#[derive(Debug)]
pub(in crate::partition) struct Attempt {
    /// The slots it holds.
    pub permit: Permit,
    /// The open request body of a bidi attempt.
    pub outbound: Option<Outbound>,
    /// Completions journaled while it ran: if it suspends on one of them, it may not have seen
    /// it, so it is attempted again.
    pub fresh: Vec<u32>,
    /// A signal was journaled while it ran.
    pub signalled: bool,
    /// Its deployment answered its request, and the paced drain was told so.
    pub answered: bool,
    /// It broke a rule (say, called an unknown handler): it is failed with this error when it
    /// ends, and nothing more of it is journaled.
    pub violation: Option<CodedError>,
    /// When it started (for its latency metric).
    pub started: Instant,
    /// Its span id and start, while spans are exported.
    pub span: Option<([u8; 8], SystemTime)>,
    /// Its invocation's journal bytes (known from its first message on), and what it added
    /// to them, taken from the running journals' budget until it ends.
    pub journaled: Option<Journaled>,
}

/// The bytes of a running attempt's journal, and its share of the running journals' budget
/// (`worker.running-journals-budget`), given back when the attempt ends.
#[derive(Debug)]
pub(in crate::partition) struct Journaled {
    /// The whole journal's bytes.
    pub bytes: u64,
    taken: u64,
    held: std::sync::Arc<crate::partition::parts::dormant::HeldMemory>,
}

impl Journaled {
    /// A journal of `bytes`, nothing taken yet.
    pub fn new(
        bytes: u64,
        held: std::sync::Arc<crate::partition::parts::dormant::HeldMemory>,
    ) -> Self {
        Self {
            bytes,
            taken: 0,
            held,
        }
    }

    /// Adds `len` bytes, taken from the budget; false (nothing added) when they do not fit.
    pub fn add(&mut self, len: u64) -> bool {
        if !self.held.take_journal(len) {
            return false;
        }
        self.taken += len;
        self.bytes += len;
        true
    }
}

impl Drop for Journaled {
    fn drop(&mut self) {
        self.held.give_back_journal(self.taken);
    }
}

/// What an ended attempt leaves for its ending to look at.
#[derive(Debug)]
pub(in crate::partition) struct Ended {
    pub fresh: Vec<u32>,
    pub signalled: bool,
    pub answered: bool,
    pub violation: Option<CodedError>,
    pub started: Instant,
    pub span: Option<([u8; 8], SystemTime)>,
}

impl Attempt {
    pub(in crate::partition) fn new(permit: Permit) -> Self {
        Self {
            permit,
            outbound: None,
            fresh: Vec::new(),
            signalled: false,
            answered: false,
            violation: None,
            started: Instant::now(),
            span: None,
            journaled: None,
        }
    }
}

impl Run {
    /// Idle, waiting on nothing in particular.
    pub(in crate::partition) const IDLE: Self = Self::Idle { awaiting: None };

    /// The running attempt, if one runs.
    pub(in crate::partition) fn attempt(&mut self) -> Option<&mut Attempt> {
        match self {
            Self::Running(attempt) => Some(attempt),
            _ => None,
        }
    }

    pub(in crate::partition) fn is_running(&self) -> bool {
        matches!(self, Self::Running(_))
    }

    /// Its queue while queued.
    pub(in crate::partition) fn queue(&self) -> Option<QueueId> {
        match self {
            Self::Queued { queue } => Some(*queue),
            _ => None,
        }
    }

    /// The permit of the attempt that ended and waits to give its slots back.
    pub(in crate::partition) fn permit(&self) -> Option<&Permit> {
        match self {
            Self::Ending { permit, .. } => Some(permit),
            _ => None,
        }
    }

    /// What its suspension waits on (`None`: anything, or not suspended).
    pub(in crate::partition) fn awaiting(&self) -> Option<&Awaited> {
        match self {
            Self::Idle { awaiting } | Self::Ending { awaiting, .. } => awaiting.as_deref(),
            _ => None,
        }
    }

    /// Stops the running attempt, if any: its later messages and ending are ignored, its slots
    /// go back once that is stored. True if one ran.
    pub(in crate::partition) fn stop(&mut self) -> bool {
        match std::mem::replace(self, Self::IDLE) {
            Self::Running(attempt) => {
                *self = Self::Ending {
                    permit: attempt.permit,
                    awaiting: None,
                };
                true
            }
            other => {
                *self = other;
                false
            }
        }
    }

    /// The attempt ended: its slots wait for the ending's commit. What it left behind, or
    /// `None` when no attempt ran.
    pub(in crate::partition) fn end(&mut self) -> Option<Ended> {
        match std::mem::replace(self, Self::IDLE) {
            Self::Running(attempt) => {
                let Attempt {
                    permit,
                    outbound: _,
                    fresh,
                    signalled,
                    answered,
                    violation,
                    started,
                    span,
                    journaled: _,
                } = *attempt;
                *self = Self::Ending {
                    permit,
                    awaiting: None,
                };
                Some(Ended {
                    fresh,
                    signalled,
                    answered,
                    violation,
                    started,
                    span,
                })
            }
            other => {
                *self = other;
                None
            }
        }
    }

    /// A suspension says what it waits on.
    pub(in crate::partition) fn await_on(&mut self, awaited: Awaited) {
        if let Self::Idle { awaiting } | Self::Ending { awaiting, .. } = self {
            *awaiting = Some(Box::new(awaited));
        }
    }

    /// Its slots, if it still holds them after its attempt ended; it is idle after.
    pub(in crate::partition) fn settle(&mut self) -> Option<Permit> {
        match std::mem::replace(self, Self::IDLE) {
            Self::Ending { permit, awaiting } => {
                *self = Self::Idle { awaiting };
                Some(permit)
            }
            other => {
                *self = other;
                None
            }
        }
    }

    /// Bytes it holds beside the invocation's `Live` (an attempt, what a suspension awaits).
    pub(in crate::partition) fn heap_bytes(&self) -> usize {
        let awaiting = |a: &Option<Box<Awaited>>| {
            a.as_ref().map_or(0, |a| {
                std::mem::size_of::<Awaited>()
                    + 4 * (a.completions.capacity() + a.signals.capacity())
                    + a.named.iter().map(|n| n.len() + 24).sum::<usize>()
            })
        };
        match self {
            Self::Idle { awaiting: a } | Self::Ending { awaiting: a, .. } => awaiting(a),
            Self::Queued { .. } => 0,
            Self::Running(attempt) => {
                std::mem::size_of::<Attempt>()
                    + 4 * attempt.fresh.capacity()
                    + attempt.violation.as_ref().map_or(0, |v| v.message.len())
            }
        }
    }

    fn kind(&self) -> RunKind {
        match self {
            Self::Idle { .. } => RunKind::Idle,
            Self::Queued { .. } => RunKind::Queued,
            Self::Running(_) => RunKind::Running,
            Self::Ending { .. } => RunKind::Ending,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunKind {
    Idle,
    Queued,
    Running,
    Ending,
}

/// An invocation's state as the transition table names it: its durable status and its run
/// phase together, plus the two places outside `live`: at rest (a held invocation that never
/// ran, packed) and gone from memory (not yet created, evicted after completing, purged, or a
/// process that has not recovered it yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// Not in memory.
    Gone,
    /// Held at rest, packed: queued for its first attempt, or a delayed send.
    Resting,
    /// Stored (or about to be), its first queueing waits for that commit.
    Accepted,
    /// A delayed send waiting for its time.
    Delayed,
    /// In a scheduler queue for an attempt (first, or again after a suspension, a back-off
    /// or a restart).
    Queued,
    /// An attempt runs.
    Running,
    /// Suspended: waits for a completion or a signal.
    Suspended,
    /// Its attempt failed: the next waits for its back-off.
    BackingOff,
    /// Out of attempts or paused by an operator.
    Paused,
    /// It has its outcome; it leaves memory once nobody waits.
    Completed,
}

impl State {
    /// Every state, in the table's order.
    pub const ALL: [State; 10] = [
        State::Gone,
        State::Resting,
        State::Accepted,
        State::Delayed,
        State::Queued,
        State::Running,
        State::Suspended,
        State::BackingOff,
        State::Paused,
        State::Completed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            State::Gone => "gone",
            State::Resting => "resting",
            State::Accepted => "accepted",
            State::Delayed => "delayed",
            State::Queued => "queued",
            State::Running => "running",
            State::Suspended => "suspended",
            State::BackingOff => "backing-off",
            State::Paused => "paused",
            State::Completed => "completed",
        }
    }
}

/// The state of a live invocation with `status` in phase `run`; an error names a combination
/// the partition must never hold. An attempt that ended keeps its slots a while (`Ending`) in
/// the state its ending moved it to.
pub(in crate::partition) fn state_of(status: Status, run: &Run) -> Result<State, String> {
    use RunKind as R;
    let state = match (status, run.kind()) {
        (Status::Pending, R::Idle) => State::Accepted,
        (Status::Scheduled, R::Idle) => State::Delayed,
        // Queued for a first attempt, again after a suspension or a back-off, or after a
        // restart found it running.
        (
            Status::Pending
            | Status::Scheduled
            | Status::Suspended
            | Status::BackingOff
            | Status::Running,
            R::Queued,
        ) => State::Queued,
        // Found running by recovery, before its attempt is queued again.
        (Status::Running, R::Idle) => State::Queued,
        (Status::Running, R::Running) => State::Running,
        (Status::Suspended, R::Idle | R::Ending) => State::Suspended,
        (Status::BackingOff, R::Idle | R::Ending) => State::BackingOff,
        (Status::Paused, R::Idle | R::Ending) => State::Paused,
        // A canceled invocation that never ran completes where it waits; it leaves its queue
        // when admitted.
        (Status::Completed, R::Idle | R::Ending | R::Queued) => State::Completed,
        (status, kind) => {
            return Err(format!("status {} with run phase {kind:?}", status.name()));
        }
    };
    Ok(state)
}

/// Every move between states the partition makes, with what makes it. A move not listed is a
/// bug the partition simulator reports.
#[rustfmt::skip]
pub const TRANSITIONS: &[(State, State, &str)] = &[
    (State::Gone,       State::Accepted,   "submit (stored with its batch)"),
    (State::Gone,       State::Queued,     "submit of a call (stored once something depends on it); recovery"),
    (State::Gone,       State::Delayed,    "submit of a delayed send; recovery"),
    (State::Gone,       State::Suspended,  "recovery"),
    (State::Gone,       State::BackingOff, "recovery"),
    (State::Gone,       State::Paused,     "recovery"),
    (State::Accepted,   State::Queued,     "its batch committed"),
    (State::Accepted,   State::Completed,  "killed or canceled before it was queued, or absorbed into a debounced burst's run (FLO0009)"),
    (State::Accepted,   State::Paused,     "paused before it was queued"),
    (State::Delayed,    State::Resting,    "waits for its time at rest"),
    (State::Delayed,    State::Queued,     "its time came"),
    (State::Delayed,    State::Completed,  "killed or canceled, or a newer debounced call took its place (FLO0009)"),
    (State::Delayed,    State::Paused,     "paused"),
    (State::Resting,    State::Queued,     "woken: admitted, controlled, or its time came"),
    (State::Resting,    State::Delayed,    "woken by a control or a signal while it waits for its time"),
    (State::Resting,    State::Accepted,   "its deadline passed while it rested in its queue, or a rule's on_full replaced it: failed (FLO0003, FLO0008) by the next batch"),
    (State::Queued,     State::Resting,    "still waiting after a dispatch"),
    (State::Queued,     State::Running,    "admitted: an attempt starts"),
    (State::Queued,     State::Completed,  "killed or canceled while queued"),
    (State::Queued,     State::Paused,     "paused while queued"),
    (State::Queued,     State::Accepted,   "its deadline passed in its queue, or a rule's on_full dropped or replaced it: failed (FLO0003, FLO0007, FLO0008) by the next batch"),
    (State::Queued,     State::Delayed,    "a delayed send's deadline passed in its queue, or a rule's on_full dropped or replaced it: failed (FLO0003, FLO0007, FLO0008) by the next batch"),
    (State::Queued,     State::Suspended,  "admitted, but its resting journal could not be read back: the store failed and the process restarts"),
    (State::Queued,     State::BackingOff, "admitted, but its resting journal could not be read back: the store failed and the process restarts"),
    (State::Running,    State::Suspended,  "the attempt suspended"),
    (State::Running,    State::BackingOff, "the attempt failed, to be retried"),
    (State::Running,    State::Paused,     "the attempt failed past its retries, or paused by an operator"),
    (State::Running,    State::Completed,  "the attempt ended with an outcome, or killed"),
    (State::Suspended,  State::Queued,     "a completion or signal it waits on"),
    (State::Suspended,  State::Completed,  "killed"),
    (State::Suspended,  State::Paused,     "paused"),
    (State::BackingOff, State::Queued,     "its back-off is over"),
    (State::BackingOff, State::Suspended,  "resumed: queued once that is stored"),
    (State::BackingOff, State::Completed,  "killed or canceled"),
    (State::BackingOff, State::Paused,     "paused"),
    (State::Paused,     State::Accepted,   "resumed before it ever ran: queued once that is stored"),
    (State::Paused,     State::Suspended,  "resumed after it ran: queued once that is stored"),
    (State::Paused,     State::Completed,  "killed or canceled"),
    (State::Completed,  State::Gone,       "evicted once stored and nobody waits, or purged"),
];

/// Whether the partition may move an invocation from `from` to `to` in one step.
pub fn allowed(from: State, to: State) -> bool {
    from == to || TRANSITIONS.iter().any(|&(f, t, _)| f == from && t == to)
}

/// The transition table as `docs/partition.md` prints it.
pub fn table_markdown() -> String {
    let mut out = String::from("| from | to | when |\n|---|---|---|\n");
    for (from, to, why) in TRANSITIONS {
        out.push_str(&format!("| {} | {} | {why} |\n", from.name(), to.name()));
    }
    out
}

/// Test builds: what every partition was last seen holding, so each step's moves are checked
/// against [`TRANSITIONS`] (a move not in the table panics, naming both states) and recorded in
/// [`WALKED`], which a simulator test reads to show every edge is walked.
/// What a suspended invocation waits on: a completion, a signal or a named signal that is not
/// among them does not start an attempt (it is journaled and seen by the next one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(in crate::partition) struct Awaited {
    /// Completion ids (empty: the suspension named none, so any completion may be it).
    pub completions: Vec<u32>,
    /// Signal indexes (awakeables, built-in signals).
    pub signals: Vec<u32>,
    /// Named signals.
    pub named: Vec<String>,
}

impl Awaited {
    pub(in crate::partition) fn of(message: &Message) -> Self {
        fn walk(future: &proto::Future, out: &mut Awaited) {
            out.completions
                .extend_from_slice(&future.waiting_completions);
            out.signals.extend_from_slice(&future.waiting_signals);
            out.named
                .extend(future.waiting_named_signals.iter().cloned());
            for nested in &future.nested_futures {
                walk(nested, out);
            }
        }
        let mut out = Self::default();
        match message {
            Message::SuspensionV6(s) => {
                out.completions.extend_from_slice(&s.waiting_completions);
                out.signals.extend_from_slice(&s.waiting_signals);
                out.named.extend(s.waiting_named_signals.iter().cloned());
            }
            Message::Suspension(s) => {
                if let Some(future) = &s.awaiting_on {
                    walk(future, &mut out);
                }
            }
            _ => {}
        }
        out
    }

    /// Whether the signal `id` is one it waits on. A suspension that names nothing at all
    /// (an SDK that does not say) waits on anything; the runtime's own signals (cancellation)
    /// always count.
    pub(in crate::partition) fn wants(&self, id: &proto::notification_template::Id) -> bool {
        use proto::notification_template::Id;
        if self.completions.is_empty() && self.signals.is_empty() && self.named.is_empty() {
            return true;
        }
        match id {
            Id::SignalId(index) => {
                *index < super::signals::FIRST_AWAKEABLE_INDEX || self.signals.contains(index)
            }
            Id::SignalName(name) => self.named.contains(name),
            Id::CompletionId(completion) => self.completions.contains(completion),
        }
    }
}

#[cfg(test)]
#[derive(Debug, Default)]
pub(in crate::partition) struct Watch {
    last: std::collections::HashMap<sluice_core::ids::InvocationId, State>,
}

/// Test builds: every move any partition of this test process made, and how often.
#[cfg(test)]
pub(in crate::partition) static WALKED: std::sync::Mutex<
    std::collections::BTreeMap<(State, State), u64>,
> = std::sync::Mutex::new(std::collections::BTreeMap::new());

#[cfg(test)]
impl Watch {
    /// Looks at what the partition holds `now`; panics on a state or a move the table forbids.
    pub(in crate::partition) fn look(
        &mut self,
        now: impl Iterator<Item = (sluice_core::ids::InvocationId, Result<State, String>)>,
    ) {
        let mut seen = std::collections::HashMap::with_capacity(self.last.len());
        for (id, state) in now {
            let state = state
                .unwrap_or_else(|e| panic!("invocation {id} holds {e}, no state of the table"));
            seen.insert(id, state);
        }
        let mut moves = Vec::new();
        for (id, &to) in &seen {
            let from = self.last.get(id).copied().unwrap_or(State::Gone);
            if from != to {
                moves.push((*id, from, to));
            }
        }
        for (id, &from) in &self.last {
            if !seen.contains_key(id) {
                moves.push((*id, from, State::Gone));
            }
        }
        if !moves.is_empty() {
            // SLUICE_PHASE_LEARN=1: record every move without judging it (the simulator then
            // prints the moves the table lacks).
            let learning = std::env::var_os("SLUICE_PHASE_LEARN").is_some();
            let mut walked = WALKED.lock().unwrap_or_else(|p| p.into_inner());
            for (id, from, to) in moves {
                assert!(
                    learning || allowed(from, to),
                    "invocation {id} moved from {} to {}, a move the transition table does not list",
                    from.name(),
                    to.name()
                );
                *walked.entry((from, to)).or_default() += 1;
            }
        }
        self.last = seen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_is_entered_by_some_move_and_left_by_another() {
        for state in State::ALL {
            let entered = TRANSITIONS.iter().any(|&(_, to, _)| to == state);
            let left = TRANSITIONS.iter().any(|&(from, _, _)| from == state);
            assert!(entered, "{} is never entered", state.name());
            assert!(left, "{} is never left", state.name());
        }
    }

    #[test]
    fn the_table_lists_each_move_once() {
        let mut seen = std::collections::BTreeSet::new();
        for &(from, to, _) in TRANSITIONS {
            assert_ne!(from, to, "{} to itself is not a move", from.name());
            assert!(
                seen.insert((from, to)),
                "{} -> {} twice",
                from.name(),
                to.name()
            );
        }
    }

    #[test]
    fn docs_print_the_table_as_built() {
        let docs = include_str!("../../../../../docs/partition.md");
        assert!(
            docs.contains(&table_markdown()),
            "docs/partition.md does not hold the transition table as built; paste:\n{}",
            table_markdown()
        );
    }
}
