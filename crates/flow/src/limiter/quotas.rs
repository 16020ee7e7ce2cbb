//! Quotas at the counters: what each used in its window outlives the counter (kept by name
//! until the window ends), is handed to the partition to store after each admission, comes
//! back from the store at recovery, and is reset by an operator.

use std::num::{NonZeroU32, NonZeroU64};

use super::{CounterId, CounterSnapshot, Level, Limit, Limiter, MAX_WEIGHT, RuleBook, RulePattern};
use crate::quota::{Quota, QuotaUse};

/// What few counters need, boxed so a node stays three cache lines: its quota and what it used
/// (kept after its rule drops the quota: a quota put back in the same window goes on from
/// there), and its refusals and waits (`tally.rs`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rare {
    /// Its rule's quota now.
    pub(super) quota: Option<Quota>,
    /// What it used in its window.
    pub(super) used: QuotaUse,
    /// `used` changed since the partition last took the writes.
    pub(super) dirty: bool,
    /// New invocations it refused.
    pub(super) refused: u64,
    /// How long the new invocations it admitted waited.
    pub(super) waits: super::WaitHistogram,
}

impl Rare {
    pub(super) fn new(quota: Option<Quota>) -> Self {
        Self {
            quota,
            ..Self::default()
        }
    }
}

impl Limiter {
    /// The rare state of counter `id`, made when it has none.
    pub(super) fn rare(&mut self, id: CounterId) -> &mut Rare {
        self.node_mut(id).rare.get_or_insert_with(Box::default)
    }
}

impl Limiter {
    /// A counter's name for its quota: `scope[/l1[/l2]]` (no name holds a `/`).
    pub(super) fn quota_key(&self, id: CounterId) -> String {
        self.names(id)
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("/")
    }

    /// Keeps the quota use of counter `id`, about to go, until its window ends; a change not
    /// taken yet is stored by name.
    pub(super) fn keep_quota(&mut self, id: CounterId) {
        let key = self.quota_key(id);
        let state = self.rare(id);
        let used = state.used;
        if state.dirty {
            state.dirty = false;
            self.quota_reset.push((key.clone(), used));
        }
        self.keep(key, used);
        // Now and then, forget the uses whose window ended.
        if self.quota_kept.len() >= (self.quota_swept * 2).max(1024) {
            self.sweep_kept_quotas();
        }
    }

    /// Keeps the use of the idle counter `key` until its window ends.
    fn keep(&mut self, key: String, used: QuotaUse) {
        self.quota_next_end = self.quota_next_end.min(used.window_end);
        self.quota_kept.insert(key, used);
    }

    /// Forgets the kept uses whose window ended, in the store too (a use of 0 is deleted
    /// there), and notes when the next one ends.
    fn sweep_kept_quotas(&mut self) {
        let now = self.now_ms;
        let mut next_end = u64::MAX;
        let gone = &mut self.quota_reset;
        self.quota_kept.retain(|key, used| {
            if used.window_end > now {
                next_end = next_end.min(used.window_end);
                true
            } else {
                gone.push((key.clone(), QuotaUse { used: 0, ..*used }));
                false
            }
        });
        self.quota_swept = self.quota_kept.len();
        self.quota_next_end = next_end;
    }

    /// Bounds the idle counters whose quota use is kept to `max` (see
    /// [`RefusalReason::IdleQuotasFull`]).
    pub fn set_idle_quota_cap(&mut self, max: usize) {
        self.quota_kept_cap = Some(max);
    }

    /// Whether a new entry at counter `id` must be refused because it would start a quota use
    /// the partition could not keep once the counter goes idle: it has a quota, nothing used
    /// in this window, and the kept uses are at their bound even after forgetting the ended
    /// windows. Answers the bound and when a kept window ends next.
    pub(super) fn idle_quotas_full(&mut self, id: CounterId, now_ms: u64) -> Option<(usize, u64)> {
        let max = self.quota_kept_cap?;
        let node = self.node(id);
        if !node.has_quota || self.quota_kept.len() < max {
            return None;
        }
        let fresh = node
            .rare
            .as_deref()
            .and_then(|r| r.quota.map(|q| r.used.at(&q, now_ms).used == 0))
            .unwrap_or(true);
        if !fresh {
            return None;
        }
        if self.quota_next_end <= now_ms {
            self.sweep_kept_quotas();
        }
        (self.quota_kept.len() >= max).then_some((max, self.quota_next_end))
    }

    /// A counter just made takes back the quota use kept under its name.
    pub(super) fn restore_kept_quota(&mut self, id: CounterId) {
        let key = self.quota_key(id);
        if let Some(used) = self.quota_kept.remove(&key) {
            self.rare(id).used = used;
        }
    }

    /// At recovery: what counter `key` (`scope[/l1[/l2]]`) used of its quota, from the store.
    /// A window that ended by `now_ms` is ignored (false).
    pub fn restore_quota(&mut self, key: String, used: QuotaUse, now_ms: u64) -> bool {
        if used.window_end <= now_ms {
            return false;
        }
        self.keep(key, used);
        true
    }

