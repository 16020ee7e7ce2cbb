//! A reference model of admission, used by the property tests and the simulator: it drives a
//! [`Scheduler`] with events and checks each decision against brute force over every rule and
//! every running entry.
//!
//! Invariants checked:
//! - admission: an entry is dispatched only when every counter it touches has usage < limit (the
//!   limit found by scanning all rules) and an invoker slot is free; so usage never exceeds a
//!   limit except after that limit was lowered;
//! - exclusivity: one lock holder per virtual object (running or suspended);
//! - nothing lost or duplicated: each arrival completes exactly once; nothing runs twice at once;
//! - order: per queue, resumed entries first, each kind in arrival order;
//! - no lost wake-up: after a poll with invoker slots to spare, no waiting head is admissible;
//! - fairness: while a queue is ready (in the ring) and its head admissible, at most
//!   2 × (queues − 1) entries of other queues are dispatched before it: a ring visit dispatches at
//!   most one entry, and credit (quantum 1, cap 2) covers any head within two visits. Parked
//!   queues wait at their resource instead (by priority and weight), which the no-lost-wake-up
//!   check keeps moving;
//! - bounded queues: an arrival is refused exactly when a counter on its path already holds its
//!   rule's `max-queued` waiting entries (counted by brute force), and an accepted one is never
//!   lost (drain completes every accepted arrival);
//! - shadow rules never change an admission: the limits above ignore them, so a shadow rule that
//!   held anything would fail the admission or the lost-wake-up check;
//! - a paused queue dispatches nothing, keeps its entries, and runs them once resumed;
//! - deadlines: an entry whose deadline (its request's, or now + the tightest `max_wait` of
//!   the rules on its path when it arrived) has passed is never dispatched; every such entry
//!   leaves its queue at the next poll, reported once; among the new entries of a queue
//!   without an object lock the earliest deadline goes first (none = last), arrival order
//!   otherwise;
//! - positions: each waiting entry's place in its queue (why-waiting) is its place in the
//!   model's order, resumed first;
//! - burstable limits (`concurrency = { min, max }`): a key never runs more than its max, and
//!   borrowed slots go back first: an entry whose key is at or past its guarantee never takes
//!   its parent's last slot while another key's head, within its guarantee, has waited since
//!   the last poll for that parent alone (and whose own limits no adaptive backstop lowered
//!   during the poll);
//! - quotas: a counter never admits more new entries than its rule's quota (counted while the
//!   rule has one), and a head whose quota is used up is not admissible (resumed entries pass);
//! - budgets: entries end having spent an amount, charged to the counters on their path whose
//!   rules have a budget; a new entry is admitted only while spent + reserved +
//!   max(reserve, 1) is within the budget at each (resumed entries pass), the reservations
//!   the scheduler hands out are the rules' `reserve`, held from admission to the end across
//!   suspensions, and given back exactly then;
//! - deployment gates: every key's service is on one deployment whose declared limit changes
//!   and whose attempts report outages and overloads; nothing starts while as many run as its
//!   gate allows (the declared limit, capped by the paced-drain window) or while a
//!   `Retry-After` keeps it closed, the gate counts exactly what runs, and a head held only by
//!   the gate is woken as soon as it has room.

use std::collections::{HashMap, HashSet, VecDeque};
use std::num::NonZeroU32;
use std::sync::Arc;

use super::gates::{DeploymentLimits, Gate, Gates};
use super::pacing::{PacingConfig, Signal};
use super::pattern::{Level, RulePattern};
use super::priority::Priority;
use super::rules::{AdaptiveLimit, Delete, Limit, RuleBook, Upsert};
use super::scheduler::{
    Dispatch, EntryId, EntryKind, LockId, Permit, QueueId, QueueKey, Scheduler,
};
use super::scope::{LimitKey, Scope};

/// Most dispatches of other queues a ready, admissible queue waits for.
pub const FAIRNESS_BOUND: usize = 2 * (KEYS.len() - 1);

/// A queue key as events name it: (scope, limit key, exclusive object key).
pub type KeySpec = (
    Option<&'static str>,
    Option<&'static str>,
    Option<&'static str>,
);

/// The queue keys events pick from.
pub const KEYS: &[KeySpec] = &[
    (None, None, None),
    (None, None, Some("k")),
    (Some("a"), None, None),
    (Some("a"), Some("x"), None),
    (Some("a"), Some("x/1"), None),
    (Some("a"), Some("x/2"), None),
    (Some("a"), Some("y"), Some("k")),
    (Some("a"), Some("x"), Some("k")),
    (Some("b"), None, None),
    (Some("b"), Some("x/1"), None),
];

/// Rule patterns events pick from.
pub const PATTERNS: &[&str] = &[
    "*", "a", "b", "*/*", "a/*", "a/x", "*/x", "a/x/*", "a/x/1", "*/*/1", "a/*/2",
];

