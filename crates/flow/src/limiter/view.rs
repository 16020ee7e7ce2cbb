//! Reads of the counters for people and scrapers: every one, or a bounded [`ReadView`] picked
//! by the numbers the nodes hold (waiting, then running), a snapshot with owned names built
//! only for those picked; and the snapshot itself.

use std::cmp::Reverse;
use std::num::NonZeroU32;
use std::sync::Arc;

use super::bounds::{Shadow, ShadowCounts};
use super::{CounterId, Limit, Limiter, NodeRef};
use crate::pattern::{Level, RulePattern};
use crate::quota::{Budget, Measure, Quota, QuotaUse};
use crate::rate::RateLimit;
use crate::read_view::{ReadView, greatest};
use crate::rules::{RuleBook, ShadowRule};

/// A counter as introspection shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Its level.
    pub level: Level,
    /// The scope.
    pub scope: String,
    /// L1 name at L1 and L2.
    pub l1: Option<String>,
    /// L2 name at L2.
    pub l2: Option<String>,
    /// Running invocations counted here.
    pub usage: u32,
    /// The limit in force.
    pub limit: Limit,
    /// The rule that set it.
    pub rule: Option<Arc<RulePattern>>,
    /// Free slots (`u32::MAX` when unlimited).
    pub available: u32,
    /// Waiters parked here (for a slot or a token).
    pub waiters: usize,
    /// Entries waiting in queues under it.
    pub queued: u32,
    /// Its share among its siblings.
    pub weight: u32,
    /// What its rule sets beyond a concurrency limit and a weight, and what it used of it;
    /// `None` when that is nothing. Boxed: most of a million keys' counters have none, and a
    /// read of every counter then moves a third of the bytes ([`CounterSnapshot::controls`]
    /// reads it either way).
    pub controls: Option<Box<CounterControls>>,
}

/// A counter's controls beyond a concurrency limit and a weight, as introspection shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterControls {
    /// Its rule's `max-queued`.
    pub max_queued: Option<u32>,
    /// Its rule's `max_wait`, ms.
    pub max_wait_ms: Option<u64>,
    /// Set when its limit adapts: the bounds it moves within (`limit` is where it is now).
    pub adaptive: Option<(u32, u32)>,
    /// Set when its limit is burstable: the slots guaranteed (`limit` is the most it may
    /// borrow up to; usage beyond this is borrowed).
    pub guaranteed: Option<u32>,
    /// Its rule's quota and what it used in the current window.
    pub quota: Option<(Quota, QuotaUse)>,
    /// Its rule's budget, what its calls spent in the current window, and what the calls
    /// running hold reserved.
    pub budget: Option<(Budget, QuotaUse, u64)>,
    /// Cost its calls reported past what one call may charge to its budget (its `reserve`,
    /// else the budget), cut from their charges, since the counter was made.
    pub budget_overrun: u64,
    /// Its rule's burst budget and the ms it has spent above its concurrency in the window
    /// (its `limit` is raised while some is left).
    pub burst_budget: Option<(crate::quota::BurstBudget, QuotaUse)>,
    /// Its rate, if rate limited.
    pub rate: Option<RateLimit>,
    /// Tokens there now (rate limited counters).
    pub tokens: Option<u32>,
    /// When the next token is there, ms (rate limited counters out of tokens).
    pub next_token_ms: Option<u64>,
    /// The shadow rule evaluated here and what it would have done.
    pub shadow: Option<(Arc<ShadowRule>, ShadowCounts)>,
}

impl CounterControls {
    /// No control at all.
    pub const NONE: CounterControls = CounterControls {
        max_queued: None,
        max_wait_ms: None,
        adaptive: None,
        guaranteed: None,
        quota: None,
        budget: None,
        budget_overrun: 0,
        burst_budget: None,
        rate: None,
        tokens: None,
        next_token_ms: None,
        shadow: None,
    };

    /// These controls as a snapshot keeps them: boxed, or `None` when there are none.
    pub fn boxed(self) -> Option<Box<CounterControls>> {
        (self != Self::NONE).then(|| Box::new(self))
    }
}

impl CounterSnapshot {
    /// Its controls ([`CounterControls::NONE`] when it has none).
    pub fn controls(&self) -> &CounterControls {
        self.controls.as_deref().unwrap_or(&CounterControls::NONE)
    }
}

/// What a view found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterPage {
    /// Counters that matched the view's scope, before its limit.
    pub total: usize,
    /// Those returned: the busiest first when the view has a limit, else in no order.
    pub counters: Vec<CounterSnapshot>,
}

impl CounterPage {
    /// Pages of several partitions as one: totals add up, and the busiest `limit` stay.
    pub fn merge(pages: impl IntoIterator<Item = CounterPage>, limit: Option<usize>) -> Self {
        // The others' counters moved into the largest page's, made room for once: a scope's
        // counters all live at its partition, so a million of them are often one page, and
        // are then not moved at all.
        let mut pages: Vec<CounterPage> = pages.into_iter().collect();
        let largest = (0..pages.len()).max_by_key(|&i| pages[i].counters.len());
        let mut merged = CounterPage {
            total: pages.iter().map(|p| p.total).sum(),
            counters: largest.map_or_else(Vec::new, |i| std::mem::take(&mut pages[i].counters)),
        };
        merged
            .counters
            .reserve(pages.iter().map(|p| p.counters.len()).sum());
        for page in pages {
            merged.counters.extend(page.counters);
        }
        if let Some(limit) = limit {
            merged.counters.sort_by(busiest_first);
            merged.counters.truncate(limit);
        }
        merged
    }
}

