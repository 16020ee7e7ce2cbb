//! Adaptive concurrency: a counter whose rule says `adaptive = { min, max }` (and no static
//! `concurrency`, which wins) moves its own limit with what the deployment shows.
//!
//! - **Latency gradient, per handler.** Each admission's slot is held for some time (its
//!   attempt's run), and says which handler ran (its *class*). Each class keeps its own
//!   baseline, the lowest mean hold time seen for it, drifting up slowly so that a handler
//!   that got slower for good is re-measured. Every window (at least 4 releases and at least
//!   the limit: about one round of its slots) compares each class's mean hold time in the
//!   window with that class's baseline, and weighs the ratios by the slot time the class
//!   took: near the baselines (within 10 %) and with the limit in use, the limit rises by a
//!   quarter (at least 1); above them, it falls to what the ratio says the deployment sustains
//!   (`limit × baseline / mean`, plus 1 to keep probing, and at least 1 lower). A scope whose
//!   handlers differ a hundredfold in speed is judged by whether each got slower, not by
//!   how the slow ones compare with the fast: one client looping a fast handler cannot drive
//!   the limit to its floor, and the limit rises again as soon as its handlers run as fast
//!   as they did.
//! - **Hold-time backstop.** A deployment that stops answering sends no samples. When the
//!   slots running now have been held, on average, over 4 × the slowest class's baseline,
//!   the limit drops at once to half of what runs (not below `min`), without waiting for a
//!   release to say so.
//!
//! Classes are kept by their number, each with its own baseline, at most [`MAX_CLASSES`] of
//! them per counter: a class beyond that takes the place of the one that released longest ago
//! (which learns its baseline again if it comes back), so two handlers never share a baseline
//! and memory stays bounded whatever the callers name.
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
/// Handler classes one counter keeps a baseline for.
pub(crate) const MAX_CLASSES: usize = 64;

/// One class's hold times.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Class {
    /// The class's number (its handler's).
    class: u64,
    /// The window in which it last released a slot.
    seen: u64,
    /// The lowest mean hold time seen (ms, drifting up); 0 before its first window.
    baseline_ms: f64,
    /// This window's releases: the sum of their hold times, and how many.
    sum_ms: u64,
    n: u32,
}

