//! Burst budgets at the counters: a counter whose rule has `burst_budget` over a static
//! concurrency runs up to `factor` times that concurrency while the time it has spent above
//! it in the current window (UTC calendar, as quotas) is under the budget; then its limit is
//! the concurrency again until the window ends. Nothing running is stopped: a counter that ran
//! out of budget while above its limit comes back to it as its calls end.
//!
//! The time above is counted at every change of the counter's usage, at every check of it (so
//! an admission never reads a stale limit) and in every snapshot: from when usage rose above
//! the concurrency to now, cut at the window's start. The ms spent are a windowed use like a
//! quota's ([`Measure::Burst`]): stored by the partition with what changed them, kept by name
//! while the counter is idle, and read back at recovery, so a restart or a leader change
//! neither hands out a fresh budget nor forgets what was spent.

use std::num::NonZeroU32;

use super::{CounterId, Limit, Limiter};
use crate::quota::Measure;

impl Limiter {
    /// Counts counter `id`'s time above its concurrency up to `now_ms` and puts the limit
    /// its burst budget allows now in force; nothing for a counter without one.
    pub(super) fn burst_tick(&mut self, id: CounterId, now_ms: u64) {
        let node = self.node_mut(id);
        let usage = node.usage;
        let Some(rare) = node.rare.as_deref_mut() else {
            return;
        };
        let Some(burst) = rare.burst.as_mut() else {
            return;
        };
        let window = &mut rare.windows[Measure::Burst as usize];
        let Some(budget) = window.limit else {
            return;
        };
        let before = window.used.used;
        window.used = window.used.at(&budget, now_ms);
        if let Some(since) = burst.above_since_ms {
            let from = since.max(window.used.window_start);
            window.used.used = window
                .used
                .used
                .saturating_add(now_ms.saturating_sub(from))
                .min(budget.amount.get());
        }
        burst.above_since_ms = (usage > burst.base).then_some(now_ms);
        let limit = if window.used.used < budget.amount.get() {
            burst.budget.raised(burst.base)
        } else {
            burst.base
        };
        let dirtied = window.used.used != before && !std::mem::replace(&mut window.dirty, true);
        node.limit = Limit::Concurrency(NonZeroU32::new(limit).unwrap_or(NonZeroU32::MIN));
        if dirtied {
            self.kept_mut(Measure::Burst).dirty.push(id);
        }
    }

    /// Whether counter `id` has a burst budget in force.
    pub(super) fn bursts(&self, id: CounterId) -> bool {
        self.node(id)
            .rare
            .as_deref()
            .is_some_and(|r| r.burst.is_some())
    }
}
