//! Quotas and budgets at the counters: what each used in its window (admissions for a quota,
//! reported cost for a budget) outlives the counter (kept by name until the window ends), is
//! handed to the partition to store (after each admission for a quota, with each call's end
//! for a budget), comes back from the store at recovery, and is reset by an operator. A
//! budget's reservations (`reserve`) are held in memory only: a restart takes them again for
//! the calls it resumes.

use std::num::{NonZeroU32, NonZeroU64};

use hashbrown::HashMap;

use super::{
    CounterControls, CounterId, CounterPath, CounterSnapshot, Level, Limit, Limiter, MAX_WEIGHT,
};
use super::{RuleBook, RulePattern};
use crate::quota::{Measure, Quota, QuotaUse};

/// What few counters need, boxed so a node stays three cache lines: its quota and budget with
/// what it used of each (kept after its rule drops them: put back in the same window, they go
/// on from there), the budget reservations of the calls running under it, and its refusals
/// and waits (`tally.rs`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rare {
    /// By [`Measure`]: the quota, the budget, then the burst budget (ms above the limit).
    pub(super) windows: [Window; 3],
    /// The burst budget's factor and the limit it raises, while its rule has one.
    pub(super) burst: Option<Burst>,
    /// What the calls running under it hold reserved of its budget.
    pub(super) reserved: u64,
    /// New invocations it refused.
    pub(super) refused: u64,
    /// Cost charged to its budget since it was made (metrics).
    pub(super) charged: u64,
    /// Cost reported past what one call may charge to its budget ([`Window::most_one_call`]),
    /// cut from the charges since it was made (metrics, `sys_user_limits`).
    pub(super) overrun: u64,
    /// How long the new invocations it admitted waited.
    pub(super) waits: super::WaitHistogram,
}

/// A counter's burst budget in force: its rule's factor, the limit it raises (the rule's
/// concurrency), and since when the counter has run above that limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Burst {
    pub(super) budget: crate::quota::BurstBudget,
    pub(super) base: u32,
    pub(super) above_since_ms: Option<u64>,
}

/// A quota or a budget at a counter.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Window {
    /// Its rule's amount per window now (a budget's as a quota).
    pub(super) limit: Option<Quota>,
    /// What a new call reserves of a budget (0: nothing).
    pub(super) reserve: u64,
    /// What it used in its window.
    pub(super) used: QuotaUse,
    /// `used` changed since the partition last took the writes.
    pub(super) dirty: bool,
}

impl Window {
    /// The most one call may charge to a budget of `budget` a window: its `reserve` when the
    /// rule has one (what a call is expected to spend), else the whole budget. A report over
    /// it (a handler's bug, or a caller feeding it 2^64-1) cannot spend a tenant's window
    /// beyond what one call could.
    pub(super) fn most_one_call(&self, budget: &Quota) -> u64 {
        if self.reserve > 0 {
            self.reserve
        } else {
            budget.amount.get()
        }
    }
}

impl Window {
    /// What a new call needs free in the window: 1, or a budget's reservation.
    pub(super) fn needs(&self) -> u64 {
        self.reserve.max(1)
    }
}

/// Uses of one measure kept for counters that are gone (or not created yet after a restart),
/// and what is to be stored.
#[derive(Debug, Default)]
pub(super) struct Kept {
    /// By counter name (`scope[/l1[/l2]]`), until their window ends.
    uses: HashMap<String, QuotaUse>,
    /// Its size after the last sweep of ended windows.
    swept: usize,
    /// The earliest window end among the kept uses at the last sweep (when a refusal for a
    /// full map expects room).
    next_end: u64,
    /// Live counters whose use changed, to store.
    pub(super) dirty: Vec<CounterId>,
    /// Uses of gone counters changed (reset, or their window ended: 0), to store.
    reset: Vec<(String, QuotaUse)>,
    /// Budgets only: what gone counters' calls overran ([`Rare::overrun`]), kept as long as
    /// their use is (an overrun charged the cap, so a use is kept beside it). In memory only.
    overruns: HashMap<String, u64>,
    /// How many of `uses` each scope has (the name's first part), so one tenant minting keys
    /// fills its own bound and not every tenant's.
    by_scope: HashMap<String, usize>,
}

