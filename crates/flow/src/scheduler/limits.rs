//! The scheduler's side of the user limits: a new rule book, counters and quotas, as the
//! limiter keeps them.

use std::sync::Arc;

use super::{Permit, QueueKey, Scheduler};
use crate::ReadView;
use crate::limiter::{CounterPage, CounterSnapshot, Reserved};
use crate::quota::{Measure, QuotaUse};
use crate::rules::RuleBook;

impl Scheduler {
    /// A new rule book: counters re-resolve lazily; waiters that now fit are woken.
    pub fn on_rules_changed(&mut self, book: Arc<RuleBook>, now: u64) {
        self.book = book;
        self.limiter.on_rules_changed(&self.book, &mut self.woken);
        self.wake_pending(now);
    }

    /// Every live counter with usage, limit, availability and waiters.
    pub fn counters(&mut self, now: u64) -> Vec<CounterSnapshot> {
        self.limiter.snapshot(&self.book, now)
    }

    /// The counters `view` asks for (see [`Limiter::view`]).
    pub fn counter_view(&mut self, now: u64, view: &ReadView) -> CounterPage {
        self.limiter.view(&self.book, now, view)
    }

    /// The counters summed by rule and level (see [`Limiter::sums`]).
    pub fn flow_sums(&mut self, now: u64) -> crate::limiter::FlowSums {
        self.limiter.sums(&self.book, now)
    }

    /// Counts how long the new entry a permit was given for waited before it started, at the
    /// counters it holds (see [`Limiter::record_wait`]).
    pub fn record_wait(&mut self, permit: &Permit, ms: u64) {
        if let Some(counters) = &permit.counters {
            self.limiter.record_wait(counters.path(), ms);
        }
    }

    /// Quota (or budget) uses changed since the last call, to store (see
    /// [`Limiter::take_use_writes`]).
    pub fn take_use_writes(&mut self, m: Measure) -> Vec<(String, QuotaUse)> {
        self.limiter.take_use_writes(m)
    }

    /// At recovery: a counter's stored quota or budget use (see [`Limiter::restore_use`]).
    pub fn restore_use(&mut self, m: Measure, key: String, used: QuotaUse, now: u64) -> bool {
        self.limiter.restore_use(m, key, used, now)
    }

    /// What resetting the quotas (or budgets) `pattern` matches would store (see
    /// [`Limiter::reset_plan`]).
    pub fn reset_plan(&self, m: Measure, pattern: &crate::RulePattern) -> Vec<(String, QuotaUse)> {
        self.limiter.reset_plan(m, pattern)
    }

    /// A call under `key` ended having spent `cost`: charged to the budgets of its counters,
    /// and what it held `reserved` is given back (see [`Limiter::charge`]). A call under no
    /// scope touches no counter.
    pub fn charge(&mut self, key: &QueueKey, cost: u64, reserved: Option<&Reserved>, now: u64) {
        // A waiter held by a reservation given back is woken at the next poll (its counter's
        // token wake is due now).
        self.on_path(key, |limiter, path, book| {
            limiter.charge(path, book, cost, reserved, now);
        });
    }

    /// Takes back a charge whose write was dropped (see [`Limiter::uncharge`]).
    pub fn uncharge(&mut self, key: &QueueKey, cost: u64, now: u64) {
        self.on_path(key, |limiter, path, book| {
            limiter.uncharge(path, book, cost, now);
        });
    }

    /// At recovery: a call that ran before takes its reservations of the budgets under `key`
    /// again (see [`Limiter::reserve`]).
    pub fn reserve(&mut self, key: &QueueKey) -> Option<Box<Reserved>> {
        self.on_path(key, |limiter, path, book| limiter.reserve(path, book))
            .flatten()
    }

    /// Resets the quotas (or budgets) `pattern` matches (see [`Limiter::reset_uses`]); queues
    /// waiting for the next window look again at once.
    pub fn reset_uses(&mut self, m: Measure, pattern: &crate::RulePattern, now: u64) -> usize {
        let reset = self.limiter.reset_uses(m, pattern);
        if reset > 0 {
            let book = Arc::clone(&self.book);
            self.on_rules_changed(book, now);
        }
        reset
    }

    /// Admissions since start by rule and level (see [`Limiter::admissions`]).
    pub fn admissions(&self) -> Vec<crate::limiter::RuleAdmissions> {
        self.limiter.admissions()
    }
}
