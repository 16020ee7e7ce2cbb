//! The view behind a log: the applier that writes what waits in the backlog into the redb
//! file, off every call's path, and makes it durable now and then (`checkpoint-interval`); and
//! cluster mode's view writer, whose sets landed in their Kafka log already and join the
//! backlog at once. The simulator steps the applier by hand ([`ViewFlusher`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use super::backlog::Landed;
use crate::storage::Store;
use crate::storage::jobs::stopped;
use crate::storage::write_set::WriteSet;
use sluice_core::errors::CodedError;

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

/// The writer of cluster mode (`docs/cluster.md`): what it is handed already landed in the
/// partition's Kafka log, the truth there, so a set joins the backlog and is answered at once,
/// in the caller's thread — no local log, no sync, no thread hop. The view follows behind it
/// exactly as in embedded mode (the same applier, the same read rule); after a crash the
/// replica reader replays the log from the positions the view holds durably, which the sets
/// carry with them.
pub(in crate::storage) struct ViewWriter {
    store: Arc<Store>,
    /// The applier thread (none when the simulator applies by hand).
    to_apply: Option<std_mpsc::Sender<()>>,
    /// Bytes waiting past which a set applies the backlog itself before it is answered.
    cap: u64,
}

impl ViewWriter {
    /// Starts the applier thread for `store`.
    pub(in crate::storage) fn start(store: Arc<Store>, checkpoints: Checkpoints) -> Self {
        let (to_apply, applied_rx) = std_mpsc::channel::<()>();
        {
            let store = Arc::clone(&store);
            crate::storage::threads::spawn("sluice-view-apply", move || {
                let applier = Applier::new(Arc::new(AtomicU64::new(0)));
                apply_loop(&store, &applied_rx, checkpoints, applier);
            });
        }
        Self {
            store,
            to_apply: Some(to_apply),
            cap: checkpoints.bytes,
        }
    }

    /// Takes `writes` into the backlog: the answer.
    pub(in crate::storage) fn commit(&self, writes: WriteSet) -> Result<(), CodedError> {
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
        let bytes = crate::storage::record::encoded_len(&writes) as u64;
        let waiting = store.backlog().push([Landed {
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

/// The third stage: applies what waits in the backlog to the view, and makes it durable now
/// and then.
pub(in crate::storage) struct Applier {
    durable: Arc<AtomicU64>,
    last_durable: Instant,
    bytes_since: u64,
}

impl Applier {
    pub(in crate::storage) fn new(durable: Arc<AtomicU64>) -> Self {
        Self {
            durable,
            last_durable: Instant::now(),
            bytes_since: 0,
        }
    }

    /// Whether the next transaction should make the view durable.
    pub(in crate::storage) fn due(&self, checkpoints: &Checkpoints) -> bool {
        self.last_durable.elapsed() >= checkpoints.interval || self.bytes_since >= checkpoints.bytes
    }

    /// Applies the first `groups` waiting groups in one transaction, durable if `durable`.
    pub(in crate::storage) fn apply(&mut self, store: &Store, groups: usize, durable: bool) {
        let started = Instant::now();
        // A failure failed the health already (`view/mod.rs`); the groups stay waiting.
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
    pub(in crate::storage) fn finish(&mut self, store: &Store) {
        self.apply(store, usize::MAX, true);
    }
}

pub(in crate::storage) fn apply_loop(
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
    pub(in crate::storage) fn new(store: Arc<Store>) -> (ViewWriter, Self) {
        let view = ViewWriter {
            store: Arc::clone(&store),
            to_apply: None,
            cap: Checkpoints::default().bytes,
        };
        (view, Self::with_durable(store, Arc::new(AtomicU64::new(0))))
    }

    /// The applier of `store` stepped by hand, telling `durable` where the view is durable up
    /// to (the local log's appender reuses the segments behind it).
    pub(in crate::storage) fn with_durable(store: Arc<Store>, durable: Arc<AtomicU64>) -> Self {
        Self {
            store,
            applier: Applier::new(durable),
        }
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

#[cfg(test)]
mod tests {
    use redb::ReadableDatabase;

    use super::*;
    use crate::storage::writer::{WriteSet, Writer};

    use crate::storage::test_support::{T, get};

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
            Some(sluice_core::errors::Code::RT0006),
            "a closed store refuses, never drops"
        );
    }

    #[test]
    fn a_view_that_cannot_be_applied_keeps_the_writes_waiting_and_fails_reads() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut set = WriteSet::default();
        set.put(T, b"k", b"v".to_vec());
        store.backlog().push([super::super::backlog::Landed {
            writes: vec![set],
            lsn: Some(1),
            bytes: 10,
        }]);
        store.close();
        assert!(store.with_db(|_| ()).is_err());
        assert_eq!(store.backlog().waiting(), 1, "nothing dropped");
    }
}
