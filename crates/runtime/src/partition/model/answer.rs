//! Answers a partition owes its callers once what it applied before them is stored. They are
//! data, not closures: a test reads what a step decided, and a batch whose commit failed answers
//! each caller that can take an error with that error instead of dropping it.

use tokio::sync::oneshot;

use super::{operator as control, signals};
use sluice_core::errors::CodedError;
use sluice_store::invocation::{Outcome, Status, Target};

/// What an invocation is, where it is and how it ended, as a batch saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    /// Where it goes.
    pub target: Target,
    /// Where it is (an invocation at rest is `pending` or `scheduled`).
    pub status: Status,
    /// How it ended; `None` while it has not.
    pub outcome: Option<Outcome>,
    /// The scope it runs in (what an API key's holder may read).
    pub scope: Option<String>,
}

/// Where an attach is answered: the receiver its outcome will come on, or why not.
pub(in crate::partition) type Attach =
    oneshot::Sender<Result<oneshot::Receiver<Outcome>, CodedError>>;

/// A peek's answer: `None` when the invocation is unknown.
pub(in crate::partition) type Peeked = Option<Peek>;

/// One answer, sent after the commit of the batch that decided it.
#[derive(Debug)]
pub(in crate::partition) enum Answer {
    /// A submission was refused (a full queue, an empty rate, too many waiters).
    Refused(oneshot::Sender<Result<bool, CodedError>>, CodedError),
    /// Everything applied before the barrier is stored.
    Barrier(oneshot::Sender<()>),
    /// A queue's pause or resume is stored (true), or no such queue exists (false).
    QueuePaused(oneshot::Sender<bool>, bool),
    /// A wait for an invocation's outcome: where the outcome will come, or why it will not
    /// (too many waiters).
    Attached(Attach, Result<oneshot::Receiver<Outcome>, CodedError>),
    /// What an invocation is and how it ended (its outcome may belong to an earlier batch
    /// still committing).
    Peeked(oneshot::Sender<Peeked>, Peeked),
    /// What became of a signal.
    Signalled(oneshot::Sender<signals::Delivery>, signals::Delivery),
    /// An operator's request about one invocation, done.
    Controlled(
        oneshot::Sender<Result<control::Controlled, CodedError>>,
        control::Controlled,
    ),
    /// A batch of a bulk cancel, stored.
    BulkCancelled(
        oneshot::Sender<Result<super::bulk::Cancelled, CodedError>>,
        super::bulk::Cancelled,
    ),
}

impl Answer {
    /// Its kind, for fixture tests.
    #[cfg(test)]
    pub(in crate::partition) fn kind(&self) -> String {
        match self {
            Self::Refused(_, e) => format!("refused {:?}", e.code),
            Self::Barrier(_) => "barrier".into(),
            Self::QueuePaused(_, known) => format!("queue paused (known: {known})"),
            Self::Attached(_, waits) => format!("attached (waits: {})", waits.is_ok()),
            Self::Peeked(_, seen) => format!("peeked (known: {})", seen.is_some()),
            Self::Signalled(_, delivery) => format!("signalled {delivery:?}"),
            Self::Controlled(_, done) => format!("controlled {done:?}"),
            Self::BulkCancelled(_, done) => {
                format!("bulk cancelled {} of {}", done.cancelled, done.named)
            }
        }
    }

    /// Sends it: what it answers is stored.
    pub(in crate::partition) fn send(self) {
        // A caller that stopped waiting is no error.
        match self {
            Self::Refused(reply, refused) => drop(reply.send(Err(refused))),
            Self::Barrier(reply) => drop(reply.send(())),
            Self::QueuePaused(reply, known) => drop(reply.send(known)),
            Self::Attached(reply, waits) => drop(reply.send(waits)),
            Self::Peeked(reply, seen) => drop(reply.send(seen)),
            Self::Signalled(reply, delivery) => drop(reply.send(delivery)),
            Self::Controlled(reply, done) => drop(reply.send(Ok(done))),
            Self::BulkCancelled(reply, done) => drop(reply.send(Ok(done))),
        }
    }

    /// The batch it belongs to was not stored: callers that take an error get `error`; the
    /// others see their answer dropped (never a false "done", nor a "no such queue").
    pub(in crate::partition) fn fail(self, error: &CodedError) {
        match self {
            Self::Refused(reply, _) => drop(reply.send(Err(error.clone()))),
            Self::Controlled(reply, _) => drop(reply.send(Err(error.clone()))),
            Self::Attached(reply, _) => drop(reply.send(Err(error.clone()))),
            Self::BulkCancelled(reply, _) => drop(reply.send(Err(error.clone()))),
            Self::QueuePaused(..) | Self::Barrier(_) | Self::Peeked(..) | Self::Signalled(..) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::errors::Code;

    #[test]
    fn a_failed_batch_answers_with_its_failure_never_done() {
        let failure = CodedError::new(Code::RT0006, "the disk is full");
        let (reply, answer) = oneshot::channel();
        Answer::Controlled(reply, control::Controlled::Done).fail(&failure);
        assert_eq!(
            answer.blocking_recv().unwrap().unwrap_err().code,
            Some(Code::RT0006)
        );
        // `false` would read as "no such queue" (404): the caller sees the partition gone.
        let (reply, answer) = oneshot::channel();
        Answer::QueuePaused(reply, true).fail(&failure);
        assert!(answer.blocking_recv().is_err());
        let (reply, mut answer) = oneshot::channel();
        Answer::Barrier(reply).fail(&failure);
        assert!(answer.try_recv().is_err());
        let (reply, answer) = oneshot::channel();
        let (_, outcome) = oneshot::channel();
        Answer::Attached(reply, Ok(outcome)).fail(&failure);
        assert_eq!(
            answer.blocking_recv().unwrap().unwrap_err().code,
            Some(Code::RT0006),
            "a wait whose batch failed is told so"
        );
        let (reply, answer) = oneshot::channel();
        Answer::Controlled(reply, control::Controlled::Accepted).send();
        assert!(matches!(
            answer.blocking_recv().unwrap(),
            Ok(control::Controlled::Accepted)
        ));
    }
}
