//! Concurrency counters per scope → L1 → L2, their permits and their waiter lists.
//!
//! Counters live in an arena and are addressed by index, so the hot path (check, acquire,
//! release of a known [`CounterPath`]) hashes nothing. A node exists only while something needs
//! it: usage, waiters, pending wake-ups, children or paths held by queues; then it is pruned.
//!
//! Waiters park FIFO at the deepest level that blocked them. A node's free slots (limit − usage)
//! minus the wake-ups already handed out (`pending`) is how many more waiters may be woken, so a
//! release wakes one waiter per freed slot, deepest level first, and a woken waiter that does not
//! use its slot hands it on (see [`Limiter::settle`]); no wake-up is lost.

use std::collections::VecDeque;
use std::sync::Arc;

use hashbrown::{Equivalent, HashMap};

use super::pattern::{Level, RulePattern};
use super::rules::{Limit, RuleBook};
use super::scope::{LimitKey, Scope};

/// Index of a counter node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterId(u32);

/// Who waits at a counter (the scheduler's queue ids); opaque to the limiter.
pub type WaiterId = u32;

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
}

impl Permit {
    /// The counters it holds a slot of.
    pub fn path(&self) -> &CounterPath {
        &self.path
    }
}

/// Why a path cannot be admitted now: its deepest counter at its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The level of that counter.
    pub level: Level,
    /// The counter.
    pub counter: CounterId,
    /// Its limit.
    pub limit: Limit,
    /// The rule that set the limit.
    pub rule: Option<Arc<RulePattern>>,
}

#[derive(Debug)]
struct Node {
    level: Level,
    name: Box<str>,
    parent: Option<CounterId>,
    usage: u32,
    children: u32,
    /// Paths handed out by [`Limiter::path`] whose deepest counter is this one.
    refs: u32,
    /// Limiter generation `limit`/`rule` were resolved at; `None` forces a resolve.
    resolved_at: Option<u64>,
    limit: Limit,
    rule: Option<Arc<RulePattern>>,
    waiters: VecDeque<WaiterId>,
    /// Waiters woken for a free slot that have not re-checked yet.
    pending: u32,
}

impl Node {
    fn idle(&self) -> bool {
        self.usage == 0
            && self.children == 0
            && self.refs == 0
            && self.pending == 0
            && self.waiters.is_empty()
    }

    /// Slots that may still be offered to waiters.
    fn wakeable(&self) -> u32 {
        self.limit
            .available(self.usage)
            .saturating_sub(self.pending)
    }
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
    /// Waiters parked here.
    pub waiters: usize,
}

/// The counters of one partition.
#[derive(Debug, Default)]
pub struct Limiter {
    /// Bumped by [`Limiter::on_rules_changed`]; cached limits of older generations are stale.
    generation: u64,
    nodes: Vec<Option<Node>>,
    free: Vec<u32>,
    index: HashMap<NodeKey, CounterId>,
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
            parent,
            usage: 0,
            children: 0,
            refs: 0,
            resolved_at: None,
            limit: Limit::Unlimited,
            rule: None,
            waiters: VecDeque::new(),
            pending: 0,
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

    /// Removes `id` and then its ancestors while they are idle.
    fn prune(&mut self, id: CounterId) {
        let mut at = Some(id);
        while let Some(id) = at {
            let node = self.node(id);
            if !node.idle() {
                return;
            }
            let node = self.nodes[id.0 as usize].take().expect("live counter");
            self.free.push(id.0);
            self.index.remove(&NodeRef {
                parent: node.parent,
                name: &node.name,
            });
            at = node.parent;
            if let Some(parent) = at {
                self.node_mut(parent).children -= 1;
            }
        }
    }

    /// Brings a node's cached limit up to the current generation.
    fn resolve(&mut self, id: CounterId, book: &RuleBook) {
        if self.node(id).resolved_at == Some(self.generation) {
            return;
        }
        let [scope, l1, l2] = self.names(id);
        let level = self.node(id).level;
        let resolved = book.resolve(level, scope.unwrap_or_default(), l1, l2);
        let generation = self.generation;
        let node = self.node_mut(id);
        node.limit = resolved.limit;
        node.rule = resolved.pattern;
        node.resolved_at = Some(generation);
    }

    /// Scope, L1 and L2 names of a counter, borrowed from it and its ancestors.
    fn names(&self, id: CounterId) -> [Option<&str>; 3] {
        let mut names = [None; 3];
        let mut at = Some(id);
        while let Some(id) = at {
            let node = self.node(id);
            names[node.level.index()] = Some(&*node.name);
            at = node.parent;
        }
        names
    }

