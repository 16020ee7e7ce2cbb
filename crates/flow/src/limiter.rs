//! Concurrency counters per scope → L1 → L2, their permits and their waiter lists.
//!
//! Counters live in an arena and are addressed by index, so the hot path (check, acquire,
//! release of a known [`CounterPath`]) hashes nothing. A node exists only while something needs
//! it: usage, waiters, pending wake-ups, children or paths held by queues; then it is pruned.
//!
//! Waiters park at the deepest level that blocked them, in the order of [`waits`] (fair across
//! the counter's children by weight, priority first, FIFO otherwise). A node's free slots (limit − usage)
//! minus the wake-ups already handed out (`pending`) is how many more waiters may be woken, so a
//! release wakes one waiter per freed slot, deepest level first, and a woken waiter that does not
//! use its slot hands it on (see [`Limiter::settle`]); no wake-up is lost.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;

use hashbrown::{Equivalent, HashMap};

mod adaptive;
mod admit;
mod bounds;
mod burst;
mod crowd;
mod quotas;
mod sums;
mod tally;
mod tokens;
mod view;
mod waits;
mod wake;

use super::pattern::{Level, RulePattern};
use super::priority::Priority;
use super::quota::{Budget, Measure, Quota, QuotaUse};
use super::rate::{Bucket, RateLimit};
use super::rules::{Limit, RuleBook};
use super::scope::{LimitKey, Scope};
use bounds::Bounds;
pub use bounds::ShadowCounts;
pub use crowd::{Arrival, Crowding, Named, Verdict};
pub use quotas::{IdleBound, Reserved};
pub use sums::{FlowSums, RuleSums, ShadowSums};
pub use tally::{Tally, WAIT_BUCKETS, WaitHistogram};
pub use view::{CounterControls, CounterPage, CounterSnapshot};
use waits::WaitList;
pub use waits::{MAX_WEIGHT, PRIORITY_STEP, Ticket};

/// Index of a counter node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterId(u32);

/// Who waits at a counter (the scheduler's queue ids); opaque to the limiter.
pub type WaiterId = u32;

/// Whether the path being checked is a waiter's that was woken, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// A newcomer (or a waiter never woken).
    No,
    /// Woken for a slot of this counter.
    At(CounterId),
    /// Woken by something else (a token, a lock, the invoker).
    Elsewhere,
}

/// The counters an invocation touches: scope, then L1 and L2 when its limit key has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterPath {
    nodes: [CounterId; 3],
    depth: u8,
}

impl CounterPath {
    /// Touched counters, scope first.
    pub fn counters(&self) -> &[CounterId] {
        &self.nodes[..usize::from(self.depth)]
    }
}

/// Proof that one slot is held at every counter of a path; give it back with [`Limiter::release`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a permit holds slots until it is released"]
pub struct Permit {
    path: CounterPath,
    /// When it was taken, ms: an adaptive counter learns from how long it was held.
    taken_ms: u64,
    /// What ran on it (a handler), for an adaptive counter's per-handler baselines.
    class: u64,
    /// What it reserved of its counters' budgets, until the call ends
    /// ([`Permit::take_reserved`]) or the permit goes back unused.
    reserved: Option<Box<Reserved>>,
}

impl Permit {
    /// The counters it holds a slot of.
    pub fn path(&self) -> &CounterPath {
        &self.path
    }

    /// Says what runs on it: a number standing for its handler (equal for equal handlers).
    pub fn classify(&mut self, class: u64) {
        self.class = class;
    }

    /// What it reserved of its counters' budgets: the call holds it until it ends and
    /// [`Limiter::charge`] settles it (else releasing the permit gives it back).
    pub fn take_reserved(&mut self) -> Option<Box<Reserved>> {
        self.reserved.take()
    }
}

/// Why a new entry is refused instead of queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The level of the counter that refused it.
    pub level: Level,
    /// The rule that set the bound.
    pub rule: Option<Arc<RulePattern>>,
    /// Which bound.
    pub why: RefusalReason,
    /// When to try again, ms from now (at least 1).
    pub retry_after_ms: u64,
}