/// One thing that happens to the scheduler.
#[derive(Debug, Clone)]
pub enum Event {
    /// A new entry arrives on `KEYS[key]`.
    Arrive(usize),
    /// A new entry arrives on `KEYS[key]` with a request deadline this many steps ahead.
    ArriveBy(usize, u64),
    /// The `i`-th running entry completes (mod the number running).
    Complete(usize),
    /// The `i`-th running entry completes having spent this much (its handler's report).
    CompleteSpending(usize, u64),
    /// The `i`-th running entry suspends.
    Suspend(usize),
    /// The `i`-th suspended entry resumes.
    Resume(usize),
    /// Upsert a rule.
    Rule {
        /// `PATTERNS[pattern]`.
        pattern: usize,
        /// Concurrency, 0 = unlimited.
        limit: u32,
        /// Kept but not applied.
        disabled: bool,
        /// Counted, never enforced.
        shadow: bool,
        /// Share among siblings (0 = none).
        weight: u32,
        /// `max-queued`, 0 = none.
        max_queued: u32,
        /// `max_wait` in steps, 0 = none.
        max_wait: u64,
        /// `adaptive = { min, max }` (applies when `limit` is 0).
        adaptive: Option<(u32, u32)>,
        /// Burstable: slots guaranteed below `limit` (0 = none).
        guaranteed: u32,
        /// A quota of this many new admissions per hour (0 = none); the simulation never
        /// reaches the next hour, so a used-up quota holds until a rule change.
        quota: u64,
        /// A budget per hour and its per-call reservation (0 = none), as `quota`.
        budget: Option<(u64, u64)>,
    },
    /// An operator pauses the queue of `KEYS[key]`.
    PauseQueue(usize),
    /// An operator resumes it.
    ResumeQueue(usize),
    /// Delete `PATTERNS[p]`.
    DeleteRule(usize),
    /// The deployment is registered again declaring this concurrency (0 = none).
    Deployment(u32),
    /// The `i`-th running attempt fails: 0 unreachable, 1 overloaded, 2 overloaded with a
    /// `Retry-After` of this many steps; it comes back like a suspension.
    Fail(usize, u8, u64),
}

struct Running {
    key: usize,
    permit: Permit,
    lock: Option<LockId>,
}

/// The model plus the scheduler under test.
pub struct Model {
    sched: Scheduler,
    book: RuleBook,
    keys: Vec<QueueKey>,
    invoker_limit: u32,
    now: u64,
    next_id: EntryId,
    entry_key: HashMap<EntryId, usize>,
    waiting_resumed: Vec<VecDeque<EntryId>>,
    waiting_new: Vec<VecDeque<EntryId>>,
    running: HashMap<EntryId, Running>,
    /// Running entry ids in start order, so events can pick "the i-th".
    running_order: Vec<EntryId>,
    suspended: Vec<EntryId>,
    lock_holder: HashMap<usize, EntryId>,
    completed: HashSet<EntryId>,
    starved: Vec<usize>,
    /// Every counter some key touches, as its names (scope[, l1[, l2]]).
    counters: Vec<Vec<&'static str>>,
    /// Per key: indices into `counters` of the counters it touches.
    touched: Vec<Vec<usize>>,
    /// Per counter: running entries counted there.
    usage: Vec<u32>,
    /// Per counter: the limit found by scanning every rule, refreshed on each rule change.
    limits: Vec<Limit>,
    /// Per counter: its limit once the current poll ends. Only an adaptive backstop, run
    /// while the poll checks a path, moves it, and only down; a queue whose own limit it
    /// lowered could not have taken a slot that the poll gave to a borrower.
    limits_after_poll: Vec<Limit>,
    /// Per key: paused by an operator.
    paused: Vec<bool>,
    /// Some rule adapts: adaptive counters' limits come from the scheduler.
    adaptive: bool,
    /// Deadlines of waiting entries that have one.
    deadline: HashMap<EntryId, u64>,
    /// Entries dropped past their deadline.
    pub expired: u64,
    /// Per key: the queue its last entry went into (alive while it holds entries).
    queue_of: Vec<Option<QueueId>>,
    /// Arrivals refused for a full queue.
    pub refused: u64,
    /// Largest fairness wait seen, for reporting.
    pub worst_wait: usize,
    /// Entries dispatched so far.
    pub dispatched: u64,
    /// Per key: the head that waited at the end of the last poll for a slot of one counter
    /// (its lock free, the only full counter on its path), and that counter.
    waited: Vec<Option<(EntryId, usize)>>,
    /// Entries dispatched on borrowed slots (beyond their key's guarantee).
    pub borrowed: u64,
    /// Per counter: new admissions while its rule had a quota.
    quota_used: Vec<u64>,
    /// Per counter: what ended entries spent while its rule had a budget.
    spent: Vec<u64>,
    /// Per counter: what admitted entries that have not ended hold reserved there.
    reserved: Vec<u64>,
    /// Per entry admitted and not ended: the reservations the scheduler handed it, and the
    /// model's own (counter, amount) of them.
    holds: HashMap<EntryId, Holds>,
    /// New entries held back by a spent budget at some poll.
    pub budget_held: u64,
    /// New entries held back by a used-up quota at some poll.
    pub quota_held: u64,
    /// The deployment every key's service is on.
    gates: Arc<Gates>,
    /// Head-polls held by the deployment gate alone.
    pub gate_held: u64,
}

