//! The writer of embedded mode: the local segment log is the truth, the redb file a view
//! applied behind it (`docs/durability.md`). Three threads, a pipeline, so that each stage of
//! one group overlaps the next group's:
//!
//! 1. **append** (`sluice-writer`): takes every set waiting, encodes them as one log record
//!    (`log.rs`'s binary write-set record) and appends it to the current segment;
//! 2. **sync** (`sluice-log-sync`): one `fdatasync` for every record appended since the last,
//!    while the appender fills the next group;
//! 3. **apply** (`sluice-log-apply`): applies every synced group waiting into the view in one
//!    redb transaction that does not sync (its checkpoint row — the last record it holds — in
//!    the same transaction), then answers the group's sets. Every `checkpoint-interval`, after
//!    those answers, a checkpoint syncs the view: it is then durable up to that record, and
//!    the segments behind it are reused.
//!
//! A set is answered only once its record is synced *and* applied to the view, so anything read
//! after an acknowledgement (an admin read after a `202`, a journal a partition reads back, an
//! idempotency lookup) sees it. A crash loses the view's unsynced transactions; opening the
//! store replays the log from the view's durable checkpoint ([`super::Store::open`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::Store;
use super::segments::SegmentLog;
use super::writer::{Job, apply_all, stopped, take_group};
use crate::errors::CodedError;
use crate::schema::LOCAL_LOG;

/// The view's checkpoint row in [`LOCAL_LOG`]: the last log record it holds (u64 BE).
const APPLIED: &[u8] = b"applied";

/// Most bytes of writes one record takes (more sets wait for the next record).
const RECORD_BYTES: usize = 16 * 1024 * 1024;

/// How often the view is made durable.
#[derive(Debug, Clone, Copy)]
pub struct Checkpoints {
    /// Longest time between two durable view transactions.
    pub interval: Duration,
    /// Most log bytes appended between two.
    pub bytes: u64,
}

impl Default for Checkpoints {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            bytes: 64 * 1024 * 1024,
        }
    }
}

/// The last log record the view holds (0: none).
pub(crate) fn applied(txn: &redb::ReadTransaction) -> Result<u64, redb::Error> {
    let table = match txn.open_table(LOCAL_LOG) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    Ok(table
        .get(APPLIED)?
        .and_then(|raw| <[u8; 8]>::try_from(raw.value()).ok())
        .map_or(0, u64::from_be_bytes))
}

/// Records `lsn` as the last record the view holds, inside `txn`.
pub(crate) fn set_applied(txn: &redb::WriteTransaction, lsn: u64) -> Result<(), redb::Error> {
    txn.open_table(LOCAL_LOG)?
        .insert(APPLIED, lsn.to_be_bytes().as_slice())?;
    Ok(())
}

/// A group on its way through the pipeline.
pub(super) struct Stage {
    jobs: Vec<Job>,
    /// Its record, if it writes anything (an empty group only keeps its place in line).
    appended: Option<super::segments::Appended>,
    bytes: u64,
    since: Instant,
}

/// Starts the three threads over `log`; the sender is the writer's.
pub(super) fn start(
    store: Arc<Store>,
    log: SegmentLog,
    checkpoints: Checkpoints,
) -> mpsc::UnboundedSender<Job> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (to_sync, synced) = std_mpsc::channel::<Stage>();
    let (to_apply, applied_rx) = std_mpsc::channel::<(Vec<Stage>, Option<CodedError>)>();
    let appender = Appender::new(log);
    let durable = Arc::clone(&appender.durable);
    {
        let store = Arc::clone(&store);
        std::thread::Builder::new()
            .name("sluice-writer".into())
            .spawn(move || append_loop(&store, appender, rx, &to_sync))
            .expect("the writer thread starts");
    }
    {
        let store = Arc::clone(&store);
        std::thread::Builder::new()
            .name("sluice-log-sync".into())
            .spawn(move || sync_loop(&store, &synced, &to_apply))
            .expect("the log sync thread starts");
    }
    std::thread::Builder::new()
        .name("sluice-log-apply".into())
        .spawn(move || apply_loop(&store, &applied_rx, checkpoints, Applier::new(durable)))
        .expect("the log apply thread starts");
    tx
}