    /// Whether every counter of `path` has room; `Err` names the deepest one that has not.
    ///
    /// Slots offered to woken waiters are reserved for them, so a newcomer counts them as used.
    /// A woken waiter (`woken`) checks actual usage only: had it to respect the reservations
    /// of waiters woken at other levels, two of them could each hold what the other needs and
    /// hand their slots back and forth forever.
    pub fn check(
        &mut self,
        path: &CounterPath,
        book: &RuleBook,
        woken: bool,
    ) -> Result<(), Blocked> {
        let mut blocked = None;
        for &id in path.counters() {
            self.resolve(id, book);
            let node = self.node(id);
            let reserved = if woken { 0 } else { node.pending };
            if !node.limit.admits(node.usage + reserved) {
                blocked = Some(id);
            }
        }
        match blocked {
            None => Ok(()),
            Some(id) => {
                let node = self.node(id);
                Err(Blocked {
                    level: node.level,
                    counter: id,
                    limit: node.limit,
                    rule: node.rule.clone(),
                })
            }
        }
    }

    /// Takes a slot at every counter of `path` at once (after a successful [`Limiter::check`]).
    pub fn acquire(&mut self, path: &CounterPath) -> Permit {
        for &id in path.counters() {
            self.node_mut(id).usage += 1;
        }
        Permit { path: *path }
    }

    /// [`Limiter::check`] then [`Limiter::acquire`].
    pub fn try_acquire(&mut self, path: &CounterPath, book: &RuleBook) -> Result<Permit, Blocked> {
        self.check(path, book, false)?;
        Ok(self.acquire(path))
    }

    /// Gives back a permit's slots; pushes the waiters to wake onto `woken`, deepest level first.
    pub fn release(&mut self, permit: Permit, book: &RuleBook, woken: &mut Vec<WaiterId>) {
        let counters = permit.path.counters();
        for &id in counters {
            self.node_mut(id).usage -= 1;
        }
        for &id in counters.iter().rev() {
            self.pump(id, book, woken);
        }
        self.prune(counters[counters.len() - 1]);
    }

    /// Parks `waiter` at the back of `counter`'s FIFO.
    pub fn park(&mut self, counter: CounterId, waiter: WaiterId) {
        self.node_mut(counter).waiters.push_back(waiter);
    }

    /// Parks `waiter` at the front: it was first in line here and lost its slot to a lowered limit.
    pub fn park_front(&mut self, counter: CounterId, waiter: WaiterId) {
        self.node_mut(counter).waiters.push_front(waiter);
    }

    /// Takes `waiter` out of `counter`'s list (its queue changed or vanished); true if it was there.
    pub fn unpark(
        &mut self,
        counter: CounterId,
        waiter: WaiterId,
        book: &RuleBook,
        woken: &mut Vec<WaiterId>,
    ) -> bool {
        let node = self.node_mut(counter);
        let Some(at) = node.waiters.iter().position(|w| *w == waiter) else {
            return false;
        };
        node.waiters.remove(at);
        self.pump(counter, book, woken);
        self.prune(counter);
        true
    }

    /// A waiter woken from `counter` has re-checked (and acquired, or parked); its reservation
    /// ends, and if it did not take the slot the next waiter is offered it.
    pub fn settle(&mut self, counter: CounterId, book: &RuleBook, woken: &mut Vec<WaiterId>) {
        let node = self.node_mut(counter);
        node.pending -= 1;
        self.pump(counter, book, woken);
        self.prune(counter);
    }

    /// Wakes waiters of `counter` while it has slots not yet offered.
    fn pump(&mut self, counter: CounterId, book: &RuleBook, woken: &mut Vec<WaiterId>) {
        if self.node(counter).waiters.is_empty() {
            return;
        }
        self.resolve(counter, book);
        let node = self.node_mut(counter);
        let mut offer = node.wakeable();
        while offer > 0 {
            let Some(waiter) = node.waiters.pop_front() else {
                break;
            };
            node.pending += 1;
            offer -= 1;
            woken.push(waiter);
        }
    }

    /// The rule book changed (call this whenever the book passed to other methods changes):
    /// cached limits go stale, and waiters of counters that now have room are woken.
    /// Running permits are never revoked; a lowered limit only stops new admissions.
    pub fn on_rules_changed(&mut self, book: &RuleBook, woken: &mut Vec<WaiterId>) {
        self.generation += 1;
        let waiting: Vec<CounterId> = self
            .index
            .values()
            .copied()
            .filter(|id| !self.node(*id).waiters.is_empty())
            .collect();
        for id in waiting {
            self.pump(id, book, woken);
        }
    }

    /// Usage of one counter.
    pub fn usage(&self, counter: CounterId) -> u32 {
        self.node(counter).usage
    }

    /// Every live counter, resolved against `book`.
    pub fn snapshot(&mut self, book: &RuleBook) -> Vec<CounterSnapshot> {
        let ids: Vec<CounterId> = self.index.values().copied().collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            self.resolve(id, book);
            let [scope, l1, l2] = self.names(id).map(|n| n.map(str::to_owned));
            let node = self.node(id);
            out.push(CounterSnapshot {
                level: node.level,
                scope: scope.unwrap_or_default(),
                l1,
                l2,
                usage: node.usage,
                limit: node.limit,
                rule: node.rule.clone(),
                available: node.limit.available(node.usage),
                waiters: node.waiters.len(),
            });
        }
        out.sort_by(|a, b| (&a.scope, &a.l1, &a.l2).cmp(&(&b.scope, &b.l1, &b.l2)));
        out
    }
}

#[cfg(test)]
mod tests;
