//! Pauses between tries of a request that waits for the cluster to settle (a leadership move,
//! a takeover): doubling from 100 ms up to a cap, while another try can still start within the
//! request's time budget.

use std::time::{Duration, Instant};

/// The first pause.
const FIRST: Duration = Duration::from_millis(100);

/// The pauses of one request, from the moment it was made.
#[derive(Debug)]
pub struct Pauses {
    started: Instant,
    budget: Duration,
    next: Duration,
    cap: Duration,
}

impl Pauses {
    /// Pauses for a request that may take `budget` in all, each at most `cap`.
    pub fn new(budget: Duration, cap: Duration) -> Self {
        Self {
            started: Instant::now(),
            budget,
            next: FIRST,
            cap,
        }
    }

    /// How long the request has taken so far.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// What is left of its budget.
    pub fn left(&self) -> Duration {
        self.budget.saturating_sub(self.elapsed())
    }

    /// The pause before the next try; `None` when the budget would be spent by its end.
    pub fn next_pause(&mut self) -> Option<Duration> {
        if self.elapsed() + self.next >= self.budget {
            return None;
        }
        let pause = self.next;
        self.next = (pause * 2).min(self.cap);
        Some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_cap() {
        let mut pauses = Pauses::new(Duration::from_secs(3600), Duration::from_millis(350));
        let taken: Vec<u128> = (0..4)
            .map(|_| pauses.next_pause().unwrap().as_millis())
            .collect();
        assert_eq!(taken, [100, 200, 350, 350]);
    }

    #[test]
    fn no_pause_is_given_that_would_end_past_the_budget() {
        // Nothing sleeps here: each pause is weighed against the hour alone (plus what this
        // test takes), so 6,553.6 s is the first refused and 3,276.8 s the last given.
        let mut pauses = Pauses::new(Duration::from_secs(3600), Duration::from_secs(7200));
        let mut taken = Vec::new();
        while let Some(pause) = pauses.next_pause() {
            taken.push(pause.as_millis());
        }
        let doubling: Vec<u128> = (0..16).map(|k| 100 << k).collect();
        assert_eq!(taken, doubling);
        assert!(pauses.left() <= Duration::from_secs(3600));
    }
}
