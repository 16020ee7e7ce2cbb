//! The writer of embedded mode: the local segment log is the truth, the redb file a view
//! applied behind it (`docs/durability.md`). Two threads:
//!
//! 1. **write** (`sluice-writer`): takes every set waiting, encodes them as one log record
//!    (`log.rs`'s binary write-set record), appends it to the current segment and syncs it
//!    (`fdatasync`); the next group fills meanwhile. The synced group joins the store's
//!    backlog (`backlog.rs`) and its sets are answered;
//! 2. **apply** (`sluice-log-apply`): off every call's path, applies what waits in the backlog
//!    to the view in one redb transaction that does not sync (its checkpoint row — the last
//!    record it holds — in the same transaction), gathering `apply-delay` of groups first.
//!    Every `checkpoint-interval` that transaction syncs the view: it is then durable up to
//!    that record, and the segments behind it are reused.
//!
//! The simulator steps the same stages one by one (`LoggedFlusher`).
//!
//! A set is answered once its record is synced. Anything read after the answer (an admin read
//! after a `202`, a journal a partition reads back, an idempotency lookup) sees it all the
//! same: every read first applies what waits in the backlog ([`super::Store::with_db`]). A
//! crash loses the view's unsynced transactions and the backlog; opening the store replays the
//! log from the view's durable checkpoint ([`super::Store::open`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::Store;
use super::backlog::Group;
use super::jobs::{Job, stopped, take_group};
use super::segments::SegmentLog;
use super::view::fail_store;
use super::write_set::WriteSet;
use crate::errors::CodedError;

/// Most bytes of writes one record takes (more sets wait for the next record).
const RECORD_BYTES: usize = 16 * 1024 * 1024;

/// How the view follows the log: how often it is applied and made durable.
#[derive(Debug, Clone, Copy)]
pub struct Checkpoints {
    /// Longest time between two durable view transactions.
    pub interval: Duration,
    /// Most log bytes appended between two; also the most bytes of answered groups that may
    /// wait for the view (past it the sync stage applies them itself before answering more).
    pub bytes: u64,
    /// How long the applier gathers groups before one transaction (a read never waits for
    /// it: it applies what waits itself).
    pub apply_delay: Duration,
}

impl Default for Checkpoints {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            bytes: 64 * 1024 * 1024,
            apply_delay: Duration::from_millis(2),
        }
    }
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
    let (to_apply, applied_rx) = std_mpsc::channel::<()>();
    let appender = Appender::new(log);
    let durable = Arc::clone(&appender.durable);
    {
        let store = Arc::clone(&store);
        std::thread::Builder::new()
            .name("sluice-writer".into())
            .spawn(move || write_loop(&store, appender, rx, &to_apply, checkpoints.bytes))
            .expect("the writer thread starts");
    }
    std::thread::Builder::new()
        .name("sluice-log-apply".into())
        .spawn(move || apply_loop(&store, &applied_rx, checkpoints, Applier::new(durable)))
        .expect("the log apply thread starts");
    tx
}

/// The writer of cluster mode (`docs/cluster.md`): what it is handed already landed in the
/// partition's Kafka log, the truth there, so a set joins the backlog and is answered at once,
/// in the caller's thread — no local log, no sync, no thread hop. The view follows behind it
/// exactly as in embedded mode (the same applier, the same read rule); after a crash the
/// replica reader replays the log from the positions the view holds durably, which the sets
/// carry with them.
pub(super) struct ViewWriter {
    store: Arc<Store>,
    /// The applier thread (none when the simulator applies by hand).
    to_apply: Option<std_mpsc::Sender<()>>,
    /// Bytes waiting past which a set applies the backlog itself before it is answered.
    cap: u64,
}

