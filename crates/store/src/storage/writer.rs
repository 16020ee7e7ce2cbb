//! Group commit across partitions. redb admits one write transaction at a time and each commit
//! pays an fsync, so partitions do not write themselves: they hand a [`WriteSet`] to the one
//! writer thread, which applies every set waiting at that moment in a single transaction and
//! answers them all after that one commit. The more load, the more sets share an fsync.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::Store;
use super::gather::Gather;
use super::jobs::{GROUP, Job, stopped, take_group};
#[cfg(any(test, feature = "testing"))]
use super::local::appender::LoggedFlusher;
#[cfg(any(test, feature = "testing"))]
use super::view::ViewFlusher;
use super::write_set::apply_all;
pub use super::write_set::{BytesTable, WriteSet};
use sluice_core::errors::CodedError;

/// Hands write sets to the writer thread. Cheap to clone; the thread ends when every clone is
/// dropped.
#[derive(Clone)]
pub struct Writer {
    to: To,
    /// The sets go to this process's own log (embedded mode): a set with nothing to write
    /// needs no trip through it ([`Writer::answers_empty_sets`]).
    local: bool,
}

/// Where a [`Writer`]'s sets go.
#[derive(Clone)]
enum To {
    /// A thread, or whoever holds the receiver (a stage, a flusher).
    Channel(mpsc::UnboundedSender<Job>),
    /// Straight into the view's backlog (cluster mode, `view/applier.rs`).
    View(Arc<super::view::applier::ViewWriter>),
    /// Into a channel, with the other sets its shard queues in the same loop turn
    /// (`gather.rs`).
    Gather(Arc<Gather>),
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let to = match self.to {
            To::Channel(_) => "channel",
            To::View(_) => "view",
            To::Gather(_) => "gather",
        };
        f.debug_struct("Writer").field("to", &to).finish()
    }
}

/// Answers once the write set is durable (or failed).
pub type Commit = oneshot::Receiver<Result<(), CodedError>>;

impl Writer {
    /// Starts the writer thread for `store`.
    pub fn start(store: Arc<Store>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        super::threads::spawn("sluice-writer", move || write_loop(&store, rx));
        Self::from_channel(tx).local()
    }

    fn from_channel(tx: mpsc::UnboundedSender<Job>) -> Self {
        Self {
            to: To::Channel(tx),
            local: false,
        }
    }

    fn local(mut self) -> Self {
        self.local = true;
        self
    }

    /// Whether a set with nothing to write may be answered by its caller without this writer:
    /// true when the sets go to this process's own log (embedded mode), where the one thing an
    /// empty set orders is its caller's own earlier sets, which the caller can order itself.
    /// In cluster mode an empty set still goes through the leader's log: a leader that lost
    /// its partition learns so from its next record, and must not answer from memory before.
    pub fn answers_empty_sets(&self) -> bool {
        self.local
    }

    /// The writer of cluster mode for `store`: each set already landed in its partition's
    /// Kafka log, so it joins the view's backlog and is answered at once; an applier thread
    /// applies the backlog behind (`view/applier.rs`).
    pub fn start_view(store: Arc<Store>, checkpoints: super::view::Checkpoints) -> Self {
        Self::from_view(super::view::applier::ViewWriter::start(store, checkpoints))
    }

    fn from_view(view: super::view::applier::ViewWriter) -> Self {
        Self {
            to: To::View(Arc::new(view)),
            local: false,
        }
    }

    /// Starts the writer of embedded mode for `store`: the local log its open replayed is the
    /// truth, the store a view applied behind it (`local/appender.rs`). A store without a log (one on
    /// a simulated backend) gets the plain writer.
    pub fn start_logged(store: Arc<Store>, checkpoints: super::view::Checkpoints) -> Self {
        match store.take_log() {
            Some(log) => Self::from_channel(super::local::appender::start(
                store,
                super::local::LocalLog::new(log),
                checkpoints,
            ))
            .local(),
            None => Self::start(store),
        }
    }

    /// A logged writer without its threads: sets wait until the [`LoggedFlusher`] moves them.
    /// `None` when `store` has no log ([`Store::open_backend_logged`] gives it one).
    #[cfg(any(test, feature = "testing"))]
    pub fn manual_logged(store: Arc<Store>) -> Option<(Self, LoggedFlusher)> {
        let (tx, flusher) = LoggedFlusher::new(store)?;
        Some((Self::from_channel(tx).local(), flusher))
    }