/// The bound a refusal enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// The counter holds `max_queued` waiting entries.
    QueueFull {
        /// The rule's `max-queued`.
        max_queued: u32,
    },
    /// The counter's rate rejects and no token is there.
    RateExceeded {
        /// The rate.
        rate: RateLimit,
    },
    /// The counter's quota rejects and is used up until its next window.
    QuotaExhausted {
        /// The quota.
        quota: Quota,
    },
    /// The counter's budget rejects and what its calls spent (and hold reserved) leaves no
    /// room for a new call until its next window, or until running calls end.
    BudgetExhausted {
        /// The budget's amount per window.
        budget: Quota,
    },
    /// The counter has a quota (or budget) and nothing used of it in this window, and its
    /// scope (or the partition) keeps the use of as many idle counters as it may: a new one
    /// would be one more.
    IdleQuotasFull {
        /// The bound it met.
        bound: IdleBound,
    },
}

/// What a new entry waits for at a counter with a slot: a token of its rate, or its quota's
/// (or budget's) next window.
#[derive(Debug, Clone, Copy)]
enum Waits {
    Rate(RateLimit, u64),
    Quota(Measure, Quota, u64),
}

/// Why a path cannot be admitted now: its deepest counter at its limit or out of tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The level of that counter.
    pub level: Level,
    /// The counter.
    pub counter: CounterId,
    /// Its limit.
    pub limit: Limit,
    /// Set when the counter has a slot but lends none beyond the guarantee of the path's key
    /// below it: a waiter within its guarantee waits there, and goes first.
    pub borrows: bool,
    /// Set when it is the counter's rate that holds the path: the rate, and when its next token
    /// is there (ms; for a path behind others waiting for tokens, the earliest it could be).
    pub rate: Option<(RateLimit, u64)>,
    /// Set when it is the counter's quota or budget, used up: which, its amount per window,
    /// and when its next window starts.
    pub quota: Option<(Measure, Quota, u64)>,
    /// The rule that set the limit.
    pub rule: Option<Arc<RulePattern>>,
}

/// A counter. In declaration order (`repr(C)`): what every admission and release reads comes
/// first, in the first two cache lines (nodes are aligned to a line, so those are two lines);
/// names and fair-queuing tags, read only when waiters park, come last.
#[derive(Debug)]
#[repr(C, align(64))]
struct Node {
    // The first line: what every admission and release reads of every counter on its path.
    usage: u32,
    /// Waiters woken for a free slot that have not re-checked yet.
    pending: u32,
    /// Paths handed out by [`Limiter::path`] whose deepest counter is this one.
    refs: u32,
    children: u32,
    /// Entries waiting in queues whose path holds this counter (not delayed, not running).
    queued: u32,
    /// Slots guaranteed under a burstable limit (0: not burstable); beyond them it borrows
    /// from its parent, which lends only while no waiter within its guarantee waits there.
    guaranteed: u32,
    /// Waiters parked here whose flow is within its guarantee (see [`Node::within`]).
    owed: u32,
    /// Limiter generation `limit`/`rule` were resolved at; [`UNRESOLVED`] forces a resolve.
    resolved_at: u32,
    /// Its share among its siblings, from its rule.
    weight: u32,
    limit: Limit,
    /// What only a counter with token waiters, a `max-queued` or a shadow rule needs.
    bounds: Option<Box<Bounds>>,
    /// Waiters parked at its parent whose flow it is.
    parked_above: u32,
    /// Waiters of its flow woken at its parent that have not re-checked yet: each will take a
    /// slot here, so it counts against the guarantee ([`Node::within`]) from its wake on. Else
    /// one turn that frees two parent slots could wake two waiters of a key with one
    /// guaranteed slot left, and the second would borrow while another key within its
    /// guarantee waited.
    woken_above: u32,
    /// Mirrors `bounds.token_queued()`, so an admission that finds a token reads no box.
    token_queue: bool,
    /// Mirrors `bounds.watches_admissions()`.
    watched: bool,
    level: Level,
    /// Bit `1 << m` set when its rule has a window of [`Measure`] `m` (`rare` holds it), so an
    /// admission without a quota or budget reads no further; and [`HOLDS_RESERVATIONS`].
    measured: u8,
    /// Its parent's index ([`NO_PARENT`] for a scope).
    parent: u32,
    // The second line: a rate with its bucket, and the waiters every release looks at.
    /// Its rate, inline with its bucket: every admission here reads them.
    rate: Option<RateLimit>,
    /// Tokens taken recently; the node outlives its users until the bucket is full again, or
    /// a counter that comes and goes would get a fresh burst each time.
    bucket: Bucket,
    waiters: WaitList,
    // The rest: written on admission (`admitted`) or read when waiters park and at
    // introspection.
    /// Admissions through it since it was created (metrics).
    admitted: u64,
    /// Its quota, refusals and waits, once it had any (`quotas::Rare`).
    rare: Option<Box<quotas::Rare>>,
    rule: Option<Arc<RulePattern>>,
    name: Box<str>,
    /// Its virtual time: the start of the last waiter woken here (see [`waits`]).
    vtime: u64,
    /// Its finish tag as a flow of its parent.
    finish: u64,
    /// The finish tag of the waiters whose path ends here, as a flow of this counter.
    own_finish: u64,
}

