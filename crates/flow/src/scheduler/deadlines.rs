//! Deadlines on queued work: a new entry may carry its request's deadline, and the rules it
//! passes may bound its wait (`max_wait`); the earlier of the two is its deadline. Past it the
//! entry leaves its queue without ever starting and is reported by
//! [`Scheduler::take_expired`]. Among the entries of one queue without an object lock (so of
//! one priority), the earliest deadline goes first; entries without one go after, in arrival
//! order. An object's queue keeps arrival order: its calls run in the order they came.
//!
//! Only a deadline within the *horizon* of when the entry's wait began
//! (`flow.deadline-horizon`, 5 min) orders it: one further out (a client asking for the year
//! 2286 to jump its queue) waits in arrival order like an entry without one, and still
//! expires at its time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use hashbrown::HashMap;

use super::{EntryId, EntryKind, QueueId, QueueKey, Scheduler};
use crate::pattern::{Level, RulePattern};

/// What set an entry's deadline.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeadlineCause {
    /// The request's own (`x-request-deadline`, `grpc-timeout`).
    Request,
    /// A rule's `max_wait` at a counter the entry passes.
    Rule {
        /// The counter's level.
        level: Level,
        /// The rule.
        rule: Option<Arc<RulePattern>>,
    },
}

/// An entry's deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deadline {
    /// When, ms since the epoch.
    pub at: u64,
    /// What set it.
    pub cause: DeadlineCause,
}

/// An entry that waited past its deadline and left its queue, never started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// The entry.
    pub entry: EntryId,
    /// The queue it waited in.
    pub queue: QueueId,
    /// Its deadline.
    pub deadline: Deadline,
}

/// Entries that expired, by what set their deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredCount {
    /// The request's deadline, or a rule's `max_wait`.
    pub cause: DeadlineCause,
    /// Entries dropped since start.
    pub expired: u64,
}

#[derive(Debug, Default)]
pub(super) struct Deadlines {
    /// Waiting (or delayed) entries with a deadline, their queue, and whether the deadline
    /// orders them (it is within the horizon).
    by_entry: HashMap<EntryId, (Deadline, QueueId, bool)>,
    /// The same, earliest first; an entry that left keeps a stale item, skipped when it comes
    /// up.
    due: BinaryHeap<Reverse<(u64, EntryId)>>,
    expired: Vec<Expired>,
    counts: HashMap<DeadlineCause, u64>,
}

impl Deadlines {
    /// The deadline of a waiting entry.
    pub(super) fn of(&self, entry: EntryId) -> Option<u64> {
        self.by_entry.get(&entry).map(|(d, _, _)| d.at)
    }

    /// The deadline that orders a waiting entry in its queue, if one does.
    fn ordering(&self, entry: EntryId) -> Option<u64> {
        self.by_entry
            .get(&entry)
            .and_then(|(d, _, orders)| orders.then_some(d.at))
    }

    /// The entry left its queue (dispatched, removed): its deadline no longer counts.
    pub(super) fn forget(&mut self, entry: EntryId) {
        self.by_entry.remove(&entry);
    }

    /// The earliest deadline that may still be due.
    pub(super) fn next(&self) -> Option<u64> {
        self.due.peek().map(|Reverse((at, _))| *at)
    }

    /// `entry` expired: reported and counted.
    fn report(&mut self, entry: EntryId, deadline: Deadline, queue: QueueId) {
        *self.counts.entry(deadline.cause.clone()).or_default() += 1;
        self.expired.push(Expired {
            entry,
            queue,
            deadline,
        });
    }
}

