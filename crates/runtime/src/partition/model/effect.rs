//! What a batch asks to do once it is committed, as plain data: acknowledgements and answers,
//! attempts to start, wake-ups to schedule, events for other partitions, slots to give back.
//! The command handlers (`commands/`) return these; one runner (`Partition::run_effects`)
//! executes them after the commit, or answers them with the failure if the commit failed.

use bytes::Bytes;
use tokio::sync::oneshot;

use super::answer::Answer;
use super::{calls, operator as control, signals};
use sluice_core::errors::CodedError;
use sluice_core::ids::InvocationId;
use sluice_flow::scheduler::QueueKey;
use sluice_store::invocation::store::Timer;
use sluice_store::invocation::{Caller, Outcome};

/// (workflow, key, promise name).
pub(in crate::partition) type PromiseKey = (String, String, String);

/// What a batch asks to do once committed.
#[derive(Debug)]
pub(in crate::partition) enum Effect {
    Ack(oneshot::Sender<Result<bool, CodedError>>, bool),
    Notify(Vec<oneshot::Sender<Outcome>>, Outcome),
    Attempt(InvocationId),
    WakeAt(InvocationId, u64, Option<Timer>),
    /// Bytes for the open request body of attempt `.1`, if it still runs.
    Deliver(InvocationId, u32, Bytes),
    /// A child invocation for its partition.
    Child(Box<calls::Child>),
    /// A result for the caller that waits on it.
    CallResult(Caller, Outcome),
    /// A signal for another invocation.
    Signal(signals::Signal),
    /// Cancel or kill another invocation (a child of a canceled or killed one).
    Forward(InvocationId, control::Control),
    /// An attempt's slots and (if it completed) its object lock go back.
    Settle(InvocationId),
    /// A completed invocation leaves memory (the store keeps it).
    Evict(InvocationId),
    /// An answer sent after the commit (it must not overtake earlier writes).
    Answer(Answer),
    /// A queue's pause (or resume) is stored: the scheduler follows.
    PauseQueue(Box<QueueKey>, bool),
    /// A quota (or budget) reset is stored: the scheduler follows, and the operator is
    /// answered.
    ResetQuota(
        sluice_flow::Measure,
        Box<sluice_flow::RulePattern>,
        tokio::sync::oneshot::Sender<u64>,
    ),
    /// A completed promise is stored: it leaves memory.
    UncachePromise(Box<PromiseKey>),
}

#[cfg(test)]
impl Effect {
    /// One line saying what it asks, for fixture tests ("given this state and this command,
    /// exactly these effects").
    pub(in crate::partition) fn brief(&self) -> String {
        match self {
            Effect::Ack(_, true) => "ack: created".into(),
            Effect::Ack(_, false) => "ack: exists".into(),
            Effect::Notify(waiters, outcome) => {
                format!("notify {} waiters: {}", waiters.len(), outcome.summary())
            }
            Effect::Attempt(_) => "attempt".into(),
            Effect::WakeAt(_, at, None) => format!("wake at {at}"),
            Effect::WakeAt(_, at, Some(timer)) => {
                format!("wake at {at} completing {}", timer.completion)
            }
            Effect::Deliver(_, attempt, _) => format!("deliver to attempt {attempt}"),
            Effect::Child(child) => format!("child {}", child.record.target.service),
            Effect::CallResult(_, outcome) => format!("call result: {}", outcome.summary()),
            Effect::Signal(_) => "signal".into(),
            Effect::Forward(_, op) => format!("forward {op:?}"),
            Effect::Settle(_) => "settle".into(),
            Effect::Evict(_) => "evict".into(),
            Effect::Answer(answer) => format!("answer {}", answer.kind()),
            Effect::PauseQueue(_, true) => "pause queue".into(),
            Effect::PauseQueue(_, false) => "resume queue".into(),
            Effect::ResetQuota(m, pattern, _) => format!("reset {} {pattern}", m.as_str()),
            Effect::UncachePromise(_) => "uncache promise".into(),
        }
    }
}
