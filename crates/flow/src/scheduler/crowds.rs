//! `on_full` at the scheduler: a new entry about to join its queue is judged by the counters
//! of its path (`limiter/crowd.rs`). What the decision names leaves its queue here; the
//! caller learns it from [`Scheduler::take_crowded`] and ends those invocations (a dropped or
//! replaced one completes, never run; a running one is told to cancel).

use super::{EntryId, QueueId, Scheduler, State};
use crate::limiter::{Arrival, Crowding};
use crate::rules::OnFull;

/// An entry an `on_full` decision named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrowdedOut {
    /// The entry.
    pub entry: EntryId,
    /// What it gets.
    pub fate: Fate,
    /// The counter, rule and newcomer that decided.
    pub why: Crowding,
}

/// What an entry named by an `on_full` gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// It never runs: it was the one too many (`drop_new`, or the newest under `keep_oldest`).
    Dropped,
    /// It never runs: a newer call took its place (`keep_newest`, `cancel_running`).
    Replaced,
    /// It runs and is told to cancel (`cancel_running`).
    Cancel,
}

impl Scheduler {
    /// Judges new entry `entry`, arriving at `since` into queue `q`: the entries the counters'
    /// `on_full` name leave their queues (listed for [`Scheduler::take_crowded`]); `false` when
    /// the newcomer itself goes, and must not be queued.
    pub(super) fn judge_arrival(
        &mut self,
        q: QueueId,
        entry: EntryId,
        since: u64,
        now: u64,
    ) -> bool {
        let Some(path) = self.queue(q).path else {
            return true;
        };
        let arrival = Arrival {
            at_ms: since,
            entry,
        };
        let verdict = self.limiter.crowd_verdict(&path, &self.book, arrival);
        if let Some(why) = verdict.dropped {
            self.crowded.push(CrowdedOut {
                entry,
                fate: Fate::Dropped,
                why,
            });
            return false;
        }
        for named in verdict.replaced {
            let Some(queue) = named.queue else { continue };
            if self.remove(QueueId(queue), named.entry, now) {
                let fate = match named.why.policy {
                    OnFull::KeepOldest => Fate::Dropped,
                    _ => Fate::Replaced,
                };
                self.crowded.push(CrowdedOut {
                    entry: named.entry,
                    fate,
                    why: named.why,
                });
            }
        }
        for named in verdict.cancel {
            self.crowded.push(CrowdedOut {
                entry: named.entry,
                fate: Fate::Cancel,
                why: named.why,
            });
        }
        self.limiter.crowd_join(&path, arrival, q.0);
        true
    }

    /// A queue made for a newcomer that was dropped: gone again if nothing else holds it.
    pub(super) fn forget_if_unused(&mut self, q: QueueId, now: u64) {
        let queue = self.queue(q);
        if queue.len() == 0 && queue.delayed == 0 && queue.state == State::Idle {
            self.go_idle(q, now);
        }
    }

    /// What `on_full` decisions named since the last call.
    pub fn take_crowded(&mut self) -> Vec<CrowdedOut> {
        std::mem::take(&mut self.crowded)
    }
}
