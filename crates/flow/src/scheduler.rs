//! The per-partition scheduler: virtual queues, deficit round robin across them, and admission
//! through the virtual-object lock, the user limits and the invoker's global slots, in that order.
//!
//! A queue groups the entries of one (scope, limit key, service, object key of exclusive
//! virtual-object handlers). Inside a queue, resumed entries go before new ones, each FIFO.
//! Ready queues sit in a ring; a visit adds one unit of credit (capped at 2) and dispatches the
//! head when the credit covers its weight (new 2, resumed 1), so at most one entry per visit and
//! resumed work runs twice as often. A queue that cannot be admitted leaves the ring and parks at
//! what blocked it (a lock, or the deepest full counter, where waiters are ordered by
//! priority and weighted fair across sibling keys); it comes back when woken. A paused queue
//! keeps its entries and leaves the ring until it is resumed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use hashbrown::{HashMap, HashSet};

mod admission;
mod crowds;
mod deadlines;
mod drain;
mod gated;
mod limits;
mod locks;
mod operator;
mod snapshot;

pub use super::limiter::{IdleBound, Refusal, RefusalReason};
pub use crowds::{CrowdedOut, Fate};
pub use deadlines::{Deadline, DeadlineCause, Expired, ExpiredCount};
pub use drain::Position;
use locks::Locks;
pub use locks::{LockId, LockKey};
pub use snapshot::{BlockedOn, QueuePage, QueueSnapshot, QueueStatus, StageCounts};

use super::gates::Gates;
use super::limiter::{self, Blocked, CounterId, CounterPath, Limiter, Ticket, WaiterId};
use super::priority::Priority;
use super::rules::RuleBook;
use super::scope::{LimitKey, Scope};
use super::slots::InvokerSlots;
use gated::{GateTable, QueueGates};

/// The caller's id of an entry (an invocation).
pub type EntryId = u64;

/// Most entries one poll dispatches, so one poll never runs long.
pub const MAX_DISPATCH_PER_POLL: usize = 1000;

/// Credit a queue may hold: the heaviest entry's weight.
const MAX_CREDIT: u8 = 2;

/// Whether an entry starts fresh or comes back (after suspension or back-off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryKind {
    /// Never ran.
    New,
    /// Ran before; holds its queue's lock if the queue has one.
    Resumed,
}

impl EntryKind {
    fn weight(self) -> u8 {
        match self {
            EntryKind::New => 2,
            EntryKind::Resumed => 1,
        }
    }
}

/// `flow.deadline-horizon`'s default: 5 minutes.
pub const DEFAULT_DEADLINE_HORIZON_MS: u64 = 5 * 60 * 1000;

/// What a queue is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueueKey {
    /// Flow-control scope; unscoped queues never touch user limits.
    pub scope: Option<Scope>,
    /// Limit key under the scope.
    pub limit_key: Option<LimitKey>,
    /// Target service.
    pub service: Box<str>,
    /// Object key, only for exclusive virtual-object handlers: their entries take the object lock.
    pub object_key: Option<Box<str>>,
    /// The priority of its entries among the waiters of a counter.
    pub priority: Priority,
}

/// Index of a queue; stable while the queue lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId(u32);

impl QueueId {
    /// Its number within the partition.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// An entry waiting for its run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: u64,
    /// Ties broken by arrival.
    seq: u64,
    queue: QueueId,
    entry: EntryId,
    kind: EntryKind,
}

/// What a parked queue waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resource {
    Lock(LockId),
    /// A slot of a counter.
    Counter(CounterId),
    /// A token of a rate limited counter.
    Token(CounterId),
    /// A slot of a deployment gate (an index into the gate table).
    Gate(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Empty, not in the ring.
    Idle,
    /// In the ring.
    Ready,
    /// In the waiter list of a resource, with its place in line at a counter.
    Parked(Resource, Option<Ticket>, Option<Blocked>),
    /// Paused by an operator: out of the ring, entries kept.
    Paused,
}

#[derive(Debug)]
struct Queue {
    key: QueueKey,
    path: Option<CounterPath>,
    lock: Option<LockId>,
    /// The deployment gates its attempts pass.
    gates: QueueGates,
    resumed: VecDeque<EntryId>,
    new: VecDeque<EntryId>,
    /// Entries of this queue waiting in the timer heap.
    delayed: u32,
    credit: u8,
    state: State,
    /// Set when woken: the reservation to settle at its next check, and the place in line it
    /// keeps if it has to wait there again.
    woken_from: Option<(Resource, Option<Ticket>)>,
    /// When the current state began.
    since: u64,
    /// When the queue was created, its last entry arrived, an entry first started, and an
    /// entry was last dispatched (ms; 0: never), for introspection.
    times: QueueTimes,
    /// Its recent drain rate, for the ETA of its waiting entries.
    drain: drain::Drain,
}