impl Scheduler {
    /// Queues a new entry like [`Scheduler::enqueue`], with a deadline: the earlier of
    /// `request` (ms since the epoch) and `since` plus the tightest `max_wait` of the rules
    /// on its path. `since` is when its wait began (its arrival, or the end of its delay), so
    /// a restart that queues it again keeps the same deadline. `None` when a rule's `on_full`
    /// dropped it ([`Scheduler::take_crowded`] says why): it is in no queue.
    pub fn enqueue_with_deadline(
        &mut self,
        key: &QueueKey,
        entry: EntryId,
        run_at: Option<u64>,
        request: Option<u64>,
        since: u64,
        now: u64,
    ) -> Option<QueueId> {
        let q = self.queue_for(key, now);
        // A rule's `on_full` may drop the newcomer, or make room for it (`crowds.rs`).
        if self.book.crowds() && run_at.is_none() && !self.judge_arrival(q, entry, since, now) {
            self.forget_if_unused(q, now);
            return None;
        }
        let by_rule = if self.book.bounds_waits() {
            self.queue(q)
                .path
                .and_then(|path| self.limiter.max_wait(&path, &self.book))
                .map(|m| Deadline {
                    at: since.saturating_add(m.ms),
                    cause: DeadlineCause::Rule {
                        level: m.level,
                        rule: m.rule,
                    },
                })
        } else {
            None
        };
        let by_request = request.map(|at| Deadline {
            at,
            cause: DeadlineCause::Request,
        });
        let deadline = match (by_request, by_rule) {
            (Some(r), Some(b)) => Some(if b.at < r.at { b } else { r }),
            (r, b) => r.or(b),
        };
        if let Some(deadline) = deadline {
            let orders = deadline.at <= since.saturating_add(self.deadline_horizon_ms);
            self.deadlines.due.push(Reverse((deadline.at, entry)));
            self.deadlines.by_entry.insert(entry, (deadline, q, orders));
        }
        self.enqueue_into(q, entry, EntryKind::New, run_at, now);
        Some(q)
    }

    /// Entries that expired since the last call, never started; the caller fails them.
    pub fn take_expired(&mut self) -> Vec<Expired> {
        std::mem::take(&mut self.deadlines.expired)
    }

    /// Entries dropped past their deadline since start, by what set it.
    pub fn expired_counts(&self) -> Vec<ExpiredCount> {
        self.deadlines
            .counts
            .iter()
            .map(|(cause, n)| ExpiredCount {
                cause: cause.clone(),
                expired: *n,
            })
            .collect()
    }

    /// Takes every waiting entry whose deadline is due out of its queue. One still delayed
    /// expires when its delay ends ([`Scheduler::expire_if_due`]).
    pub(super) fn expire_due(&mut self, now: u64) {
        while let Some(&Reverse((at, entry))) = self.deadlines.due.peek() {
            if at > now {
                break;
            }
            self.deadlines.due.pop();
            let Some((deadline, q, _)) = self.deadlines.by_entry.get(&entry).cloned() else {
                continue;
            };
            // A stale item (the entry left and came back with another deadline), or an entry
            // still delayed: not now.
            if deadline.at == at && self.remove(q, entry, now) {
                self.deadlines.report(entry, deadline, q);
            }
        }
    }

    /// A delayed entry's time came: true (and reported) if its deadline passed meanwhile.
    pub(super) fn expire_if_due(&mut self, entry: EntryId, now: u64) -> bool {
        if self.deadlines.of(entry).is_none_or(|at| at > now) {
            return false;
        }
        let (deadline, q, _) = self
            .deadlines
            .by_entry
            .remove(&entry)
            .expect("checked present");
        self.deadlines.report(entry, deadline, q);
        true
    }

    /// Where a new entry with a deadline within the horizon goes among the queue's new
    /// entries: after every entry due no later, before the rest (entries without such a
    /// deadline count as due never).
    pub(super) fn edf_place(&self, q: QueueId, entry: EntryId) -> Option<usize> {
        let at = self.deadlines.ordering(entry)?;
        let queue = self.queue(q);
        if queue.lock.is_some() {
            return None;
        }
        let due = |e: &EntryId| self.deadlines.ordering(*e).unwrap_or(u64::MAX);
        Some(queue.new.partition_point(|e| due(e) <= at))
    }
}
