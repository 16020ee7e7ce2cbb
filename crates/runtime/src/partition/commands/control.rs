//! Control: an operator's cancel, kill, pause, resume, purge or purge-journal of one
//! invocation (the operations: `partition/model/operator.rs`). Killing or canceling reaches the
//! invocations it called too; stopping a running attempt leaves its slots held until that is
//! stored.

use super::super::live::Live;
use super::super::model::effect::Effect;
use super::super::model::operator::{Control, Controlled};
use super::super::task::Partition;
use sluice_core::errors::CodedError;
use sluice_core::ids::InvocationId;
use sluice_protocol::Message;
use sluice_protocol::proto::{self, notification_template};
use sluice_store::invocation::store;
use sluice_store::invocation::{Failure, Outcome, Status};
use sluice_store::storage::writer::WriteSet;

/// Built-in signal id of CANCEL.
const CANCEL_SIGNAL: u32 = 1;

impl Partition {
    pub(in super::super) fn control(
        &mut self,
        id: InvocationId,
        op: Control,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<Controlled, CodedError> {
        let now = self.outside.driver.now_ms();
        let children = if matches!(op, Control::Cancel | Control::Kill) {
            called_children(self, id)
        } else {
            Vec::new()
        };
        if !self.live.contains_key(&id) {
            return self.control_stored(id, op, writes);
        }
        let retention = self
            .live
            .get(&id)
            .map(|live| self.retention(&live.record().target));
        let (Some(live), Some(retention)) = (self.live.get_mut(&id), retention) else {
            return Ok(Controlled::NotFound);
        };
        let completed = live.record().status == Status::Completed;
        let answer = match op {
            Control::Purge if !completed => Controlled::Conflict(format!(
                "invocation {id} is not yet completed; cancel or kill it first, then purge"
            )),
            Control::Purge => {
                store::delete_invocation(writes, id);
                let entry = live.entry;
                self.live.remove(&id);
                self.entries.remove(entry);
                return Ok(Controlled::Done);
            }
            Control::PurgeJournal if !completed => Controlled::Conflict(format!(
                "invocation {id} is not yet completed; only a completed invocation's journal can be purged"
            )),
            Control::PurgeJournal => {
                // A retained result (idempotency key, workflow run) stays answerable: it is
                // the record's outcome, not the journal.
                store::delete_journal(writes, id);
                live.journal = Vec::new();
                return Ok(Controlled::Done);
            }
            _ if completed => Controlled::Conflict(format!(
                "invocation {id} is already completed; only purge and purge-journal apply to it"
            )),
            Control::Cancel => {
                // Cancellation reaches the children it waits on, too.
                for child in &children {
                    effects.push(Effect::Forward(*child, Control::Cancel));
                }
                let signal = Message::Signal(proto::NotificationTemplate {
                    id: Some(notification_template::Id::SignalId(CANCEL_SIGNAL)),
                    result: Some(notification_template::Result::Void(proto::Void {})),
                });
                signal_live(live, writes, signal, effects);
                Controlled::Accepted
            }
            Control::Kill => {
                // Children it called (not one-way sends) are killed with it.
                for child in &children {
                    effects.push(Effect::Forward(*child, Control::Kill));
                }
                kill(live, retention, now, writes, effects);
                Controlled::Done
            }
            Control::Pause => {
                let was_running = stop_attempt(live);
                live.set_status(Status::Paused);
                live.set_run_at(None);
                // A pause may last days: its journal rests once this is stored.
                self.journals_to_rest.push(id);
                if was_running {
                    Controlled::Accepted
                } else {
                    Controlled::Done
                }
            }
            Control::Resume => {
                resume(live, effects);
                Controlled::Done
            }
        };
        if matches!(answer, Controlled::Conflict(_)) {
            return Ok(answer);
        }
        store::put_record(writes, live.record())?;
        if live.run().queue().is_some() && op != Control::Cancel && op != Control::Resume {
            self.scheduler_forget(id);
        }
        effects.push(Effect::Settle(id));
        Ok(answer)
    }

    /// An operation on `id`, which is not in memory: completed (the store still knows it, and
    /// only purges apply to it), or unknown.
    fn control_stored(
        &self,
        id: InvocationId,
        op: Control,
        writes: &mut WriteSet,
    ) -> Result<Controlled, CodedError> {
        Ok(match self.stored(id)? {
            None => Controlled::NotFound,
            Some(_) if op == Control::Purge => {
                store::delete_invocation(writes, id);
                Controlled::Done
            }
            Some(_) if op == Control::PurgeJournal => {
                store::delete_journal(writes, id);
                Controlled::Done
            }
            Some(_) => Controlled::Conflict(format!(
                "invocation {id} is already completed; only purge and purge-journal apply to it"
            )),
        })
    }
}

/// Completes `live` as killed (409), its running attempt stopped.
fn kill(
    live: &mut Live,
    retention: super::super::ending::Retention,
    now: u64,
    writes: &mut WriteSet,
    effects: &mut Vec<Effect>,
) {
    stop_attempt(live);
    live.set_last_failure(None);
    super::super::ending::complete(
        live,
        Outcome::Failure(Failure {
            code: 409,
            message: "killed".into(),
        }),
        retention,
        now,
        writes,
        effects,
    );
}

/// Attempts a paused or backing-off `live` again now, its retries counted afresh; anything
/// else is left as it is.
fn resume(live: &mut Live, effects: &mut Vec<Effect>) {
    if live.record().status == Status::Paused || live.record().status == Status::BackingOff {
        let status = if live.started() {
            Status::Suspended
        } else {
            Status::Pending
        };
        live.set_status(status);
        live.set_run_at(None);
        live.set_retry_count(0);
        effects.push(Effect::Attempt(live.record().id));
    }
}

/// The invocations `id` called and that may still run (one-way sends are not its children).
fn called_children(partition: &Partition, id: InvocationId) -> Vec<InvocationId> {
    let Some(live) = partition.live.get(&id) else {
        return Vec::new();
    };
    if live.record().status == Status::Completed {
        return Vec::new();
    }
    super::super::model::calls::children_in(
        &partition.outside.registry,
        partition.outside.config.flow.inherit_scope,
        live.record(),
        &live.journal,
        partition.outside.driver.now_ms(),
    )
    .into_iter()
    .filter(|child| child.record.caller.is_some_and(|c| c.id == id))
    .map(|child| child.record.id)
    .collect()
}

/// Appends a signal; a waiting invocation is attempted again to see it.
fn signal_live(live: &mut Live, writes: &mut WriteSet, signal: Message, effects: &mut Vec<Effect>) {
    super::super::journal::append_signal(live, writes, signal.to_frame(false), effects);
    if !live.running() && live.record().status != Status::Paused {
        effects.push(Effect::Attempt(live.record().id));
    }
}

/// Stops the running attempt, if any (its later messages and ending are ignored); true if
/// there was one.
fn stop_attempt(live: &mut Live) -> bool {
    live.stop()
}
