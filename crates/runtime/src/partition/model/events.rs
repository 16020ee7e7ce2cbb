//! What a partition is told (an [`Event`] on its channel) and the snapshots it answers with.

use bytes::Bytes;
use tokio::sync::oneshot;

use super::{operator as control, signals};

use crate::invoker::{AttemptError, Ending};
use sluice_core::errors::CodedError;
use sluice_core::ids::InvocationId;
use sluice_flow::scheduler::QueueId;
use sluice_protocol::{Frame, Message};
use sluice_store::invocation::store::Timer;
use sluice_store::invocation::{InvocationRecord, Outcome};

/// Something that happens to a partition.
#[derive(Debug)]
pub enum Event {
    /// A new invocation with its Input entry; acknowledged once durable.
    Submit {
        /// The record (boxed: events are small otherwise).
        record: Box<InvocationRecord>,
        /// The Input command frame (journal entry 0).
        input: Frame,
        /// Answered after the commit: true when created, false when an invocation with this
        /// id exists (an idempotent repeat). `None` for children of other invocations.
        /// For a [`Event::Submit::call`] with a fresh id it is answered at once instead:
        /// nobody is told anything until the outcome, which waits for the commit.
        reply: Option<oneshot::Sender<Result<bool, CodedError>>>,
        /// A caller at the ingress waiting for the outcome, registered with the invocation in
        /// the same event (no second round trip). A request/response call with a fresh id,
        /// not delayed and not a workflow run, is stored at the first point anything depends
        /// on it (see `docs/durability.md`), not before its first attempt.
        call: Option<oneshot::Sender<Outcome>>,
    },
    /// A completed invocation restarted as a new one with a journal prefix
    /// ([`restart::journal_prefix`]); acknowledged once durable.
    Restart {
        /// The new invocation's record.
        record: Box<InvocationRecord>,
        /// Its journal, from the Input entry on.
        journal: Vec<Frame>,
        /// Answered after the commit.
        reply: oneshot::Sender<Result<bool, CodedError>>,
    },
    /// An operator's request about one invocation.
    Control {
        /// The invocation.
        id: InvocationId,
        /// What to do.
        op: control::Control,
        /// Answered after the commit.
        reply: oneshot::Sender<Result<control::Controlled, CodedError>>,
    },
    /// A signal (an awakeable's completion, or SendSignal) for an invocation.
    Signal {
        /// The signal.
        signal: signals::Signal,
        /// Answered after the commit: what became of it.
        reply: Option<oneshot::Sender<signals::Delivery>>,
    },
    /// The result of an invocation that `id` called.
    CallResult {
        /// The caller.
        id: InvocationId,
        /// The completion its Call waits on.
        completion: u32,
        /// The callee's outcome.
        outcome: Outcome,
    },
    /// Wait for the outcome of an invocation.
    Await {
        /// The invocation.
        id: InvocationId,
        /// Answered after the commit of what came before: where the outcome will come
        /// (dropped when the invocation is unknown), or why the wait is refused (SEC0008).
        reply: oneshot::Sender<Result<oneshot::Receiver<Outcome>, CodedError>>,
    },
    /// A message of a running attempt.
    AttemptMessage {
        /// The invocation.
        id: InvocationId,
        /// Which attempt sent it (messages of a superseded attempt are dropped).
        attempt: u32,
        /// The message.
        message: Message,
        /// Its ack flag.
        ack: bool,
    },
    /// An operator replaces the whole state of one object.
    SetObjectState {
        /// Virtual object or workflow.
        service: String,
        /// Object key.
        key: String,
        /// The new state, replacing all of it.
        state: Vec<(Bytes, Bytes)>,
        /// Answered after the commit.
        reply: oneshot::Sender<Result<bool, CodedError>>,
    },
    /// Where an invocation is, without waiting.
    Peek {
        /// The invocation.
        id: InvocationId,
        /// Whether the answer carries a completed value's bytes (a status needs none: they
        /// are then neither read from the store nor copied).
        output: bool,
        /// Its target, status and outcome; `None` when unknown.
        reply: oneshot::Sender<Option<super::answer::Peek>>,
    },
    /// The deployment answered an attempt's request (a 2xx head of the protocol's content
    /// type): it is reachable and not overloaded, whatever the attempt does next. Its paced
    /// drain learns that now, not when the attempt ends: an attempt may hold its slot for
    /// long (a handler awaiting an awakeable), and a window full of those would otherwise
    /// never grow.
    AttemptAnswered {
        /// The invocation.
        id: InvocationId,
        /// Which attempt.
        attempt: u32,
    },
    /// An attempt finished.
    AttemptDone {
        /// The invocation.
        id: InvocationId,
        /// Which attempt.
        attempt: u32,
        /// How it ended.
        result: Result<Ending, AttemptError>,
    },
    /// Another partition gave back invoker slots this one waits for.
    SlotsFree,
    /// Answered after the commit of every event before it (cluster mode: the inbox commits
    /// its offsets only once what it delivered is durable).
    Barrier {
        /// Answered after that commit.
        reply: oneshot::Sender<()>,
    },
    /// An operator pauses (or resumes) the queue with this index; answered once stored,
    /// `false` when no such queue lives.
    PauseQueue {
        /// The queue's index in this partition.
        queue: u32,
        /// Pause (`true`) or resume.
        pause: bool,
        /// Answered after the commit.
        reply: oneshot::Sender<bool>,
    },
    /// Cancels those of `batch` that `filter` names now (`model/bulk.rs`); `dry_run` counts
    /// them only.
    CancelBatch {
        /// Which invocations.
        filter: std::sync::Arc<super::bulk::CancelFilter>,
        /// The candidates to look at, listed by [`crate::partition::queries::Query::CancelCandidates`].
        batch: super::bulk::Batch,
        /// Count, change nothing.
        dry_run: bool,
        /// How many it named and canceled, once stored.
        reply: oneshot::Sender<Result<super::bulk::Cancelled, CodedError>>,
    },
    /// An operator resets the quotas (or budgets) `pattern` matches: their count in the
    /// current window starts again from 0; answered with how many counters were reset, after
    /// the commit.
    ResetQuota {
        /// Quotas or budgets.
        measure: sluice_flow::Measure,
        /// The pattern.
        pattern: Box<sluice_flow::RulePattern>,
        /// Answered after the commit.
        reply: oneshot::Sender<u64>,
    },
    /// A timer fired (`completion` set) or a delay/back-off is over (`None`).
    Wake {
        /// The invocation.
        id: InvocationId,
        /// The Sleep completion to resolve.
        completion: Option<Timer>,
    },
}