    /// Cluster mode's view writer without its applier thread: sets are answered as they join
    /// the backlog, which waits until the [`ViewFlusher`] applies it (or a read catches up).
    #[cfg(any(test, feature = "testing"))]
    pub fn manual_view(store: Arc<Store>) -> (Self, ViewFlusher) {
        let (view, flusher) = ViewFlusher::new(store);
        (Self::from_view(view), flusher)
    }

    /// Queues `writes`; the answer comes after the commit that holds them. Sets queued by one
    /// caller commit in the order they were queued, and an empty set is answered only after
    /// every set queued before it, so it can order acknowledgements behind earlier writes.
    pub fn commit(&self, writes: WriteSet) -> Commit {
        let (done, answer) = oneshot::channel();
        match &self.to {
            To::Channel(tx) => super::jobs::send(tx, Job { writes, done }),
            To::View(view) => {
                let _ = done.send(view.commit(writes));
            }
            To::Gather(gather) => gather.push(Job { writes, done }),
        }
        answer
    }

    /// A writer for the partitions of one shard: the sets they queue in one turn of the shard's
    /// loop go to the writer's thread as one set, answered once (`gather.rs`). A writer that
    /// gathers already, or writes no channel (cluster mode's view), is returned as it is.
    pub fn gathering(&self) -> Self {
        match &self.to {
            To::Channel(tx) => Self {
                to: To::Gather(Arc::new(Gather::new(tx.clone()))),
                local: self.local,
            },
            To::Gather(_) | To::View(_) => self.clone(),
        }
    }
}

impl Writer {
    /// How many bytes the writes of `writes` after its first `skip` take in a log record (the
    /// count in front of them aside): what a partition measures a growing set by, once per
    /// write, to cut it before it outgrows a record.
    pub fn record_bytes(&self, writes: &WriteSet, skip: usize) -> usize {
        super::record::encoded_len_after(writes, skip)
    }
}

/// A writer whose sets stop at a stage before they reach the store (cluster mode: each
/// partition's sets go to its Kafka log first). Made by [`Writer::staged`].
pub struct Staged {
    rx: mpsc::UnboundedReceiver<Job>,
    /// A set that did not fit in the last group: it starts the next one.
    held: Option<Job>,
}

/// Sets taken from a [`Staged`] writer together, in the order they were queued.
pub struct Group {
    jobs: Vec<Job>,
}

impl Writer {
    /// A new writer whose sets wait in the returned stage; whoever holds the stage moves them on
    /// (or fails them). The thread of `self` is not involved until [`Group::store`].
    pub fn staged() -> (Writer, Staged) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self::from_channel(tx), Staged { rx, held: None })
    }
}

impl Staged {
    /// Waits for a set, then takes every set waiting, while their writes fit in `max_bytes` of
    /// a log record (at least one set is taken, however large). `None` once every sender is
    /// gone.
    pub async fn next_group(&mut self, max_bytes: usize) -> Option<Group> {
        if self.held.is_none() {
            self.held = Some(self.rx.recv().await?);
        }
        self.try_group(max_bytes)
    }

    /// Takes every set waiting now (as [`Staged::next_group`] would), without waiting; `None`
    /// when none waits (the simulators move sets by hand).
    pub fn try_group(&mut self, max_bytes: usize) -> Option<Group> {
        let first = match self.held.take() {
            Some(job) => job,
            None => self.rx.try_recv().ok()?,
        };
        let (jobs, _) = take_group(first, max_bytes, &mut self.held, || self.rx.try_recv().ok());
        Some(Group { jobs })
    }

    /// Fails every set waiting now and every set queued later, with `error`.
    pub fn close(&mut self, error: &CodedError) {
        self.rx.close();
        if let Some(job) = self.held.take() {
            let _ = job.done.send(Err(error.clone()));
        }
        while let Ok(job) = self.rx.try_recv() {
            let _ = job.done.send(Err(error.clone()));
        }
    }
}

impl Group {
    /// Whether no set of the group writes anything.
    pub fn is_empty(&self) -> bool {
        self.jobs.iter().all(|job| job.writes.is_empty())
    }

