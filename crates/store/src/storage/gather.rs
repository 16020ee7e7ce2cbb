//! One set per shard loop turn. The partitions a shard runs each hand the writer a set per
//! batch; sent one by one, each is a job on the writer's channel and each answer a wake of that
//! partition's task from the writer's thread (on a current-thread runtime, a `write` to its
//! event fd and a trip through its inject queue). A [`Gather`] is shared by the partitions of
//! one shard: the sets queued in one turn of the shard's loop leave as one set, answered once
//! from the writer's thread, and the answer is handed to each partition on the shard itself.
//!
//! The first set queued while none waits spawns the task that sends them; the shard runs it
//! after the tasks already woken in that turn, so their sets join. Each caller's sets keep
//! their order: they join one set in the order they were queued, or later sets leave in later
//! sends. The merged set is one write set like any other: stored whole or not at all, so each
//! caller's answer is the truth about its own set.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::jobs::{Job, send, stopped, take_group};
use super::write_set::WriteSet;

/// The sets one shard queued and not yet sent, and where they go.
#[derive(Debug)]
pub(super) struct Gather {
    to: mpsc::UnboundedSender<Job>,
    queued: Mutex<Vec<Job>>,
}

impl Gather {
    pub(super) fn new(to: mpsc::UnboundedSender<Job>) -> Self {
        Self {
            to,
            queued: Mutex::default(),
        }
    }

    /// Queues `job`; it leaves with the others of this turn.
    pub(super) fn push(self: &Arc<Self>, job: Job) {
        let first = {
            let mut queued = lock(&self.queued);
            queued.push(job);
            queued.len() == 1
        };
        if !first {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(Arc::clone(self).send())),
            // Outside a runtime there is no turn to wait for: it leaves at once.
            Err(_) => {
                let jobs = std::mem::take(&mut *lock(&self.queued));
                for job in jobs {
                    send(&self.to, job);
                }
            }
        }
    }

    /// Sends what was queued in this turn as one set (or a few, each at most [`MOST_BYTES`]
    /// unless one caller's set is larger alone) and hands each answer to its callers.
    async fn send(self: Arc<Self>) {
        let jobs = std::mem::take(&mut *lock(&self.queued));
        let mut waiting = Vec::new();
        for chunk in chunks(jobs) {
            if chunk.len() == 1 {
                // Nothing to share: the writer answers the caller itself.
                chunk.into_iter().for_each(|job| send(&self.to, job));
                continue;
            }
            let (writes, dones) = merge(chunk);
            let (done, answer) = oneshot::channel();
            // A stopped writer answers the shared set at once; the loop below hands that on.
            send(&self.to, Job { writes, done });
            waiting.push((answer, dones));
        }
        // Every set is on its way before the first answer is awaited: the writer keeps their
        // order, and later turns' sets go behind them.
        for (answer, dones) in waiting {
            let result = answer.await.unwrap_or_else(|_| Err(stopped()));
            for done in dones {
                let _ = done.send(result.clone());
            }
        }
    }
}

/// Most bytes of writes one gathered set takes in a log record: what the writer's thread takes
/// into one record at most (a set larger alone still goes, alone, as it would have).
const MOST_BYTES: usize = super::local::appender::RECORD_BYTES;

/// `jobs` in runs whose writes fit [`MOST_BYTES`] together, in order: the groups the writer's
/// thread would take of them ([`take_group`]).
fn chunks(jobs: Vec<Job>) -> Vec<Vec<Job>> {
    let mut jobs = jobs.into_iter();
    let mut held = None;
    let mut chunks = Vec::new();
    while let Some(first) = held.take().or_else(|| jobs.next()) {
        let (chunk, _) = take_group(first, MOST_BYTES, &mut held, || jobs.next());
        chunks.push(chunk);
    }
    chunks
}

/// The sets of `jobs` as one, in their order, and whom to answer.
fn merge(
    jobs: Vec<Job>,
) -> (
    WriteSet,
    Vec<oneshot::Sender<Result<(), sluice_core::errors::CodedError>>>,
) {
    let mut merged = WriteSet::default();
    merged
        .ops
        .reserve(jobs.iter().map(|job| job.writes.ops.len()).sum());
    let mut dones = Vec::with_capacity(jobs.len());
    for job in jobs {
        merged.ops.extend(job.writes.ops);
        dones.push(job.done);
    }
    (merged, dones)
}

