//! Virtual-object locks: exclusive handlers of one (scope, service, object key) run one at a time,
//! and the lock is held from first dispatch to completion, across suspensions. Queues wait for a
//! lock FIFO; a freed lock is offered to one waiter at a time.

use std::collections::VecDeque;

use hashbrown::HashMap;

use super::{EntryId, QueueId};
use crate::scope::Scope;

/// Index of a virtual-object lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockId(u32);

/// The identity of one virtual object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockKey {
    /// Flow-control scope (objects are per scope).
    pub scope: Option<Scope>,
    /// Virtual object or workflow.
    pub service: Box<str>,
    /// Object key.
    pub object_key: Box<str>,
}

#[derive(Debug)]
struct Lock {
    key: LockKey,
    holder: Option<EntryId>,
    /// When its holder took it (ms; for a holder claiming it back after a restart, the
    /// restart's time).
    acquired_at: u64,
    waiters: VecDeque<QueueId>,
    /// 1 while a woken waiter has not re-checked.
    pending: u32,
    /// Queues using this lock.
    refs: u32,
}

/// The locks of one partition.
#[derive(Debug, Default)]
pub(super) struct Locks {
    slots: Vec<Option<Lock>>,
    free: Vec<u32>,
    index: HashMap<LockKey, LockId>,
}

impl Locks {
    fn get(&self, id: LockId) -> &Lock {
        self.slots[id.0 as usize].as_ref().expect("live lock")
    }

    fn get_mut(&mut self, id: LockId) -> &mut Lock {
        self.slots[id.0 as usize].as_mut().expect("live lock")
    }

    /// Every held lock: scope, service, object key, holder and when it took it.
    pub fn held(&self) -> Vec<(LockKey, EntryId, u64)> {
        self.slots
            .iter()
            .flatten()
            .filter_map(|lock| Some((lock.key.clone(), lock.holder?, lock.acquired_at)))
            .collect()
    }

    /// The lock of `key`, referenced by one more queue.
    pub fn add_ref(&mut self, key: LockKey) -> LockId {
        if let Some(id) = self.index.get(&key).copied() {
            self.get_mut(id).refs += 1;
            return id;
        }
        let lock = Lock {
            key: key.clone(),
            holder: None,
            acquired_at: 0,
            waiters: VecDeque::new(),
            pending: 0,
            refs: 1,
        };
        let id = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(lock);
                LockId(slot)
            }
            None => {
                self.slots.push(Some(lock));
                LockId(u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 locks"))
            }
        };
        self.index.insert(key, id);
        id
    }

    /// A queue stopped using the lock.
    pub fn drop_ref(&mut self, id: LockId) {
        self.get_mut(id).refs -= 1;
        self.prune(id);
    }

    /// Whether `entry` must wait: another entry holds the lock, or it is offered to a woken
    /// waiter and `entry`'s queue is not that waiter.
    pub fn blocks(&self, id: LockId, entry: EntryId, woken_here: bool) -> bool {
        let lock = self.get(id);
        if lock.holder == Some(entry) {
            return false;
        }
        lock.holder.is_some() || (lock.pending > 0 && !woken_here)
    }

    /// `entry` holds the lock now (a resumed holder keeps its time).
    pub fn take(&mut self, id: LockId, entry: EntryId, now: u64) {
        let lock = self.get_mut(id);
        if lock.holder != Some(entry) {
            lock.holder = Some(entry);
            lock.acquired_at = now;
        }
    }

    /// A resumed entry holds its lock already; after a restart it claims it back if free.
    pub fn claim(&mut self, id: LockId, entry: EntryId, now: u64) {
        let lock = self.get_mut(id);
        if lock.holder.is_none() {
            lock.holder = Some(entry);
            lock.acquired_at = now;
        }
    }

    /// Parks `q` (at the front when it was first in line and lost the offer).
    pub fn park(&mut self, id: LockId, q: QueueId, front: bool) {
        let waiters = &mut self.get_mut(id).waiters;
        if front {
            waiters.push_front(q);
        } else {
            waiters.push_back(q);
        }
    }

    /// Takes `q` out of the waiters.
    pub fn unpark(&mut self, id: LockId, q: QueueId) {
        let waiters = &mut self.get_mut(id).waiters;
        if let Some(at) = waiters.iter().position(|w| *w == q) {
            waiters.remove(at);
        }
    }

    /// A woken waiter re-checked: the offer ends, and the next waiter may get it.
    pub fn settle(&mut self, id: LockId, woken: &mut Vec<u32>) {
        self.get_mut(id).pending -= 1;
        self.offer(id, woken);
    }

    /// `entry` completed: if it held the lock, the lock is offered to the next waiter.
    pub fn release(&mut self, id: LockId, entry: EntryId, woken: &mut Vec<u32>) {
        if self.get(id).holder != Some(entry) {
            return;
        }
        self.get_mut(id).holder = None;
        self.offer(id, woken);
    }

    fn offer(&mut self, id: LockId, woken: &mut Vec<u32>) {
        let lock = self.get_mut(id);
        if lock.holder.is_none()
            && lock.pending == 0
            && let Some(q) = lock.waiters.pop_front()
        {
            lock.pending = 1;
            woken.push(q.0);
            return;
        }
        self.prune(id);
    }

    fn prune(&mut self, id: LockId) {
        let lock = self.get(id);
        if lock.holder.is_none() && lock.pending == 0 && lock.waiters.is_empty() && lock.refs == 0 {
            let lock = self.slots[id.0 as usize].take().expect("live lock");
            self.index.remove(&lock.key);
            self.free.push(id.0);
        }
    }
}