fn fail_store(store: &Store, what: &str, e: impl std::fmt::Display) -> CodedError {
    metrics::counter!(sluice_core::metrics::STORE_COMMIT_FAILURES).increment(1);
    let error = crate::health::store_write_failed(format!("{what}: {e}"));
    store.health().fail(error.clone());
    error
}

fn answer(jobs: Vec<Job>, result: &Result<(), CodedError>) {
    for job in jobs {
        let _ = job.done.send(result.clone());
    }
}

/// The first stage: owns the log, appends one record per group.
pub(super) struct Appender {
    log: SegmentLog,
    /// The view's durable checkpoint, as the applier last made it.
    durable: Arc<AtomicU64>,
    /// The checkpoint up to which segments were given up.
    released: u64,
}

impl Appender {
    fn new(log: SegmentLog) -> Self {
        Self {
            log,
            durable: Arc::new(AtomicU64::new(0)),
            released: 0,
        }
    }

    /// Appends `jobs` as one record; `None` when they were answered already (a failure).
    fn append(&mut self, store: &Store, jobs: Vec<Job>, bytes: usize) -> Option<Stage> {
        let since = Instant::now();
        // After a failure nothing more is acknowledged, not even an empty set (see
        // `writer.rs`): memory may hold what the store does not.
        if let Some(failure) = store.health().failure() {
            answer(jobs, &Err(failure.clone()));
            return None;
        }
        let appended = if jobs.iter().all(|job| job.writes.is_empty()) {
            None
        } else {
            let record = super::log::encode_writes(0, 0, jobs.iter().map(|job| &job.writes));
            match self.log.append(&record) {
                Ok(appended) => Some(appended),
                Err(e) => {
                    let error = fail_store(store, "appending to the log", e);
                    answer(jobs, &Err(error));
                    return None;
                }
            }
        };
        // Segments the view holds durably are reused (the appender owns the log).
        let checkpoint = self.durable.load(Ordering::Acquire);
        if checkpoint > self.released {
            self.released = checkpoint;
            if let Err(e) = self.log.release(checkpoint) {
                fail_store(store, "reusing a log segment", e);
            }
        }
        Some(Stage {
            jobs,
            appended,
            bytes: bytes as u64,
            since,
        })
    }
}

/// The second stage: one sync per file, in the order appended (a segment left for the next is
/// synced before the next one's records count). The failure, if any.
fn sync(store: &Store, stages: &[Stage]) -> Option<CodedError> {
    if let Some(failure) = store.health().failure() {
        return Some(failure.clone());
    }
    let mut last: Option<&Arc<dyn super::segments::LogFile>> = None;
    for appended in stages.iter().filter_map(|stage| stage.appended.as_ref()) {
        if last.is_some_and(|file| Arc::ptr_eq(file, &appended.file)) {
            continue;
        }
        if let Some(previous) = last
            && let Err(e) = previous.sync_data()
        {
            return Some(fail_store(store, "syncing the log", e));
        }
        last = Some(&appended.file);
    }
    if let Some(file) = last
        && let Err(e) = file.sync_data()
    {
        // A failed fsync may have dropped the dirty pages: nothing after it can be trusted.
        return Some(fail_store(store, "syncing the log", e));
    }
    None
}

/// The third stage: applies synced groups to the view and answers them.
pub(super) struct Applier {
    durable: Arc<AtomicU64>,
    last_durable: Instant,
    bytes_since: u64,
    /// The last record applied to the view (synced into it once `durable` reaches it).
    last_lsn: u64,
}

impl Applier {
    fn new(durable: Arc<AtomicU64>) -> Self {
        Self {
            durable,
            last_durable: Instant::now(),
            bytes_since: 0,
            last_lsn: 0,
        }
    }