    /// Every write of the group, in order.
    pub(crate) fn ops(&self) -> impl Iterator<Item = &super::write_set::Op> {
        self.jobs.iter().flat_map(|job| job.writes.ops.iter())
    }

    /// How many sets the group holds.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// The group's log record for the leader of `(epoch, incarnation)`, meant to land at
    /// offset `at`: every set's writes, in order.
    pub fn record(&self, epoch: u64, incarnation: u64, at: i64) -> Vec<u8> {
        super::record::encode_writes_at(
            epoch,
            incarnation,
            at,
            self.jobs.iter().map(|job| &job.writes),
        )
    }

    /// Answers every set of the group with `error`.
    pub fn fail(self, error: &CodedError) {
        for job in self.jobs {
            let _ = job.done.send(Err(error.clone()));
        }
    }

    /// Hands the group's writes, then `extra`, to `next` as one set, and answers every set of
    /// the group with that commit's result. Groups stored in order commit in order.
    pub fn store(self, next: &Writer, mut extra: WriteSet) -> impl Future<Output = ()> + use<> {
        let mut all = WriteSet::default();
        let mut answers = Vec::with_capacity(self.jobs.len());
        for mut job in self.jobs {
            all.ops.append(&mut job.writes.ops);
            answers.push(job.done);
        }
        all.ops.append(&mut extra.ops);
        let committed = next.commit(all);
        async move {
            let result = committed.await.unwrap_or_else(|_| Err(stopped()));
            for answer in answers {
                let _ = answer.send(result.clone());
            }
        }
    }
}

fn write_loop(store: &Store, mut rx: mpsc::UnboundedReceiver<Job>) {
    let mut group = Vec::with_capacity(GROUP);
    while rx.blocking_recv().map(|job| group.push(job)).is_some() {
        while group.len() < GROUP {
            match rx.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        commit_and_answer(store, &mut group);
    }
}

/// Commits `group` in one transaction and answers every set of it.
fn commit_and_answer(store: &Store, group: &mut Vec<Job>) {
    // After a failed write nothing more is acknowledged, not even an empty set: memory may
    // hold what the store does not, and an empty set's answer (an idempotent repeat, say)
    // would vouch for it.
    let result = if let Some(failure) = store.health().failure() {
        Err(failure.clone())
    } else if group.iter().all(|job| job.writes.is_empty()) {
        Ok(())
    } else {
        commit_group(store, group)
    };
    for job in group.drain(..) {
        let _ = job.done.send(result.clone());
    }
}

/// The writer's receiving end, committed by hand: the partition simulator decides when a
/// group commits (and so what a crash finds durable) instead of a thread's timing.
#[cfg(any(test, feature = "testing"))]
pub struct Flusher {
    store: Arc<Store>,
    rx: mpsc::UnboundedReceiver<Job>,
}

#[cfg(any(test, feature = "testing"))]
impl Writer {
    /// A writer without its thread: sets wait until [`Flusher::flush`].
    pub fn manual(store: Arc<Store>) -> (Self, Flusher) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self::from_channel(tx), Flusher { store, rx })
    }
}

#[cfg(any(test, feature = "testing"))]
impl Flusher {
    /// Commits every set queued so far as one group; how many sets there were.
    pub fn flush(&mut self) -> usize {
        let mut group = Vec::new();
        while let Ok(job) = self.rx.try_recv() {
            group.push(job);
        }
        let sets = group.len();
        if sets > 0 {
            commit_and_answer(&self.store, &mut group);
        }
        sets
    }
}

