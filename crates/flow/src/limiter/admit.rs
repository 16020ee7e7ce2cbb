//! Admission at the counters: whether a path may start now (slots, a guarantee's borrowing,
//! quota and tokens), taking and giving back its slots, and the bounds on new entries
//! (`max-queued`, a rejecting rate or quota, `max_wait`) with what they tally.

use super::*;

impl Limiter {
    /// Whether every counter of `path` has room (and, for a path that takes tokens, a token);
    /// `Err` names the deepest one that has not, its slots before its tokens.
    ///
    /// Slots offered to woken waiters are reserved for them, so a newcomer counts them as used;
    /// tokens likewise go to those already waiting for them, in order. A woken waiter
    /// (`woken`) checks actual usage and tokens only: had it to respect the reservations of
    /// waiters woken at other levels, two of them could each hold what the other needs and
    /// hand their slots back and forth forever. Borrowing is the exception: see
    /// [`Limiter::check_woken`].
    pub fn check(
        &mut self,
        path: &CounterPath,
        book: &RuleBook,
        woken: bool,
        tokens: bool,
        now_ms: u64,
    ) -> Result<(), Blocked> {
        let woken = if woken { Woken::Elsewhere } else { Woken::No };
        self.check_woken(path, book, woken, tokens, now_ms)
    }

    /// [`Limiter::check`] for a waiter woken as `woken` says.
    ///
    /// A slot beyond a key's guarantee is lent by its parent only while no waiter whose key
    /// is within its guarantee waits there (borrowed slots go back first), and, for a waiter
    /// woken elsewhere, only from slots not reserved for others. A waiter woken at the parent
    /// takes its slot: it was picked there, those within a guarantee first. That cannot hand
    /// slots back and forth, for whoever holds the parent's reservation ignores reservations
    /// as any woken waiter does.
    pub fn check_woken(
        &mut self,
        path: &CounterPath,
        book: &RuleBook,
        woken: Woken,
        tokens: bool,
        now_ms: u64,
    ) -> Result<(), Blocked> {
        self.now_ms = self.now_ms.max(now_ms);
        let mut blocked = None;
        let counters = path.counters();
        for (at, &id) in counters.iter().enumerate() {
            self.resolve(id, book);
            self.adapt_backstop(id, now_ms);
            if self.node(id).measures(Measure::Burst) {
                self.burst_tick(id, now_ms);
            }
            let node = self.node(id);
            let new = woken == Woken::No;
            let reserved = if new { node.pending } else { 0 };
            // Lends a slot beyond the next counter's guarantee (see above).
            if !node.limit.admits(node.usage + reserved) {
                blocked = Some((id, None, false));
                continue;
            }
            // Nobody within a guarantee waits and no slot is reserved: it lends (most counters,
            // so the common case reads two fields).
            let lends = (node.owed == 0 && node.pending == 0)
                || match woken {
                    Woken::At(counter) => {
                        counter == id
                            || (node.owed == 0 && node.limit.admits(node.usage + node.pending))
                    }
                    Woken::No => node.owed == 0,
                    Woken::Elsewhere => {
                        node.owed == 0 && node.limit.admits(node.usage + node.pending)
                    }
                };
            if !lends {
                // Whether the next counter borrows needs its guarantee as the book says now.
                let child = counters.get(at + 1).copied();
                if let Some(child) = child {
                    self.resolve(child, book);
                }
                if self.borrows(child.as_ref()) {
                    blocked = Some((id, None, true));
                    continue;
                }
            }
            let node = self.node(id);
            if tokens && let Some((m, quota, at)) = node.used_up(now_ms) {
                blocked = Some((id, Some(Waits::Quota(m, quota, at)), false));
                continue;
            }
            if tokens && let Some(rate) = node.rate {
                let queued = new && node.token_queue;
                let next = node.bucket.next_token_ms(rate, now_ms);
                if queued || next > now_ms {
                    blocked = Some((id, Some(Waits::Rate(rate, next)), false));
                }
            }
        }
        match blocked {
            None => Ok(()),
            Some((id, waits, borrows)) => {
                let node = self.node(id);
                let (rate, quota) = match waits {
                    Some(Waits::Rate(rate, next)) => (Some((rate, next)), None),
                    Some(Waits::Quota(m, quota, at)) => (None, Some((m, quota, at))),
                    None => (None, None),
                };
                Err(Blocked {
                    level: node.level,
                    counter: id,
                    limit: node.limit,
                    borrows,
                    rate,
                    quota,
                    rule: node.rule.clone(),
                })
            }
        }
    }

