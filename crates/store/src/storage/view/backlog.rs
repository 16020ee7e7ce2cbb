//! Groups that landed in their log and were answered, not yet applied to the view
//! (`applier.rs`).
//!
//! The read rule (`docs/durability.md`): anything read after an acknowledgement sees it. A set
//! is answered once its record is synced; its group then waits here until the applier thread
//! writes it into the view. Every read of the store ([`super::Store::with_db`]) first applies
//! whatever waits here, so a read that starts after an answer never sees the view without it.
//! The applier is the usual one to apply (in large transactions, off every call's path); a
//! reader only helps when it comes before it.
//!
//! A group counts as waiting until the transaction that applied it committed: a reader that
//! finds nothing waiting finds the view complete.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::storage::Store;
use crate::storage::write_set::WriteSet;
use sluice_core::errors::CodedError;

/// One landed log record's writes: a group of sets after its record landed (the writer's
/// [`crate::storage::writer::Group`] before), its answers sent.
pub(crate) struct Landed {
    pub(crate) writes: Vec<WriteSet>,
    /// Its record in the local log; `None` for writes whose log is another (cluster mode: the
    /// partition's Kafka log, whose position the writes carry themselves).
    pub(crate) lsn: Option<u64>,
    pub(crate) bytes: u64,
}

/// What the view holds, as far as this process applied it.
#[derive(Default)]
struct View {
    /// The last local log record applied (0: none since open).
    lsn: u64,
    /// Whether a transaction that did not sync applied something since the last that did.
    unsynced: bool,
}

/// What waits for the view. Two locks, so that the sync stage adding groups never waits for
/// a transaction in progress: `incoming` is held for a push or a take, `applied` for a whole
/// application.
#[derive(Default)]
pub(crate) struct Backlog {
    /// Groups pushed and not yet committed to the view: a reader's check when nothing waits
    /// is this one load. Lowered only after the commit that applied them.
    waiting: AtomicUsize,
    /// Bytes of those groups.
    bytes: AtomicU64,
    incoming: Mutex<VecDeque<Landed>>,
    /// Held while applying.
    applied: Mutex<View>,
}

impl std::fmt::Debug for Backlog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backlog")
            .field("waiting", &self.waiting())
            .finish()
    }
}

/// What one application did.
pub(crate) struct Applied {
    /// The last local log record the view holds now.
    pub(crate) lsn: u64,
    /// Bytes of the groups it applied.
    pub(crate) bytes: u64,
}

impl Backlog {
    /// Groups waiting for the view.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Adds synced groups, in log order, before their sets are answered; the bytes waiting now.
    pub(crate) fn push(&self, groups: impl IntoIterator<Item = Landed>) -> u64 {
        let mut incoming = self.incoming.lock().unwrap_or_else(|e| e.into_inner());
        let before = incoming.len();
        let mut bytes = 0;
        for group in groups {
            bytes += group.bytes;
            incoming.push_back(group);
        }
        self.waiting
            .fetch_add(incoming.len() - before, Ordering::AcqRel);
        self.bytes.fetch_add(bytes, Ordering::AcqRel) + bytes
    }

    /// Applies the first `groups` waiting groups to the view in one transaction (durable if
    /// `durable`, with the checkpoint row of the last); a durable call with nothing waiting
    /// still syncs what earlier transactions applied. A failure fails the store's health and
    /// keeps the groups waiting, so every later read fails too instead of missing them.
    pub(crate) fn apply(
        &self,
        store: &Store,
        groups: usize,
        durable: bool,
    ) -> Result<Applied, CodedError> {
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        let taken: Vec<Landed> = {
            let mut incoming = self.incoming.lock().unwrap_or_else(|e| e.into_inner());
            let n = groups.min(incoming.len());
            incoming.drain(..n).collect()
        };
        let logged = taken.iter().rev().find_map(|group| group.lsn);
        let lsn = logged.unwrap_or(applied.lsn);
        // Nothing applied since open: the view's checkpoint row is the replay's, left as it is.
        let row = logged.or((applied.lsn > 0).then_some(applied.lsn));
        if !taken.is_empty() || (durable && applied.unsynced) {
            let sets = taken.iter().flat_map(|group| &group.writes);
            if let Err(error) = super::apply(store, sets, row, durable) {
                let mut incoming = self.incoming.lock().unwrap_or_else(|e| e.into_inner());
                for group in taken.into_iter().rev() {
                    incoming.push_front(group);
                }
                return Err(error);
            }
            applied.unsynced = !durable;
        }
        let bytes: u64 = taken.iter().map(|group| group.bytes).sum();
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        self.waiting.fetch_sub(taken.len(), Ordering::AcqRel);
        applied.lsn = lsn;
        Ok(Applied { lsn, bytes })
    }

    /// Before a read: applies everything waiting (nothing to do, the common case, is one load).
    pub(crate) fn catch_up(&self, store: &Store) -> Result<(), CodedError> {
        if self.waiting() == 0 {
            return Ok(());
        }
        metrics::counter!(sluice_core::metrics::STORE_READ_CATCH_UPS).increment(1);
        self.apply(store, usize::MAX, false).map(drop)
    }
}