/// A queue's introspection timestamps (ms since the epoch; 0: not yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueTimes {
    /// The queue was created.
    pub created_at: u64,
    /// A new entry last arrived.
    pub last_enqueued_at: u64,
    /// A new entry last started (its first attempt).
    pub last_start_at: u64,
    /// An entry last started an attempt (new or resumed).
    pub last_attempt_at: u64,
}

impl Queue {
    fn head(&self) -> Option<(EntryId, EntryKind)> {
        self.resumed
            .front()
            .map(|e| (*e, EntryKind::Resumed))
            .or_else(|| self.new.front().map(|e| (*e, EntryKind::New)))
    }

    fn len(&self) -> usize {
        self.resumed.len() + self.new.len()
    }
}

/// Slots an entry holds while its attempt runs: one invoker slot and its user counters.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a permit holds slots until it is released"]
pub struct Permit {
    counters: Option<limiter::Permit>,
    gates: QueueGates,
    /// Whose it is: a counter with an `on_full` lists the entries running on its slots.
    entry: EntryId,
}

impl Permit {
    /// What it reserved of its counters' budgets (see [`limiter::Permit::take_reserved`]).
    pub fn take_reserved(&mut self) -> Option<Box<crate::limiter::Reserved>> {
        self.counters.as_mut()?.take_reserved()
    }

    /// Says which handler runs on it (a number equal for equal handlers): adaptive limits keep
    /// a latency baseline per handler.
    pub fn classify(&mut self, class: u64) {
        if let Some(counters) = self.counters.as_mut() {
            counters.classify(class);
        }
    }
}

/// An entry the scheduler decided to run now.
#[derive(Debug)]
pub struct Dispatch {
    /// The entry.
    pub entry: EntryId,
    /// Its queue.
    pub queue: QueueId,
    /// New or resumed.
    pub kind: EntryKind,
    /// Give back with [`Scheduler::release`] when the attempt ends, suspends, pauses or backs off.
    pub permit: Permit,
    /// The object lock it now holds, until [`Scheduler::unlock`] when the invocation completes.
    pub lock: Option<LockId>,
}

/// The scheduler of one partition.
#[derive(Debug)]
pub struct Scheduler {
    book: Arc<RuleBook>,
    limiter: Limiter,
    queues: Vec<Option<Queue>>,
    free_queues: Vec<u32>,
    queue_index: HashMap<QueueKey, QueueId>,
    locks: Locks,
    ring: VecDeque<QueueId>,
    slots: Arc<InvokerSlots>,
    /// This scheduler's index among those sharing `slots`.
    member: u32,
    running: u32,
    /// Members waiting for an invoker slot that this scheduler gave back.
    nudge: u64,
    timers: BinaryHeap<Reverse<Timer>>,
    timer_seq: u64,
    woken: Vec<WaiterId>,
    /// Queues an operator paused, kept while their queue comes and goes.
    paused: HashSet<QueueKey>,
    /// Deadlines of waiting entries, and the entries that passed theirs.
    deadlines: deadlines::Deadlines,
    /// Deadlines further than this from when a wait began do not order it.
    deadline_horizon_ms: u64,
    /// The deployment gates its queues pass, and the queues parked at them.
    gates: GateTable,
    /// The last poll's time: gates closed until later wake the partition then.
    polled_at: u64,
    /// What `on_full` decisions named, for the caller to end (`crowds.rs`).
    crowded: Vec<CrowdedOut>,
}

impl Scheduler {
    /// A scheduler over `book` with `invoker_limit` slots of its own.
    pub fn new(book: Arc<RuleBook>, invoker_limit: u32) -> Self {
        Self::sharing(book, Arc::new(InvokerSlots::new(invoker_limit)), 0)
    }