/// `Node::measured` bit set while calls hold reservations of its budget (`rare.reserved` > 0):
/// the counter stays until they end, whatever its rule says meanwhile, so what they give back
/// is what they took.
const HOLDS_RESERVATIONS: u8 = 1 << 7;

/// `Node::resolved_at` of a counter never resolved.
const UNRESOLVED: u32 = u32::MAX;

/// `Node::parent` of a scope.
const NO_PARENT: u32 = u32::MAX;

impl Node {
    /// Its totals, under its rule and level.
    fn tally(&self) -> Option<Tally> {
        let (refused, waits, charged, overrun) = self
            .rare
            .as_deref()
            .map_or((0, WaitHistogram::default(), 0, 0), |r| {
                (r.refused, r.waits, r.charged, r.overrun)
            });
        (self.admitted > 0 || refused > 0 || charged > 0 || overrun > 0).then_some(Tally {
            admitted: self.admitted,
            refused,
            waits,
            charged,
            overrun,
        })
    }
}

impl Node {
    /// Nothing but a bucket that is not full yet keeps it.
    fn unused(&self) -> bool {
        !self.holds_reservations()
            && self.usage == 0
            && self.queued == 0
            && self.children == 0
            && self.refs == 0
            && self.pending == 0
            && self.waiters.is_empty()
            && !self.token_queue
    }

    fn idle(&self, now_ms: u64) -> bool {
        self.unused()
            && self.bucket.is_full(now_ms)
            && self.bounds.as_ref().is_none_or(|b| b.shadow_full(now_ms))
    }

    /// When every bucket here is full again, ms.
    fn full_at_ms(&self) -> u64 {
        let shadow = self.bounds.as_ref().map_or(0, |b| b.shadow_full_at_ms());
        self.bucket.full_at_ms().max(shadow)
    }

    /// When the next token is there (now when there is no rate), or its quota's (or
    /// budget's) next window when it is used up.
    fn next_token_ms(&self, now_ms: u64) -> u64 {
        let token = self
            .rate
            .map_or(now_ms, |rate| self.bucket.next_token_ms(rate, now_ms));
        match self.used_up(now_ms) {
            Some((_, _, at)) => token.max(at),
            None => token,
        }
    }

    /// Whether its rule has a window of `m`.
    fn measures(&self, m: Measure) -> bool {
        self.measured & (1 << m as u8) != 0
    }

    /// Calls running under it hold some of its budget reserved: it stays until they end.
    fn holds_reservations(&self) -> bool {
        self.measured & HOLDS_RESERVATIONS != 0
    }

    /// When its quota, or its budget, leaves no room for a new call at `now_ms`: which, its
    /// amount per window, and when its next window starts. A budget counts what the calls
    /// running under it hold reserved beside what was spent.
    fn used_up(&self, now_ms: u64) -> Option<(Measure, Quota, u64)> {
        if self.measured == 0 {
            return None;
        }
        let state = self.rare.as_deref()?;
        Measure::GATES.into_iter().find_map(|m| {
            let window = &state.windows[m as usize];
            let limit = window.limit?;
            let used = window.used.at(&limit, now_ms);
            let held = if m == Measure::Cost {
                state.reserved
            } else {
                0
            };
            let taken = used.used.saturating_add(held);
            (taken.saturating_add(window.needs()) > limit.amount.get()).then_some((
                m,
                limit,
                used.window_end,
            ))
        })
    }

