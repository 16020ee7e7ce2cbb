//! The purger: removes what completed invocations leave behind once their retention is up
//! (`worker.completion-retention`, `journal_retention`), so the store stops growing under a
//! steady load. It works off the purge rows completions write, earliest first, at most
//! `worker.purge-batch-size` in one write, through the same writer as the partitions.
//! Retained results (idempotency keys, workflows) are not its business: they are looked up in
//! memory, and leave memory and store together on their partition's expiry timer.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::clock::now_ms;
use sluice_core::ids::InvocationId;
use sluice_store::invocation::store;
use sluice_store::storage::Store;
use sluice_store::storage::writer::{WriteSet, Writer};

/// How fast the purger goes.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// How long it waits when nothing more is due.
    pub interval: Duration,
    /// Most due purges one read of the store takes.
    pub batch: usize,
    /// Most purges written at once and not yet stored (`worker.cleanup-max-in-flight`): each
    /// write waits for the one before, so a backlog never fills the writer's queue ahead of
    /// the calls sharing it.
    pub in_flight: usize,
}

/// Purges the invocations `owns` selects until the store closes or a write fails (the process
/// is then stopping anyway). In cluster mode each led partition runs its own, through its log.
pub async fn run(
    store: Arc<Store>,
    writer: Writer,
    pace: Pace,
    owns: impl Fn(InvocationId) -> bool,
) {
    let chunk = pace.in_flight.max(1);
    loop {
        let due = match store.with_db(|db| store::due_purges(db, now_ms(), pace.batch, &owns)) {
            Ok(Ok(due)) => due,
            Ok(Err(e)) => {
                tracing::warn!(error.code = ?e.code, error = %e, "cannot read due purges; trying again");
                tokio::time::sleep(pace.interval).await;
                continue;
            }
            // Closed: shutting down.
            Err(_) => return,
        };
        for purges in due.chunks(chunk) {
            let mut writes = WriteSet::default();
            for purge in purges {
                store::apply_purge(&mut writes, purge);
            }
            match writer.commit(writes).await {
                Ok(Ok(())) => {
                    let now = now_ms();
                    let delay = metrics::histogram!(sluice_core::metrics::CLEANER_PURGE_DELAY);
                    for purge in purges {
                        delay.record(now.saturating_sub(purge.due_at_ms()) as f64 / 1000.0);
                    }
                    tracing::debug!(purged = purges.len(), "purged completed invocations");
                }
                // A failed write already failed the process's health.
                _ => return,
            }
        }
        // A full batch means a backlog: the next one goes at once.
        if due.len() < pace.batch {
            tokio::time::sleep(pace.interval).await;
        }
    }
}