/// The scope part of a counter name (`scope[/l1[/l2]]`).
fn scope_of(key: &str) -> &str {
    key.split_once('/').map_or(key, |(scope, _)| scope)
}

/// One name of `scope` is no longer kept ([`Kept::by_scope`]).
fn forget_one(by_scope: &mut HashMap<String, usize>, scope: &str) {
    if let Some(n) = by_scope.get_mut(scope) {
        *n -= 1;
        if *n == 0 {
            by_scope.remove(scope);
        }
    }
}

impl Kept {
    /// Nothing kept.
    pub(super) fn is_empty(&self) -> bool {
        self.uses.is_empty()
    }

    /// Keeps `used` under `key`, counting a new name against its scope.
    fn insert(&mut self, key: String, used: QuotaUse) {
        let scope = scope_of(&key);
        if !self.uses.contains_key(&key) {
            match self.by_scope.get_mut(scope) {
                Some(n) => *n += 1,
                None => {
                    self.by_scope.insert(scope.to_owned(), 1);
                }
            }
        }
        self.uses.insert(key, used);
    }

    /// Forgets what `key` kept.
    fn remove(&mut self, key: &str) -> Option<QuotaUse> {
        let used = self.uses.remove(key)?;
        forget_one(&mut self.by_scope, scope_of(key));
        Some(used)
    }

    /// How many names of `scope` are kept.
    pub(super) fn in_scope(&self, scope: &str) -> usize {
        self.by_scope.get(scope).copied().unwrap_or(0)
    }
}

impl Limiter {
    /// The rare state of counter `id`, made when it has none.
    pub(super) fn rare(&mut self, id: CounterId) -> &mut Rare {
        self.node_mut(id).rare.get_or_insert_with(Box::default)
    }

    /// The kept uses of `m`.
    pub(super) fn kept_mut(&mut self, m: Measure) -> &mut Kept {
        &mut self.kept[m as usize]
    }
}

impl Limiter {
    /// A counter's name for its quota and budget: `scope[/l1[/l2]]` (no name holds a `/`).
    pub(super) fn quota_key(&self, id: CounterId) -> String {
        self.names(id)
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("/")
    }

    /// Keeps the uses of counter `id`, about to go, until their windows end; a change not
    /// taken yet is stored by name.
    pub(super) fn keep_uses(&mut self, id: CounterId) {
        let key = self.quota_key(id);
        for m in Measure::ALL {
            let rare = self.rare(id);
            let overrun = rare.overrun;
            let window = &mut rare.windows[m as usize];
            let used = window.used;
            if used.used == 0 {
                continue;
            }
            let dirty = std::mem::take(&mut window.dirty);
            let kept = self.kept_mut(m);
            if dirty {
                kept.reset.push((key.clone(), used));
            }
            kept.next_end = kept.next_end.min(used.window_end);
            kept.insert(key.clone(), used);
            if m == Measure::Cost && overrun > 0 {
                kept.overruns.insert(key.clone(), overrun);
            }
            // Now and then, forget the uses whose window ended.
            if kept.uses.len() >= (kept.swept * 2).max(1024) {
                self.sweep_kept(m);
            }
        }
    }

    /// Forgets the kept uses of `m` whose window ended, in the store too (a use of 0 is
    /// deleted there), and notes when the next one ends.
    fn sweep_kept(&mut self, m: Measure) {
        let now = self.now_ms;
        let kept = &mut self.kept[m as usize];
        let mut next_end = u64::MAX;
        let gone = &mut kept.reset;
        let before = gone.len();
        kept.uses.retain(|key, used| {
            if used.window_end > now {
                next_end = next_end.min(used.window_end);
                true
            } else {
                gone.push((key.clone(), QuotaUse { used: 0, ..*used }));
                false
            }
        });
        for (key, _) in &kept.reset[before..] {
            kept.overruns.remove(key);
            forget_one(&mut kept.by_scope, scope_of(key));
        }
        kept.swept = kept.uses.len();
        kept.next_end = next_end;
    }