impl ViewWriter {
    /// Starts the applier thread for `store`.
    pub(super) fn start(store: Arc<Store>, checkpoints: Checkpoints) -> Self {
        let (to_apply, applied_rx) = std_mpsc::channel::<()>();
        {
            let store = Arc::clone(&store);
            std::thread::Builder::new()
                .name("sluice-view-apply".into())
                .spawn(move || {
                    let applier = Applier::new(Arc::new(AtomicU64::new(0)));
                    apply_loop(&store, &applied_rx, checkpoints, applier);
                })
                .expect("the view apply thread starts");
        }
        Self {
            store,
            to_apply: Some(to_apply),
            cap: checkpoints.bytes,
        }
    }

    /// Takes `writes` into the backlog: the answer.
    pub(super) fn commit(&self, writes: WriteSet) -> Result<(), CodedError> {
        let store = &self.store;
        if let Some(failure) = store.health().failure() {
            return Err(failure.clone());
        }
        if store.is_closed() {
            return Err(stopped());
        }
        if writes.is_empty() {
            // Every set before it was answered in its own call: nothing to wait behind.
            return Ok(());
        }
        let bytes = super::log::encoded_len(&writes) as u64;
        let waiting = store.backlog().push([Group {
            writes: vec![writes],
            lsn: None,
            bytes,
        }]);
        let result = if waiting >= self.cap {
            store.backlog().apply(store, usize::MAX, false).map(drop)
        } else {
            Ok(())
        };
        if let Some(to_apply) = &self.to_apply {
            let _ = to_apply.send(());
        }
        result
    }
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

/// What the sync stage does with synced groups: into the backlog, then answered (the failure
/// instead, if any). Past `cap` bytes waiting, applies them before answering: the view may
/// lag, but not without bound.
fn settle(store: &Store, stages: Vec<Stage>, error: Option<CodedError>, cap: u64) {
    let error = error.or_else(|| store.health().failure().cloned());
    let mut result = match error {
        Some(error) => Err(error),
        None => Ok(()),
    };
    let mut answers = Vec::with_capacity(stages.len());
    let mut groups = Vec::with_capacity(stages.len());
    for mut stage in stages {
        if result.is_ok()
            && let Some(appended) = &stage.appended
        {
            groups.push(Group {
                writes: stage
                    .jobs
                    .iter_mut()
                    .map(|job| std::mem::take(&mut job.writes))
                    .collect(),
                lsn: Some(appended.lsn),
                bytes: stage.bytes,
            });
        }
        answers.push((stage.jobs, stage.since));
    }
    if result.is_ok() && store.backlog().push(groups) >= cap {
        result = store.backlog().apply(store, usize::MAX, false).map(drop);
    }
    metrics::histogram!(sluice_core::metrics::STORE_COMMIT_GROUP).record(answers.len() as f64);
    for (jobs, since) in answers {
        if result.is_ok() {
            metrics::histogram!(sluice_core::metrics::STORE_COMMIT_DURATION)
                .record(since.elapsed());
        }
        answer(jobs, &result);
    }
}

/// The third stage: applies what waits in the backlog to the view, and makes it durable now
/// and then.
pub(super) struct Applier {
    durable: Arc<AtomicU64>,
    last_durable: Instant,
    bytes_since: u64,
}

impl Applier {
    fn new(durable: Arc<AtomicU64>) -> Self {
        Self {
            durable,
            last_durable: Instant::now(),
            bytes_since: 0,
        }
    }

    /// Whether the next transaction should make the view durable.
    fn due(&self, checkpoints: &Checkpoints) -> bool {
        self.last_durable.elapsed() >= checkpoints.interval || self.bytes_since >= checkpoints.bytes
    }

    /// Applies the first `groups` waiting groups in one transaction, durable if `durable`.
    fn apply(&mut self, store: &Store, groups: usize, durable: bool) {
        let started = Instant::now();
        // A failure failed the health already (`backlog.rs`); the groups stay waiting.
        if let Ok(applied) = store.backlog().apply(store, groups, durable) {
            self.bytes_since += applied.bytes;
            if durable {
                metrics::histogram!(sluice_core::metrics::STORE_CHECKPOINT_DURATION)
                    .record(started.elapsed());
                self.last_durable = Instant::now();
                self.bytes_since = 0;
                self.durable.store(applied.lsn, Ordering::Release);
            }
        }
    }