    /// Counts a new admission against its quota and reserves its share of its budget, as its
    /// rule has them; answers whether its quota use was clean until now (it is to be stored)
    /// and what it reserved.
    fn take_windows(&mut self, now_ms: u64) -> (bool, u64) {
        let Some(state) = self.rare.as_deref_mut() else {
            return (false, 0);
        };
        let mut dirtied = false;
        let calls = &mut state.windows[Measure::Calls as usize];
        if let Some(quota) = calls.limit {
            calls.used = calls.used.at(&quota, now_ms);
            calls.used.used += 1;
            dirtied = !std::mem::replace(&mut calls.dirty, true);
        }
        (dirtied, self.reserve())
    }

    /// Reserves a new call's share of its budget, if its rule has one with a `reserve`;
    /// answers the amount.
    fn reserve(&mut self) -> u64 {
        if !self.measures(Measure::Cost) {
            return 0;
        }
        let Some(state) = self.rare.as_deref_mut() else {
            return 0;
        };
        let reserve = state.windows[Measure::Cost as usize].reserve;
        state.reserved = state.reserved.saturating_add(reserve);
        if state.reserved > 0 {
            self.measured |= HOLDS_RESERVATIONS;
        }
        reserve
    }

    /// Its rule's quota now.
    fn quota_rule(&self) -> Option<Quota> {
        self.rare
            .as_deref()
            .and_then(|r| r.windows[Measure::Calls as usize].limit)
    }

    /// Its rule's budget, what was spent in the window holding `now_ms`, and what the calls
    /// running hold reserved.
    fn budget(&self, now_ms: u64) -> Option<(Budget, QuotaUse, u64)> {
        let state = self.rare.as_deref()?;
        let window = &state.windows[Measure::Cost as usize];
        let limit = window.limit?;
        let budget = Budget {
            limit,
            reserve: NonZeroU64::new(window.reserve),
        };
        Some((budget, window.used.at(&limit, now_ms), state.reserved))
    }

    /// What it used of its quota (`Calls`) or budget (`Cost`): nothing when it never had one.
    fn used(&self, m: Measure) -> QuotaUse {
        self.rare
            .as_deref()
            .map(|r| r.windows[m as usize].used)
            .unwrap_or_default()
    }

    /// Brings the mirrors of its box's state up to date.
    fn sync(&mut self) {
        self.token_queue = self.bounds.as_ref().is_some_and(|b| b.token_queued());
        self.watched = self.bounds.as_ref().is_some_and(|b| b.watches_admissions());
    }

    /// Its parent, `None` for a scope.
    fn parent(&self) -> Option<CounterId> {
        (self.parent != NO_PARENT).then_some(CounterId(self.parent))
    }

    /// Whether one more slot here stays within its guarantee (always, when not burstable);
    /// slots reserved for waiters woken here, or woken at its parent for its flow, count as
    /// taken.
    fn within(&self) -> bool {
        self.guaranteed == 0 || self.usage + self.pending + self.woken_above < self.guaranteed
    }

    /// Slots that may still be offered to waiters.
    fn wakeable(&self) -> u32 {
        self.limit
            .available(self.usage)
            .saturating_sub(self.pending)
    }
}

/// The limit an adaptive controller puts in force.
fn adaptive_limit(state: &adaptive::Adaptive) -> Limit {
    Limit::Concurrency(NonZeroU32::new(state.limit).unwrap_or(NonZeroU32::MIN))
}

/// Index key: a child's name under its parent (`None` for scopes).
#[derive(Debug, PartialEq, Eq, Hash)]
struct NodeKey {
    parent: Option<CounterId>,
    name: Box<str>,
}

/// Borrowed form of [`NodeKey`] with the same hash.
#[derive(Hash)]
struct NodeRef<'a> {
    parent: Option<CounterId>,
    name: &'a str,
}

impl Equivalent<NodeKey> for NodeRef<'_> {
    fn equivalent(&self, key: &NodeKey) -> bool {
        self.parent == key.parent && *self.name == *key.name
    }
}

/// The bound a rule's `max_wait` puts on a new invocation's wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaxWait {
    /// How long it may wait, ms.
    pub ms: u64,
    /// The level of the counter whose rule sets it.
    pub level: Level,
    /// That rule.
    pub rule: Option<Arc<RulePattern>>,
}

/// What the counters of one rule and level did since start.
#[derive(Debug, Clone)]
pub struct RuleAdmissions {
    /// The rule (`None`: counters no rule matched).
    pub rule: Option<Arc<RulePattern>>,
    /// The counters' level.
    pub level: Level,
    /// Admissions since start.
    pub admitted: u64,
    /// New invocations refused since start.
    pub refused: u64,
    /// How long admitted new invocations waited, since start.
    pub waits: WaitHistogram,
    /// Cost charged to budgets, since start.
    pub charged: u64,
    /// Cost reported past what one call may charge, cut, since start.
    pub overrun: u64,
}

