//! The lines of waiters at a counter: their places (fair by weight, priority first, those
//! within a guarantee before borrowers) and waking them as slots free up, so that no wake-up is
//! lost (see the module documentation of `limiter.rs`).

use super::*;

impl Limiter {
    /// A place in line at `counter` for a waiter on `path` with `priority`: behind its flow's
    /// earlier waiters by its weight, ahead of lower priorities (see [`waits`]).
    pub(super) fn ticket(
        &mut self,
        counter: CounterId,
        path: &CounterPath,
        priority: Priority,
    ) -> Ticket {
        let flow = Self::flow(counter, path);
        let vtime = self.node(counter).vtime;
        let (finish, weight) = match flow {
            Some(child) => (self.node(child).finish, self.node(child).weight),
            None => (self.node(counter).own_finish, 1),
        };
        let start = vtime.max(finish);
        let next = start.saturating_add(waits::cost(weight));
        match flow {
            Some(child) => self.node_mut(child).finish = next,
            None => self.node_mut(counter).own_finish = next,
        }
        self.tickets += 1;
        Ticket::new(start, priority, self.tickets)
    }

    /// The flow of a waiter on `path` at `counter`: the next counter of the path.
    pub(super) fn flow(counter: CounterId, path: &CounterPath) -> Option<CounterId> {
        let counters = path.counters();
        counters
            .iter()
            .position(|c| *c == counter)
            .and_then(|at| counters.get(at + 1))
            .copied()
    }

    /// Parks `waiter` (on `path`, with `priority`) for a slot of `counter`; `again` is the
    /// ticket it had when it was woken here and lost the slot (to a lowered limit): it keeps
    /// its place. Answers its ticket.
    pub fn park(
        &mut self,
        counter: CounterId,
        waiter: WaiterId,
        path: &CounterPath,
        priority: Priority,
        again: Option<Ticket>,
    ) -> Ticket {
        let ticket = again.unwrap_or_else(|| self.ticket(counter, path, priority));
        let flow = Self::flow(counter, path);
        let within = flow.is_none_or(|c| {
            let child = self.node_mut(c);
            child.parked_above += 1;
            child.within()
        });
        let node = self.node_mut(counter);
        node.waiters.push(ticket, waiter, flow);
        node.owed += u32::from(within);
        ticket
    }

    /// Takes the waiter with `ticket` out of `counter`'s list (its queue changed or vanished);
    /// true if it was there.
    pub fn unpark(
        &mut self,
        counter: CounterId,
        ticket: Ticket,
        book: &RuleBook,
        woken: &mut Vec<WaiterId>,
    ) -> bool {
        let Some(flow) = self.node_mut(counter).waiters.remove(ticket) else {
            return false;
        };
        self.unowe(counter, flow);
        self.pump(counter, book, woken);
        self.prune(counter);
        true
    }

    /// A waiter woken from `counter` (on `path`) has re-checked (and acquired, or parked); its
    /// reservation ends, and if it did not take the slot the next waiter is offered it.
    pub fn settle(
        &mut self,
        counter: CounterId,
        path: Option<&CounterPath>,
        book: &RuleBook,
        woken: &mut Vec<WaiterId>,
    ) {
        self.woken_above(path.and_then(|path| Self::flow(counter, path)), false);
        let node = self.node_mut(counter);
        let was = node.within();
        node.pending -= 1;
        self.rewithin(counter, was);
        self.pump(counter, book, woken);
        self.prune(counter);
    }

    /// Wakes waiters of `counter` while it has slots not yet offered: those whose key is
    /// within its guarantee first (borrowed slots go back first), in line otherwise.
    pub(super) fn pump(&mut self, counter: CounterId, book: &RuleBook, woken: &mut Vec<WaiterId>) {
        if self.node(counter).waiters.is_empty() {
            return;
        }
        self.resolve(counter, book);
        let mut offer = self.node(counter).wakeable();
        let was = self.node(counter).within();
        while offer > 0 {
            let node = self.node_mut(counter);
            let next = if node.owed > 0 {
                // Out of the node while the others are read.
                let mut line = std::mem::take(&mut node.waiters);
                let next = line.pop_preferring(|flow| flow.is_none_or(|c| self.node(c).within()));
                self.node_mut(counter).waiters = line;
                next
            } else {
                node.waiters.pop()
            };
            let Some((ticket, waiter, flow)) = next else {
                break;
            };
            self.unowe(counter, flow);
            self.woken_above(flow, true);
            let node = self.node_mut(counter);
            node.vtime = node.vtime.max(ticket.start());
            node.pending += 1;
            offer -= 1;
            woken.push(waiter);
        }
        self.rewithin(counter, was);
    }

    /// A waiter of flow `flow` was woken at the flow's parent (`up`), or re-checked there: the
    /// flow's counter counts it against its guarantee meanwhile.
    fn woken_above(&mut self, flow: Option<CounterId>, up: bool) {
        let Some(child) = flow else {
            return;
        };
        let node = self.node_mut(child);
        let was = node.within();
        if up {
            node.woken_above += 1;
        } else {
            node.woken_above -= 1;
        }
        self.rewithin(child, was);
    }

    /// A waiter of flow `flow` left `counter`'s line.
    pub(super) fn unowe(&mut self, counter: CounterId, flow: Option<CounterId>) {
        let within = flow.is_none_or(|c| {
            let child = self.node_mut(c);
            child.parked_above -= 1;
            child.within()
        });
        self.node_mut(counter).owed -= u32::from(within);
    }
}
