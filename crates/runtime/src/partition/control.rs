//! Operator control of one invocation: cancel (a CANCEL signal the handler sees as a terminal
//! 409 "canceled"), kill (ends it now with 409 "killed"), purge (forgets a completed one),
//! pause (no more attempts until resumed), resume, and purge-journal (drops a completed one's
//! journal and keeps its record and result).

use super::{Effect, Live, Partition};
use crate::errors::CodedError;
use crate::ids::InvocationId;
use crate::invocation::store;
use crate::invocation::{Failure, Outcome, Status};
use crate::protocol::Message;
use crate::protocol::proto::{self, notification_template};
use crate::storage::writer::WriteSet;

/// What the operator asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Append the CANCEL signal.
    Cancel,
    /// End it now.
    Kill,
    /// Forget a completed invocation.
    Purge,
    /// Drop a completed invocation's journal; keep its record and result.
    PurgeJournal,
    /// Stop attempting it.
    Pause,
    /// Attempt it again.
    Resume,
}

impl Control {
    /// Parses the operation's name as it appears in paths and `?mode=`.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "cancel" => Self::Cancel,
            "kill" => Self::Kill,
            "purge" => Self::Purge,
            "purge-journal" => Self::PurgeJournal,
            "pause" => Self::Pause,
            "resume" => Self::Resume,
            _ => return None,
        })
    }
}

/// How a control request went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Controlled {
    /// Done (200).
    Done,
    /// Under way (202): the signal is appended, or a running attempt is being stopped.
    Accepted,
    /// No such invocation (404).
    NotFound,
    /// Not possible in its state (409), and why.
    Conflict(String),
}

/// Built-in signal id of CANCEL.
const CANCEL_SIGNAL: u32 = 1;

impl Partition {
    pub(super) fn control(
        &mut self,
        id: InvocationId,
        op: Control,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<Controlled, CodedError> {
        let now = self.driver.now_ms();
        let children = if matches!(op, Control::Cancel | Control::Kill) {
            called_children(self, id)
        } else {
            Vec::new()
        };
        if !self.live.contains_key(&id) {
            // Completed invocations leave memory; the store still knows them.
            return Ok(match self.stored(id)? {
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
            });
        }
        let retention = self
            .live
            .get(&id)
            .map(|live| self.retention(&live.record.target));
        let (Some(live), Some(retention)) = (self.live.get_mut(&id), retention) else {
            return Ok(Controlled::NotFound);
        };
        let completed = live.record.status == Status::Completed;
        let answer = match op {
            Control::Purge if !completed => Controlled::Conflict(format!(
                "invocation {id} is not yet completed; cancel or kill it first, then purge"
            )),
            Control::Purge => {
                store::delete_invocation(writes, id);
                let entry = live.entry;
                self.live.remove(&id);
                self.entries.remove(&entry);
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
                stop_attempt(live);
                live.record.last_failure = None;
                super::ending::complete(
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
                Controlled::Done
            }
            Control::Pause => {
                let was_running = stop_attempt(live);
                live.record.status = Status::Paused;
                live.record.run_at_ms = None;
                if was_running {
                    Controlled::Accepted
                } else {
                    Controlled::Done
                }
            }
            Control::Resume => {
                if live.record.status == Status::Paused || live.record.status == Status::BackingOff
                {
                    live.record.status = if live.started() {
                        Status::Suspended
                    } else {
                        Status::Pending
                    };
                    live.record.run_at_ms = None;
                    live.record.retry_count = 0;
                    effects.push(Effect::Attempt(id));
                }
                Controlled::Done
            }
        };
        if matches!(answer, Controlled::Conflict(_)) {
            return Ok(answer);
        }
        store::put_record(writes, &live.record)?;
        let queued = live.queued;
        if queued && op != Control::Cancel && op != Control::Resume {
            live.queued = false;
            self.scheduler_forget(id);
        }
        effects.push(Effect::Settle(id));
        Ok(answer)
    }
}

/// The invocations `id` called and that may still run (one-way sends are not its children).
fn called_children(partition: &Partition, id: InvocationId) -> Vec<InvocationId> {
    let Some(live) = partition.live.get(&id) else {
        return Vec::new();
    };
    if live.record.status == Status::Completed {
        return Vec::new();
    }
    let flow_control = partition.config.flow_control_enabled();
    super::calls::children_in(
        &partition.registry,
        flow_control,
        &live.record,
        &live.journal,
        partition.driver.now_ms(),
    )
    .into_iter()
    .filter(|child| child.record.caller.is_some_and(|c| c.id == id))
    .map(|child| child.record.id)
    .collect()
}

/// Appends a signal; a waiting invocation is attempted again to see it.
fn signal_live(live: &mut Live, writes: &mut WriteSet, signal: Message, effects: &mut Vec<Effect>) {
    super::journal::append_signal(live, writes, signal.to_frame(false), effects);
    if !live.running && live.record.status != Status::Paused {
        effects.push(Effect::Attempt(live.record.id));
    }
}

/// Stops the running attempt, if any (its later messages and ending are ignored); true if
/// there was one.
fn stop_attempt(live: &mut Live) -> bool {
    let was = live.running;
    live.running = false;
    live.outbound = None;
    live.fresh.clear();
    live.violation = None;
    was
}
