//! The waiters of one counter, in the order they are admitted: start-time fair queuing across
//! the counter's children, with a head start for priority.
//!
//! A waiter belongs to a *flow*: the child of the counter on its path (its L1 key under a
//! scope, its L2 key under an L1 key), or the counter itself when its path ends there. Each
//! flow has a finish tag in the counter's virtual time; a waiter starts at
//! `max(virtual time, its flow's finish)` and moves its flow's finish on by `SCALE / weight`,
//! so backlogged siblings are admitted in the ratio of their weights and an idle flow banks no
//! credit. Priority subtracts a head start of [`PRIORITY_STEP`] weight-1 admissions per level
//! (it is added to everyone below the highest, so tags never underflow). A waiter is therefore
//! overtaken by fewer than `9 × PRIORITY_STEP` later arrivals of its own flow: low priority
//! ages into the front and is never starved.

use std::collections::BTreeMap;

use super::{CounterId, WaiterId};
use crate::priority::Priority;

/// Virtual time one admission of a weight-1 flow takes.
pub(crate) const SCALE: u64 = 1_000_000;

/// Weight-1 admissions of head start per level of priority.
pub const PRIORITY_STEP: u64 = 10;

/// A waiter's place in line; keep it to take the waiter out or put it back where it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket {
    tag: u64,
    seq: u64,
    start: u64,
}

impl Ticket {
    /// A ticket that starts at `start` (virtual time) for `priority`; `seq` breaks ties FIFO.
    pub(crate) fn new(start: u64, priority: Priority, seq: u64) -> Self {
        Self {
            tag: start.saturating_add(priority.below_high() * PRIORITY_STEP * SCALE),
            seq,
            start,
        }
    }

    /// The virtual time it starts at.
    pub(crate) fn start(self) -> u64 {
        self.start
    }
}

/// Waiters by ticket, each with its flow (the child of the counter on its path, if any).
#[derive(Debug, Default)]
pub(crate) struct WaitList {
    waiters: BTreeMap<Ticket, (WaiterId, Option<CounterId>)>,
}

impl WaitList {
    pub(crate) fn push(&mut self, ticket: Ticket, waiter: WaiterId, flow: Option<CounterId>) {
        self.waiters.insert(ticket, (waiter, flow));
    }

    /// The first in line.
    pub(crate) fn pop(&mut self) -> Option<(Ticket, WaiterId, Option<CounterId>)> {
        self.waiters
            .pop_first()
            .map(|(ticket, (waiter, flow))| (ticket, waiter, flow))
    }

    /// The first in line whose flow `first` picks, else the first in line.
    pub(crate) fn pop_preferring(
        &mut self,
        first: impl Fn(Option<CounterId>) -> bool,
    ) -> Option<(Ticket, WaiterId, Option<CounterId>)> {
        let picked = self
            .waiters
            .iter()
            .find(|(_, (_, flow))| first(*flow))
            .map(|(ticket, _)| *ticket);
        match picked {
            Some(ticket) => {
                let (waiter, flow) = self.waiters.remove(&ticket).expect("just found");
                Some((ticket, waiter, flow))
            }
            None => self.pop(),
        }
    }

    /// Takes out the waiter with `ticket`; its flow if it was there.
    pub(crate) fn remove(&mut self, ticket: Ticket) -> Option<Option<CounterId>> {
        self.waiters.remove(&ticket).map(|(_, flow)| flow)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.waiters.len()
    }
}

/// Weight a rule may give, at most.
pub const MAX_WEIGHT: u32 = 1000;

/// The virtual time one admission of a flow of `weight` takes.
pub(crate) fn cost(weight: u32) -> u64 {
    SCALE / u64::from(weight.clamp(1, MAX_WEIGHT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn higher_priority_goes_first_and_ages_out() {
        let mut list = WaitList::default();
        // A low waiter at start 0; high waiters of the same flow arrive one admission apart.
        list.push(Ticket::new(0, Priority::LOW, 0), 0, None);
        for i in 1..=100u32 {
            list.push(
                Ticket::new(u64::from(i) * SCALE, Priority::HIGH, u64::from(i)),
                i,
                None,
            );
        }
        let order: Vec<WaiterId> = std::iter::from_fn(|| list.pop().map(|(_, w, _)| w)).collect();
        let low_at = order.iter().position(|w| *w == 0).unwrap();
        // Those that started less than 9 × PRIORITY_STEP admissions after it go first.
        assert_eq!(low_at as u64, 9 * PRIORITY_STEP - 1);
    }

    #[test]
    fn same_priority_is_fifo() {
        let mut list = WaitList::default();
        for i in 0..10u32 {
            list.push(
                Ticket::new(5 * SCALE, Priority::NORMAL, u64::from(i)),
                i,
                None,
            );
        }
        let order: Vec<WaiterId> = std::iter::from_fn(|| list.pop().map(|(_, w, _)| w)).collect();
        assert_eq!(order, (0..10).collect::<Vec<_>>());
    }
}