/// One counter's adaptive limit.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Adaptive {
    pub(crate) min: u32,
    pub(crate) max: u32,
    /// The limit in force.
    pub(crate) limit: u32,
    /// The classes seen, at most [`MAX_CLASSES`] (few: a scope's handlers).
    classes: Vec<Class>,
    /// Windows ended so far.
    windows: u64,
    /// Releases in this window, of every class.
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
            classes: Vec::new(),
            windows: 0,
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

    /// A slot of handler class `class`, taken at `taken`, was given back at `now`; true when
    /// the limit changed.
    pub(crate) fn released(&mut self, taken: u64, now: u64, class: u64) -> bool {
        self.running = self.running.saturating_sub(1);
        self.taken_sum_ms = self.taken_sum_ms.saturating_sub(u128::from(taken));
        let window = self.windows;
        let place = self.place_of(class);
        place.seen = window;
        place.sum_ms = place
            .sum_ms
            .saturating_add(now.saturating_sub(taken).max(1));
        place.n += 1;
        self.window_n += 1;
        if self.window_n < MIN_WINDOW.max(self.limit) {
            return false;
        }
        let in_use = self.window_peak.saturating_mul(2) >= self.limit;
        // Each class against its own baseline, weighed by the slot time it took: concurrency
        // is spent on the handlers that hold slots longest, and a fast handler's jittery
        // millisecond counts for what it costs.
        let (mut weighed, mut held) = (0.0, 0.0);
        for class in self.classes.iter_mut().filter(|c| c.n > 0) {
            let mean = class.sum_ms as f64 / f64::from(class.n);
            if class.baseline_ms == 0.0 || mean < class.baseline_ms {
                class.baseline_ms = mean;
            } else {
                class.baseline_ms += (mean - class.baseline_ms) * DRIFT;
            }
            weighed += class.sum_ms as f64 * class.baseline_ms / mean;
            held += class.sum_ms as f64;
            class.sum_ms = 0;
            class.n = 0;
        }
        let ratio = if held > 0.0 { weighed / held } else { 1.0 };
        self.windows += 1;
        self.window_n = 0;
        self.window_peak = self.running;
        let before = self.limit;
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

    /// The place of class `class`: its own, or a new one (taking the place of the class
    /// that released longest ago when [`MAX_CLASSES`] are kept).
    fn place_of(&mut self, class: u64) -> &mut Class {
        if let Some(i) = self.classes.iter().position(|c| c.class == class) {
            return &mut self.classes[i];
        }
        let fresh = Class {
            class,
            ..Class::default()
        };
        if self.classes.len() < MAX_CLASSES {
            self.classes.push(fresh);
            return self.classes.last_mut().expect("just pushed");
        }
        let (oldest, _) = self
            .classes
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.seen)
            .expect("MAX_CLASSES > 0");
        // Its releases in this window leave with it.
        let gone = std::mem::replace(&mut self.classes[oldest], fresh);
        self.window_n = self.window_n.saturating_sub(gone.n);
        &mut self.classes[oldest]
    }

    /// The backstop at `now`: true when it lowered the limit.
    pub(crate) fn backstop(&mut self, now: u64) -> bool {
        // The slowest handler's baseline: slots of a slow handler are not stuck for being
        // slower than a fast one's.
        let baseline_ms = self
            .classes
            .iter()
            .map(|c| c.baseline_ms)
            .fold(0.0, f64::max);
        if self.running == 0 || baseline_ms == 0.0 {
            return false;
        }
        let mean_taken = self.taken_sum_ms / u128::from(self.running);
        let age = u128::from(now).saturating_sub(mean_taken) as f64;
        if age <= STUCK * baseline_ms {
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
                a.released(now - held, now, 0);
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

    /// Runs `rounds` windows in which each slot runs a fast handler (class 1, 2 ms) or a slow
    /// one (class 2, 200 ms) in turn, neither slowing with concurrency; answers the limits.
    fn drive_mix(a: &mut Adaptive, rounds: usize, fast_share: u32) -> Vec<u32> {
        let mut now = 1_000;
        let mut seen = Vec::new();
        for _ in 0..rounds {
            let c = a.limit;
            for _ in 0..c {
                a.taken(now);
            }
            // Fast slots come back first, many times over, as a looping client's would.
            for _ in 0..c * fast_share {
                a.taken(now);
                a.released(now, now + 2, 1);
            }
            now += 200;
            for _ in 0..c {
                a.released(now - 200, now, 2);
            }
            seen.push(a.limit);
        }
        seen
    }

    #[test]
    fn a_fast_handler_beside_a_slow_one_does_not_drive_the_limit_down() {
        let mut a = Adaptive::new(1, 64);
        drive(&mut a, 40, |_| 200);
        assert_eq!(a.limit, 64, "the slow handler alone rises to max");
        // A client loops the fast handler in the same scope: neither handler got slower.
        let seen = drive_mix(&mut a, 30, 10);
        assert!(seen.iter().all(|l| *l == 64), "fell with the mix: {seen:?}");
    }

    #[test]
    fn a_limit_lowered_by_a_slow_spell_recovers_when_it_ends() {
        let mut a = Adaptive::new(1, 64);
        drive(&mut a, 40, |_| 100);
        assert_eq!(a.limit, 64);
        // The handler is ten times slower for a while: the limit falls.
        let seen = drive(&mut a, 10, |_| 1_000);
        assert!(*seen.last().unwrap() < 16, "{seen:?}");
        // As fast as before again: back to max within a few rounds.
        let seen = drive(&mut a, 30, |_| 100);
        assert_eq!(*seen.last().unwrap(), 64, "{seen:?}");
    }

    #[test]
    fn handlers_whose_numbers_were_one_place_apart_keep_their_own_baselines() {
        // Classes 1 and 17 shared a place in a table of 16: the fast one's 2 ms became the
        // slow one's baseline, and the slow one looked 100 times slower than it is.
        let mut a = Adaptive::new(1, 64);
        let mut now = 1_000;
        for _ in 0..40 {
            let c = a.limit;
            for _ in 0..c {
                a.taken(now);
                a.released(now, now + 2, 1);
            }
            for _ in 0..c {
                a.taken(now);
            }
            now += 200;
            for _ in 0..c {
                a.released(now - 200, now, 17);
            }
        }
        assert_eq!(a.limit, 64, "neither handler got slower");
        let baseline = |class| {
            a.classes
                .iter()
                .find(|c| c.class == class)
                .unwrap()
                .baseline_ms
        };
        assert!(
            baseline(1) < 3.0 && baseline(17) >= 199.0,
            "{:?}",
            a.classes
        );
    }

    #[test]
    fn past_its_bound_a_new_class_takes_the_place_released_longest_ago() {
        let mut a = Adaptive::new(1, 64);
        let mut now = 1_000;
        for class in 0..(super::MAX_CLASSES as u64 + 10) {
            for _ in 0..4 {
                a.taken(now);
                now += 5;
                a.released(now - 5, now, class);
            }
        }
        assert_eq!(a.classes.len(), super::MAX_CLASSES);
        assert!(
            a.classes.iter().all(|c| c.class >= 10),
            "the first ten went first"
        );
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