    /// A scheduler over `book`, member `member` of those sharing the invoker's `slots`.
    pub fn sharing(book: Arc<RuleBook>, slots: Arc<InvokerSlots>, member: u32) -> Self {
        Self {
            book,
            limiter: Limiter::new(),
            queues: Vec::new(),
            free_queues: Vec::new(),
            queue_index: HashMap::new(),
            locks: Locks::default(),
            ring: VecDeque::new(),
            slots,
            member,
            running: 0,
            nudge: 0,
            timers: BinaryHeap::new(),
            timer_seq: 0,
            woken: Vec::new(),
            paused: HashSet::new(),
            deadlines: deadlines::Deadlines::default(),
            deadline_horizon_ms: DEFAULT_DEADLINE_HORIZON_MS,
            gates: GateTable::default(),
            polled_at: 0,
            crowded: Vec::new(),
        }
    }

    /// Orders only by deadlines within `ms` of when an entry's wait began
    /// (`flow.deadline-horizon`); further ones wait in arrival order.
    pub fn with_deadline_horizon(mut self, ms: u64) -> Self {
        self.deadline_horizon_ms = ms;
        self
    }

    /// Keeps the quota use of at most `max` idle counters (`flow.max-idle-quota-counters`),
    /// `per_scope` of them in one scope (`flow.max-idle-quota-counters-per-scope`); new work
    /// that would need one more is refused (see
    /// [`crate::limiter::RefusalReason::IdleQuotasFull`]).
    pub fn with_idle_quota_cap(mut self, max: usize, per_scope: usize) -> Self {
        self.limiter.set_idle_quota_cap(max, per_scope);
        self
    }

    /// Counts attempts against the deployment gates of `gates` too (every queue created from
    /// now on looks its service's gates up there).
    pub fn with_gates(mut self, gates: Arc<Gates>) -> Self {
        self.gates = GateTable::new(Some(gates));
        self
    }

    fn queue(&self, id: QueueId) -> &Queue {
        self.queues[id.0 as usize].as_ref().expect("live queue")
    }

    fn queue_mut(&mut self, id: QueueId) -> &mut Queue {
        self.queues[id.0 as usize].as_mut().expect("live queue")
    }

    /// Attempts of this scheduler running now.
    pub fn running(&self) -> u32 {
        self.running
    }

    /// Changes the invoker's global slots; extra running attempts are not revoked.
    pub fn set_invoker_limit(&mut self, limit: u32) {
        self.slots.set_limit(limit);
    }

    /// Other schedulers that wait for the invoker slots this one gave back since the last
    /// call: they should poll again.
    pub fn take_nudges(&mut self) -> u64 {
        std::mem::take(&mut self.nudge)
    }

    fn give_back_slot(&mut self) {
        let waiting = self.slots.give_back();
        self.nudge |= waiting;
    }

    /// The rule book in use.
    pub fn rules(&self) -> &Arc<RuleBook> {
        &self.book
    }

    /// Queues an entry; with `run_at` in the future it waits for that time first.
    pub fn enqueue(
        &mut self,
        key: &QueueKey,
        entry: EntryId,
        kind: EntryKind,
        run_at: Option<u64>,
        now: u64,
    ) -> QueueId {
        let q = self.queue_for(key, now);
        self.enqueue_into(q, entry, kind, run_at, now);
        q
    }

    /// [`Scheduler::enqueue`] into the live queue `q`.
    fn enqueue_into(
        &mut self,
        q: QueueId,
        entry: EntryId,
        kind: EntryKind,
        run_at: Option<u64>,
        now: u64,
    ) {
        match run_at {
            Some(at) if at > now => {
                self.queue_mut(q).delayed += 1;
                self.timer_seq += 1;
                self.timers.push(Reverse(Timer {
                    at,
                    seq: self.timer_seq,
                    queue: q,
                    entry,
                    kind,
                }));
            }
            _ => self.push_entry(q, entry, kind, now),
        }
    }

    /// Whether a new entry for `key` must be refused rather than queued (`max-queued`, or a
    /// rate that rejects); unscoped work never is.
    pub fn refusal(&mut self, key: &QueueKey, now: u64) -> Option<Refusal> {
        // Most books refuse nothing: no counters are looked up (or created) per submission.
        if !self.book.may_refuse() {
            return None;
        }
        self.on_path(key, |limiter, path, book| limiter.refusal(path, book, now))
            .flatten()
    }

    /// Runs `f` on the counters of `key`'s path (made for it and given back after); `None`
    /// for a key under no scope, which touches no counter.
    fn on_path<T>(
        &mut self,
        key: &QueueKey,
        f: impl FnOnce(&mut Limiter, &CounterPath, &RuleBook) -> T,
    ) -> Option<T> {
        let scope = key.scope.as_ref()?;
        let path = self.limiter.path(scope, key.limit_key.as_ref());
        let out = f(&mut self.limiter, &path, &self.book);
        self.limiter.drop_path(path);
        Some(out)
    }