    /// Whether the next transaction should make the view durable.
    fn due(&self, checkpoints: &Checkpoints) -> bool {
        self.last_durable.elapsed() >= checkpoints.interval || self.bytes_since >= checkpoints.bytes
    }

    /// Applies `stages` (synced, unless `error`) in one transaction that does not sync, answers
    /// their sets, then makes the view durable if `durable` says so.
    fn apply(
        &mut self,
        store: &Store,
        stages: Vec<Stage>,
        error: Option<CodedError>,
        durable: impl FnOnce(&Self) -> bool,
    ) {
        self.bytes_since += stages.iter().map(|stage| stage.bytes).sum::<u64>();
        let lsn = stages
            .iter()
            .filter_map(|stage| stage.appended.as_ref().map(|a| a.lsn))
            .max();
        let result = match (error.or_else(|| store.health().failure().cloned()), lsn) {
            (Some(error), _) => Err(error),
            // Only empty sets: they kept their place behind every earlier write.
            (None, None) => Ok(()),
            // Never synced here: the log holds the writes durably already, and a sync of the
            // view (the checkpoint below) takes milliseconds that no answer should wait for.
            (None, Some(lsn)) => {
                let jobs = stages.iter().flat_map(|stage| &stage.jobs);
                apply(store, jobs, lsn, false).map(|()| self.last_lsn = lsn)
            }
        };
        let groups = stages.len();
        for stage in stages {
            if result.is_ok() {
                metrics::histogram!(sluice_core::metrics::STORE_COMMIT_DURATION)
                    .record(stage.since.elapsed());
            }
            answer(stage.jobs, &result);
        }
        metrics::histogram!(sluice_core::metrics::STORE_COMMIT_GROUP).record(groups as f64);
        // The checkpoint comes after the answers; groups that arrive meanwhile wait for it.
        if result.is_ok() && durable(self) {
            self.finish(store);
        }
    }

    /// Makes the view durable if it holds unsynced records: a checkpoint (when every writer is
    /// gone, the next start then replays nothing).
    fn finish(&mut self, store: &Store) {
        let started = Instant::now();
        let unsynced = self.last_lsn > self.durable.load(Ordering::Acquire);
        if unsynced && apply(store, std::iter::empty(), self.last_lsn, true).is_ok() {
            metrics::histogram!(sluice_core::metrics::STORE_CHECKPOINT_DURATION)
                .record(started.elapsed());
            self.last_durable = Instant::now();
            self.bytes_since = 0;
            self.durable.store(self.last_lsn, Ordering::Release);
        }
    }
}

fn append_loop(
    store: &Store,
    mut appender: Appender,
    mut rx: mpsc::UnboundedReceiver<Job>,
    to_sync: &std_mpsc::Sender<Stage>,
) {
    let mut held: Option<Job> = None;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match rx.blocking_recv() {
                Some(job) => job,
                None => return,
            },
        };
        let (jobs, bytes) = take_group(first, RECORD_BYTES, &mut held, || rx.try_recv().ok());
        let Some(stage) = appender.append(store, jobs, bytes) else {
            continue;
        };
        if let Err(std_mpsc::SendError(stage)) = to_sync.send(stage) {
            answer(stage.jobs, &Err(stopped()));
            return;
        }
    }
}

fn sync_loop(
    store: &Store,
    rx: &std_mpsc::Receiver<Stage>,
    to_apply: &std_mpsc::Sender<(Vec<Stage>, Option<CodedError>)>,
) {
    while let Ok(first) = rx.recv() {
        let mut stages = vec![first];
        stages.extend(rx.try_iter());
        let error = sync(store, &stages);
        if let Err(std_mpsc::SendError((stages, _))) = to_apply.send((stages, error)) {
            for stage in stages {
                answer(stage.jobs, &Err(stopped()));
            }
            return;
        }
    }
}