/// What an admitted entry holds of its counters' budgets until it ends: the reservations the
/// scheduler handed it, and the model's own (counter, amount) of them.
type Holds = (Option<Box<crate::limiter::Reserved>>, Vec<(usize, u64)>);

/// Keys get different priorities, so waiters of one counter are reordered.
fn queue_key((i, (scope, key, object)): (usize, KeySpec)) -> QueueKey {
    QueueKey {
        scope: scope.map(|s| Scope::parse(s).unwrap()),
        limit_key: key.map(|k| LimitKey::parse(k).unwrap()),
        service: "S".into(),
        object_key: object.map(Into::into),
        priority: [Priority::NORMAL, Priority::HIGH, Priority::LOW][i % 3],
    }
}

impl Model {
    /// A model with an empty rule book and `invoker_limit` global slots.
    pub fn new(invoker_limit: u32) -> Self {
        let book = RuleBook::new();
        let mut counters: Vec<Vec<&'static str>> = Vec::new();
        let touched = KEYS
            .iter()
            .map(|(scope, limit_key, _)| {
                let Some(scope) = scope else {
                    return Vec::new();
                };
                let mut names = vec![*scope];
                names.extend(limit_key.iter().flat_map(|k| k.split('/')));
                (1..=names.len())
                    .map(|depth| {
                        let counter = names[..depth].to_vec();
                        counters
                            .iter()
                            .position(|c| *c == counter)
                            .unwrap_or_else(|| {
                                counters.push(counter);
                                counters.len() - 1
                            })
                    })
                    .collect()
            })
            .collect();
        let n = counters.len();
        let gates = Arc::new(Gates::new(PacingConfig {
            enabled: true,
            initial_window: 1 + (invoker_limit % 3),
            open_window: 6,
            max_closed_ms: 20,
            max_probe_ms: 8,
        }));
        gates.sync(&[Self::deployment(0)]);
        Self {
            sched: Scheduler::new(Arc::new(book.clone()), invoker_limit)
                .with_gates(Arc::clone(&gates)),
            book,
            keys: KEYS.iter().copied().enumerate().map(queue_key).collect(),
            invoker_limit,
            now: 0,
            next_id: 0,
            entry_key: HashMap::new(),
            waiting_resumed: vec![VecDeque::new(); KEYS.len()],
            waiting_new: vec![VecDeque::new(); KEYS.len()],
            running: HashMap::new(),
            running_order: Vec::new(),
            suspended: Vec::new(),
            lock_holder: HashMap::new(),
            completed: HashSet::new(),
            starved: vec![0; KEYS.len()],
            counters,
            touched,
            usage: vec![0; n],
            limits: vec![Limit::Unlimited; n],
            limits_after_poll: vec![Limit::Unlimited; n],
            paused: vec![false; KEYS.len()],
            queue_of: vec![None; KEYS.len()],
            deadline: HashMap::new(),
            adaptive: false,
            expired: 0,
            refused: 0,
            worst_wait: 0,
            dispatched: 0,
            waited: vec![None; KEYS.len()],
            borrowed: 0,
            quota_used: vec![0; n],
            quota_held: 0,
            spent: vec![0; n],
            reserved: vec![0; n],
            holds: HashMap::new(),
            budget_held: 0,
            gates,
            gate_held: 0,
        }
    }

    fn deployment(limit: u32) -> DeploymentLimits {
        DeploymentLimits::of(
            "dp",
            NonZeroU32::new(limit).map(NonZeroU32::get),
            &[("S", None)],
        )
    }

    fn gate(&self) -> Arc<Gate> {
        self.gates.for_service("S").deployment.expect("paced")
    }

    /// The deployment gate has room now (by the model's own count of what runs).
    fn gate_admits(&self) -> bool {
        let gate = self.gate();
        gate.closed_until(self.now).is_none()
            && gate.limit().is_none_or(|l| (self.running.len() as u32) < l)
    }