    /// The earliest `run_at` still waiting, or token due, so the caller knows when to poll
    /// again.
    pub fn next_timer(&self) -> Option<u64> {
        let run_at = self.timers.peek().map(|Reverse(timer)| timer.at);
        run_at
            .into_iter()
            .chain(self.limiter.next_wake())
            .chain(self.deadlines.next())
            .chain(self.gates.next_open(self.polled_at))
            .min()
    }

    fn queue_for(&mut self, key: &QueueKey, now: u64) -> QueueId {
        if let Some(id) = self.queue_index.get(key) {
            return *id;
        }
        let path = key
            .scope
            .as_ref()
            .map(|scope| self.limiter.path(scope, key.limit_key.as_ref()));
        let lock = key.object_key.as_ref().map(|object_key| {
            self.locks.add_ref(LockKey {
                scope: key.scope.clone(),
                service: key.service.clone(),
                object_key: object_key.clone(),
            })
        });
        let gates = self.gates.resolve(&key.service);
        let queue = Queue {
            key: key.clone(),
            path,
            lock,
            gates,
            resumed: VecDeque::new(),
            new: VecDeque::new(),
            delayed: 0,
            credit: 0,
            state: if self.paused.contains(key) {
                State::Paused
            } else {
                State::Idle
            },
            woken_from: None,
            since: now,
            times: QueueTimes {
                created_at: now,
                ..QueueTimes::default()
            },
            drain: drain::Drain::default(),
        };
        let id = match self.free_queues.pop() {
            Some(slot) => {
                self.queues[slot as usize] = Some(queue);
                QueueId(slot)
            }
            None => {
                self.queues.push(Some(queue));
                QueueId(u32::try_from(self.queues.len() - 1).expect("fewer than 2^32 queues"))
            }
        };
        self.queue_index.insert(key.clone(), id);
        id
    }

    fn push_entry(&mut self, q: QueueId, entry: EntryId, kind: EntryKind, now: u64) {
        if let Some(path) = self.queue(q).path {
            self.limiter.count_queued(&path, true);
        }
        let place = match kind {
            EntryKind::New => self.edf_place(q, entry),
            EntryKind::Resumed => None,
        };
        let queue = self.queue_mut(q);
        match kind {
            EntryKind::New => {
                match place {
                    Some(at) => queue.new.insert(at, entry),
                    None => queue.new.push_back(entry),
                }
                queue.times.last_enqueued_at = now;
            }
            EntryKind::Resumed => queue.resumed.push_back(entry),
        }
        if kind == EntryKind::Resumed {
            // A resumed entry of an exclusive handler still holds its object's lock.
            if let Some(lock) = queue.lock {
                self.locks.claim(lock, entry, now);
            }
        }
        let queue = self.queue_mut(q);
        match queue.state {
            State::Paused => {}
            State::Idle => {
                queue.state = State::Ready;
                queue.since = now;
                self.ring.push_back(q);
            }
            // The head may have changed (a resumed entry goes first): look again.
            State::Parked(..) if kind == EntryKind::Resumed => self.unpark(q, now),
            _ => {}
        }
    }

    /// Runs what can run now, fairly; moves due timers into their queues and wakes queues
    /// whose token is due first.
    pub fn poll_runnable(&mut self, now: u64) -> Vec<Dispatch> {
        self.polled_at = now;
        self.refresh_gates(now);
        self.promote_due(now);
        // Before anything is admitted: an entry past its deadline never starts.
        self.expire_due(now);
        self.limiter.wake_due(now, &self.book, &mut self.woken);
        self.wake_pending(now);
        let mut out = Vec::new();
        // Rounds are bounded too: each wakes token waiters that were due, and one that does
        // not run parks elsewhere or for a later token, so this ends well before.
        for _ in 0..MAX_DISPATCH_PER_POLL {
            self.run_ring(now, &mut out);
            if out.len() >= MAX_DISPATCH_PER_POLL || self.slots.full() {
                break;
            }
            // A token waiter that settled hands the next one a token due now (a rate or quota
            // just lifted): it is woken in this poll, not the next.
            if self.limiter.token_wake_due(now) {
                self.limiter.wake_due(now, &self.book, &mut self.woken);
            }
            // A queue woken at a gate that then waited for something else left the gate's
            // slot free: the next one there looks.
            self.gates.wake(now, false, self.member, &mut self.woken);
            self.wake_pending(now);
            if self.ring.is_empty() {
                break;
            }
        }
        out
    }

