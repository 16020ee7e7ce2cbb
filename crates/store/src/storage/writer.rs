//! Group commit across partitions. redb admits one write transaction at a time and each commit
//! pays an fsync, so partitions do not write themselves: they hand a [`WriteSet`] to the one
//! writer thread, which applies every set waiting at that moment in a single transaction and
//! answers them all after that one commit. The more load, the more sets share an fsync.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::Store;
use crate::errors::{Code, CodedError};

pub use crate::schema::BytesTable;

/// Most write sets applied in one transaction.
const GROUP: usize = 1024;

pub(crate) enum Op {
    Put(BytesTable, Vec<u8>, Vec<u8>),
    Delete(BytesTable, Vec<u8>),
    DeleteRange(BytesTable, Vec<u8>, Vec<u8>),
}

/// Writes to apply atomically, in order.
#[derive(Default)]
pub struct WriteSet {
    pub(crate) ops: Vec<Op>,
}

impl std::fmt::Debug for WriteSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteSet")
            .field("ops", &self.ops.len())
            .finish()
    }
}

impl WriteSet {
    /// Inserts or replaces `key`.
    pub fn put(&mut self, table: BytesTable, key: &[u8], value: Vec<u8>) {
        self.ops.push(Op::Put(table, key.to_vec(), value));
    }

    /// Removes `key` (nothing when absent).
    pub fn delete(&mut self, table: BytesTable, key: &[u8]) {
        self.ops.push(Op::Delete(table, key.to_vec()));
    }

    /// Removes every key in `start..end`.
    pub fn delete_range(&mut self, table: BytesTable, start: Vec<u8>, end: Vec<u8>) {
        self.ops.push(Op::DeleteRange(table, start, end));
    }

    /// How many writes it holds.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Commits the writes at once in a transaction of their own (tests, which have no writer).
    #[cfg(any(test, feature = "testing"))]
    pub fn commit_now(&self, store: &Store) {
        store
            .with_db(|db| {
                let txn = db.begin_write().expect("a write transaction");
                self.apply(&txn).expect("the writes apply");
                txn.commit().expect("the commit");
            })
            .expect("the store is open");
    }

    /// Applies the writes inside `txn`.
    pub fn apply(&self, txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
        apply_all(std::iter::once(self), txn)
    }

    /// Applies `sets`, in order, inside `txn`, as the view's applier does (coalesced).
    pub fn apply_all<'a>(
        sets: impl IntoIterator<Item = &'a WriteSet>,
        txn: &redb::WriteTransaction,
    ) -> Result<(), redb::Error> {
        apply_all(sets, txn)
    }
}

/// A table open in the group's transaction.
type OpenTable<'txn> = redb::Table<'txn, &'static [u8], &'static [u8]>;