    /// The quota uses changed since the last call, by counter name, to store.
    pub fn take_quota_writes(&mut self) -> Vec<(String, QuotaUse)> {
        let mut out = std::mem::take(&mut self.quota_reset);
        for id in std::mem::take(&mut self.quota_dirty) {
            let live = self
                .nodes
                .get(id.0 as usize)
                .and_then(Option::as_ref)
                .and_then(|n| n.rare.as_deref())
                .is_some_and(|q| q.dirty);
            if live {
                let state = self.rare(id);
                state.dirty = false;
                let used = state.used;
                out.push((self.quota_key(id), used));
            }
        }
        out
    }

    /// What [`Limiter::reset_quota`] would store: each counter `pattern` matches that used
    /// something, with its use at 0.
    pub fn quota_reset_plan(&self, pattern: &RulePattern) -> Vec<(String, QuotaUse)> {
        let live = self.index.values().filter_map(|&id| {
            let used = self.node(id).quota_used();
            let key = self.quota_key(id);
            (used.used > 0 && matches(pattern, &key)).then_some((key, QuotaUse { used: 0, ..used }))
        });
        let kept = self
            .quota_kept
            .iter()
            .filter(|(key, used)| used.used > 0 && matches(pattern, key))
            .map(|(key, used)| (key.clone(), QuotaUse { used: 0, ..*used }));
        live.chain(kept).collect()
    }

    /// An operator resets the quota of every counter `pattern` matches at its level (live or
    /// kept): their use in the current window starts again from 0. Answers how many were
    /// reset.
    pub fn reset_quota(&mut self, pattern: &RulePattern) -> usize {
        let mut reset = 0;
        let ids: Vec<CounterId> = self.index.values().copied().collect();
        for id in ids {
            if self.node(id).quota_used().used == 0 || !matches(pattern, &self.quota_key(id)) {
                continue;
            }
            let state = self.rare(id);
            state.used.used = 0;
            if !state.dirty {
                state.dirty = true;
                self.quota_dirty.push(id);
            }
            reset += 1;
        }
        for (key, used) in self
            .quota_kept
            .iter_mut()
            .filter(|(key, used)| used.used > 0 && matches(pattern, key))
        {
            used.used = 0;
            self.quota_reset.push((key.clone(), *used));
            reset += 1;
        }
        reset
    }
}

impl Limiter {
    /// Counters that are gone while nothing runs or waits under them, but whose quota use is
    /// kept for their window: shown idle with what they used, so an operator sees a tenant's
    /// quota between its calls as the next call will find it.
    pub(super) fn idle_quota_counters(&self, book: &RuleBook, out: &mut Vec<CounterSnapshot>) {
        let now = self.now_ms;
        for (key, kept) in &self.quota_kept {
            let (level, scope, l1, l2) = key_names(key);
            let resolved = book.resolve(level, scope, l1, l2);
            let Some(quota) = resolved.quota else {
                continue;
            };
            let used = kept.at(&quota, now);
            if used.used == 0 {
                continue;
            }
            // As a counter made now would be: an adaptive limit starts at its least.
            let adaptive = resolved.adaptive_in_force();
            let limit = adaptive.map_or(resolved.limit, |a| Limit::Concurrency(a.min));
            out.push(CounterSnapshot {
                level,
                scope: scope.to_owned(),
                l1: l1.map(str::to_owned),
                l2: l2.map(str::to_owned),
                usage: 0,
                limit,
                rule: resolved.pattern,
                available: limit.available(0),
                waiters: 0,
                queued: 0,
                max_queued: resolved.max_queued.map(NonZeroU32::get),
                max_wait_ms: resolved.max_wait_ms.map(NonZeroU64::get),
                adaptive: adaptive.map(|a| (a.min.get(), a.max.get())),
                guaranteed: resolved.guaranteed.map(NonZeroU32::get),
                quota: Some((quota, used)),
                // A counter goes only once its bucket is full again.
                tokens: resolved.rate.map(|rate| rate.burst.get()),
                rate: resolved.rate,
                next_token_ms: None,
                weight: resolved.weight.get().min(MAX_WEIGHT),
                shadow: None,
            });
        }
    }
}

/// The level and names of the counter a quota key names (`scope[/l1[/l2]]`).
fn key_names(key: &str) -> (Level, &str, Option<&str>, Option<&str>) {
    let mut names = key.split('/');
    let scope = names.next().unwrap_or_default();
    let (l1, l2) = (names.next(), names.next());
    let level = Level::ALL[usize::from(l1.is_some()) + usize::from(l2.is_some())];
    (level, scope, l1, l2)
}

/// Whether `pattern` names the counter `key` (`scope[/l1[/l2]]`) at its level.
fn matches(pattern: &RulePattern, key: &str) -> bool {
    let (level, scope, l1, l2) = key_names(key);
    pattern.level() == level && pattern.matches(scope, l1, l2)
}
