//! A full counter's `on_full` (`rules/on_full.rs`), judged when a new entry joins its queue.
//!
//! A counter whose rule has one keeps the new entries waiting under it (with when each
//! arrived and its queue) and the entries running on its slots: the few a decision may name.
//! Those lists hold what joined or started while the rule was in force; calls that waited or
//! ran before it took effect are counted (the counter's usage and queue) but never named.
//!
//! A decision only reads the counters; the scheduler then takes the entries it names out of
//! their queues and only then lists the newcomer ([`Limiter::crowd_join`]), so a replaced
//! entry never counts against the one replacing it. Which entries go is decided by arrival
//! time, not by the order entries joined, so a restart that queues the same entries again in
//! another order decides the same.

use std::sync::Arc;

use super::{CounterId, CounterPath, Limiter};
use crate::pattern::{Level, RulePattern};
use crate::rules::{OnFull, RuleBook};

/// When an entry arrived (its wait began, ms) and its id: older first, ties by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Arrival {
    /// Ms since the epoch.
    pub at_ms: u64,
    /// The entry.
    pub entry: u64,
}

/// The state of a counter whose rule has an `on_full`.
#[derive(Debug)]
pub(super) struct Crowd {
    policy: OnFull,
    /// New entries waiting under it, with their queues.
    waiting: Vec<(Arrival, u32)>,
    /// Entries running on its slots, and whether they were told to cancel.
    running: Vec<(u64, bool)>,
}

impl Crowd {
    /// Whether its `on_full` bounds what waits in place of `max_queued`'s refusal.
    pub(super) fn bounds_waiting(&self) -> bool {
        self.policy.bounds_waiting()
    }

    /// Takes the rule's `on_full`; the lists carry over while it has one.
    pub(super) fn set(crowd: &mut Option<Crowd>, policy: Option<OnFull>) {
        match (crowd.as_mut(), policy) {
            (_, None) => *crowd = None,
            (Some(c), Some(p)) => c.policy = p,
            (None, Some(policy)) => {
                *crowd = Some(Crowd {
                    policy,
                    waiting: Vec::new(),
                    running: Vec::new(),
                });
            }
        }
    }
}

/// The counter, rule and `on_full` that decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crowding {
    /// The counter's level.
    pub level: Level,
    /// The rule.
    pub rule: Option<Arc<RulePattern>>,
    /// Its `on_full`.
    pub policy: OnFull,
    /// The new entry that decided it.
    pub by: u64,
}

/// An entry a decision names, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The entry.
    pub entry: u64,
    /// Its queue (the scheduler's id; running entries: none).
    pub queue: Option<u32>,
    /// The decision.
    pub why: Crowding,
}

/// What a new entry's arrival decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The newcomer goes (never queued), and why.
    pub dropped: Option<Crowding>,
    /// Entries waiting, never started, that leave their queues: replaced by the newcomer, or
    /// dropped as the newest under `keep_oldest`.
    pub replaced: Vec<Named>,
    /// Entries running that are told to cancel.
    pub cancel: Vec<Named>,
}

impl Limiter {
    /// What the `on_full` rules on `path` decide for a new entry arriving as `arrival`; reads
    /// the counters only.
    pub fn crowd_verdict(
        &mut self,
        path: &CounterPath,
        book: &RuleBook,
        arrival: Arrival,
    ) -> Verdict {
        let mut verdict = Verdict::default();
        let mut decided = Vec::new();
        for &id in path.counters().iter().rev() {
            self.resolve(id, book);
            if let Some(at) = self.crowd_at(id, arrival) {
                decided.push(at);
            }
        }
        // A newcomer dropped anywhere replaces nothing anywhere.
        if let Some(dropped) = decided.iter().find_map(|d| d.dropped.clone()) {
            verdict.dropped = Some(dropped);
            return verdict;
        }
        for d in decided {
            for named in d.replaced {
                if !verdict.replaced.iter().any(|n| n.entry == named.entry) {
                    verdict.replaced.push(named);
                }
            }
            for named in d.cancel {
                if !verdict.cancel.iter().any(|n| n.entry == named.entry) {
                    verdict.cancel.push(named);
                }
            }
        }
        // Told once: a second newcomer does not cancel them again.
        for named in &verdict.cancel {
            for &id in path.counters() {
                if let Some(crowd) = self.crowd_mut(id)
                    && let Some(run) = crowd.running.iter_mut().find(|r| r.0 == named.entry)
                {
                    run.1 = true;
                }
            }
        }
        verdict
    }