    /// Applies an event, polls, and checks every invariant.
    pub fn step(&mut self, event: &Event) {
        self.now += 1;
        match *event {
            Event::Arrive(key) => self.arrive(key % KEYS.len(), None),
            Event::ArriveBy(key, within) => {
                self.arrive(key % KEYS.len(), Some(self.now + within));
            }
            Event::Complete(i)
            | Event::CompleteSpending(i, _)
            | Event::Suspend(i)
            | Event::Fail(i, ..) => {
                if self.running_order.is_empty() {
                    return;
                }
                let id = self.running_order.remove(i % self.running_order.len());
                let run = self.running.remove(&id).expect("running");
                let signal = match *event {
                    Event::Fail(_, 0, _) => Signal::Down,
                    Event::Fail(_, 1, _) => Signal::Overloaded {
                        retry_after_ms: None,
                    },
                    Event::Fail(_, _, after) => Signal::Overloaded {
                        retry_after_ms: Some(after),
                    },
                    _ => Signal::Answered,
                };
                self.sched.report(&run.permit, signal, self.now);
                self.sched.release(run.permit, self.now);
                for &c in &self.touched[run.key] {
                    self.usage[c] -= 1;
                }
                if let Event::Complete(_) | Event::CompleteSpending(..) = *event {
                    let cost = match *event {
                        Event::CompleteSpending(_, cost) => cost,
                        _ => 0,
                    };
                    self.charge(id, run.key, cost);
                    if let Some(lock) = run.lock {
                        self.sched.unlock(lock, id, self.now);
                        let held = self.lock_holder.remove(&self.lock_of(run.key));
                        assert_eq!(held, Some(id), "completed entry did not hold its lock");
                    }
                    assert!(self.completed.insert(id), "entry {id} completed twice");
                } else {
                    self.suspended.push(id);
                }
            }
            Event::Resume(i) => {
                if self.suspended.is_empty() {
                    return;
                }
                let id = self.suspended.remove(i % self.suspended.len());
                let key = self.entry_key[&id];
                self.waiting_resumed[key].push_back(id);
                let q = self
                    .sched
                    .enqueue(&self.keys[key], id, EntryKind::Resumed, None, self.now);
                self.queue_of[key] = Some(q);
            }
            Event::Rule {
                pattern,
                limit,
                disabled,
                shadow,
                weight,
                max_queued,
                max_wait,
                adaptive,
                guaranteed,
                quota,
                budget,
            } => {
                let limit = NonZeroU32::new(limit).map_or(Limit::Unlimited, Limit::Concurrency);
                let pattern = RulePattern::parse(PATTERNS[pattern % PATTERNS.len()]).unwrap();
                let upsert = Upsert {
                    disabled,
                    shadow,
                    weight: NonZeroU32::new(weight),
                    max_queued: NonZeroU32::new(max_queued),
                    max_wait_ms: std::num::NonZeroU64::new(max_wait),
                    adaptive: adaptive.map(|(min, max)| AdaptiveLimit {
                        min: NonZeroU32::new(min.max(1)).unwrap(),
                        max: NonZeroU32::new(max.max(min).max(1)).unwrap(),
                    }),
                    guaranteed: NonZeroU32::new(guaranteed),
                    quota: std::num::NonZeroU64::new(quota).map(|amount| crate::quota::Quota {
                        amount,
                        window: crate::quota::QuotaWindow::Hour,
                        reject: false,
                    }),
                    budget: budget.and_then(|(amount, reserve)| {
                        Some(crate::quota::Budget {
                            limit: crate::quota::Quota {
                                amount: std::num::NonZeroU64::new(amount)?,
                                window: crate::quota::QuotaWindow::Hour,
                                reject: false,
                            },
                            // A reservation past the amount would hold its counter for good.
                            reserve: std::num::NonZeroU64::new(reserve.min(amount)),
                        })
                    }),
                    ..Upsert::new(pattern, limit)
                };
                self.book.apply_batch(&[upsert], self.now).unwrap();
                self.rules_changed();
            }
            Event::DeleteRule(p) => {
                let pattern = RulePattern::parse(PATTERNS[p % PATTERNS.len()]).unwrap();
                let delete = Delete {
                    pattern,
                    expected_version: None,
                };
                self.book.delete_batch(&[delete]).unwrap();
                self.rules_changed();
            }
            Event::PauseQueue(key) => {
                let key = key % KEYS.len();
                self.paused[key] = true;
                self.sched.pause(&self.keys[key], self.now);
            }
            Event::ResumeQueue(key) => {
                let key = key % KEYS.len();
                self.paused[key] = false;
                self.sched.resume(&self.keys[key], self.now);
            }
            Event::Deployment(limit) => self.gates.sync(&[Self::deployment(limit)]),
        }
        self.poll();
    }

    /// A new entry on `key` with request deadline `by`: refused for a full queue, or queued
    /// with the earlier of `by` and the tightest `max_wait` on its path, in deadline order.
    fn arrive(&mut self, key: usize, by: Option<u64>) {
        let full = self.touched[key].iter().any(|&c| {
            self.max_queued_of(&self.counters[c])
                .is_some_and(|max| self.queued_at(c) >= max)
        });
        let refusal = self.sched.refusal(&self.keys[key], self.now);
        assert_eq!(
            refusal.is_some(),
            full,
            "refusal {refusal:?} of {:?} disagrees with the queue bounds",
            KEYS[key]
        );
        if full {
            self.refused += 1;
            return;
        }
        self.next_id += 1;
        let id = self.next_id;
        self.entry_key.insert(id, key);
        let max_wait = self.touched[key]
            .iter()
            .filter_map(|&c| self.rule_of(&self.counters[c]).and_then(|r| r.max_wait_ms))
            .map(|ms| self.now + ms.get())
            .min();
        let deadline = by.into_iter().chain(max_wait).min();
        let due = |e: &EntryId, deadlines: &HashMap<EntryId, u64>| {
            deadlines.get(e).copied().unwrap_or(u64::MAX)
        };
        match deadline {
            Some(at) if KEYS[key].2.is_none() => {
                let place = self.waiting_new[key].partition_point(|e| due(e, &self.deadline) <= at);
                self.waiting_new[key].insert(place, id);
            }
            _ => self.waiting_new[key].push_back(id),
        }
        if let Some(at) = deadline {
            self.deadline.insert(id, at);
        }
        let q = self
            .sched
            .enqueue_with_deadline(&self.keys[key], id, None, by, self.now, self.now);
        // The model's books have no `on_full`: nothing is dropped on arrival.
        self.queue_of[key] = Some(q.expect("queued"));
    }

