//! Bulk cancel (`model/bulk.rs`): the candidates a filter may name, listed from memory alone,
//! and one batch of them canceled. An invocation that never started (queued, behind its
//! object's lock, or a delayed send) completes at once with 409 `FLO0006`, never run; one that
//! started and waits (suspended) gets the cancel signal, as a single cancel gives it, and ends
//! as its handler decides.

use std::collections::HashMap;

use super::super::model::bulk::{Batch, CancelFilter, Cancelled};
use super::super::model::effect::Effect;
use super::super::model::operator::Control;
use super::super::task::Partition;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_store::invocation::{InvocationRecord, Status};
use sluice_store::storage::writer::WriteSet;

impl Partition {
    /// The invocations `filter` may name, from what memory says: those at rest by their queue
    /// (or as delayed sends), those live by their records. A batch checks each one whole.
    pub(in super::super) fn cancel_candidates(&self, filter: &CancelFilter) -> Batch {
        let mut ids = Vec::new();
        // One look per queue, however many of its entries rest.
        let mut queues = HashMap::new();
        for (id, dormant) in self.resting.iter() {
            let may = match dormant.queue() {
                Some(queue) => *queues.entry(queue).or_insert_with(|| {
                    self.admission
                        .scheduler
                        .queue_key(queue.index())
                        .is_some_and(|key| filter.names_queue(&key))
                }),
                None => filter.scheduled,
            };
            if may {
                ids.push(*id);
            }
        }
        ids.extend(
            self.live
                .iter()
                .filter(|(_, live)| filter.names(live.record()))
                .map(|(id, _)| *id),
        );
        ids
    }

    /// Cancels those of `batch` that `filter` names now (`dry_run`: counts them only).
    pub(in super::super) fn cancel_batch(
        &mut self,
        filter: &CancelFilter,
        batch: Batch,
        dry_run: bool,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<Cancelled, CodedError> {
        let mut done = Cancelled::default();
        for id in batch {
            if dry_run {
                if self.record_now(id)?.is_some_and(|r| filter.names(&r)) {
                    done.named += 1;
                }
                continue;
            }
            self.rouse(id);
            self.observe();
            let Some(live) = self.live.get(&id) else {
                continue;
            };
            if !filter.names(live.record()) {
                continue;
            }
            done.named += 1;
            if live.started() || live.record().status == Status::Suspended {
                self.wake_journal(id)?;
                if let Some(live) = self.live.get_mut(&id)
                    && live.unsaved
                {
                    super::super::journal::save(live, writes)?;
                }
                self.control(id, Control::Cancel, writes, effects)?;
            } else {
                self.cancel_unstarted(id, writes, effects)?;
            }
            done.cancelled += 1;
        }
        Ok(done)
    }

    /// `id`'s record as it is now, without waking it: in memory, or read from the store for one
    /// at rest; `None` when it is neither.
    fn record_now(&self, id: InvocationId) -> Result<Option<InvocationRecord>, CodedError> {
        if let Some(live) = self.live.get(&id) {
            return Ok(Some(live.record().clone()));
        }
        if !self.resting.contains(&id) {
            return Ok(None);
        }
        self.stored(id)
    }

    /// Completes `id`, which never started, as canceled: out of its queue, its callers and
    /// waiters answered 409 `FLO0006`.
    fn cancel_unstarted(
        &mut self,
        id: InvocationId,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        self.scheduler_forget(id);
        let now = self.outside.driver.now_ms();
        let Some(retention) = self
            .live
            .get(&id)
            .map(|live| self.retention(&live.record().target))
        else {
            return Ok(());
        };
        let live = self.live.get_mut(&id).expect("checked live");
        if live.unsaved {
            super::super::journal::save(live, writes)?;
        }
        let error = CodedError::new(
            Code::FLO0006,
            "an operator's bulk cancel canceled the invocation before it started",
        );
        super::super::ending::fail_unstarted(live, 409, &error, retention, now, writes, effects)
    }
}