    /// Bounds the idle counters whose quota (or budget) use is kept to `max` each (see
    /// [`super::RefusalReason::IdleQuotasFull`]), of which one scope keeps at most `per_scope`.
    pub fn set_idle_quota_cap(&mut self, max: usize, per_scope: usize) {
        self.quota_kept_cap = Some(IdleCap {
            max,
            per_scope: per_scope.min(max),
        });
    }

    /// Whether a new entry at counter `id` must be refused because it would start a quota or
    /// budget use the partition could not keep once the counter goes idle: it has one, nothing
    /// used in this window, and the kept uses (its scope's, or all) are at their bound even
    /// after forgetting the ended windows. Answers the bound it met and when a kept window
    /// ends next.
    pub(super) fn idle_quotas_full(
        &mut self,
        id: CounterId,
        now_ms: u64,
    ) -> Option<(IdleBound, u64)> {
        let cap = self.quota_kept_cap?;
        for m in Measure::ALL {
            let node = self.node(id);
            if !node.measures(m) || self.idle_bound_met(m, id, cap).is_none() {
                continue;
            }
            let fresh = node.rare.as_deref().is_none_or(|r| {
                let w = &r.windows[m as usize];
                w.limit.is_none_or(|q| w.used.at(&q, now_ms).used == 0)
            });
            if !fresh {
                continue;
            }
            if self.kept[m as usize].next_end <= now_ms {
                self.sweep_kept(m);
            }
            if let Some(bound) = self.idle_bound_met(m, id, cap) {
                return Some((bound, self.kept[m as usize].next_end));
            }
        }
        None
    }

    /// The bound on kept uses of `m` that counter `id` would go past, if any: the
    /// partition's, else its scope's (looked up only when the first has room).
    fn idle_bound_met(&self, m: Measure, id: CounterId, cap: IdleCap) -> Option<IdleBound> {
        let kept = &self.kept[m as usize];
        if kept.uses.len() >= cap.max {
            return Some(IdleBound::Partition(cap.max));
        }
        let scope = self.names(id)[0].unwrap_or_default();
        (kept.in_scope(scope) >= cap.per_scope).then_some(IdleBound::Scope(cap.per_scope))
    }

    /// A counter just made takes back the uses kept under its name.
    pub(super) fn restore_kept(&mut self, id: CounterId) {
        let key = self.quota_key(id);
        for m in Measure::ALL {
            if let Some(used) = self.kept[m as usize].remove(&key) {
                self.rare(id).windows[m as usize].used = used;
            }
            if let Some(overrun) = self.kept[m as usize].overruns.remove(&key) {
                self.rare(id).overrun = overrun;
            }
        }
    }

    /// At recovery: what counter `key` (`scope[/l1[/l2]]`) used of its quota or budget, from
    /// the store. A window that ended by `now_ms` is ignored (false).
    pub fn restore_use(&mut self, m: Measure, key: String, used: QuotaUse, now_ms: u64) -> bool {
        if used.window_end <= now_ms {
            return false;
        }
        let kept = self.kept_mut(m);
        kept.next_end = kept.next_end.min(used.window_end);
        kept.insert(key, used);
        true
    }

    /// The uses of `m` changed since the last call, by counter name, to store.
    pub fn take_use_writes(&mut self, m: Measure) -> Vec<(String, QuotaUse)> {
        let kept = self.kept_mut(m);
        let mut out = std::mem::take(&mut kept.reset);
        for id in std::mem::take(&mut kept.dirty) {
            let live = self
                .nodes
                .get(id.0 as usize)
                .and_then(Option::as_ref)
                .and_then(|n| n.rare.as_deref())
                .is_some_and(|r| r.windows[m as usize].dirty);
            if live {
                let window = &mut self.rare(id).windows[m as usize];
                window.dirty = false;
                let used = window.used;
                out.push((self.quota_key(id), used));
            }
        }
        out
    }