    /// Takes a slot at every counter of `path` at once, and a token at each rate limited one
    /// when `tokens` (after a successful [`Limiter::check`]).
    pub fn acquire(&mut self, path: &CounterPath, tokens: bool, now_ms: u64) -> Permit {
        let mut reserved: Option<Box<Reserved>> = None;
        for &id in path.counters() {
            let node = self.node_mut(id);
            let usage = node.usage;
            let was = node.within();
            node.usage += 1;
            node.admitted += 1;
            let burstable = node.guaranteed != 0;
            if tokens && let Some(rate) = node.rate {
                node.bucket.take(rate, now_ms);
            }
            let (quota_dirty, reserve) = if tokens && node.measured != 0 {
                node.take_windows(now_ms)
            } else {
                (false, 0)
            };
            if reserve > 0 {
                reserved.get_or_insert_default()[node.level.index()] = reserve;
            }
            if node.watched
                && let Some(bounds) = node.bounds.as_deref_mut()
            {
                bounds.admitted(usage, tokens, now_ms);
            }
            let bursts = node.measures(Measure::Burst);
            if quota_dirty {
                self.kept[Measure::Calls as usize].dirty.push(id);
            }
            if burstable {
                self.rewithin(id, was);
            }
            if bursts {
                self.burst_tick(id, now_ms);
            }
        }
        Permit {
            path: *path,
            taken_ms: now_ms,
            class: 0,
            reserved,
        }
    }

    /// [`Limiter::check`] then [`Limiter::acquire`], taking tokens.
    pub fn try_acquire(
        &mut self,
        path: &CounterPath,
        book: &RuleBook,
        now_ms: u64,
    ) -> Result<Permit, Blocked> {
        self.check(path, book, false, true, now_ms)?;
        Ok(self.acquire(path, true, now_ms))
    }

    /// Gives back a permit's slots at `now_ms`; pushes the waiters to wake onto `woken`,
    /// deepest level first. An adaptive counter learns from how long the slot was held.
    pub fn release(
        &mut self,
        permit: Permit,
        book: &RuleBook,
        now_ms: u64,
        woken: &mut Vec<WaiterId>,
    ) {
        self.now_ms = self.now_ms.max(now_ms);
        // Reservations its call did not take over go back with the slots.
        if let Some(reserved) = &permit.reserved {
            self.unreserve(&permit.path, reserved);
        }
        let counters = permit.path.counters();
        for &id in counters {
            let node = self.node_mut(id);
            let was = node.within();
            node.usage -= 1;
            let burstable = node.guaranteed != 0;
            if node.watched
                && let Some(state) = node.bounds.as_deref_mut().and_then(|b| b.adaptive.as_mut())
                && state.released(permit.taken_ms, now_ms, permit.class)
            {
                node.limit = adaptive_limit(state);
            }
            if burstable {
                self.rewithin(id, was);
            }
            if self.node(id).measures(Measure::Burst) {
                self.burst_tick(id, now_ms);
            }
        }
        for &id in counters.iter().rev() {
            self.pump(id, book, woken);
        }
        self.prune(counters[counters.len() - 1]);
    }

    /// Counts an entry waiting (`true`) or no longer waiting (`false`) at every counter of
    /// `path`.
    pub fn count_queued(&mut self, path: &CounterPath, waiting: bool) {
        for &id in path.counters() {
            let node = self.node_mut(id);
            if waiting
                && let Some(shadow) = node.bounds.as_deref_mut().and_then(|b| b.shadow.as_mut())
            {
                shadow.enqueue(node.queued);
            }
            node.queued = if waiting {
                node.queued.saturating_add(1)
            } else {
                node.queued.saturating_sub(1)
            };
        }
    }