    /// What the scheduler dropped past its deadline: exactly the waiting entries now due.
    fn check_expired(&mut self) {
        for expired in self.sched.take_expired() {
            let e = expired.entry;
            let at = self.deadline.remove(&e);
            assert_eq!(
                at,
                Some(expired.deadline.at),
                "entry {e} expired at the wrong deadline"
            );
            assert!(expired.deadline.at <= self.now, "entry {e} expired early");
            let key = self.entry_key[&e];
            let before = self.waiting_new[key].len();
            self.waiting_new[key].retain(|w| *w != e);
            assert_eq!(
                self.waiting_new[key].len() + 1,
                before,
                "entry {e} was not waiting"
            );
            assert!(self.completed.insert(e), "entry {e} ended twice");
            self.expired += 1;
        }
    }

    /// No entry still waits past its deadline (the map holds only waiting entries).
    fn check_none_overdue(&self) {
        for (e, at) in &self.deadline {
            assert!(*at > self.now, "entry {e} waits past its deadline {at}");
        }
    }

    /// Entries waiting (not running, not suspended) in queues whose path holds counter `c`.
    fn queued_at(&self, c: usize) -> u32 {
        (0..KEYS.len())
            .filter(|k| self.touched[*k].contains(&c))
            .map(|k| (self.waiting_new[k].len() + self.waiting_resumed[k].len()) as u32)
            .sum()
    }

    fn rules_changed(&mut self) {
        self.sched
            .on_rules_changed(Arc::new(self.book.clone()), self.now);
        self.limits = (0..self.counters.len())
            .map(|c| self.limit_of(&self.counters[c]))
            .collect();
        self.adaptive = self.book.rules().any(|r| r.adaptive.is_some());
        self.refresh_adaptive();
    }

    /// The limits of adaptive counters, as the scheduler has them now: each within its rule's
    /// bounds (they move with hold times and the backstop, which the model does not redo).
    fn refresh_adaptive(&mut self) {
        if !self.adaptive {
            return;
        }
        let live = self.sched.counters(self.now);
        for c in 0..self.counters.len() {
            let Some(bounds) = self
                .rule_of(&self.counters[c])
                .filter(|r| r.limit == Limit::Unlimited)
                .and_then(|r| r.adaptive)
            else {
                continue;
            };
            let names = &self.counters[c];
            let found = live.iter().find(|s| {
                s.scope == names[0]
                    && s.l1.as_deref() == names.get(1).copied()
                    && s.l2.as_deref() == names.get(2).copied()
            });
            // A counter not live yet starts at `min`.
            let limit = found.map_or(bounds.min.get(), |s| {
                s.limit
                    .concurrency()
                    .expect("an adaptive counter is bounded")
            });
            assert!(
                (bounds.min.get()..=bounds.max.get()).contains(&limit),
                "adaptive limit {limit} of {names:?} outside {bounds:?}"
            );
            self.limits[c] = Limit::Concurrency(NonZeroU32::new(limit).unwrap());
        }
    }

    fn poll(&mut self) {
        // A poll may only lower an adaptive limit (its backstop): admissions are checked
        // against the limits from before it, waits against the ones after it.
        self.refresh_adaptive();
        let dispatched = self.sched.poll_runnable(self.now);
        // The limits after the poll, read once: only the poll's own checks run a backstop, so
        // nothing below moves them again.
        let before = self.limits.clone();
        self.refresh_adaptive();
        self.limits_after_poll = std::mem::replace(&mut self.limits, before);
        // The poll drops what is past its deadline before it admits anything.
        self.check_expired();
        for dispatch in dispatched {
            self.on_dispatch(dispatch);
        }
        self.check_none_overdue();
        self.check_positions();
        self.check_waiting_sums();
        self.waited = (0..KEYS.len()).map(|key| self.waits_for_one(key)).collect();
        self.quota_held += (0..KEYS.len())
            .filter(|&key| {
                self.head(key).is_some()
                    && self.waiting_resumed[key].is_empty()
                    && self.touched[key]
                        .iter()
                        .any(|&c| self.quota_of(c).is_some_and(|a| self.quota_used[c] >= a))
            })
            .count() as u64;
        self.budget_held += (0..KEYS.len())
            .filter(|&key| {
                self.head(key).is_some()
                    && self.waiting_resumed[key].is_empty()
                    && self.touched[key].iter().any(|&c| self.budget_spent(c))
            })
            .count() as u64;
        self.limits.clone_from(&self.limits_after_poll);
        assert_eq!(
            self.gate().used(),
            self.running.len() as u32,
            "the deployment gate counts what runs"
        );
        if !self.gate_admits() {
            self.gate_held += (0..KEYS.len())
                .filter(|&key| {
                    self.head(key)
                        .is_some_and(|head| self.admissible_past_gate(key, head))
                })
                .count() as u64;
        }
        if (self.running.len() as u32) < self.invoker_limit {
            for (key, spec) in KEYS.iter().enumerate() {
                if self.paused[key] {
                    continue;
                }
                if let Some(head) = self.head(key) {
                    assert!(
                        !self.admissible(key, head),
                        "lost wake-up: entry {head} of queue {spec:?} could run but waits ({:?})",
                        self.sched
                            .queues()
                            .into_iter()
                            .find(|q| q.key == self.keys[key])
                            .map(|q| (q.status, q.blocked_on))
                    );
                }
            }
        }
    }