    /// What [`Limiter::reset_uses`] would store: each counter `pattern` matches that used
    /// something of `m`, with its use at 0.
    pub fn reset_plan(&self, m: Measure, pattern: &RulePattern) -> Vec<(String, QuotaUse)> {
        let live = self.index.values().filter_map(|&id| {
            let used = self.node(id).used(m);
            let key = self.quota_key(id);
            (used.used > 0 && matches(pattern, &key)).then_some((key, QuotaUse { used: 0, ..used }))
        });
        let kept = self.kept[m as usize]
            .uses
            .iter()
            .filter(|(key, used)| used.used > 0 && matches(pattern, key))
            .map(|(key, used)| (key.clone(), QuotaUse { used: 0, ..*used }));
        live.chain(kept).collect()
    }

    /// An operator resets the quota (or budget) of every counter `pattern` matches at its
    /// level (live or kept): their use in the current window starts again from 0. Answers how
    /// many were reset.
    pub fn reset_uses(&mut self, m: Measure, pattern: &RulePattern) -> usize {
        let mut reset = 0;
        let ids: Vec<CounterId> = self.index.values().copied().collect();
        for id in ids {
            if self.node(id).used(m).used == 0 || !matches(pattern, &self.quota_key(id)) {
                continue;
            }
            let window = &mut self.rare(id).windows[m as usize];
            window.used.used = 0;
            if !std::mem::replace(&mut window.dirty, true) {
                self.kept_mut(m).dirty.push(id);
            }
            reset += 1;
        }
        let kept = &mut self.kept[m as usize];
        for (key, used) in kept
            .uses
            .iter_mut()
            .filter(|(key, used)| used.used > 0 && matches(pattern, key))
        {
            used.used = 0;
            kept.reset.push((key.clone(), *used));
            reset += 1;
        }
        reset
    }
}

/// The bounds on kept idle uses (`flow.max-idle-quota-counters`, and
/// `flow.max-idle-quota-counters-per-scope`).
#[derive(Debug, Clone, Copy)]
pub(super) struct IdleCap {
    max: usize,
    per_scope: usize,
}

/// Which bound on kept idle uses a fresh counter met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleBound {
    /// Its scope keeps `flow.max-idle-quota-counters-per-scope` idle uses.
    Scope(usize),
    /// The partition keeps `flow.max-idle-quota-counters` idle uses.
    Partition(usize),
}

/// A budget's reservations, by the level of the counter that holds each (0: none there).
pub type Reserved = [u64; 3];

impl Limiter {
    /// Reserves a call's share of the budgets on `path` (at recovery, for a call that was
    /// running before it); `None` when no counter there reserves.
    pub fn reserve(&mut self, path: &CounterPath, book: &RuleBook) -> Option<Box<Reserved>> {
        let mut reserved = Reserved::default();
        for &id in path.counters() {
            self.resolve(id, book);
            let node = self.node_mut(id);
            reserved[node.level.index()] = node.reserve();
        }
        reserved.iter().any(|r| *r > 0).then(|| Box::new(reserved))
    }

    /// Gives back what a call held `reserved` on `path`; a waiter held by the budget looks
    /// again at once.
    pub(super) fn unreserve(&mut self, path: &CounterPath, reserved: &Reserved) {
        let now = self.now_ms;
        for &id in path.counters() {
            let node = self.node_mut(id);
            let held = reserved[node.level.index()];
            let Some(state) = node.rare.as_deref_mut().filter(|_| held > 0) else {
                continue;
            };
            state.reserved = state.reserved.saturating_sub(held);
            if state.reserved == 0 {
                node.measured &= !super::HOLDS_RESERVATIONS;
            }
            if node.token_queue {
                self.token_wakes.push(std::cmp::Reverse((now, id)));
            }
        }
    }

    /// A call on `path` ended having spent `cost` (as its handler reported): charged to the
    /// budget of each of its counters whose rule has one, and what it held reserved there is
    /// given back. The uses changed are stored with the call's end
    /// ([`Limiter::take_use_writes`]).
    pub fn charge(
        &mut self,
        path: &CounterPath,
        book: &RuleBook,
        cost: u64,
        reserved: Option<&Reserved>,
        now_ms: u64,
    ) {
        self.move_spent(path, book, cost, false, now_ms);
        if let Some(reserved) = reserved {
            self.unreserve(path, reserved);
        }
    }