    /// Applies everything waiting and makes the view durable (when every writer is gone, the
    /// next start then replays nothing).
    fn finish(&mut self, store: &Store) {
        self.apply(store, usize::MAX, true);
    }
}

/// Append and sync in one thread: while it syncs one group, the next fills in its channel,
/// and is appended (one `write`) and synced as soon as that sync returns. A thread of its own
/// for the sync measured slower on two cores: one more wake-up per group for no overlap worth
/// it (`docs/perf.md`).
fn write_loop(
    store: &Store,
    mut appender: Appender,
    mut rx: mpsc::UnboundedReceiver<Job>,
    to_apply: &std_mpsc::Sender<()>,
    cap: u64,
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
        let stages = vec![stage];
        let error = sync(store, &stages);
        settle(store, stages, error, cap);
        if to_apply.send(()).is_err() {
            return;
        }
    }
}

fn apply_loop(
    store: &Store,
    rx: &std_mpsc::Receiver<()>,
    checkpoints: Checkpoints,
    mut applier: Applier,
) {
    while rx.recv().is_ok() {
        // Gathering: one transaction for every group synced meanwhile. No answer waits for it.
        if !checkpoints.apply_delay.is_zero() {
            std::thread::sleep(checkpoints.apply_delay);
        }
        while rx.try_recv().is_ok() {}
        let durable = applier.due(&checkpoints);
        applier.apply(store, usize::MAX, durable);
    }
    applier.finish(store);
}

/// The logged writer's stages, stepped by hand: the partition simulator decides when a group
/// is appended, synced, applied, and when the view is made durable — and crashes between.
#[cfg(any(test, feature = "testing"))]
pub struct LoggedFlusher {
    store: Arc<Store>,
    rx: mpsc::UnboundedReceiver<Job>,
    appender: Appender,
    /// The view behind the log, applied by hand as in cluster mode.
    view: ViewFlusher,
    /// Appended, not synced.
    appended: Vec<Stage>,
}

#[cfg(any(test, feature = "testing"))]
impl LoggedFlusher {
    /// The stages of a logged writer without its threads, and the sender of its sets
    /// (`Writer::manual_logged`). `None` when `store` has no log.
    pub(super) fn new(store: Arc<Store>) -> Option<(mpsc::UnboundedSender<Job>, Self)> {
        let log = store.take_log()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let appender = Appender::new(log);
        let view = ViewFlusher {
            store: Arc::clone(&store),
            applier: Applier::new(Arc::clone(&appender.durable)),
        };
        Some((
            tx,
            LoggedFlusher {
                store,
                rx,
                appender,
                view,
                appended: Vec::new(),
            },
        ))
    }
}

/// The applier of cluster mode's view writer, stepped by hand (the partition simulator).
#[cfg(any(test, feature = "testing"))]
pub struct ViewFlusher {
    store: Arc<Store>,
    applier: Applier,
}

#[cfg(any(test, feature = "testing"))]
impl ViewFlusher {
    /// Cluster mode's view writer without its applier thread, and its applier stepped by hand
    /// (`Writer::manual_view`).
    pub(super) fn new(store: Arc<Store>) -> (ViewWriter, Self) {
        let view = ViewWriter {
            store: Arc::clone(&store),
            to_apply: None,
            cap: Checkpoints::default().bytes,
        };
        (
            view,
            ViewFlusher {
                store,
                applier: Applier::new(Arc::new(AtomicU64::new(0))),
            },
        )
    }
}

