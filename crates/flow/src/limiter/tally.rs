//! What a rule's counters did, for charts and metrics: admissions, refusals, and how long new
//! invocations waited before they started, in a histogram with power-of-two buckets. Totals
//! only grow; a reader takes the difference of two readings for a rate or a recent p99.

/// Buckets: `0` ms, then `[2^(i-1), 2^i)` ms for bucket `i`, the last open-ended (≥ 2^30 ms,
/// about 12 days).
pub const WAIT_BUCKETS: usize = 32;

/// Wait times, counted by bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitHistogram {
    counts: [u64; WAIT_BUCKETS],
}

impl Default for WaitHistogram {
    fn default() -> Self {
        Self {
            counts: [0; WAIT_BUCKETS],
        }
    }
}

impl WaitHistogram {
    /// Counts one wait of `ms`.
    pub fn record(&mut self, ms: u64) {
        let bucket = (u64::BITS - ms.leading_zeros()) as usize;
        self.counts[bucket.min(WAIT_BUCKETS - 1)] += 1;
    }

    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: &WaitHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a = a.saturating_add(b);
        }
    }

    /// What was counted since `earlier` (a reading of the same totals).
    pub fn since(&self, earlier: &WaitHistogram) -> WaitHistogram {
        let mut out = *self;
        for (a, b) in out.counts.iter_mut().zip(earlier.counts) {
            *a = a.saturating_sub(b);
        }
        out
    }

    /// Waits counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `q` quantile (0 < q ≤ 1), as its bucket's upper bound in ms (so at most twice the
    /// true value); `None` with nothing counted.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        // The rank of the quantile, 1-based, rounded up.
        let rank = ((total as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(if bucket == 0 { 0 } else { (1u64 << bucket) - 1 });
            }
        }
        Some(u64::MAX)
    }
}

/// A rule's totals at one level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Admissions.
    pub admitted: u64,
    /// New invocations refused (`max_queued` full, or a rejecting rate out of tokens).
    pub refused: u64,
    /// How long new invocations waited before they started.
    pub waits: WaitHistogram,
    /// Cost charged to budgets as calls ended.
    pub charged: u64,
    /// Cost reported past what one call may charge, cut from the charges.
    pub overrun: u64,
}

impl Tally {
    /// Adds `other`'s totals.
    pub fn merge(&mut self, other: &Tally) {
        self.admitted = self.admitted.saturating_add(other.admitted);
        self.charged = self.charged.saturating_add(other.charged);
        self.overrun = self.overrun.saturating_add(other.overrun);
        self.refused = self.refused.saturating_add(other.refused);
        self.waits.merge(&other.waits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_are_powers_of_two() {
        let mut h = WaitHistogram::default();
        for ms in [0, 1, 2, 3, 4, 1000] {
            h.record(ms);
        }
        assert_eq!(h.count(), 6);
        assert_eq!(h.quantile(1.0 / 6.0), Some(0));
        assert_eq!(h.quantile(0.5), Some(3), "2 and 3 share [2, 4)");
        assert_eq!(h.quantile(1.0), Some(1023));
        assert_eq!(WaitHistogram::default().quantile(0.99), None);
    }

    proptest! {
        /// The quantile's bucket holds the true value: at least it, less than twice it (+1).
        #[test]
        fn a_quantile_bounds_the_true_value(mut waits in proptest::collection::vec(0u64..10_000_000, 1..200), q in 0.01f64..=1.0) {
            let mut h = WaitHistogram::default();
            for w in &waits {
                h.record(*w);
            }
            waits.sort_unstable();
            let rank = ((waits.len() as f64) * q).ceil().max(1.0) as usize;
            let truth = waits[rank - 1];
            let got = h.quantile(q).unwrap();
            prop_assert!(got >= truth, "{got} < {truth}");
            prop_assert!(got <= truth.saturating_mul(2).max(1), "{got} > 2 × {truth}");
            let later = {
                let mut l = h;
                l.record(5);
                l
            };
            prop_assert_eq!(later.since(&h).count(), 1);
        }
    }
}