    /// The calls waiting per scope, as a subscription's bound reads them (sums, no snapshot),
    /// agree with the queues' snapshots.
    fn check_waiting_sums(&self) {
        let service = &self.keys[0].service;
        let mut from_snapshots = std::collections::HashMap::new();
        for queue in self.sched.queues() {
            if queue.key.service == *service && queue.queued > 0 {
                *from_snapshots.entry(queue.key.scope.clone()).or_insert(0) += queue.queued;
            }
        }
        assert_eq!(self.sched.waiting_by_scope(service), from_snapshots);
    }

    /// Each waiting entry's position is its place in the model's order: one queue per step,
    /// in turn, its first few entries and its last (a lookup scans the queue, and simulated
    /// queues grow long).
    fn check_positions(&self) {
        let key = (self.now % KEYS.len() as u64) as usize;
        let order: Vec<EntryId> = self.waiting_resumed[key]
            .iter()
            .chain(&self.waiting_new[key])
            .copied()
            .collect();
        let Some(q) = self.queue_of[key] else {
            assert!(order.is_empty(), "entries waiting without a queue");
            return;
        };
        let n = order.len();
        for (at, entry) in order.iter().enumerate() {
            if at >= 3 && at + 1 < n {
                continue;
            }
            let place = self.sched.position(q, *entry, self.now);
            assert_eq!(
                place.map(|p| p.position),
                Some(at + 1),
                "entry {entry} of queue {:?} is {} in line",
                KEYS[key],
                at + 1
            );
        }
    }

    fn head(&self, key: usize) -> Option<EntryId> {
        self.waiting_resumed[key]
            .front()
            .or_else(|| self.waiting_new[key].front())
            .copied()
    }

    fn on_dispatch(&mut self, d: Dispatch) {
        let key = self.entry_key[&d.entry];
        assert!(!self.paused[key], "a paused queue dispatched {}", d.entry);
        assert!(
            !self.running.contains_key(&d.entry),
            "entry {} runs twice",
            d.entry
        );
        assert!(
            (self.running.len() as u32) < self.invoker_limit,
            "invoker limit {} exceeded",
            self.invoker_limit
        );
        assert_eq!(
            Some(d.entry),
            self.head(key),
            "queue order broken for {:?}",
            KEYS[key]
        );
        assert!(
            self.limits_admit(key),
            "entry {} admitted over a limit",
            d.entry
        );
        assert!(
            self.gate_admits(),
            "entry {} admitted past its deployment gate ({} running, limit {:?}, closed until {:?})",
            d.entry,
            self.running.len(),
            self.gate().limit(),
            self.gate().closed_until(self.now)
        );
        let expected_kind = if self.waiting_resumed[key].is_empty() {
            EntryKind::New
        } else {
            EntryKind::Resumed
        };
        assert_eq!(d.kind, expected_kind);
        if KEYS[key].2.is_some() {
            let lock = self.lock_of(key);
            let holder = self.lock_holder.entry(lock).or_insert(d.entry);
            assert_eq!(*holder, d.entry, "two holders of one object lock");
        }
        // Fairness: every other waiting, admissible queue waited one more dispatch.
        for (other, spec) in KEYS.iter().enumerate() {
            if other == key {
                continue;
            }
            let ready = self.sched.is_ready(&self.keys[other]);
            match self.head(other) {
                Some(head) if ready && self.admissible(other, head) => {
                    self.starved[other] += 1;
                    self.worst_wait = self.worst_wait.max(self.starved[other]);
                    assert!(
                        self.starved[other] <= FAIRNESS_BOUND,
                        "queue {spec:?} starved for {} dispatches",
                        self.starved[other]
                    );
                }
                _ => self.starved[other] = 0,
            }
        }
        self.starved[key] = 0;
        if d.kind == EntryKind::New
            && let Some(at) = self.deadline.remove(&d.entry)
        {
            assert!(
                at > self.now,
                "entry {} started past its deadline {at}",
                d.entry
            );
        }
        match d.kind {
            EntryKind::Resumed => self.waiting_resumed[key].pop_front(),
            EntryKind::New => self.waiting_new[key].pop_front(),
        };
        self.check_given_back(key);
        let mut held = Vec::new();
        for &c in &self.touched[key] {
            self.usage[c] += 1;
            if d.kind == EntryKind::New
                && let Some(amount) = self.quota_of(c)
            {
                assert!(
                    self.quota_used[c] < amount,
                    "{:?} admitted past its quota of {amount}",
                    self.counters[c]
                );
                self.quota_used[c] += 1;
            }
            if d.kind == EntryKind::New
                && let Some((amount, reserve)) = self.budget_of(c)
            {
                assert!(
                    !self.budget_spent(c),
                    "{:?} admitted past its budget of {amount}: {} spent, {} reserved",
                    self.counters[c],
                    self.spent[c],
                    self.reserved[c]
                );
                if reserve > 0 {
                    self.reserved[c] += reserve;
                    held.push((c, reserve));
                }
            }
        }
        let mut permit = d.permit;
        if d.kind == EntryKind::New {
            // What the scheduler reserved is the rules' `reserve` at each counter, by level.
            let reserved = permit.take_reserved();
            let mut expected = crate::limiter::Reserved::default();
            for &(c, amount) in &held {
                expected[self.counters[c].len() - 1] = amount;
            }
            assert_eq!(
                reserved.as_deref().copied().unwrap_or_default(),
                expected,
                "the reservations of entry {} on {:?}",
                d.entry,
                KEYS[key]
            );
            self.holds.insert(d.entry, (reserved, held));
        }
        self.running_order.push(d.entry);
        self.running.insert(
            d.entry,
            Running {
                key,
                permit,
                lock: d.lock,
            },
        );
        self.dispatched += 1;
    }

