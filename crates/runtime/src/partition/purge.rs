//! The purger: removes what completed invocations leave behind once their retention is up
//! (`worker.completion-retention`, `journal_retention`), so the store stops growing under a
//! steady load. It works off the purge rows completions write, earliest first, at most
//! `worker.purge-batch-size` in one write, through the same writer as the partitions.
//! Retained results (idempotency keys, workflows) are not its business: they are looked up in
//! memory, and leave memory and store together on their partition's expiry timer.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::now_ms;
use crate::ids::InvocationId;
use crate::invocation::store;
use crate::storage::Store;
use crate::storage::writer::{WriteSet, Writer};

/// Purges the invocations `owns` selects until the store closes or a write fails (the process
/// is then stopping anyway). In cluster mode each led partition runs its own, through its log.
pub async fn run(
    store: Arc<Store>,
    writer: Writer,
    interval: Duration,
    batch: usize,
    owns: impl Fn(InvocationId) -> bool,
) {
    loop {
        let due = match store.with_db(|db| store::due_purges(db, now_ms(), batch, &owns)) {
            Ok(Ok(due)) => due,
            Ok(Err(e)) => {
                tracing::warn!(error.code = ?e.code, error = %e, "cannot read due purges; trying again");
                tokio::time::sleep(interval).await;
                continue;
            }
            // Closed: shutting down.
            Err(_) => return,
        };
        let mut writes = WriteSet::default();
        for purge in &due {
            store::apply_purge(&mut writes, purge);
        }
        if !due.is_empty() {
            match writer.commit(writes).await {
                Ok(Ok(())) => tracing::debug!(purged = due.len(), "purged completed invocations"),
                // A failed write already failed the process's health.
                _ => return,
            }
        }
        // A full batch means a backlog: the next one goes at once.
        if due.len() < batch {
            tokio::time::sleep(interval).await;
        }
    }
}
