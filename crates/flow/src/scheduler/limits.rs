//! The scheduler's side of the user limits: a new rule book, counters and quotas, as the
//! limiter keeps them.

use std::sync::Arc;

use super::{Permit, Scheduler};
use crate::limiter::CounterSnapshot;
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

    /// Counts how long the new entry a permit was given for waited before it started, at the
    /// counters it holds (see [`Limiter::record_wait`]).
    pub fn record_wait(&mut self, permit: &Permit, ms: u64) {
        if let Some(counters) = &permit.counters {
            self.limiter.record_wait(counters.path(), ms);
        }
    }

    /// Quota uses changed since the last call, to store (see [`Limiter::take_quota_writes`]).
    pub fn take_quota_writes(&mut self) -> Vec<(String, crate::quota::QuotaUse)> {
        self.limiter.take_quota_writes()
    }

    /// At recovery: a counter's stored quota use (see [`Limiter::restore_quota`]).
    pub fn restore_quota(&mut self, key: String, used: crate::quota::QuotaUse, now: u64) -> bool {
        self.limiter.restore_quota(key, used, now)
    }

    /// What resetting the quotas `pattern` matches would store (see
    /// [`Limiter::quota_reset_plan`]).
    pub fn quota_reset_plan(
        &self,
        pattern: &crate::RulePattern,
    ) -> Vec<(String, crate::quota::QuotaUse)> {
        self.limiter.quota_reset_plan(pattern)
    }

    /// Resets the quotas `pattern` matches (see [`Limiter::reset_quota`]); queues waiting for
    /// the next window look again at once.
    pub fn reset_quota(&mut self, pattern: &crate::RulePattern, now: u64) -> usize {
        let reset = self.limiter.reset_quota(pattern);
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
