//! The redb view behind a log: applying write sets to it in one transaction with its
//! checkpoint row (the last log record it holds), and what a failure to do so turns off; what
//! waits for it ([`backlog`]) and what applies that ([`applier`]).

pub mod applier;
pub(crate) mod backlog;

pub use applier::Checkpoints;
#[cfg(any(test, feature = "testing"))]
pub use applier::ViewFlusher;

use super::Store;
use super::write_set::{WriteSet, apply_all};
use crate::schema::LOCAL_LOG;
use sluice_core::errors::CodedError;

/// The view's checkpoint row in [`LOCAL_LOG`]: the last log record it holds (u64 BE).
const APPLIED: &[u8] = b"applied";

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

/// Fails the store's health: `what` could not be written.
pub(in crate::storage) fn fail_store(
    store: &Store,
    what: &str,
    e: impl std::fmt::Display,
) -> CodedError {
    metrics::counter!(sluice_core::metrics::STORE_COMMIT_FAILURES).increment(1);
    let error = crate::health::store_write_failed(format!("{what}: {e}"));
    store.health().fail(error.clone());
    error
}

/// Applies `sets` and the checkpoint `lsn` (if any) to the view in one transaction.
pub(in crate::storage) fn apply<'a>(
    store: &Store,
    sets: impl Iterator<Item = &'a WriteSet>,
    lsn: Option<u64>,
    durable: bool,
) -> Result<(), CodedError> {
    // Not `with_db`: that catches up with the backlog, which is what calls this.
    let written = store.with_view(|db| -> Result<(), redb::Error> {
        let mut txn = db.begin_write()?;
        if !durable {
            txn.set_durability(redb::Durability::None)?;
        }
        apply_all(sets, &txn)?;
        if let Some(lsn) = lsn {
            set_applied(&txn, lsn)?;
        }
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
