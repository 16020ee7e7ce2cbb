//! What only some counters need, boxed so that the rest stay small (counters are many, and the
//! hot path walks three of them): a rate's bucket and token waiters, a queue bound, the drain
//! estimate behind `Retry-After`, and the tallies of a shadow rule.

use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;

use super::waits::WaitList;
use crate::rate::Bucket;
use crate::rules::{Limit, ShadowRule};

/// The state of a counter's token waiters, queue bound and shadow rule (its rate and bucket
/// live in the node: every admission reads them).
#[derive(Debug, Default)]
pub(super) struct Bounds {
    /// Waiters for a token; the first in line is woken when the next one is due.
    pub(super) rate_waiters: WaitList,
    /// A token waiter was woken and has not re-checked yet.
    pub(super) rate_pending: bool,
    pub(super) max_queued: Option<NonZeroU32>,
    /// The adaptive limit's controller, when its rule adapts.
    pub(super) adaptive: Option<super::adaptive::Adaptive>,
    /// The longest a new invocation may wait here (its rule's `max_wait`), ms.
    pub(super) max_wait_ms: Option<NonZeroU64>,
    /// The shadow rule evaluated here, if one matches.
    pub(super) shadow: Option<Shadow>,
    /// Its rule's `on_full`, with the entries a decision may name.
    pub(super) crowd: Option<super::crowd::Crowd>,
    /// Admissions here (counted only under a `max-queued`): the last one's time and the mean
    /// gap between them (ms), for how long a full queue takes to drain.
    pub(super) last_admit_ms: u64,
    pub(super) mean_gap_ms: u64,
}

impl Bounds {
    /// Whether waiters are ahead of a newcomer for the next token.
    pub(super) fn token_queued(&self) -> bool {
        self.rate_pending || !self.rate_waiters.is_empty()
    }

    /// When the shadow rule's bucket is full again, ms (0 without one).
    pub(super) fn shadow_full_at_ms(&self) -> u64 {
        self.shadow.as_ref().map_or(0, |s| s.bucket.full_at_ms())
    }

    /// Whether forgetting the shadow rule's bucket changes nothing at `now_ms`.
    pub(super) fn shadow_full(&self, now_ms: u64) -> bool {
        self.shadow
            .as_ref()
            .is_none_or(|s| s.bucket.is_full(now_ms))
    }

    /// Whether an admission must tell it something (a queue bound's drain estimate, a shadow
    /// rule's tallies).
    pub(super) fn watches_admissions(&self) -> bool {
        self.max_queued.is_some() || self.shadow.is_some() || self.adaptive.is_some()
    }

    /// An admission here, with `usage` running before it: a shadow rule tallies it, an
    /// adaptive limit notes when its slot was taken, and a queue bound's drain estimate moves.
    pub(super) fn admitted(&mut self, usage: u32, tokens: bool, now_ms: u64) {
        if let Some(shadow) = &mut self.shadow {
            shadow.admit(usage, tokens, now_ms);
        }
        if let Some(adaptive) = &mut self.adaptive {
            adaptive.taken(now_ms);
        }
        if self.max_queued.is_none() {
            return;
        }
        if self.last_admit_ms != 0 {
            let gap = now_ms.saturating_sub(self.last_admit_ms);
            // A moving mean: recent admissions count most.
            self.mean_gap_ms = (self.mean_gap_ms.saturating_mul(7).saturating_add(gap)) / 8;
        }
        self.last_admit_ms = now_ms.max(1);
    }

    /// Takes the shadow rule now in force; its tallies carry over while it is the same rule.
    pub(super) fn set_shadow(&mut self, rule: Option<Arc<ShadowRule>>) {
        self.shadow = match (self.shadow.take(), rule) {
            (_, None) => None,
            (Some(old), Some(rule)) if old.rule.pattern == rule.pattern => {
                Some(Shadow { rule, ..old })
            }
            (_, Some(rule)) => Some(Shadow {
                rule,
                bucket: Bucket::default(),
                counts: ShadowCounts::default(),
            }),
        };
    }
}

/// What a shadow rule would have done so far at one counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShadowCounts {
    /// Admissions it would have held back (no free slot, or no token).
    pub would_wait: u64,
    /// Arrivals it would have refused (a full queue, or a rejecting rate without a token).
    pub would_reject: u64,
    /// How long the held-back admissions would have waited for their tokens, ms in total.
    pub would_wait_ms: u64,
}

/// A shadow rule's state at one counter.
#[derive(Debug)]
pub(super) struct Shadow {
    pub(super) rule: Arc<ShadowRule>,
    /// Its own bucket: tokens the rule would have handed out.
    pub(super) bucket: Bucket,
    pub(super) counts: ShadowCounts,
}

impl Shadow {
    /// An admission happens with `usage` running before it: tally what the rule would have
    /// done. A throttling rate takes its token anyway (the admission would have waited for it,
    /// so later ones queue behind it); a rejecting one takes none.
    pub(super) fn admit(&mut self, usage: u32, tokens: bool, now_ms: u64) {
        let mut held =
            matches!(self.rule.limit, Limit::Concurrency(_)) && !self.rule.limit.admits(usage);
        if tokens && let Some(rate) = self.rule.rate {
            let next = self.bucket.next_token_ms(rate, now_ms);
            if next <= now_ms {
                self.bucket.take(rate, now_ms);
            } else if rate.reject {
                self.counts.would_reject += 1;
                return;
            } else {
                held = true;
                self.counts.would_wait_ms = self.counts.would_wait_ms.saturating_add(next - now_ms);
                self.bucket.take(rate, now_ms);
            }
        }
        if held {
            self.counts.would_wait += 1;
        }
    }

    /// An entry starts waiting where `queued` wait already: a bound would have refused it.
    pub(super) fn enqueue(&mut self, queued: u32) {
        if self.rule.max_queued.is_some_and(|max| queued >= max.get()) {
            self.counts.would_reject += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RulePattern;
    use crate::rate::RateLimit;

    fn shadow(limit: Option<u32>, rate: Option<&str>, max_queued: Option<u32>) -> Shadow {
        Shadow {
            rule: Arc::new(ShadowRule {
                limit: limit
                    .and_then(NonZeroU32::new)
                    .map_or(Limit::Unlimited, Limit::Concurrency),
                rate: rate.map(|r| RateLimit::new(r.parse().unwrap())),
                max_queued: max_queued.and_then(NonZeroU32::new),
                pattern: Arc::new("acme".parse::<RulePattern>().unwrap()),
            }),
            bucket: Bucket::default(),
            counts: ShadowCounts::default(),
        }
    }

    #[test]
    fn a_full_shadow_limit_counts_a_wait() {
        let mut s = shadow(Some(2), None, None);
        for usage in 0..4 {
            s.admit(usage, true, 1_000);
        }
        assert_eq!(s.counts.would_wait, 2);
    }

    #[test]
    fn a_shadow_rate_counts_waits_and_their_time() {
        let mut s = shadow(None, Some("10/s"), None);
        for _ in 0..3 {
            s.admit(0, true, 1_000);
        }
        // One token at once, then 100 ms and 200 ms late.
        assert_eq!(s.counts.would_wait, 2);
        assert_eq!(s.counts.would_wait_ms, 300);
        // Retries take no token and wait for none.
        s.admit(0, false, 1_000);
        assert_eq!(s.counts.would_wait, 2);
    }

    #[test]
    fn a_shadow_bound_counts_refusals() {
        let mut s = shadow(None, None, Some(2));
        for queued in 0..5 {
            s.enqueue(queued);
        }
        assert_eq!(s.counts.would_reject, 3);
    }
}