    /// Takes back a [`Limiter::charge`] of `cost` on `path` whose write was dropped (its
    /// batch failed before it was stored): each budget it went to spent that much less.
    pub fn uncharge(&mut self, path: &CounterPath, book: &RuleBook, cost: u64, now_ms: u64) {
        self.move_spent(path, book, cost, true, now_ms);
    }

    /// Adds `cost` to (or, `back`, takes it from) what the budgets on `path` spent in the
    /// window of `now_ms`, marking each changed use to be stored.
    fn move_spent(
        &mut self,
        path: &CounterPath,
        book: &RuleBook,
        cost: u64,
        back: bool,
        now_ms: u64,
    ) {
        self.now_ms = self.now_ms.max(now_ms);
        if cost == 0 {
            return;
        }
        let moved = |total: u64, amount: u64| {
            if back {
                total.saturating_sub(amount)
            } else {
                total.saturating_add(amount)
            }
        };
        for &id in path.counters() {
            self.resolve(id, book);
            let node = self.node_mut(id);
            if !node.measures(Measure::Cost) {
                continue;
            }
            let Some(state) = node.rare.as_deref_mut() else {
                continue;
            };
            let window = &state.windows[Measure::Cost as usize];
            // The same cut whether charged or taken back: the rule is the same within a batch.
            let charged = window
                .limit
                .map_or(cost, |budget| cost.min(window.most_one_call(&budget)));
            state.charged = moved(state.charged, charged);
            state.overrun = moved(state.overrun, cost - charged);
            let window = &mut state.windows[Measure::Cost as usize];
            let Some(budget) = window.limit else {
                continue;
            };
            window.used = window.used.at(&budget, now_ms);
            window.used.used = moved(window.used.used, charged);
            if !std::mem::replace(&mut window.dirty, true) {
                self.kept_mut(Measure::Cost).dirty.push(id);
            }
        }
    }
}

impl Limiter {
    /// Counters that are gone while nothing runs or waits under them, but whose quota or
    /// budget use is kept for their window: shown idle with what they used, so an operator
    /// sees a tenant's quota between its calls as the next call will find it.
    pub(super) fn idle_quota_counters(&self, book: &RuleBook, out: &mut Vec<CounterSnapshot>) {
        let now = self.now_ms;
        let [calls, cost, burst] = &self.kept;
        let keys = calls
            .uses
            .keys()
            .chain(cost.uses.keys().filter(|k| !calls.uses.contains_key(*k)))
            .chain(
                burst
                    .uses
                    .keys()
                    .filter(|k| !calls.uses.contains_key(*k) && !cost.uses.contains_key(*k)),
            );
        for key in keys {
            let (level, scope, l1, l2) = key_names(key);
            let resolved = book.resolve(level, scope, l1, l2);
            let quota = resolved.quota.and_then(|q| {
                let used = calls.uses.get(key)?.at(&q, now);
                (used.used > 0).then_some((q, used))
            });
            let budget = resolved.budget.and_then(|b| {
                let used = cost.uses.get(key)?.at(&b.limit, now);
                (used.used > 0).then_some((b, used, 0))
            });
            let burst_budget = resolved.burst_budget.and_then(|b| {
                let used = burst.uses.get(key)?.at(&b.budget, now);
                (used.used > 0).then_some((b, used))
            });
            if quota.is_none() && budget.is_none() && burst_budget.is_none() {
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
                weight: resolved.weight.get().min(MAX_WEIGHT),
                controls: CounterControls {
                    max_queued: resolved.max_queued.map(NonZeroU32::get),
                    max_wait_ms: resolved.max_wait_ms.map(NonZeroU64::get),
                    adaptive: adaptive.map(|a| (a.min.get(), a.max.get())),
                    guaranteed: resolved.guaranteed.map(NonZeroU32::get),
                    quota,
                    budget,
                    budget_overrun: cost.overruns.get(key).copied().unwrap_or(0),
                    burst_budget,
                    // A counter goes only once its bucket is full again.
                    tokens: resolved.rate.map(|rate| rate.burst.get()),
                    rate: resolved.rate,
                    next_token_ms: None,
                    shadow: None,
                }
                .boxed(),
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