    /// Takes turns over the ready queues until the ring is empty or the poll dispatched its
    /// most.
    fn run_ring(&mut self, now: u64, out: &mut Vec<Dispatch>) {
        while out.len() < MAX_DISPATCH_PER_POLL && !self.ring.is_empty() {
            // The slot is taken before the head is checked: another partition cannot take it
            // in between, and it goes back at once when the head stays parked.
            if !self.slots.take_or_wait(self.member) {
                break;
            }
            let q = self.ring.pop_front().expect("checked non-empty");
            let Some((_, kind)) = self.queue(q).head() else {
                self.give_back_slot();
                // A woken queue whose entries left (expired, removed) hands its reservation on:
                // whoever that wakes joins the ring in this poll.
                self.go_idle(q, now);
                self.wake_pending(now);
                continue;
            };
            let queue = self.queue_mut(q);
            queue.credit = (queue.credit + 1).min(MAX_CREDIT);
            if queue.credit < kind.weight() {
                self.give_back_slot();
                self.ring.push_back(q);
                continue;
            }
            match self.admit(q, now) {
                Some(dispatch) => out.push(dispatch),
                None => self.give_back_slot(),
            }
        }
    }

    fn promote_due(&mut self, now: u64) {
        while self.timers.peek().is_some_and(|Reverse(t)| t.at <= now) {
            let Reverse(timer) = self.timers.pop().expect("peeked");
            self.queue_mut(timer.queue).delayed -= 1;
            if self.expire_if_due(timer.entry, now) {
                // Dropped without ever being queued; an emptied queue goes.
                if self.queue(timer.queue).len() == 0
                    && self.queue(timer.queue).state == State::Idle
                {
                    self.go_idle(timer.queue, now);
                }
                continue;
            }
            self.push_entry(timer.queue, timer.entry, timer.kind, now);
        }
    }

    /// Moves woken queues back into the ring.
    fn wake_pending(&mut self, now: u64) {
        let mut woken = std::mem::take(&mut self.woken);
        for q in woken.drain(..) {
            let q = QueueId(q);
            let queue = self.queue_mut(q);
            let State::Parked(resource, ticket, _) = queue.state else {
                unreachable!("only parked queues are woken");
            };
            queue.woken_from = Some((resource, ticket));
            queue.state = State::Ready;
            queue.since = now;
            self.ring.push_back(q);
        }
        // Keep the buffer's capacity: waking allocates nothing in the steady state.
        self.woken = woken;
    }

    /// The attempt behind `permit` ended, suspended, paused or backed off: its slots free up.
    pub fn release(&mut self, permit: Permit, now: u64) {
        self.running -= 1;
        self.give_back_slot();
        self.nudge |= self.gates.give_back(permit.gates);
        self.gates.unref(permit.gates);
        if let Some(counters) = permit.counters {
            if self.book.crowds() {
                self.limiter
                    .crowd_running(counters.path(), permit.entry, false);
            }
            // The limiter lists waiters deepest level first; they re-enter the ring in that order.
            self.limiter
                .release(counters, &self.book, now, &mut self.woken);
        }
        self.wake_pending(now);
    }

    /// Records that `entry` holds the object lock of `key` although it is not queued (it was
    /// suspended when the process restarted). `None` when the key has no lock.
    pub fn hold(&mut self, key: &QueueKey, entry: EntryId, now: u64) -> Option<LockId> {
        let object_key = key.object_key.clone()?;
        let lock = self.locks.add_ref(LockKey {
            scope: key.scope.clone(),
            service: key.service.clone(),
            object_key,
        });
        self.locks.claim(lock, entry, now);
        // The lock outlives this reference while it has a holder.
        self.locks.drop_ref(lock);
        Some(lock)
    }

    /// The invocation `entry` completed: it gives up its object lock.
    pub fn unlock(&mut self, lock: LockId, entry: EntryId, now: u64) {
        self.locks.release(lock, entry, &mut self.woken);
        self.wake_pending(now);
    }
}

#[cfg(test)]
mod crowd_tests;
#[cfg(test)]
mod deadline_tests;
#[cfg(test)]
mod gate_tests;
#[cfg(test)]
mod rate_tests;
#[cfg(test)]
mod share_tests;
#[cfg(test)]
mod tests;
