//! How a ready queue's head gets in: checked against its object lock, its limits and the
//! deployment's gates, in that order; dispatched when all let it, else the queue parks at the
//! first that does not (and leaves that waiter list when it is taken back); and how a queue
//! goes idle, settling what it was woken with.

use super::{Dispatch, EntryId, EntryKind, LockId, Permit, QueueId, Resource, Scheduler, State};
use crate::limiter::{Blocked, CounterPath, Ticket, Woken};

impl Scheduler {
    /// Takes a parked queue out of its waiter list and back into the ring.
    pub(super) fn unpark(&mut self, q: QueueId, now: u64) {
        if !self.leave_waiters(q) {
            return;
        }
        let queue = self.queue_mut(q);
        queue.state = State::Ready;
        queue.since = now;
        self.ring.push_back(q);
        self.wake_pending(now);
    }

    /// Takes a parked queue out of its waiter list; false if it was not parked.
    pub(super) fn leave_waiters(&mut self, q: QueueId) -> bool {
        let State::Parked(resource, ticket, _) = self.queue(q).state.clone() else {
            return false;
        };
        match (resource, ticket) {
            (Resource::Counter(counter), Some(ticket)) => {
                self.limiter
                    .unpark(counter, ticket, &self.book, &mut self.woken);
            }
            (Resource::Token(counter), Some(ticket)) => {
                self.limiter.unpark_from_tokens(counter, ticket);
            }
            (Resource::Lock(lock), _) => self.locks.unpark(lock, q),
            (Resource::Gate(gate), _) => self.gates.unpark(gate, q),
            (_, None) => unreachable!("counter parks hold a ticket"),
        }
        true
    }

    /// Checks the head of `q` against its lock and counters; dispatches it or parks the queue.
    pub(super) fn admit(&mut self, q: QueueId, now: u64) -> Option<Dispatch> {
        let (entry, kind) = self.queue(q).head().expect("checked non-empty");
        let woken_from = self.queue_mut(q).woken_from.take();
        let woken_resource = woken_from.map(|(resource, _)| resource);
        // Its path outlives a dispatch that empties and drops the queue.
        let path = self.queue(q).path;
        let blocked = self
            .check_lock(q, entry, woken_resource)
            .map(|lock| (Resource::Lock(lock), None))
            .or_else(|| {
                let path = self.queue(q).path?;
                let woken = match woken_resource {
                    None => Woken::No,
                    Some(Resource::Counter(counter)) => Woken::At(counter),
                    Some(_) => Woken::Elsewhere,
                };
                // Only a new entry takes a token: a retry or a resumption is the same
                // admission continuing.
                let tokens = kind == EntryKind::New;
                let blocked = self
                    .limiter
                    .check_woken(&path, &self.book, woken, tokens, now)
                    .err()?;
                let resource = if blocked.rate.is_some() || blocked.quota.is_some() {
                    Resource::Token(blocked.counter)
                } else {
                    Resource::Counter(blocked.counter)
                };
                Some((resource, Some(blocked)))
            });
        // Past its lock and limits: the deployment's gates, last, so a slot is not held there
        // by work that could not run anyway.
        let blocked = blocked.or_else(|| {
            let gates = self.queue(q).gates;
            let (gate, nudge) = self.gates.take(gates, self.member, now).err()?;
            self.nudge |= nudge;
            Some((Resource::Gate(gate), None))
        });
        let dispatch = match blocked {
            Some((resource, why)) => {
                // Woken here and held again: it keeps its place in line.
                let again = woken_from
                    .filter(|(from, _)| *from == resource)
                    .and_then(|(_, ticket)| ticket);
                let first_in_line = woken_resource == Some(resource);
                self.park(q, resource, why, first_in_line, again, now);
                None
            }
            None => Some(self.dispatch(q, entry, kind, now)),
        };
        if let Some((from, _)) = woken_from {
            self.settle(path.as_ref(), from);
        }
        self.wake_pending(now);
        dispatch
    }

    /// The lock that blocks `entry`, if any.
    pub(super) fn check_lock(
        &self,
        q: QueueId,
        entry: EntryId,
        woken_from: Option<Resource>,
    ) -> Option<LockId> {
        let id = self.queue(q).lock?;
        let woken_here = woken_from == Some(Resource::Lock(id));
        self.locks.blocks(id, entry, woken_here).then_some(id)
    }