/// A lock held for a push or a take: a panic while holding it left the queue whole.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::write_set::BytesTable;
    use sluice_core::errors::{Code, CodedError};

    const T: BytesTable = redb::TableDefinition::new("gather_test");

    fn job(key: &[u8]) -> (Job, oneshot::Receiver<Result<(), CodedError>>) {
        let mut writes = WriteSet::default();
        writes.put(T, key, key.to_vec());
        let (done, answer) = oneshot::channel();
        (Job { writes, done }, answer)
    }

    /// Queues sets under keys "a", "b" and "c", each writing a value of `bytes`.
    fn push_three(
        gather: &Arc<Gather>,
        bytes: usize,
    ) -> Vec<oneshot::Receiver<Result<(), CodedError>>> {
        let value = vec![0u8; bytes];
        let mut answers = Vec::new();
        for key in [b"a", b"b", b"c"] {
            let mut writes = WriteSet::default();
            writes.put(T, key, value.clone());
            let (done, answer) = oneshot::channel();
            gather.push(Job { writes, done });
            answers.push(answer);
        }
        answers
    }

    async fn all_answered_ok(answers: Vec<oneshot::Receiver<Result<(), CodedError>>>) {
        for answer in answers {
            assert_eq!(answer.await.unwrap(), Ok(()));
        }
    }

    fn keys(writes: &WriteSet) -> Vec<Vec<u8>> {
        writes
            .ops
            .iter()
            .map(|op| match op {
                crate::storage::write_set::Op::Put(_, key, _) => key.clone(),
                _ => panic!("only puts are queued here"),
            })
            .collect()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sets_of_one_turn_leave_as_one_set_in_order_and_share_its_answer() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let gather = Arc::new(Gather::new(tx));
        let mut answers = Vec::new();
        for key in [b"a", b"b", b"c"] {
            let (job, answer) = job(key);
            gather.push(job);
            answers.push(answer);
        }
        let sent = rx.recv().await.unwrap();
        assert_eq!(
            keys(&sent.writes),
            [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert!(rx.try_recv().is_err(), "one set for the turn");
        sent.done.send(Ok(())).unwrap();
        all_answered_ok(answers).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_shared_set_fails_every_caller() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let gather = Arc::new(Gather::new(tx));
        let (first, first_answer) = job(b"a");
        let (second, second_answer) = job(b"b");
        gather.push(first);
        gather.push(second);
        let sent = rx.recv().await.unwrap();
        let error = CodedError::new(Code::RT0006, "disk full");
        sent.done.send(Err(error.clone())).unwrap();
        assert_eq!(first_answer.await.unwrap(), Err(error.clone()));
        assert_eq!(second_answer.await.unwrap(), Err(error));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sets_of_later_turns_leave_later_and_a_lone_set_goes_as_it_is() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let gather = Arc::new(Gather::new(tx));
        let (first, first_answer) = job(b"a");
        gather.push(first);
        // The turn ends: the set leaves.
        let sent = rx.recv().await.unwrap();
        assert_eq!(keys(&sent.writes), [b"a".to_vec()]);
        let (second, second_answer) = job(b"b");
        gather.push(second);
        let later = rx.recv().await.unwrap();
        assert_eq!(keys(&later.writes), [b"b".to_vec()]);
        // Alone, each is its caller's own job: the writer answers the caller directly.
        sent.done.send(Ok(())).unwrap();
        assert_eq!(first_answer.await.unwrap(), Ok(()));
        drop(later);
        assert!(second_answer.await.is_err(), "its answer went with the job");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_stopped_writer_fails_the_sets_instead_of_losing_them() {
        let (tx, rx) = mpsc::unbounded_channel();
        drop(rx);
        let gather = Arc::new(Gather::new(tx));
        let (first, first_answer) = job(b"a");
        let (second, second_answer) = job(b"b");
        gather.push(first);
        gather.push(second);
        for answer in [first_answer, second_answer] {
            assert_eq!(answer.await.unwrap().unwrap_err().code, Some(Code::RT0006));
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sets_too_large_to_share_a_record_leave_one_by_one_in_order() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let gather = Arc::new(Gather::new(tx));
        let answers = push_three(&gather, MOST_BYTES / 2);
        // Two halves and their headers pass one record's worth: each set goes alone, in
        // order, as its caller's own job.
        let sent: Vec<Job> = [
            rx.recv().await.unwrap(),
            rx.recv().await.unwrap(),
            rx.recv().await.unwrap(),
        ]
        .into();
        for (job, key) in sent.iter().zip([b"a", b"b", b"c"]) {
            assert_eq!(keys(&job.writes), [key.to_vec()]);
        }
        for job in sent {
            job.done.send(Ok(())).unwrap();
        }
        all_answered_ok(answers).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sets_that_fit_a_record_together_share_one() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let gather = Arc::new(Gather::new(tx));
        let answers = push_three(&gather, MOST_BYTES / 3);
        // Three thirds and their headers pass one record's worth by a few bytes: the first
        // two share a set, the third goes alone.
        let shared = rx.recv().await.unwrap();
        let alone = rx.recv().await.unwrap();
        assert_eq!(keys(&shared.writes), [b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(keys(&alone.writes), [b"c".to_vec()]);
        shared.done.send(Ok(())).unwrap();
        alone.done.send(Ok(())).unwrap();
        all_answered_ok(answers).await;
    }

    #[test]
    fn outside_a_runtime_a_set_leaves_at_once() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let gather = Arc::new(Gather::new(tx));
        let (first, _answer) = job(b"a");
        gather.push(first);
        assert_eq!(keys(&rx.try_recv().unwrap().writes), [b"a".to_vec()]);
    }
}