fn apply_loop(
    store: &Store,
    rx: &std_mpsc::Receiver<(Vec<Stage>, Option<CodedError>)>,
    checkpoints: Checkpoints,
    mut applier: Applier,
) {
    while let Ok(first) = rx.recv() {
        let mut batches = vec![first];
        batches.extend(rx.try_iter());
        let error = batches.iter().find_map(|(_, error)| error.clone());
        let stages: Vec<Stage> = batches.into_iter().flat_map(|(s, _)| s).collect();
        applier.apply(store, stages, error, |applier| applier.due(&checkpoints));
    }
    applier.finish(store);
}

/// Applies the writes of `jobs` and the checkpoint `lsn` to the view in one transaction.
fn apply<'a>(
    store: &Store,
    jobs: impl Iterator<Item = &'a Job>,
    lsn: u64,
    durable: bool,
) -> Result<(), CodedError> {
    let written = store.with_db(|db| -> Result<(), redb::Error> {
        let mut txn = db.begin_write()?;
        if !durable {
            txn.set_durability(redb::Durability::None)?;
        }
        apply_all(jobs.map(|job| &job.writes), &txn)?;
        set_applied(&txn, lsn)?;
        txn.commit()?;
        Ok(())
    });
    match written {
        // Closed: shutting down, not a failure of the store.
        Err(closed) => Err(closed),
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            let error = fail_store(store, "applying the log to the view", e);
            tracing::error!(error.code = ?error.code, error = %error, "applying the log failed; nothing of it was acknowledged");
            Err(error)
        }
    }
}

/// The logged writer's stages, stepped by hand: the partition simulator decides when a group
/// is appended, synced, applied, and when the view is made durable — and crashes between.
#[cfg(any(test, feature = "testing"))]
pub struct LoggedFlusher {
    store: Arc<Store>,
    rx: mpsc::UnboundedReceiver<Job>,
    appender: Appender,
    applier: Applier,
    /// Appended, not synced.
    appended: Vec<Stage>,
    /// Synced, not applied.
    synced: Vec<Stage>,
}

#[cfg(any(test, feature = "testing"))]
impl super::writer::Writer {
    /// A logged writer without its threads: sets wait until the [`LoggedFlusher`] moves them.
    /// `None` when `store` has no log ([`Store::open_backend_logged`] gives it one).
    pub fn manual_logged(store: Arc<Store>) -> Option<(Self, LoggedFlusher)> {
        let log = store.take_log()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let appender = Appender::new(log);
        let applier = Applier::new(Arc::clone(&appender.durable));
        Some((
            Self::from_sender(tx),
            LoggedFlusher {
                store,
                rx,
                appender,
                applier,
                appended: Vec::new(),
                synced: Vec::new(),
            },
        ))
    }
}

#[cfg(any(test, feature = "testing"))]
impl LoggedFlusher {
    /// Appends every set queued so far (in groups, as the appender thread would); how many
    /// sets.
    pub fn append(&mut self) -> usize {
        let mut sets = 0;
        let mut held = None;
        loop {
            let first = match held.take() {
                Some(job) => job,
                None => match self.rx.try_recv() {
                    Ok(job) => job,
                    Err(_) => return sets,
                },
            };
            let (jobs, bytes) =
                take_group(first, RECORD_BYTES, &mut held, || self.rx.try_recv().ok());
            sets += jobs.len();
            if let Some(stage) = self.appender.append(&self.store, jobs, bytes) {
                self.appended.push(stage);
            }
        }
    }

    /// Syncs what was appended.
    pub fn sync(&mut self) {
        let stages = std::mem::take(&mut self.appended);
        if stages.is_empty() {
            return;
        }
        match sync(&self.store, &stages) {
            None => self.synced.extend(stages),
            Some(error) => self
                .applier
                .apply(&self.store, stages, Some(error), |_| false),
        }
    }