/// An invocation waiting in a scheduler queue.
#[derive(Debug, Clone)]
pub struct QueuedEntry {
    /// Its queue.
    pub queue: QueueId,
    /// The invocation.
    pub invocation: InvocationId,
    /// Attempts so far.
    pub attempts: u32,
    /// When it was created, ms.
    pub created_at_ms: u64,
    /// When it may run, ms (delayed sends, back-offs).
    pub run_at_ms: Option<u64>,
    /// The deployment it is pinned to; `None` until its first attempt.
    pub deployment: Option<sluice_core::ids::DeploymentId>,
}

/// An object lock and the invocation holding it.
#[derive(Debug, Clone)]
pub struct HeldLock {
    /// Flow-control scope of the object.
    pub scope: Option<String>,
    /// Virtual object or workflow.
    pub service: String,
    /// Object key.
    pub key: String,
    /// The holder.
    pub holder: InvocationId,
    /// When the holder took it, ms (after a restart: when it claimed it back).
    pub acquired_at_ms: u64,
}

/// What `GET /metrics` reads of one partition.
#[derive(Debug, Clone)]
pub struct PartitionMetrics {
    /// Flow-control admissions since start, by rule and level.
    pub admissions: Vec<sluice_flow::limiter::RuleAdmissions>,
    /// Invocations dropped past their deadline since start, by what set it.
    pub expired: Vec<sluice_flow::scheduler::ExpiredCount>,
    /// Its queues paused by an operator.
    pub paused_queues: usize,
    /// Held invocations at rest, across every partition.
    pub held_invocations: usize,
    /// Bytes of held inputs in memory, across every partition.
    pub held_bytes: u64,
    /// This partition's invocations in memory by state (`partition/model/phase.rs`), with the
    /// bytes each state holds.
    pub states: Vec<StateMemory>,
}

/// Invocations of one state in a partition's memory, and what they take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMemory {
    /// The state's name (`queued`, `running`, `resting`, ...).
    pub state: &'static str,
    /// Invocations in it.
    pub invocations: usize,
    /// Bytes they hold.
    pub bytes: u64,
}

impl Event {
    /// The invocation whose live state the event reads or changes, if it names one.
    pub(in crate::partition) fn invocation(&self) -> Option<InvocationId> {
        match self {
            Event::Submit { record, .. } | Event::Restart { record, .. } => Some(record.id),
            Event::Control { id, .. }
            | Event::CallResult { id, .. }
            | Event::Await { id, .. }
            | Event::Peek { id, .. }
            | Event::Wake { id, .. } => Some(*id),
            Event::Signal { signal, .. } => Some(signal.target),
            // Running invocations are never at rest; the rest read no invocation's state or
            // look at it in either form (a bulk cancel wakes each of its batch itself).
            Event::AttemptMessage { .. }
            | Event::CancelBatch { .. }
            | Event::AttemptAnswered { .. }
            | Event::AttemptDone { .. }
            | Event::SetObjectState { .. }
            | Event::SlotsFree
            | Event::Barrier { .. }
            | Event::PauseQueue { .. }
            | Event::ResetQuota { .. } => None,
        }
    }
}
