//! Waiting for a token: parking at a rate limited counter, and waking the first in line when
//! its token is due (the partition sleeps until [`Limiter::next_wake`], it never polls).

use std::cmp::Reverse;

use super::{CounterId, CounterPath, Limiter, Priority, RuleBook, Ticket, WaiterId};

impl Limiter {
    /// Parks `waiter` for a token of `counter`, in line like [`Limiter::park`] (`again`: it
    /// was first in line and the token went elsewhere); the first in line is woken when the
    /// next token is due.
    pub fn park_for_token(
        &mut self,
        counter: CounterId,
        waiter: WaiterId,
        path: &CounterPath,
        priority: Priority,
        again: Option<Ticket>,
    ) -> Ticket {
        let now = self.now_ms;
        let ticket = again.unwrap_or_else(|| self.ticket(counter, path, priority));
        let node = self.node_mut(counter);
        let due = node.next_token_ms(now);
        let bounds = node.bounds.get_or_insert_with(Box::default);
        bounds.rate_waiters.push(ticket, waiter, None);
        let pending = bounds.rate_pending;
        node.sync();
        if !pending {
            self.token_wakes.push(Reverse((due, counter)));
        }
        ticket
    }

    /// Takes the waiter with `ticket` out of `counter`'s token waiters; true if it was there.
    pub fn unpark_from_tokens(&mut self, counter: CounterId, ticket: Ticket) -> bool {
        let Some(bounds) = self.node_mut(counter).bounds.as_deref_mut() else {
            return false;
        };
        if bounds.rate_waiters.remove(ticket).is_none() {
            return false;
        }
        self.node_mut(counter).sync();
        self.prune(counter);
        true
    }

    /// A waiter woken for a token of `counter` has re-checked; the next one is woken when its
    /// token is due (at once if it is there).
    pub fn settle_token(&mut self, counter: CounterId, book: &RuleBook) {
        let node = self.node_mut(counter);
        if let Some(bounds) = node.bounds.as_deref_mut() {
            bounds.rate_pending = false;
        }
        node.sync();
        self.resolve(counter, book);
        let now = self.now_ms;
        let node = self.node(counter);
        if node.token_queue {
            self.token_wakes
                .push(Reverse((node.next_token_ms(now), counter)));
        }
        self.prune(counter);
    }

    /// At `now_ms`: wakes the head token waiter of every counter whose next token is there, and
    /// forgets counters kept only for a bucket that is full again.
    pub fn wake_due(&mut self, now_ms: u64, book: &RuleBook, woken: &mut Vec<WaiterId>) {
        self.now_ms = self.now_ms.max(now_ms);
        while let Some(&Reverse((due, counter))) = self.token_wakes.peek()
            && due <= now_ms
        {
            self.token_wakes.pop();
            // Entries may be stale: the counter gone, or its waiters already woken.
            let live = self
                .nodes
                .get(counter.0 as usize)
                .is_some_and(Option::is_some);
            if !live {
                continue;
            }
            self.resolve(counter, book);
            let node = self.node_mut(counter);
            let next = node.next_token_ms(now_ms);
            let Some(bounds) = node.bounds.as_deref_mut() else {
                continue;
            };
            if bounds.rate_pending || bounds.rate_waiters.is_empty() {
                continue;
            }
            if next > now_ms {
                self.token_wakes.push(Reverse((next, counter)));
                continue;
            }
            let (ticket, waiter, _) = bounds.rate_waiters.pop().expect("checked non-empty");
            bounds.rate_pending = true;
            node.vtime = node.vtime.max(ticket.start());
            node.sync();
            woken.push(waiter);
        }
        while let Some(&Reverse((due, counter))) = self.cooling.peek()
            && due <= now_ms
        {
            self.cooling.pop();
            if self
                .nodes
                .get(counter.0 as usize)
                .is_some_and(Option::is_some)
            {
                self.prune(counter);
            }
        }
    }

    /// Whether a token waiter's wake-up is due at `now_ms`.
    pub fn token_wake_due(&self, now_ms: u64) -> bool {
        self.token_wakes
            .peek()
            .is_some_and(|Reverse((at, _))| *at <= now_ms)
    }

    /// When [`Limiter::wake_due`] has something to do next, ms.
    pub fn next_wake(&self) -> Option<u64> {
        let token = self.token_wakes.peek().map(|Reverse((at, _))| *at);
        let cooling = self.cooling.peek().map(|Reverse((at, _))| *at);
        token.into_iter().chain(cooling).min()
    }
}
