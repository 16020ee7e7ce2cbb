//! What a partition hands the store's writer: a write set and where its answer goes; and how
//! the writers take the sets waiting as one group (a log record's worth, in order).

use tokio::sync::{mpsc, oneshot};

use super::write_set::WriteSet;
use sluice_core::errors::{Code, CodedError};

/// Most write sets applied in one transaction.
pub(super) const GROUP: usize = 1024;

/// A write set on its way, and whom to answer once it is durable (or failed).
pub(super) struct Job {
    pub(super) writes: WriteSet,
    pub(super) done: oneshot::Sender<Result<(), CodedError>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("writes", &self.writes).finish()
    }
}

/// Takes `first` and the sets `next` hands over behind it while their writes fit one log record
/// of `max_bytes` (at least one set, at most [`GROUP`]); the set that did not fit waits in
/// `held`. The sets, and the bytes their writes take in a record.
pub(super) fn take_group(
    first: Job,
    max_bytes: usize,
    held: &mut Option<Job>,
    mut next: impl FnMut() -> Option<Job>,
) -> (Vec<Job>, usize) {
    let mut bytes = super::record::encoded_len(&first.writes);
    let mut jobs = vec![first];
    while jobs.len() < GROUP {
        let Some(job) = next() else { break };
        let len = super::record::encoded_len(&job.writes);
        if bytes.saturating_add(len) > max_bytes {
            *held = Some(job);
            break;
        }
        bytes += len;
        jobs.push(job);
    }
    (jobs, bytes)
}

/// Hands `job` to the writer behind `to`; a writer that stopped answers it with [`stopped`]
/// at once, so no set waits for an answer that cannot come.
pub(super) fn send(to: &mpsc::UnboundedSender<Job>, job: Job) {
    if let Err(mpsc::error::SendError(job)) = to.send(job) {
        let _ = job.done.send(Err(stopped()));
    }
}

pub(super) fn stopped() -> CodedError {
    CodedError::new(Code::RT0006, "the store writer stopped (shutting down?)")
}
