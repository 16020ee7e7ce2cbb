//! What operators do to queues: pause and resume them, take an entry out, and look at them.

use super::{EntryId, LockKey, QueueId, QueueKey, Scheduler, State};

impl Scheduler {
    /// Pauses the queue of `key` (created, empty, if it does not exist): its entries stay but
    /// none is dispatched until [`Scheduler::resume`]. Running attempts are not stopped.
    pub fn pause(&mut self, key: &QueueKey, now: u64) {
        if !self.paused.insert(key.clone()) {
            return;
        }
        let Some(&q) = self.queue_index.get(key) else {
            // Listed from now on, empty and paused, so an operator can see and resume it.
            self.queue_for(key, now);
            return;
        };
        self.leave_waiters(q);
        if let Some(from) = self.queue_mut(q).woken_from.take() {
            let path = self.queue(q).path;
            self.settle(path.as_ref(), from.0);
        }
        if self.queue(q).state == State::Ready {
            self.ring.retain(|r| *r != q);
        }
        let queue = self.queue_mut(q);
        queue.state = State::Paused;
        queue.credit = 0;
        queue.since = now;
        self.wake_pending(now);
    }

    /// Resumes the queue of `key`: it takes its turn again.
    pub fn resume(&mut self, key: &QueueKey, now: u64) {
        if !self.paused.remove(key) {
            return;
        }
        let Some(&q) = self.queue_index.get(key) else {
            return;
        };
        let queue = self.queue_mut(q);
        queue.since = now;
        if queue.len() > 0 {
            queue.state = State::Ready;
            self.ring.push_back(q);
        } else {
            queue.state = State::Idle;
            self.go_idle(q, now);
        }
    }

    /// The key of the live queue with index `index`.
    pub fn queue_key(&self, index: u32) -> Option<QueueKey> {
        let queue = self.queues.get(index as usize)?.as_ref()?;
        Some(queue.key.clone())
    }

    /// Whether the queue of `key` is paused.
    pub fn is_paused(&self, key: &QueueKey) -> bool {
        self.paused.contains(key)
    }

    /// Every paused queue's key.
    pub fn paused(&self) -> impl Iterator<Item = &QueueKey> {
        self.paused.iter()
    }

    /// Removes a queued (not delayed, not running) entry; true if it was there.
    pub fn remove(&mut self, q: QueueId, entry: EntryId, now: u64) -> bool {
        let Some(Some(queue)) = self.queues.get_mut(q.0 as usize) else {
            return false;
        };
        let found = [&mut queue.resumed, &mut queue.new]
            .into_iter()
            .any(|list| {
                list.iter()
                    .position(|e| *e == entry)
                    .and_then(|at| list.remove(at))
                    .is_some()
            });
        if found {
            self.deadlines.forget(entry);
            if let Some(path) = self.queue(q).path {
                self.limiter.count_queued(&path, false);
                if self.book.crowds() {
                    self.limiter.crowd_left(&path, entry);
                }
            }
            // The head may have changed: a parked queue looks again.
            self.unpark(q, now);
        }
        found
    }

    /// Every held object lock: scope, service, object key, the entry holding it, and when it
    /// took it (ms).
    pub fn held_locks(&self) -> Vec<(LockKey, EntryId, u64)> {
        self.locks.held()
    }

    /// Whether the queue of `key` is in the ring, waiting for its turn (not parked, not empty).
    pub fn is_ready(&self, key: &QueueKey) -> bool {
        self.queue_index
            .get(key)
            .is_some_and(|id| self.queue(*id).state == State::Ready)
    }
}