fn commit_group(store: &Store, group: &[Job]) -> Result<(), CodedError> {
    use sluice_core::metrics as names;
    let started = std::time::Instant::now();
    let written = store.with_db(|db| -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        apply_all(group.iter().map(|job| &job.writes), &txn)?;
        txn.commit()?;
        Ok(())
    });
    match written {
        // Closed: shutting down, not a failure of the store.
        Err(closed) => Err(closed),
        Ok(Ok(())) => {
            metrics::histogram!(names::STORE_COMMIT_DURATION).record(started.elapsed());
            metrics::histogram!(names::STORE_COMMIT_GROUP).record(group.len() as f64);
            Ok(())
        }
        Ok(Err(e)) => {
            metrics::counter!(names::STORE_COMMIT_FAILURES).increment(1);
            let error = crate::health::store_write_failed(e);
            tracing::error!(error.code = ?error.code, error = %error, sets = group.len(), "group commit failed; none of its writes were acknowledged");
            store.health().fail(error.clone());
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use redb::ReadableDatabase;

    use super::*;
    use sluice_core::errors::Code;

    const T: BytesTable = redb::TableDefinition::new("writer_test");

    #[tokio::test]
    async fn sets_commit_in_order_and_empty_sets_wait_behind_writes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let writer = Writer::start(Arc::clone(&store));
        let mut first = WriteSet::default();
        first.put(T, b"a", b"1".to_vec());
        first.put(T, b"b", b"1".to_vec());
        let mut second = WriteSet::default();
        second.put(T, b"a", b"2".to_vec());
        second.delete(T, b"b");
        second.put(T, b"c1", b"1".to_vec());
        second.put(T, b"c2", b"1".to_vec());
        second.delete_range(T, b"c".to_vec(), b"d".to_vec());
        let answers = [
            writer.commit(first),
            writer.commit(second),
            writer.commit(WriteSet::default()),
        ];
        for answer in answers {
            answer.await.unwrap().unwrap();
        }
        assert_eq!(value(&store, b"a").as_deref(), Some(&b"2"[..]));
        for gone in [&b"b"[..], b"c1", b"c2"] {
            assert_eq!(value(&store, gone), None);
        }
    }

    /// What the store holds under `key` in the test table.
    fn value(store: &Store, key: &[u8]) -> Option<Vec<u8>> {
        store
            .with_db(|db| {
                let txn = db.begin_read().unwrap();
                let table = txn.open_table(T).unwrap();
                table.get(key).unwrap().map(|v| v.value().to_vec())
            })
            .unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sets_gathered_in_one_turn_land_in_order_through_the_writer_thread() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let writer = Writer::start(Arc::clone(&store));
        let (one, other) = (writer.gathering(), writer.gathering());
        let mut first = WriteSet::default();
        first.put(T, b"a", b"1".to_vec());
        let mut second = WriteSet::default();
        second.put(T, b"a", b"2".to_vec());
        second.put(T, b"b", b"1".to_vec());
        let mut third = WriteSet::default();
        third.delete(T, b"b");
        // Two callers of two shards' writers, queued in one turn: each shard's sets in order.
        let answers = [
            one.commit(first),
            other.commit(WriteSet::default()),
            one.commit(second),
            one.commit(third),
        ];
        for answer in answers {
            answer.await.unwrap().unwrap();
        }
        assert_eq!(value(&store, b"a").as_deref(), Some(&b"2"[..]));
        assert_eq!(value(&store, b"b"), None);
    }

    #[tokio::test]
    async fn a_closed_store_fails_the_sets_instead_of_losing_them_silently() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let writer = Writer::start(Arc::clone(&store));
        store.close();
        let mut set = WriteSet::default();
        set.put(T, b"a", b"1".to_vec());
        let error = writer.commit(set).await.unwrap().unwrap_err();
        assert_eq!(error.code, Some(Code::RT0006));
    }

    #[tokio::test]
    async fn a_failed_write_fails_the_health_and_every_later_set() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        // A table of other key and value types under the name the set writes to: opening it
        // fails inside the transaction, as an I/O error would.
        let foreign: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("writer_test");
        store
            .with_db(|db| {
                let txn = db.begin_write().unwrap();
                txn.open_table(foreign).unwrap().insert(1, 1).unwrap();
                txn.commit().unwrap();
            })
            .unwrap();
        let writer = Writer::start(Arc::clone(&store));
        let mut set = WriteSet::default();
        set.put(T, b"a", b"1".to_vec());
        let error = writer.commit(set).await.unwrap().unwrap_err();
        assert_eq!(error.code, Some(Code::STO0001));
        assert_eq!(store.health().failure().unwrap().code, Some(Code::STO0001));
        // Nothing is acknowledged afterwards, not even an empty set (an idempotent repeat).
        let empty = writer.commit(WriteSet::default()).await.unwrap();
        assert_eq!(empty.unwrap_err().code, Some(Code::STO0001));
    }
}
