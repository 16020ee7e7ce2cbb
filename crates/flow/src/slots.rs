//! The invoker's global concurrency limit, shared by every partition's scheduler.
//!
//! Taking a slot is one compare-and-swap, so admission stays lock-free per partition. A
//! partition that finds no slot raises its bit in `waiting`; whoever gives a slot back
//! collects those bits and nudges the partitions they name, so nobody polls.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bits of `waiting` a partition index maps to (more partitions share bits: a spurious nudge
/// only costs a poll).
const MEMBERS: u32 = u64::BITS;

/// Slots for running attempts across partitions.
#[derive(Debug)]
pub struct InvokerSlots {
    limit: AtomicU32,
    used: AtomicU32,
    waiting: AtomicU64,
}

impl InvokerSlots {
    /// `limit` slots, all free.
    pub fn new(limit: u32) -> Self {
        Self {
            limit: AtomicU32::new(limit),
            used: AtomicU32::new(0),
            waiting: AtomicU64::new(0),
        }
    }

    /// Takes a slot if one is free.
    pub fn try_take(&self) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used < limit).then_some(used + 1)
            })
            .is_ok()
    }

    /// Takes a slot for `member`, or records that it waits for one. A slot given back between
    /// the failed take and the record is caught by the second try, so no wake-up is lost.
    pub fn take_or_wait(&self, member: u32) -> bool {
        if self.try_take() {
            return true;
        }
        self.waiting
            .fetch_or(1 << (member % MEMBERS), Ordering::AcqRel);
        self.try_take()
    }

    /// Gives a slot back; answers the members that waited for one (their bits are cleared).
    pub fn give_back(&self) -> u64 {
        self.used.fetch_sub(1, Ordering::AcqRel);
        if self.waiting.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.waiting.swap(0, Ordering::AcqRel)
    }

    /// True when every slot is taken.
    pub fn full(&self) -> bool {
        self.used.load(Ordering::Acquire) >= self.limit.load(Ordering::Relaxed)
    }

    /// Changes the number of slots; attempts already running keep theirs.
    pub fn set_limit(&self, limit: u32) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Slots taken now.
    pub fn used(&self) -> u32 {
        self.used.load(Ordering::Acquire)
    }

    /// Whether `waiters` (from [`InvokerSlots::give_back`]) names `member`.
    pub fn names(waiters: u64, member: u32) -> bool {
        waiters & (1 << (member % MEMBERS)) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn slots_are_bounded_and_waiters_are_named_once() {
        let slots = InvokerSlots::new(2);
        assert!(slots.try_take() && slots.try_take());
        assert!(slots.full());
        assert!(!slots.take_or_wait(3));
        assert!(!slots.take_or_wait(70));
        let woken = slots.give_back();
        assert!(InvokerSlots::names(woken, 3) && InvokerSlots::names(woken, 70));
        assert!(!InvokerSlots::names(woken, 4));
        assert_eq!(slots.give_back(), 0, "the bits were cleared");
        assert_eq!(slots.used(), 0);
    }

    /// More takers than slots, each holding its slot a moment: the holders are counted apart
    /// from the code under test, and some takers must have been turned away.
    #[test]
    fn concurrent_takers_never_exceed_the_limit() {
        const LIMIT: u32 = 3;
        let slots = Arc::new(InvokerSlots::new(LIMIT));
        let holding = Arc::new(AtomicU32::new(0));
        let peak = Arc::new(AtomicU32::new(0));
        let refused = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..8)
            .map(|member| {
                let slots = Arc::clone(&slots);
                let (holding, peak, refused) = (
                    Arc::clone(&holding),
                    Arc::clone(&peak),
                    Arc::clone(&refused),
                );
                std::thread::spawn(move || {
                    for _ in 0..5_000 {
                        if slots.take_or_wait(member) {
                            let now = holding.fetch_add(1, Ordering::AcqRel) + 1;
                            peak.fetch_max(now, Ordering::AcqRel);
                            std::thread::yield_now();
                            holding.fetch_sub(1, Ordering::AcqRel);
                            slots.give_back();
                        } else {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let peak = peak.load(Ordering::Acquire);
        assert!(
            peak <= LIMIT,
            "{peak} holders at once, the limit is {LIMIT}"
        );
        assert!(
            refused.load(Ordering::Relaxed) > 0,
            "no taker was ever turned away: the test did not contend"
        );
        assert_eq!(slots.used(), 0);
    }
}