    /// The decision of counter `id` alone.
    fn crowd_at(&self, id: CounterId, arrival: Arrival) -> Option<Verdict> {
        let node = self.node(id);
        let bounds = node.bounds.as_deref()?;
        let crowd = bounds.crowd.as_ref()?;
        let limit = node.limit.concurrency()?;
        let full = node.usage.saturating_add(node.queued) >= limit;
        let why = Crowding {
            level: node.level,
            rule: node.rule.clone(),
            policy: crowd.policy,
            by: arrival.entry,
        };
        let named = |(arrival, queue): (Arrival, u32)| Named {
            entry: arrival.entry,
            queue: Some(queue),
            why: why.clone(),
        };
        let bound = bounds.max_queued.map_or(1, |m| m.get() as usize);
        let mut verdict = Verdict::default();
        match crowd.policy {
            OnFull::DropNew if full => verdict.dropped = Some(why.clone()),
            OnFull::DropNew => {}
            OnFull::KeepOldest | OnFull::KeepNewest if crowd.waiting.len() >= bound => {
                let mut all = crowd.waiting.clone();
                all.push((arrival, u32::MAX));
                all.sort_unstable();
                let over = all.len() - bound;
                let going: Vec<(Arrival, u32)> = if crowd.policy == OnFull::KeepOldest {
                    all.split_off(all.len() - over)
                } else {
                    all.truncate(over);
                    all
                };
                if going.iter().any(|(a, _)| *a == arrival) {
                    verdict.dropped = Some(why.clone());
                } else {
                    verdict.replaced = going.into_iter().map(named).collect();
                }
            }
            OnFull::KeepOldest | OnFull::KeepNewest => {}
            OnFull::CancelRunning if full => {
                verdict.replaced = crowd.waiting.iter().copied().map(named).collect();
                verdict.cancel = crowd
                    .running
                    .iter()
                    .filter(|(_, told)| !told)
                    .map(|(entry, _)| Named {
                        entry: *entry,
                        queue: None,
                        why: why.clone(),
                    })
                    .collect();
            }
            OnFull::CancelRunning => {}
        }
        Some(verdict)
    }

    /// A new entry joined its queue (number `queue`) on `path`: the counters with an
    /// `on_full` list it.
    pub fn crowd_join(&mut self, path: &CounterPath, arrival: Arrival, queue: u32) {
        for &id in path.counters() {
            if let Some(crowd) = self.crowd_mut(id) {
                crowd.waiting.push((arrival, queue));
            }
        }
    }

    /// `entry` left its queue on `path` (started, removed, expired).
    pub fn crowd_left(&mut self, path: &CounterPath, entry: u64) {
        for &id in path.counters() {
            if let Some(crowd) = self.crowd_mut(id) {
                crowd.waiting.retain(|(a, _)| a.entry != entry);
            }
        }
    }

    /// `entry` took a slot at every counter of `path` (`true`) or gave it back (`false`).
    pub fn crowd_running(&mut self, path: &CounterPath, entry: u64, running: bool) {
        for &id in path.counters() {
            if let Some(crowd) = self.crowd_mut(id) {
                if running {
                    crowd.running.push((entry, false));
                } else {
                    crowd.running.retain(|(e, _)| *e != entry);
                }
            }
        }
    }

    fn crowd_mut(&mut self, id: CounterId) -> Option<&mut Crowd> {
        self.node_mut(id).bounds.as_deref_mut()?.crowd.as_mut()
    }
}