/// The counters of one partition.
#[derive(Debug, Default)]
pub struct Limiter {
    /// Bumped by [`Limiter::on_rules_changed`]; cached limits of older generations are stale.
    generation: u32,
    nodes: Vec<Option<Node>>,
    free: Vec<u32>,
    index: HashMap<NodeKey, CounterId>,
    /// The latest time the limiter was told, ms.
    now_ms: u64,
    /// Counters whose head token waiter is due at a time, earliest first (stale entries are
    /// checked and dropped when they come up).
    token_wakes: BinaryHeap<Reverse<(u64, CounterId)>>,
    /// Unused counters kept for their bucket, with the time it is full again.
    cooling: BinaryHeap<Reverse<(u64, CounterId)>>,
    /// Tickets handed out, for FIFO among equal tags.
    tickets: u64,
    /// Totals of counters that are gone, by the rule they had and their level.
    retired: HashMap<(Option<Arc<RulePattern>>, Level), Tally>,
    /// Most idle counters whose quota (or budget) use is kept, in all and by one scope
    /// (`flow.max-idle-quota-counters[-per-scope]`); `None`: unbounded.
    quota_kept_cap: Option<quotas::IdleCap>,
    /// By [`Measure`]: uses of counters that are gone, and what is to be stored.
    kept: [quotas::Kept; 3],
}

impl Limiter {
    /// An empty limiter.
    pub fn new() -> Self {
        Self::default()
    }

    fn node(&self, id: CounterId) -> &Node {
        self.nodes[id.0 as usize].as_ref().expect("live counter")
    }

    fn node_mut(&mut self, id: CounterId) -> &mut Node {
        self.nodes[id.0 as usize].as_mut().expect("live counter")
    }

    /// Admissions since start, by the rule of the counter that counted them (the rule in force
    /// when it was last resolved, or when it went away) and its level.
    pub fn admissions(&self) -> Vec<RuleAdmissions> {
        let mut totals = self.retired.clone();
        for node in self.nodes.iter().flatten() {
            if let Some(tally) = node.tally() {
                totals
                    .entry((node.rule.clone(), node.level))
                    .or_default()
                    .merge(&tally);
            }
        }
        totals
            .into_iter()
            .map(|((rule, level), tally)| RuleAdmissions {
                rule,
                level,
                admitted: tally.admitted,
                refused: tally.refused,
                waits: tally.waits,
                charged: tally.charged,
                overrun: tally.overrun,
            })
            .collect()
    }