    /// Applies the first `groups` synced groups to the view, durably if `durable`, and answers
    /// their sets.
    pub fn apply(&mut self, groups: usize, durable: bool) {
        let n = groups.min(self.synced.len());
        if n == 0 && !durable {
            return;
        }
        let stages: Vec<Stage> = self.synced.drain(..n).collect();
        if stages.is_empty() {
            self.applier.finish(&self.store);
        } else {
            self.applier.apply(&self.store, stages, None, |_| durable);
        }
    }

    /// Synced groups not applied yet.
    pub fn lagging(&self) -> usize {
        self.synced.len()
    }

    /// Appends, syncs and applies everything queued; how many sets were queued.
    pub fn flush(&mut self, durable: bool) -> usize {
        let sets = self.append();
        self.sync();
        self.apply(usize::MAX, durable);
        sets
    }
}

#[cfg(test)]
mod tests {
    use redb::ReadableDatabase;

    use super::*;
    use crate::storage::segments::FsDir;
    use crate::storage::writer::{WriteSet, Writer};

    /// A partition table (only those go through a partition's writer and its log).
    const T: crate::schema::BytesTable = crate::schema::INVOCATIONS;

    fn get(store: &Store, key: &[u8]) -> Option<Vec<u8>> {
        store
            .with_db(|db| {
                let txn = db.begin_read().unwrap();
                let table = txn.open_table(T).unwrap();
                table.get(key).unwrap().map(|v| v.value().to_vec())
            })
            .unwrap()
    }

    #[tokio::test]
    async fn sets_are_answered_once_logged_and_visible_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let writer = Writer::start_logged(Arc::clone(&store), Checkpoints::default());
        let mut first = WriteSet::default();
        first.put(T, b"a", b"1".to_vec());
        first.put(T, b"b", b"1".to_vec());
        let mut second = WriteSet::default();
        second.put(T, b"a", b"2".to_vec());
        second.delete(T, b"b");
        let answers = [
            writer.commit(first),
            writer.commit(second),
            writer.commit(WriteSet::default()),
        ];
        for answer in answers {
            answer.await.unwrap().unwrap();
            // Whatever was answered is in the view already.
        }
        assert_eq!(get(&store, b"a").as_deref(), Some(b"2".as_slice()));
        assert_eq!(get(&store, b"b"), None);
        assert!(dir.path().join(crate::storage::LOG_DIR).is_dir());
    }

    /// A fresh store in `dir`, and its log opened as the appender would find it.
    fn store_and_its_log(dir: &std::path::Path) -> SegmentLog {
        drop(Store::open(dir).unwrap());
        let log_dir = dir.join(crate::storage::LOG_DIR);
        SegmentLog::open(Arc::new(FsDir(log_dir)), Default::default(), 0, |_| Ok(())).unwrap()
    }

    #[test]
    fn opening_the_store_replays_what_the_view_lacks() {
        let dir = tempfile::tempdir().unwrap();
        // Records appended and synced, never applied: a crash right after their sync.
        let mut log = store_and_its_log(dir.path());
        for i in 0..3u8 {
            let mut set = WriteSet::default();
            set.put(T, &[b'k', i], vec![i]);
            log.append(&super::super::log::encode_writes(0, 0, [&set]))
                .unwrap();
        }
        drop(log);
        let store = Store::open(dir.path()).unwrap();
        for i in 0..3u8 {
            assert_eq!(get(&store, &[b'k', i]), Some(vec![i]));
        }
        let applied = store
            .with_db(|db| applied(&db.begin_read().unwrap()).unwrap())
            .unwrap();
        assert_eq!(applied, 3);
        // The next record continues the numbering.
        assert_eq!(store.take_log().unwrap().next_lsn(), 4);
        drop(store);
        // A second open replays nothing new.
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.take_log().unwrap().next_lsn(), 4);
    }

    #[test]
    fn a_record_that_checks_out_but_is_not_a_write_set_fails_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = store_and_its_log(dir.path());
        log.append(b"not a record").unwrap();
        drop(log);
        let error = Store::open(dir.path()).unwrap_err();
        assert_eq!(error.code, Some(crate::errors::Code::RT0028), "{error}");
    }
}