fn by_name(a: &CounterSnapshot, b: &CounterSnapshot) -> std::cmp::Ordering {
    (&a.scope, &a.l1, &a.l2).cmp(&(&b.scope, &b.l1, &b.l2))
}

fn busiest_first(a: &CounterSnapshot, b: &CounterSnapshot) -> std::cmp::Ordering {
    (Reverse(a.queued), Reverse(a.usage))
        .cmp(&(Reverse(b.queued), Reverse(b.usage)))
        .then_with(|| by_name(a, b))
}

impl Limiter {
    /// Every live counter (and every idle one whose quota, budget or burst use is kept),
    /// resolved against `book`, by scope, L1, L2.
    pub fn snapshot(&mut self, book: &RuleBook, now_ms: u64) -> Vec<CounterSnapshot> {
        let mut counters = self.view(book, now_ms, &ReadView::ALL).counters;
        counters.sort_by(by_name);
        counters
    }

    /// The counters `view` asks for, resolved against `book`.
    pub fn view(&mut self, book: &RuleBook, now_ms: u64, view: &ReadView) -> CounterPage {
        self.now_ms = self.now_ms.max(now_ms);
        // A scope's counters are those under its own: compared by id, not by name.
        let root = match view.scope.as_deref() {
            Some(scope) => match self.index.get(&NodeRef {
                parent: None,
                name: scope,
            }) {
                Some(id) => Some(*id),
                None => {
                    return self.idle_page(book, view, 0, Vec::new());
                }
            },
            None => None,
        };
        let mut total = 0;
        let live = self
            .live_ids()
            .filter(|id| root.is_none_or(|r| self.root_of(*id) == r));
        let ids: Vec<CounterId> = match view.limit {
            None => live.inspect(|_| total += 1).collect(),
            Some(limit) => {
                let busy = live.inspect(|_| total += 1).map(|id| {
                    let node = self.node(id);
                    (node.queued, node.usage, Reverse(id))
                });
                greatest(busy, limit)
                    .into_iter()
                    .map(|(_, _, Reverse(id))| id)
                    .collect()
            }
        };
        let counters: Vec<CounterSnapshot> = ids
            .into_iter()
            .map(|id| self.snapshot_of(id, book))
            .collect();
        self.idle_page(book, view, total, counters)
    }

    /// `counters` (of `total` live ones matched) with the idle counters kept for their windows
    /// that `view` matches, in its order.
    fn idle_page(
        &mut self,
        book: &RuleBook,
        view: &ReadView,
        mut total: usize,
        mut counters: Vec<CounterSnapshot>,
    ) -> CounterPage {
        let mut idle = Vec::new();
        self.idle_quota_counters(book, &mut idle);
        idle.retain(|c| view.scope.as_deref().is_none_or(|s| c.scope == s));
        total += idle.len();
        counters.extend(idle);
        // Unbounded, the order is the reader's to choose (SQL sorts if asked; a million
        // names sorted for nothing cost more than the snapshots).
        if let Some(limit) = view.limit {
            counters.sort_by(busiest_first);
            counters.truncate(limit);
        }
        CounterPage { total, counters }
    }

    /// Every live counter, in arena order (a walk of memory in order, not of the index).
    pub(super) fn live_ids(&self) -> impl Iterator<Item = CounterId> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.is_some())
            .map(|(i, _)| CounterId(i as u32))
    }

    /// The scope counter `id` is under (itself at the scope level).
    fn root_of(&self, mut id: CounterId) -> CounterId {
        while let Some(parent) = self.node(id).parent() {
            id = parent;
        }
        id
    }

    /// Counter `id` as introspection shows it, resolved against `book`.
    fn snapshot_of(&mut self, id: CounterId, book: &RuleBook) -> CounterSnapshot {
        self.resolve(id, book);
        if self.bursts(id) {
            self.burst_tick(id, self.now_ms);
        }
        let [scope, l1, l2] = self.names(id).map(|n| n.map(str::to_owned));
        let node = self.node(id);
        let now = self.now_ms;
        let bounds = node.bounds.as_deref();
        let rate = node.rate;
        CounterSnapshot {
            level: node.level,
            scope: scope.unwrap_or_default(),
            l1,
            l2,
            usage: node.usage,
            limit: node.limit,
            rule: node.rule.clone(),
            available: node.limit.available(node.usage),
            waiters: node.waiters.len() + bounds.map_or(0, |b| b.rate_waiters.len()),
            queued: node.queued,
            weight: node.weight,
            controls: CounterControls {
                max_queued: bounds.and_then(|b| b.max_queued).map(NonZeroU32::get),
                max_wait_ms: bounds
                    .and_then(|b| b.max_wait_ms)
                    .map(std::num::NonZeroU64::get),
                adaptive: bounds
                    .and_then(|b| b.adaptive.as_ref())
                    .map(|a| (a.min, a.max)),
                guaranteed: (node.guaranteed > 0).then_some(node.guaranteed),
                quota: node
                    .quota_rule()
                    .map(|q| (q, node.used(Measure::Calls).at(&q, now))),
                budget: node.budget(now),
                budget_overrun: node.rare.as_deref().map_or(0, |r| r.overrun),
                burst_budget: node.rare.as_deref().and_then(|r| {
                    let burst = r.burst?;
                    Some((burst.budget, r.windows[Measure::Burst as usize].used))
                }),
                rate,
                tokens: rate.map(|rate| node.bucket.tokens(rate, now)),
                next_token_ms: rate.map(|_| node.next_token_ms(now)).filter(|at| *at > now),
                shadow: bounds
                    .and_then(|b| b.shadow.as_ref())
                    .map(|s: &Shadow| (Arc::clone(&s.rule), s.counts)),
            }
            .boxed(),
        }
    }
}
