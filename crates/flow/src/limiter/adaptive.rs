//! Adaptive concurrency: a counter whose rule says `adaptive = { min, max }` (and no static
//! `concurrency`, which wins) moves its own limit with what the deployment shows.
//!
//! - **Latency gradient.** Each admission's slot is held for some time (its attempt's run).
//!   The counter keeps a baseline, the lowest mean hold time seen, drifting up slowly so that a
//!   deployment that got slower for good is re-measured. Every window (at least 4 releases
//!   and at least the limit: about one round of its slots) compares the window's mean hold
//!   time with it: near the baseline (within 10 %) and with the limit in use, the limit rises
//!   by a quarter (at least 1); above it, the limit falls to what the ratio says the
//!   deployment sustains (`limit × baseline / mean`, plus 1 to keep probing, and at least 1
//!   lower).
//! - **Hold-time backstop.** A deployment that stops answering sends no samples. When the
//!   slots running now have been held, on average, over 4 × the baseline, the limit drops at
//!   once to half of what runs (not below `min`), without waiting for a release to say so.
//!
//! The limit starts at `min` and stays within `[min, max]`.

/// Releases a window takes at least.
const MIN_WINDOW: u32 = 4;
/// A window's mean within this of the baseline counts as "near" it.
const NEAR: f64 = 0.9;
/// The baseline drifts up by this share of the gap each window.
const DRIFT: f64 = 1.0 / 64.0;
/// Running slots held this many baselines on average trigger the backstop.
const STUCK: f64 = 4.0;

/// One counter's adaptive limit.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Adaptive {
    pub(crate) min: u32,
    pub(crate) max: u32,
    /// The limit in force.
    pub(crate) limit: u32,
    /// The lowest mean hold time seen (ms, drifting up); 0 before the first window.
    baseline_ms: f64,
    window_sum_ms: u64,
    window_n: u32,
    /// The most running at once during the window.
    window_peak: u32,
    /// Slots running now and the sum of when they were taken (ms), for their mean age.
    running: u32,
    taken_sum_ms: u128,
}

impl Adaptive {
    /// A controller for `[min, max]`, starting at `min`.
    pub(crate) fn new(min: u32, max: u32) -> Self {
        let min = min.max(1);
        let max = max.max(min);
        Self {
            min,
            max,
            limit: min,
            baseline_ms: 0.0,
            window_sum_ms: 0,
            window_n: 0,
            window_peak: 0,
            running: 0,
            taken_sum_ms: 0,
        }
    }

    /// The rule's bounds changed: keep what was learnt, within the new bounds.
    pub(crate) fn rebound(&mut self, min: u32, max: u32) {
        self.min = min.max(1);
        self.max = max.max(self.min);
        self.limit = self.limit.clamp(self.min, self.max);
    }

    /// A slot was taken at `now`.
    pub(crate) fn taken(&mut self, now: u64) {
        self.running += 1;
        self.taken_sum_ms += u128::from(now);
        self.window_peak = self.window_peak.max(self.running);
    }

    /// A slot taken at `taken` was given back at `now`; true when the limit changed.
    pub(crate) fn released(&mut self, taken: u64, now: u64) -> bool {
        self.running = self.running.saturating_sub(1);
        self.taken_sum_ms = self.taken_sum_ms.saturating_sub(u128::from(taken));
        self.window_sum_ms = self
            .window_sum_ms
            .saturating_add(now.saturating_sub(taken).max(1));
        self.window_n += 1;
        if self.window_n < MIN_WINDOW.max(self.limit) {
            return false;
        }
        let mean = self.window_sum_ms as f64 / f64::from(self.window_n);
        let in_use = self.window_peak.saturating_mul(2) >= self.limit;
        self.window_sum_ms = 0;
        self.window_n = 0;
        self.window_peak = self.running;
        if self.baseline_ms == 0.0 || mean < self.baseline_ms {
            self.baseline_ms = mean;
        } else {
            self.baseline_ms += (mean - self.baseline_ms) * DRIFT;
        }
        let before = self.limit;
        let ratio = self.baseline_ms / mean;
        if ratio >= NEAR {
            if in_use {
                self.limit = self.limit.saturating_add((self.limit / 4).max(1));
            }
        } else {
            let sustained = (f64::from(self.limit) * ratio).floor() as u32 + 1;
            self.limit = sustained.min(self.limit.saturating_sub(1));
        }
        self.limit = self.limit.clamp(self.min, self.max);
        self.limit != before
    }

    /// The backstop at `now`: true when it lowered the limit.
    pub(crate) fn backstop(&mut self, now: u64) -> bool {
        if self.running == 0 || self.baseline_ms == 0.0 {
            return false;
        }
        let mean_taken = self.taken_sum_ms / u128::from(self.running);
        let age = u128::from(now).saturating_sub(mean_taken) as f64;
        if age <= STUCK * self.baseline_ms {
            return false;
        }
        let lowered = (self.running.min(self.limit) / 2).max(self.min);
        if lowered < self.limit {
            self.limit = lowered;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::Adaptive;

    /// Runs `rounds` windows against a deployment whose hold time at `c` running is
    /// `latency(c)`, always as busy as the limit allows; answers the limit after each.
    fn drive(a: &mut Adaptive, rounds: usize, latency: impl Fn(u32) -> u64) -> Vec<u32> {
        let mut now = 1_000;
        let mut seen = Vec::new();
        for _ in 0..rounds {
            let c = a.limit;
            for _ in 0..c {
                a.taken(now);
            }
            let held = latency(c);
            now += held;
            for _ in 0..c {
                a.released(now - held, now);
            }
            seen.push(a.limit);
        }
        seen
    }

    #[test]
    fn it_rises_while_latency_holds_settles_where_it_grows_and_rises_again() {
        let mut a = Adaptive::new(1, 64);
        // 100 ms up to 8 at once, then in proportion.
        let knee = |c: u32| 100 * u64::from(c.max(8)) / 8;
        let seen = drive(&mut a, 60, knee);
        let settled = &seen[30..];
        assert!(
            settled.iter().all(|l| (7..=11).contains(l)),
            "settles near 8: {seen:?}"
        );
        // The handler speeds up: latency no longer grows with concurrency.
        let seen = drive(&mut a, 40, |_| 40);
        assert_eq!(*seen.last().unwrap(), 64, "rises to max again: {seen:?}");
    }

    #[test]
    fn it_stays_within_its_bounds_and_rebounds_keep_what_it_learnt() {
        let mut a = Adaptive::new(3, 5);
        assert_eq!(a.limit, 3);
        let seen = drive(&mut a, 20, |_| 10);
        assert!(seen.iter().all(|l| (3..=5).contains(l)), "{seen:?}");
        assert_eq!(a.limit, 5);
        a.rebound(1, 4);
        assert_eq!(a.limit, 4);
        let seen = drive(&mut a, 20, |c| 10 * u64::from(c));
        assert!(seen.iter().all(|l| (1..=4).contains(l)), "{seen:?}");
    }

    #[test]
    fn the_backstop_halves_a_limit_whose_slots_are_stuck() {
        let mut a = Adaptive::new(1, 64);
        drive(&mut a, 20, |_| 50);
        let limit = a.limit;
        assert!(limit > 8, "{limit}");
        for _ in 0..limit {
            a.taken(10_000_000);
        }
        assert!(!a.backstop(10_000_000 + 100), "young slots are not stuck");
        assert!(a.backstop(10_000_000 + 1_000), "4 × 50 ms passed");
        assert_eq!(a.limit, (limit / 2).max(1));
    }
}