    /// The head of `key` and the counter it waits for, when that counter is the only thing
    /// holding it (its lock free, every other counter on its path with room).
    fn waits_for_one(&self, key: usize) -> Option<(EntryId, usize)> {
        let head = self.head(key)?;
        // Held by the deployment gate too: it waits there, not in the counter's line.
        if !self.gate_admits() {
            return None;
        }
        // A new entry held by a quota used up (or a budget spent) on its path waits for the
        // window, not in a counter's line either: it has no claim on a slot given back until
        // it re-checks.
        if !self.waiting_resumed[key].contains(&head)
            && self.touched[key].iter().any(|&c| {
                self.quota_of(c).is_some_and(|a| self.quota_used[c] >= a) || self.budget_spent(c)
            })
        {
            return None;
        }
        let lock_free = KEYS[key].2.is_none()
            || self
                .lock_holder
                .get(&self.lock_of(key))
                .is_none_or(|h| *h == head);
        let mut full = self.touched[key]
            .iter()
            .filter(|&&c| !self.limits[c].admits(self.usage[c]));
        let only = *full.next()?;
        (lock_free && full.next().is_none()).then_some((head, only))
    }

    /// The guarantee of counter `c` under a burstable rule (0: none).
    fn guaranteed_of(&self, c: usize) -> u32 {
        self.rule_of(&self.counters[c])
            .filter(|r| matches!(r.limit, Limit::Concurrency(max) if r.guaranteed.is_some_and(|g| g < max)))
            .and_then(|r| r.guaranteed)
            .map_or(0, NonZeroU32::get)
    }

    /// Borrowed slots go back first: an entry of `key` that borrows at one of its counters
    /// (usage at or past its guarantee) may not take its parent's last slot while another
    /// queue whose head waited since the last poll, within its guarantee there, could have
    /// run.
    fn check_given_back(&mut self, key: usize) {
        let path = &self.touched[key];
        for at in 1..path.len() {
            let (parent, child) = (path[at - 1], path[at]);
            let g = self.guaranteed_of(child);
            if g == 0 || self.usage[child] < g {
                continue;
            }
            self.borrowed += 1;
            if self.limits[parent].admits(self.usage[parent] + 1)
                || self.running.len() as u32 + 1 >= self.invoker_limit
            {
                continue;
            }
            for (other, spec) in KEYS.iter().enumerate() {
                let Some(at_parent) = self.touched[other].iter().position(|c| *c == parent) else {
                    continue;
                };
                let Some(&own) = self.touched[other].get(at_parent + 1) else {
                    continue;
                };
                let Some(head) = self.head(other) else {
                    continue;
                };
                if other == key
                    || own == child
                    || self.paused[other]
                    || self.waited[other] != Some((head, parent))
                {
                    continue;
                }
                let within = self.guaranteed_of(own);
                // The model does not redo the backstop, so a lowering it made after this
                // dispatch in the same poll excuses the borrower too.
                let not_lowered = self.touched[other]
                    .iter()
                    .all(|&c| self.limits_after_poll[c].admits(self.usage[c]));
                if (within == 0 || self.usage[own] < within)
                    && self.admissible(other, head)
                    && not_lowered
                {
                    panic!(
                        "a borrower of {:?} took the last slot of {:?} while {spec:?}, within its guarantee, waited",
                        KEYS[key], self.counters[parent]
                    );
                }
            }
        }
    }

    /// Queues sharing one object lock map to the lowest key index with that lock.
    fn lock_of(&self, key: usize) -> usize {
        let (scope, _, object) = KEYS[key];
        (0..KEYS.len())
            .find(|k| KEYS[*k].0 == scope && KEYS[*k].2 == object)
            .expect("itself at least")
    }

    fn admissible(&self, key: usize, head: EntryId) -> bool {
        self.admissible_past_gate(key, head) && self.gate_admits()
    }

    /// Its lock and limits let `head` run (the deployment gate aside).
    fn admissible_past_gate(&self, key: usize, head: EntryId) -> bool {
        let lock_free = KEYS[key].2.is_none()
            || self
                .lock_holder
                .get(&self.lock_of(key))
                .is_none_or(|h| *h == head);
        lock_free && self.limits_admit(key)
    }