/// Applies `sets` in order inside `txn`, opening each table once: opening one looks it up in
/// redb's table of tables, which cost more than the insert itself when it was done per write.
///
/// A put or delete of a key that a later put or delete of the same key overwrites is skipped
/// (coalescing): the last write to a key alone decides its value, whatever ranges are deleted
/// between, so an invocation that ran and completed within one applied batch costs the view
/// its final record only, not each state it passed through.
pub(super) fn apply_all<'a>(
    sets: impl IntoIterator<Item = &'a WriteSet>,
    txn: &redb::WriteTransaction,
) -> Result<(), redb::Error> {
    let ops: Vec<&Op> = sets.into_iter().flat_map(|set| &set.ops).collect();
    let live = last_writes(&ops);
    let mut open: Vec<(&str, OpenTable<'_>)> = Vec::new();
    for (op, live) in ops.into_iter().zip(live) {
        if !live {
            continue;
        }
        let (Op::Put(definition, ..) | Op::Delete(definition, _) | Op::DeleteRange(definition, ..)) =
            op;
        let name = redb::TableHandle::name(definition);
        let index = match open.iter().position(|(open, _)| *open == name) {
            Some(index) => index,
            None => {
                open.push((name, txn.open_table(*definition)?));
                open.len() - 1
            }
        };
        let table = &mut open[index].1;
        match op {
            Op::Put(_, key, value) => {
                table.insert(key.as_slice(), value.as_slice())?;
            }
            Op::Delete(_, key) => {
                table.remove(key.as_slice())?;
            }
            Op::DeleteRange(_, start, end) => {
                table.retain_in(start.as_slice()..end.as_slice(), |_, _| false)?;
            }
        }
    }
    Ok(())
}

/// Which of `ops` still matter: every range delete, and each put or delete that no later put
/// or delete of the same key overwrites.
fn last_writes(ops: &[&Op]) -> Vec<bool> {
    let mut live = vec![true; ops.len()];
    if ops.len() < 2 {
        return live;
    }
    let mut later = std::collections::HashSet::with_capacity(ops.len());
    for (index, op) in ops.iter().enumerate().rev() {
        let (Op::Put(definition, key, _) | Op::Delete(definition, key)) = op else {
            continue;
        };
        if !later.insert((redb::TableHandle::name(definition), key.as_slice())) {
            live[index] = false;
        }
    }
    live
}

pub(super) struct Job {
    pub(super) writes: WriteSet,
    pub(super) done: oneshot::Sender<Result<(), CodedError>>,
}

/// Hands write sets to the writer thread. Cheap to clone; the thread ends when every clone is
/// dropped.
#[derive(Clone)]
pub struct Writer {
    to: To,
}

/// Where a [`Writer`]'s sets go.
#[derive(Clone)]
enum To {
    /// A thread, or whoever holds the receiver (a stage, a flusher).
    Channel(mpsc::UnboundedSender<Job>),
    /// Straight into the view's backlog (cluster mode, `logged::ViewWriter`).
    View(Arc<super::logged::ViewWriter>),
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let to = match self.to {
            To::Channel(_) => "channel",
            To::View(_) => "view",
        };
        f.debug_struct("Writer").field("to", &to).finish()
    }
}

/// Answers once the write set is durable (or failed).
pub type Commit = oneshot::Receiver<Result<(), CodedError>>;

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("writes", &self.writes).finish()
    }
}

impl Writer {
    /// Starts the writer thread for `store`.
    pub fn start(store: Arc<Store>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("sluice-writer".into())
            .spawn(move || write_loop(&store, rx))
            .expect("the writer thread starts");
        Self::from_channel(tx)
    }

    fn from_channel(tx: mpsc::UnboundedSender<Job>) -> Self {
        Self {
            to: To::Channel(tx),
        }
    }

    /// The writer of cluster mode for `store`: each set already landed in its partition's
    /// Kafka log, so it joins the view's backlog and is answered at once; an applier thread
    /// applies the backlog behind (`logged::ViewWriter`).
    pub fn start_view(store: Arc<Store>, checkpoints: super::logged::Checkpoints) -> Self {
        Self::from_view(super::logged::ViewWriter::start(store, checkpoints))
    }

    pub(super) fn from_view(view: super::logged::ViewWriter) -> Self {
        Self {
            to: To::View(Arc::new(view)),
        }
    }

    /// Starts the writer of embedded mode for `store`: the local log its open replayed is the
    /// truth, the store a view applied behind it (`logged.rs`). A store without a log (one on
    /// a simulated backend) gets the plain writer.
    pub fn start_logged(store: Arc<Store>, checkpoints: super::logged::Checkpoints) -> Self {
        match store.take_log() {
            Some(log) => Self::from_channel(super::logged::start(store, log, checkpoints)),
            None => Self::start(store),
        }
    }

    /// A writer whose sets go to `tx` (the logged writer's stages).
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn from_sender(tx: mpsc::UnboundedSender<Job>) -> Self {
        Self::from_channel(tx)
    }