#[cfg(any(test, feature = "testing"))]
impl ViewFlusher {
    /// Applies the first `groups` waiting groups in one transaction, durable if `durable`.
    pub fn apply(&mut self, groups: usize, durable: bool) {
        if groups == 0 && !durable {
            return;
        }
        self.applier.apply(&self.store, groups, durable);
    }

    /// Answered groups not applied yet.
    pub fn lagging(&self) -> usize {
        self.store.backlog().waiting()
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

    /// Syncs what was appended and answers it (its writes wait in the backlog).
    pub fn sync(&mut self) {
        let stages = std::mem::take(&mut self.appended);
        if stages.is_empty() {
            return;
        }
        let error = sync(&self.store, &stages);
        settle(&self.store, stages, error, u64::MAX);
    }

    /// The view behind the log: what applies the answered groups.
    pub fn view(&mut self) -> &mut ViewFlusher {
        &mut self.view
    }

    /// Appends, syncs and applies everything queued; how many sets were queued.
    pub fn flush(&mut self, durable: bool) -> usize {
        let sets = self.append();
        self.sync();
        self.view.apply(usize::MAX, durable);
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

    #[tokio::test]
    async fn the_view_writer_answers_at_once_and_reads_see_its_sets() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        // The applier waits an hour: what a read sees, it applied itself.
        let checkpoints = Checkpoints {
            apply_delay: Duration::from_secs(3600),
            ..Checkpoints::default()
        };
        let writer = Writer::start_view(Arc::clone(&store), checkpoints);
        let mut set = WriteSet::default();
        set.put(T, b"k", b"1".to_vec());
        let mut answer = writer.commit(set);
        assert_eq!(answer.try_recv().unwrap(), Ok(()), "answered in the call");
        assert_eq!(store.backlog().waiting(), 1);
        assert_eq!(get(&store, b"k").as_deref(), Some(b"1".as_slice()));
        assert_eq!(store.backlog().waiting(), 0);
        // No local log record, no checkpoint row: the writes carry their own position.
        let applied = store
            .with_db(|db| crate::storage::view::applied(&db.begin_read().unwrap()).unwrap())
            .unwrap();
        assert_eq!(applied, 0);
        store.close();
        let mut set = WriteSet::default();
        set.put(T, b"k", b"2".to_vec());
        let err = writer.commit(set).await.unwrap().unwrap_err();
        assert_eq!(
            err.code,
            Some(crate::errors::Code::RT0006),
            "a closed store refuses, never drops"
        );
    }

    #[tokio::test]
    async fn a_read_after_an_answer_sees_it_before_the_applier_applies_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        // The applier waits an hour: only the reads can have applied what they see.
        let checkpoints = Checkpoints {
            apply_delay: Duration::from_secs(3600),
            ..Checkpoints::default()
        };
        let writer = Writer::start_logged(Arc::clone(&store), checkpoints);
        for i in 0..3u8 {
            let mut set = WriteSet::default();
            set.put(T, b"k", vec![i]);
            writer.commit(set).await.unwrap().unwrap();
            assert_eq!(
                store.backlog().waiting(),
                1,
                "answered before the view has it"
            );
            assert_eq!(get(&store, b"k"), Some(vec![i]));
            assert_eq!(store.backlog().waiting(), 0);
        }
    }

    #[test]
    fn a_view_that_cannot_be_applied_keeps_the_writes_waiting_and_fails_reads() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut set = WriteSet::default();
        set.put(T, b"k", b"v".to_vec());
        store.backlog().push([super::Group {
            writes: vec![set],
            lsn: Some(1),
            bytes: 10,
        }]);
        store.close();
        assert!(store.with_db(|_| ()).is_err());
        assert_eq!(store.backlog().waiting(), 1, "nothing dropped");
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
            .with_db(|db| crate::storage::view::applied(&db.begin_read().unwrap()).unwrap())
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
        assert_eq!(error.code, Some(crate::errors::Code::STO0002), "{error}");
    }
}
