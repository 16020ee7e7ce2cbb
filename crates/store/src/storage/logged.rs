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
//!    the same transaction), then answers the group's sets. Every `checkpoint-interval` the
//!    transaction syncs instead: the view is then durable up to its checkpoint, and the
//!    segments behind it are reused.
//!
//! A set is answered only once its record is synced *and* applied to the view, so anything read
//! after an acknowledgement (an admin read after a `202`, a journal a partition reads back, an
//! idempotency lookup) sees it. A crash loses the view's unsynced transactions; opening the
//! store replays the log from the view's durable checkpoint ([`super::Store::open`]).

use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::Store;
use super::segments::SegmentLog;
use super::writer::{GROUP, Job, apply_all, stopped};
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
            interval: Duration::from_secs(1),
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
struct Stage {
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
    let durable = Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let (store, durable) = (Arc::clone(&store), Arc::clone(&durable));
        std::thread::Builder::new()
            .name("sluice-writer".into())
            .spawn(move || append_loop(&store, log, rx, &to_sync, &durable))
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
        .spawn(move || apply_loop(&store, &applied_rx, checkpoints, &durable))
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

fn append_loop(
    store: &Store,
    mut log: SegmentLog,
    mut rx: mpsc::UnboundedReceiver<Job>,
    to_sync: &std_mpsc::Sender<Stage>,
    durable: &std::sync::atomic::AtomicU64,
) {
    let mut released = 0;
    let mut held: Option<Job> = None;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match rx.blocking_recv() {
                Some(job) => job,
                None => return,
            },
        };
        let since = Instant::now();
        let mut bytes = super::log::encoded_len(&first.writes);
        let mut jobs = vec![first];
        while jobs.len() < GROUP {
            let Ok(job) = rx.try_recv() else { break };
            let len = super::log::encoded_len(&job.writes);
            if bytes.saturating_add(len) > RECORD_BYTES {
                held = Some(job);
                break;
            }
            bytes += len;
            jobs.push(job);
        }
        // After a failure nothing more is acknowledged, not even an empty set (see
        // `writer.rs`): memory may hold what the store does not.
        if let Some(failure) = store.health().failure() {
            answer(jobs, &Err(failure.clone()));
            continue;
        }
        let appended = if jobs.iter().all(|job| job.writes.is_empty()) {
            None
        } else {
            let record = super::log::encode_writes(0, 0, jobs.iter().map(|job| &job.writes));
            match log.append(&record) {
                Ok(appended) => Some(appended),
                Err(e) => {
                    let error = fail_store(store, "appending to the log", e);
                    answer(jobs, &Err(error));
                    continue;
                }
            }
        };
        let stage = Stage {
            jobs,
            appended,
            bytes: bytes as u64,
            since,
        };
        if let Err(std_mpsc::SendError(stage)) = to_sync.send(stage) {
            answer(stage.jobs, &Err(stopped()));
            return;
        }
        // Segments the view holds durably are reused (the appender owns the log).
        let checkpoint = durable.load(std::sync::atomic::Ordering::Acquire);
        if checkpoint > released {
            released = checkpoint;
            if let Err(e) = log.release(checkpoint) {
                fail_store(store, "reusing a log segment", e);
            }
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
        // One sync per file, in the order appended: a segment left for the next is synced
        // before the next one's records count.
        let mut error = store.health().failure().cloned();
        let mut last: Option<&Arc<std::fs::File>> = None;
        for appended in stages.iter().filter_map(|stage| stage.appended.as_ref()) {
            if error.is_some() {
                break;
            }
            if last.is_some_and(|file| Arc::ptr_eq(file, &appended.file)) {
                continue;
            }
            if let Some(previous) = last
                && let Err(e) = previous.sync_data()
            {
                error = Some(fail_store(store, "syncing the log", e));
            }
            last = Some(&appended.file);
        }
        if error.is_none()
            && let Some(file) = last
            && let Err(e) = file.sync_data()
        {
            // A failed fsync may have dropped the dirty pages: nothing after it can be trusted.
            error = Some(fail_store(store, "syncing the log", e));
        }
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
    durable: &std::sync::atomic::AtomicU64,
) {
    let mut last_durable = Instant::now();
    let mut bytes_since = 0u64;
    let mut last_lsn = 0u64;
    let mut unsynced = false;
    while let Ok(first) = rx.recv() {
        let mut batches = vec![first];
        batches.extend(rx.try_iter());
        let error = batches.iter().find_map(|(_, error)| error.clone());
        let stages: Vec<Stage> = batches.into_iter().flat_map(|(s, _)| s).collect();
        let result = match error.or_else(|| store.health().failure().cloned()) {
            Some(error) => Err(error),
            None => {
                let lsn = stages
                    .iter()
                    .filter_map(|stage| stage.appended.as_ref().map(|a| a.lsn))
                    .max();
                bytes_since += stages.iter().map(|stage| stage.bytes).sum::<u64>();
                match lsn {
                    // Only empty sets: they kept their place behind every earlier write.
                    None => Ok(()),
                    Some(lsn) => {
                        let make_durable = last_durable.elapsed() >= checkpoints.interval
                            || bytes_since >= checkpoints.bytes;
                        let jobs = stages.iter().flat_map(|stage| &stage.jobs);
                        match apply(store, jobs, lsn, make_durable) {
                            Ok(()) => {
                                last_lsn = lsn;
                                if make_durable {
                                    last_durable = Instant::now();
                                    bytes_since = 0;
                                    unsynced = false;
                                    durable.store(lsn, std::sync::atomic::Ordering::Release);
                                } else {
                                    unsynced = true;
                                }
                                Ok(())
                            }
                            Err(error) => Err(error),
                        }
                    }
                }
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
    }
    // Every writer is gone: leave the view durable, so the next start replays nothing.
    if unsynced {
        let _ = apply(store, std::iter::empty(), last_lsn, true);
    }
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

#[cfg(test)]
mod tests {
    use redb::ReadableDatabase;

    use super::*;
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

    #[test]
    fn opening_the_store_replays_what_the_view_lacks() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        // Records appended and synced, never applied: a crash right after their sync.
        let log_dir = dir.path().join(crate::storage::LOG_DIR);
        let mut log = SegmentLog::open(&log_dir, Default::default(), 0, |_| Ok(())).unwrap();
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
        drop(Store::open(dir.path()).unwrap());
        let log_dir = dir.path().join(crate::storage::LOG_DIR);
        let mut log = SegmentLog::open(&log_dir, Default::default(), 0, |_| Ok(())).unwrap();
        log.append(b"not a record").unwrap();
        drop(log);
        let error = Store::open(dir.path()).unwrap_err();
        assert_eq!(error.code, Some(crate::errors::Code::RT0028), "{error}");
    }
}