    pub(super) fn park(
        &mut self,
        q: QueueId,
        resource: Resource,
        why: Option<Blocked>,
        first_in_line: bool,
        again: Option<Ticket>,
        now: u64,
    ) {
        let queue = self.queue(q);
        let priority = queue.key.priority;
        let path = queue.path;
        let ticket = match resource {
            Resource::Lock(lock) => {
                self.locks.park(lock, q, first_in_line);
                None
            }
            Resource::Gate(gate) => {
                self.gates.park(gate, q, first_in_line);
                None
            }
            Resource::Counter(counter) => {
                let path = path.expect("counter parks have a path");
                Some(self.limiter.park(counter, q.0, &path, priority, again))
            }
            Resource::Token(counter) => {
                let path = path.expect("token parks have a path");
                Some(
                    self.limiter
                        .park_for_token(counter, q.0, &path, priority, again),
                )
            }
        };
        let queue = self.queue_mut(q);
        queue.state = State::Parked(resource, ticket, why);
        queue.since = now;
    }

    pub(super) fn dispatch(
        &mut self,
        q: QueueId,
        entry: EntryId,
        kind: EntryKind,
        now: u64,
    ) -> Dispatch {
        if kind == EntryKind::New {
            self.deadlines.forget(entry);
        }
        let queue = self.queue_mut(q);
        match kind {
            EntryKind::Resumed => queue.resumed.pop_front(),
            EntryKind::New => queue.new.pop_front(),
        };
        queue.times.last_attempt_at = now;
        queue.drain.dispatched(now);
        if kind == EntryKind::New {
            queue.times.last_start_at = now;
        }
        queue.credit -= kind.weight();
        let lock = queue.lock;
        let path = queue.path;
        let gates = queue.gates;
        let more = queue.len() > 0;
        self.gates.hold(gates);
        if let Some(lock) = lock {
            self.locks.take(lock, entry, now);
        }
        let counters = path.map(|p| {
            self.limiter.count_queued(&p, false);
            if self.book.crowds() {
                self.limiter.crowd_left(&p, entry);
                self.limiter.crowd_running(&p, entry, true);
            }
            self.limiter.acquire(&p, kind == EntryKind::New, now)
        });
        self.running += 1;
        if more {
            self.ring.push_back(q);
        } else {
            self.go_idle(q, now);
        }
        Dispatch {
            entry,
            queue: q,
            kind,
            permit: Permit {
                counters,
                gates,
                entry,
            },
            lock,
        }
    }

    /// An emptied queue leaves the ring; without delayed entries it is dropped.
    pub(super) fn go_idle(&mut self, q: QueueId, now: u64) {
        let queue = self.queue_mut(q);
        if queue.state != State::Paused {
            queue.state = State::Idle;
        }
        queue.credit = 0;
        queue.since = now;
        let woken_from = queue.woken_from.take();
        // A paused queue stays, empty or not, so an operator can still see and resume it.
        let drop_it = queue.len() == 0 && queue.delayed == 0 && queue.state != State::Paused;
        if let Some((from, _)) = woken_from {
            let path = self.queue(q).path;
            self.settle(path.as_ref(), from);
        }
        if drop_it {
            let queue = self.queues[q.0 as usize].take().expect("live queue");
            self.free_queues.push(q.0);
            self.queue_index.remove(&queue.key);
            if let Some(path) = queue.path {
                self.limiter.drop_path(path);
            }
            if let Some(lock) = queue.lock {
                self.locks.drop_ref(lock);
            }
            self.gates.unref(queue.gates);
        }
    }

    /// Ends the reservation of a woken queue (on `path`); the next waiter may be offered the
    /// slot.
    pub(super) fn settle(&mut self, path: Option<&CounterPath>, from: Resource) {
        match from {
            Resource::Counter(counter) => {
                self.limiter
                    .settle(counter, path, &self.book, &mut self.woken);
            }
            Resource::Token(counter) => self.limiter.settle_token(counter, &self.book),
            Resource::Lock(lock) => self.locks.settle(lock, &mut self.woken),
            // A gate reserves nothing for whom it wakes.
            Resource::Gate(_) => {}
        }
    }
}