    /// Every counter the key touches has usage < limit, and, for a new entry at the head, its
    /// quota and budget left.
    fn limits_admit(&self, key: usize) -> bool {
        let new = self.waiting_resumed[key].is_empty();
        self.touched[key].iter().all(|&c| {
            self.limits[c].admits(self.usage[c])
                && !(new
                    && (self.quota_of(c).is_some_and(|a| self.quota_used[c] >= a)
                        || self.budget_spent(c)))
        })
    }

    /// The budget of counter `c`'s rule and its reservation per call (0: none).
    fn budget_of(&self, c: usize) -> Option<(u64, u64)> {
        self.rule_of(&self.counters[c])
            .and_then(|r| r.budget)
            .map(|b| (b.limit.amount.get(), b.reserve.map_or(0, |r| r.get())))
    }

    /// Whether counter `c`'s budget leaves no room for a new entry: what was spent and what
    /// is held reserved, plus the entry's own reservation (at least 1), is past it.
    fn budget_spent(&self, c: usize) -> bool {
        self.budget_of(c).is_some_and(|(amount, reserve)| {
            self.spent[c] + self.reserved[c] + reserve.max(1) > amount
        })
    }

    /// Entry `id` of `key` ended having spent `cost`: charged to the counters on its path whose
    /// rules have a budget now, each up to what one call may charge, and what it held
    /// reserved goes back.
    fn charge(&mut self, id: EntryId, key: usize, cost: u64) {
        let (reserved, held) = self.holds.remove(&id).unwrap_or_default();
        self.sched
            .charge(&self.keys[key], cost, reserved.as_deref(), self.now);
        for (c, amount) in held {
            self.reserved[c] -= amount;
        }
        for &c in &self.touched[key] {
            // One call charges at most its reserve, else the whole budget (the rest is an
            // overrun, cut).
            if let Some((amount, reserve)) = self.budget_of(c) {
                let most = if reserve > 0 { reserve } else { amount };
                self.spent[c] += cost.min(most);
            }
        }
    }

    /// The quota of counter `c`'s rule, new admissions per window.
    fn quota_of(&self, c: usize) -> Option<u64> {
        self.rule_of(&self.counters[c])
            .and_then(|r| r.quota)
            .map(|q| q.amount.get())
    }

    /// Brute force over every rule: the most specific enabled, enforced rule of the counter's
    /// level.
    fn rule_of(&self, counter: &[&str]) -> Option<&super::rules::Rule> {
        let level = Level::ALL[counter.len() - 1];
        self.book
            .rules()
            .filter(|r| !r.disabled && !r.shadow && r.pattern.level() == level)
            .filter(|r| {
                r.pattern
                    .matches(counter[0], counter.get(1).copied(), counter.get(2).copied())
            })
            .max_by_key(|r| r.pattern.rank())
    }

    fn limit_of(&self, counter: &[&str]) -> Limit {
        self.rule_of(counter).map_or(Limit::Unlimited, |r| r.limit)
    }

    fn max_queued_of(&self, counter: &[&str]) -> Option<u32> {
        self.rule_of(counter)
            .and_then(|r| r.max_queued)
            .map(NonZeroU32::get)
    }

    /// Completes and resumes everything until nothing is left; every arrival must complete once.
    pub fn drain(&mut self) {
        // Quotas and budgets go (a used-up one would hold its entries until the next hour);
        // the other rules stay as they are: with nothing running every counter admits at
        // least one.
        let quotas: Vec<Upsert> = self
            .book
            .rules()
            .filter(|r| r.quota.is_some() || r.budget.is_some())
            .map(|r| Upsert {
                rate: r.rate,
                max_queued: r.max_queued,
                weight: r.weight,
                max_wait_ms: r.max_wait_ms,
                adaptive: r.adaptive,
                guaranteed: r.guaranteed,
                shadow: r.shadow,
                disabled: r.disabled,
                ..Upsert::new(r.pattern.clone(), r.limit)
            })
            .collect();
        if !quotas.is_empty() {
            self.book.apply_batch(&quotas, self.now).unwrap();
            self.rules_changed();
            self.poll();
        }
        for key in 0..KEYS.len() {
            if self.paused[key] {
                self.step(&Event::ResumeQueue(key));
            }
        }
        for round in 0.. {
            assert!(round < 100_000, "drain did not finish: something is stuck");
            if self.running.is_empty() && self.suspended.is_empty() {
                if (0..KEYS.len()).all(|k| self.head(k).is_none()) {
                    break;
                }
                // A deployment closed by a `Retry-After` opens when it said.
                if let Some(until) = self.gate().closed_until(self.now) {
                    self.now = until;
                }
                self.poll();
                assert!(!self.running.is_empty(), "entries wait but nothing can run");
                continue;
            }
            if self.running.is_empty() {
                self.step(&Event::Resume(0));
            } else {
                self.step(&Event::Complete(0));
            }
        }
        assert_eq!(self.completed.len() as u64, self.next_id, "entries lost");
        assert_eq!(self.sched.running(), 0);
        assert!(self.sched.queues().is_empty(), "queues left behind");
        assert!(self.sched.counters(0).is_empty(), "counters left behind");
    }
}