    /// Queues `writes`; the answer comes after the commit that holds them. Sets queued by one
    /// caller commit in the order they were queued, and an empty set is answered only after
    /// every set queued before it, so it can order acknowledgements behind earlier writes.
    pub fn commit(&self, writes: WriteSet) -> Commit {
        let (done, answer) = oneshot::channel();
        match &self.to {
            To::Channel(tx) => {
                if let Err(mpsc::error::SendError(job)) = tx.send(Job { writes, done }) {
                    let _ = job.done.send(Err(stopped()));
                }
            }
            To::View(view) => {
                let _ = done.send(view.commit(writes));
            }
        }
        answer
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

    /// How many sets the group holds.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// The group's log record for the leader of `(epoch, incarnation)`, meant to land at
    /// offset `at`: every set's writes, in order.
    pub fn record(&self, epoch: u64, incarnation: u64, at: i64) -> Vec<u8> {
        super::log::encode_writes_at(
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

/// Takes `first` and the sets `next` hands over behind it while their writes fit one log record
/// of `max_bytes` (at least one set, at most [`GROUP`]); the set that did not fit waits in
/// `held`. The sets, and the bytes their writes take in a record.
pub(super) fn take_group(
    first: Job,
    max_bytes: usize,
    held: &mut Option<Job>,
    mut next: impl FnMut() -> Option<Job>,
) -> (Vec<Job>, usize) {
    let mut bytes = super::log::encoded_len(&first.writes);
    let mut jobs = vec![first];
    while jobs.len() < GROUP {
        let Some(job) = next() else { break };
        let len = super::log::encoded_len(&job.writes);
        if bytes.saturating_add(len) > max_bytes {
            *held = Some(job);
            break;
        }
        bytes += len;
        jobs.push(job);
    }
    (jobs, bytes)
}

pub(super) fn stopped() -> CodedError {
    CodedError::new(Code::RT0006, "the store writer stopped (shutting down?)")
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

    const T: BytesTable = redb::TableDefinition::new("writer_test");
    const U: BytesTable = redb::TableDefinition::new("writer_test_other");

    #[test]
    fn only_the_last_write_to_a_key_is_applied() {
        let mut set = WriteSet::default();
        set.put(T, b"k", b"1".to_vec());
        set.put(U, b"k", b"1".to_vec());
        set.delete_range(T, b"a".to_vec(), b"z".to_vec());
        set.put(T, b"k", b"2".to_vec());
        set.delete(T, b"j");
        set.put(T, b"j", b"3".to_vec());
        let ops: Vec<&Op> = set.ops.iter().collect();
        assert_eq!(
            last_writes(&ops),
            [false, true, true, true, false, true],
            "the first put of T/k and the delete of T/j are overwritten; U/k is another key"
        );
    }

    proptest::proptest! {
        /// Coalescing never changes what the tables hold: the same as every write applied one
        /// after another.
        #[test]
        fn coalesced_writes_leave_what_every_write_would(
            ops in proptest::collection::vec((0..4u8, 0..2u8, 0..6u8, 0..6u8), 0..40),
        ) {
            let mut set = WriteSet::default();
            let mut model = std::collections::BTreeMap::new();
            for (kind, table, a, b) in ops {
                let (table, name) = if table == 0 { (T, 0) } else { (U, 1) };
                let (key, end) = (vec![a], vec![b]);
                match kind {
                    0 | 1 => {
                        let value = vec![a, b];
                        model.insert((name, key.clone()), value.clone());
                        set.put(table, &key, value);
                    }
                    2 => {
                        model.remove(&(name, key.clone()));
                        set.delete(table, &key);
                    }
                    _ => {
                        model.retain(|(t, k), _| *t != name || !(key.as_slice()..end.as_slice()).contains(&k.as_slice()));
                        set.delete_range(table, key, end);
                    }
                }
            }
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            set.commit_now(&store);
            let mut stored = std::collections::BTreeMap::new();
            store
                .with_db(|db| {
                    let txn = db.begin_read().unwrap();
                    for (table, name) in [(T, 0), (U, 1)] {
                        let Ok(table) = txn.open_table(table) else { continue };
                        for row in redb::ReadableTable::iter(&table).unwrap() {
                            let (k, v) = row.unwrap();
                            stored.insert((name, k.value().to_vec()), v.value().to_vec());
                        }
                    }
                })
                .unwrap();
            proptest::prop_assert_eq!(stored, model);
        }
    }

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
        store
            .with_db(|db| {
                let txn = db.begin_read().unwrap();
                let table = txn.open_table(T).unwrap();
                assert_eq!(table.get(b"a".as_slice()).unwrap().unwrap().value(), b"2");
                assert!(table.get(b"b".as_slice()).unwrap().is_none());
                assert!(table.get(b"c1".as_slice()).unwrap().is_none());
                assert!(table.get(b"c2".as_slice()).unwrap().is_none());
            })
            .unwrap();
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