    /// Whether a new entry on `path` must be refused rather than queued: a counter holds
    /// `max-queued` waiting entries already, or its rate rejects and no token is there for a
    /// newcomer. The deepest such counter answers.
    pub fn refusal(&mut self, path: &CounterPath, book: &RuleBook, now_ms: u64) -> Option<Refusal> {
        self.now_ms = self.now_ms.max(now_ms);
        let mut refused = None;
        for &id in path.counters() {
            self.resolve(id, book);
            let node = self.node(id);
            // Under `keep_oldest` or `keep_newest`, `max_queued` bounds what waits by
            // dropping or replacing (`crowd.rs`), not by refusing.
            if let Some(bounds) = &node.bounds
                && let Some(max) = bounds.max_queued
                && node.queued >= max.get()
                && !bounds.crowd.as_ref().is_some_and(|c| c.bounds_waiting())
            {
                // Each admission lets one more in: the queue ahead drains at the mean gap.
                let gap = bounds.mean_gap_ms.max(1);
                let wait = u64::from(node.queued - max.get() + 1).saturating_mul(gap);
                refused = Some(Refusal {
                    level: node.level,
                    rule: node.rule.clone(),
                    why: RefusalReason::QueueFull {
                        max_queued: max.get(),
                    },
                    retry_after_ms: wait,
                });
                continue;
            }
            if let Some((m, quota, at)) = node.used_up(now_ms).filter(|(_, q, _)| q.reject) {
                // `used_up` names gates only: a burst budget never holds a call back.
                let why = match m {
                    Measure::Calls | Measure::Burst => RefusalReason::QuotaExhausted { quota },
                    Measure::Cost => RefusalReason::BudgetExhausted { budget: quota },
                };
                refused = Some(Refusal {
                    level: node.level,
                    rule: node.rule.clone(),
                    why,
                    retry_after_ms: at.saturating_sub(now_ms).max(1),
                });
                continue;
            }
            if let Some((bound, next_end)) = self.idle_quotas_full(id, now_ms) {
                let node = self.node(id);
                refused = Some(Refusal {
                    level: node.level,
                    rule: node.rule.clone(),
                    why: RefusalReason::IdleQuotasFull { bound },
                    retry_after_ms: next_end.saturating_sub(now_ms).max(1),
                });
                continue;
            }
            let node = self.node(id);
            if let Some(rate) = node.rate.filter(|r| r.reject) {
                let next = node.bucket.next_token_ms(rate, now_ms);
                if node.token_queue || next > now_ms {
                    refused = Some(Refusal {
                        level: node.level,
                        rule: node.rule.clone(),
                        why: RefusalReason::RateExceeded { rate },
                        retry_after_ms: next.saturating_sub(now_ms).max(1),
                    });
                }
            }
        }
        if let Some(refusal) = &refused {
            let deepest = path
                .counters()
                .iter()
                .rev()
                .find(|id| self.node(**id).level == refusal.level)
                .copied();
            if let Some(id) = deepest {
                self.rare(id).refused += 1;
            }
        }
        refused
    }

    /// Counts how long a new invocation on `path` waited before it started (`ms`), at each of
    /// its counters (they are live: it holds a permit of them).
    pub fn record_wait(&mut self, path: &CounterPath, ms: u64) {
        for &id in path.counters() {
            self.rare(id).waits.record(ms);
        }
    }

    /// The tightest `max_wait` of the counters of `path`: its ms, and the level and rule of the
    /// counter that sets it (the deepest among equals).
    pub fn max_wait(&mut self, path: &CounterPath, book: &RuleBook) -> Option<MaxWait> {
        let mut tightest: Option<MaxWait> = None;
        for &id in path.counters() {
            self.resolve(id, book);
            let node = self.node(id);
            let Some(ms) = node.bounds.as_ref().and_then(|b| b.max_wait_ms) else {
                continue;
            };
            if tightest.as_ref().is_none_or(|t| ms.get() <= t.ms) {
                tightest = Some(MaxWait {
                    ms: ms.get(),
                    level: node.level,
                    rule: node.rule.clone(),
                });
            }
        }
        tightest
    }
}