    /// Live counters.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no counter is live.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    fn child(&mut self, parent: Option<CounterId>, level: Level, name: &str) -> CounterId {
        if let Some(id) = self.index.get(&NodeRef { parent, name }) {
            return *id;
        }
        let node = Node {
            level,
            name: name.into(),
            parent: parent.map_or(NO_PARENT, |p| p.0),
            usage: 0,
            children: 0,
            refs: 0,
            resolved_at: UNRESOLVED,
            limit: Limit::Unlimited,
            rule: None,
            queued: 0,
            waiters: WaitList::default(),
            pending: 0,
            vtime: 0,
            finish: 0,
            own_finish: 0,
            weight: 1,
            guaranteed: 0,
            owed: 0,
            parked_above: 0,
            woken_above: 0,
            rate: None,
            bucket: Bucket::default(),
            token_queue: false,
            watched: false,
            bounds: None,
            admitted: 0,
            rare: None,
            measured: 0,
        };
        let id = match self.free.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = Some(node);
                CounterId(slot)
            }
            None => {
                let slot = u32::try_from(self.nodes.len()).expect("fewer than 2^32 counters");
                self.nodes.push(Some(node));
                CounterId(slot)
            }
        };
        if self.kept.iter().any(|k| !k.is_empty()) {
            self.restore_kept(id);
        }
        if let Some(parent) = parent {
            self.node_mut(parent).children += 1;
        }
        self.index.insert(
            NodeKey {
                parent,
                name: name.into(),
            },
            id,
        );
        id
    }

    /// The path of `(scope, key)`, creating its counters; held until [`Limiter::drop_path`].
    pub fn path(&mut self, scope: &Scope, key: Option<&LimitKey>) -> CounterPath {
        let s = self.child(None, Level::Scope, scope.as_str());
        let mut path = CounterPath {
            nodes: [s; 3],
            depth: 1,
        };
        if let Some(key) = key {
            let a = self.child(Some(s), Level::L1, key.l1());
            path.nodes[1] = a;
            path.depth = 2;
            if let Some(l2) = key.l2() {
                path.nodes[2] = self.child(Some(a), Level::L2, l2);
                path.depth = 3;
            }
        }
        let deepest = path.nodes[usize::from(path.depth) - 1];
        self.node_mut(deepest).refs += 1;
        path
    }

    /// Gives back a path from [`Limiter::path`].
    pub fn drop_path(&mut self, path: CounterPath) {
        let deepest = path.nodes[usize::from(path.depth) - 1];
        self.node_mut(deepest).refs -= 1;
        self.prune(deepest);
    }

    /// Removes `id` and then its ancestors while they are idle; one kept only by its bucket
    /// is looked at again when the bucket is full.
    fn prune(&mut self, id: CounterId) {
        let mut at = Some(id);
        while let Some(id) = at {
            let node = self.node(id);
            if !node.idle(self.now_ms) {
                if node.unused() {
                    self.cooling.push(Reverse((node.full_at_ms(), id)));
                }
                return;
            }
            if Measure::ALL.iter().any(|m| self.node(id).used(*m).used > 0) {
                self.keep_uses(id);
            }
            let node = self.nodes[id.0 as usize].take().expect("live counter");
            self.free.push(id.0);
            if let Some(tally) = node.tally() {
                self.retired
                    .entry((node.rule.clone(), node.level))
                    .or_default()
                    .merge(&tally);
            }
            self.index.remove(&NodeRef {
                parent: node.parent(),
                name: &node.name,
            });
            at = node.parent();
            if let Some(parent) = at {
                self.node_mut(parent).children -= 1;
            }
        }
    }

    /// Brings a node's cached limit up to the current generation.
    fn resolve(&mut self, id: CounterId, book: &RuleBook) {
        if self.node(id).resolved_at == self.generation {
            return;
        }
        let [scope, l1, l2] = self.names(id);
        let level = self.node(id).level;
        let resolved = book.resolve(level, scope.unwrap_or_default(), l1, l2);
        let generation = self.generation;
        let node = self.node_mut(id);
        node.limit = resolved.limit;
        node.weight = resolved.weight.get().min(MAX_WEIGHT);
        let within = node.within();
        node.guaranteed = resolved.guaranteed.map_or(0, NonZeroU32::get);
        node.rate = resolved.rate;
        let budget = resolved.budget;
        // A burst raises a static bound (an adaptive one moves by itself).
        let burst = match (resolved.burst_budget, resolved.limit) {
            (Some(b), Limit::Concurrency(base)) if resolved.adaptive_in_force().is_none() => {
                Some((b, base.get()))
            }
            _ => None,
        };
        if resolved.quota.is_some() || budget.is_some() || burst.is_some() || node.rare.is_some() {
            let state = node.rare.get_or_insert_with(Box::default);
            state.windows[Measure::Calls as usize].limit = resolved.quota;
            let cost = &mut state.windows[Measure::Cost as usize];
            cost.limit = budget.map(|b| b.limit);
            cost.reserve = budget.and_then(|b| b.reserve).map_or(0, NonZeroU64::get);
            state.windows[Measure::Burst as usize].limit = burst.map(|(b, _)| b.budget);
            // The time above the limit runs on through a rule change.
            let since = state.burst.and_then(|b| b.above_since_ms);
            state.burst = burst.map(|(budget, base)| quotas::Burst {
                budget,
                base,
                above_since_ms: since,
            });
        }
        node.measured = node.measured & HOLDS_RESERVATIONS
            | u8::from(resolved.quota.is_some()) << Measure::Calls as u8
            | u8::from(budget.is_some()) << Measure::Cost as u8
            | u8::from(burst.is_some()) << Measure::Burst as u8;
        let adaptive = resolved.adaptive_in_force();
        if resolved.max_queued.is_some()
            || resolved.max_wait_ms.is_some()
            || resolved.shadow.is_some()
            || adaptive.is_some()
            || resolved.on_full.is_some()
            || node.bounds.is_some()
        {
            let bounds = node.bounds.get_or_insert_with(Box::default);
            bounds.max_queued = resolved.max_queued;
            bounds.max_wait_ms = resolved.max_wait_ms;
            match adaptive {
                Some(a) => {
                    let (min, max) = (a.min.get(), a.max.get());
                    let state = bounds
                        .adaptive
                        .get_or_insert_with(|| adaptive::Adaptive::new(min, max));
                    state.rebound(min, max);
                    node.limit = adaptive_limit(state);
                }
                None => bounds.adaptive = None,
            }
            bounds.set_shadow(resolved.shadow);
            crowd::Crowd::set(&mut bounds.crowd, resolved.on_full);
        }
        node.sync();
        node.rule = resolved.pattern;
        node.resolved_at = generation;
        self.rewithin(id, within);
        if burst.is_some() {
            self.burst_tick(id, self.now_ms);
        }
    }

    /// After a change to counter `id`'s usage, reservations or guarantee: if whether it is
    /// within its guarantee changed (it was `was`), its waiters at the parent count as owed
    /// there, or no longer.
    fn rewithin(&mut self, id: CounterId, was: bool) {
        let node = self.node(id);
        let now = node.within();
        if now == was || node.parked_above == 0 {
            return;
        }
        let (parked, parent) = (node.parked_above, node.parent().expect("parked above it"));
        let owed = &mut self.node_mut(parent).owed;
        *owed = if now { *owed + parked } else { *owed - parked };
    }

    /// Runs the adaptive backstop of counter `id` at `now_ms` (slots held far longer than the
    /// deployment's baseline lower the limit at once).
    fn adapt_backstop(&mut self, id: CounterId, now_ms: u64) {
        let node = self.node_mut(id);
        if !node.watched {
            return;
        }
        if let Some(state) = node.bounds.as_deref_mut().and_then(|b| b.adaptive.as_mut())
            && state.backstop(now_ms)
        {
            node.limit = adaptive_limit(state);
        }
    }

    /// Whether taking a slot at `child` (the next counter of a path) borrows beyond its
    /// guarantee, counting the slots reserved there for waiters already woken.
    fn borrows(&self, child: Option<&CounterId>) -> bool {
        child.is_some_and(|&c| !self.node(c).within())
    }

    /// Scope, L1 and L2 names of a counter, borrowed from it and its ancestors.
    fn names(&self, id: CounterId) -> [Option<&str>; 3] {
        let mut names = [None; 3];
        let mut at = Some(id);
        while let Some(id) = at {
            let node = self.node(id);
            names[node.level.index()] = Some(&*node.name);
            at = node.parent();
        }
        names
    }

    /// The rule book changed (call this whenever the book passed to other methods changes):
    /// cached limits go stale, and waiters of counters that now have room are woken.
    /// Running permits are never revoked; a lowered limit only stops new admissions.
    pub fn on_rules_changed(&mut self, book: &RuleBook, woken: &mut Vec<WaiterId>) {
        // Never the sentinel of a counter not resolved yet.
        self.generation = (self.generation + 1) % UNRESOLVED;
        // Counters are resolved lazily, when a path through them is checked; but a parent's
        // pump prefers waiters whose flow is within its guarantee, read from the flow's
        // counter, and a waiter parked before the change checks nothing until woken. So the
        // flows of parked waiters take the new book first (their owed counts with them).
        let flows: Vec<CounterId> = self
            .index
            .values()
            .copied()
            .filter(|id| self.node(*id).parked_above > 0)
            .collect();
        for id in flows {
            self.resolve(id, book);
        }
        let waiting: Vec<(CounterId, bool, bool)> = self
            .index
            .values()
            .map(|id| {
                let node = self.node(*id);
                let tokens = node
                    .bounds
                    .as_ref()
                    .is_some_and(|b| !b.rate_waiters.is_empty());
                (*id, !node.waiters.is_empty(), tokens)
            })
            .filter(|(_, slots, tokens)| *slots || *tokens)
            .collect();
        for (id, slots, tokens) in waiting {
            if slots {
                self.pump(id, book, woken);
            }
            if tokens {
                // A rate raised or removed: token waiters look again at the next wake.
                self.token_wakes.push(Reverse((self.now_ms, id)));
            }
        }
    }

    /// Usage of one counter.
    pub fn usage(&self, counter: CounterId) -> u32 {
        self.node(counter).usage
    }
}

#[cfg(test)]
mod tests;
