//! The writer of embedded mode: the local segment log is the truth, the redb file a view
//! applied behind it (`docs/durability.md`). Two threads:
//!
//! 1. **write** (`sluice-writer`): takes every set waiting, encodes them as one log record
//!    (`record.rs`'s binary write-set record), appends it to the [`LocalLog`] and waits for
//!    the log to confirm it (one `fdatasync`); the next group fills meanwhile. The confirmed
//!    group joins the store's backlog (`view/backlog.rs`) and its sets are answered;
//! 2. **apply** (`sluice-log-apply`, `view/applier.rs`): off every call's path, applies what
//!    waits in the backlog to the view in one redb transaction that does not sync (its
//!    checkpoint row — the last record it holds — in the same transaction), gathering
//!    `apply-delay` of groups first. Every `checkpoint-interval` that transaction syncs the
//!    view: it is then durable up to that record, and the segments behind it are reused.
//!
//! The simulator steps the same stages one by one (`LoggedFlusher`).
//!
//! A set is answered once its record is synced. Anything read after the answer (an admin read
//! after a `202`, a journal a partition reads back, an idempotency lookup) sees it all the
//! same: every read first applies what waits in the backlog ([`crate::storage::Store::with_db`]).
//! A crash loses the view's unsynced transactions and the backlog; opening the store replays
//! the log from the view's durable checkpoint (`replay.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use tokio::sync::mpsc;

use super::LocalLog;
use crate::storage::Store;
use crate::storage::jobs::{Job, take_group};
use crate::storage::log::{PartitionLog, confirm, wait};
#[cfg(any(test, feature = "testing"))]
use crate::storage::view::applier::ViewFlusher;
use crate::storage::view::applier::{Applier, Checkpoints, apply_loop};
use crate::storage::view::backlog::Landed;
use crate::storage::view::fail_store;
use sluice_core::errors::CodedError;

/// Most bytes of writes one record takes (more sets wait for the next record).
pub(in crate::storage) const RECORD_BYTES: usize = 16 * 1024 * 1024;

/// A group on its way through the pipeline.
struct Stage {
    jobs: Vec<Job>,
    /// Whether it handed the log a record (an empty group only keeps its place in line).
    logged: bool,
    /// Where its record landed, once confirmed.
    lsn: Option<u64>,
    bytes: u64,
    since: Instant,
}

/// Starts the writer's two threads over `log`; the sender is the writer's.
pub(in crate::storage) fn start(
    store: Arc<Store>,
    log: LocalLog,
    checkpoints: Checkpoints,
) -> mpsc::UnboundedSender<Job> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (to_apply, applied_rx) = std_mpsc::channel::<()>();
    let appender = Appender::new(log);
    let durable = Arc::clone(&appender.durable);
    {
        let store = Arc::clone(&store);
        crate::storage::threads::spawn("sluice-writer", move || {
            write_loop(&store, appender, rx, &to_apply, checkpoints.bytes)
        });
    }
    crate::storage::threads::spawn("sluice-log-apply", move || {
        apply_loop(&store, &applied_rx, checkpoints, Applier::new(durable))
    });
    tx
}

fn answer(jobs: Vec<Job>, result: &Result<(), CodedError>) {
    for job in jobs {
        let _ = job.done.send(result.clone());
    }
}

/// The first stage: owns the log, appends one record per group.
struct Appender {
    log: LocalLog,
    /// The view's durable checkpoint, as the applier last made it.
    durable: Arc<AtomicU64>,
    /// The checkpoint up to which segments were given up.
    released: u64,
}

impl Appender {
    fn new(log: LocalLog) -> Self {
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
        let logged = !jobs.iter().all(|job| job.writes.is_empty());
        if logged {
            let record =
                crate::storage::record::encode_writes(0, 0, jobs.iter().map(|job| &job.writes));
            if let Err(e) = wait(self.log.append(&record)) {
                let error = fail_store(store, "appending to the log", e);
                answer(jobs, &Err(error));
                return None;
            }
        }
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
            logged,
            lsn: None,
            bytes: bytes as u64,
            since,
        })
    }

    /// The second stage: the log confirms every record of `stages`, in the order appended
    /// (one sync for them all). The failure, if any.
    fn confirm(&mut self, store: &Store, stages: &mut [Stage]) -> Option<CodedError> {
        if let Some(failure) = store.health().failure() {
            return Some(failure.clone());
        }
        for stage in stages.iter_mut().filter(|stage| stage.logged) {
            match wait(confirm(&mut self.log)) {
                Ok(lsn) => stage.lsn = Some(lsn),
                // A failed fsync may have dropped the dirty pages: nothing after it can be
                // trusted.
                Err(e) => return Some(fail_store(store, "syncing the log", e)),
            }
        }
        None
    }
}

/// What the sync stage does with confirmed groups: into the backlog, then answered (the
/// failure instead, if any). Past `cap` bytes waiting, applies them before answering: the view
/// may lag, but not without bound.
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
            && let Some(lsn) = stage.lsn
        {
            groups.push(Landed {
                writes: stage
                    .jobs
                    .iter_mut()
                    .map(|job| std::mem::take(&mut job.writes))
                    .collect(),
                lsn: Some(lsn),
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
        let mut stages = vec![stage];
        let error = appender.confirm(store, &mut stages);
        settle(store, stages, error, cap);
        if to_apply.send(()).is_err() {
            return;
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
    /// The view behind the log, applied by hand as in cluster mode.
    view: ViewFlusher,
    /// Appended, not synced.
    appended: Vec<Stage>,
}

#[cfg(any(test, feature = "testing"))]
impl LoggedFlusher {
    /// The stages of a logged writer without its threads, and the sender of its sets
    /// (`Writer::manual_logged`). `None` when `store` has no log.
    pub(in crate::storage) fn new(store: Arc<Store>) -> Option<(mpsc::UnboundedSender<Job>, Self)> {
        let log = LocalLog::new(store.take_log()?);
        let (tx, rx) = mpsc::unbounded_channel();
        let appender = Appender::new(log);
        let view = ViewFlusher::with_durable(Arc::clone(&store), Arc::clone(&appender.durable));
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
        let mut stages = std::mem::take(&mut self.appended);
        if stages.is_empty() {
            return;
        }
        let error = self.appender.confirm(&self.store, &mut stages);
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
    use std::time::Duration;

    use super::*;
    use crate::storage::writer::{WriteSet, Writer};

    use crate::storage::test_support::{T, get};

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
}
