//! How fast a queue drains, and where an entry stands in it: the "why is it waiting" answer's
//! position and ETA.

use super::{EntryId, QueueId, Scheduler};

/// A queue's recent drain rate: a moving mean of the gaps between its dispatches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Drain {
    /// When it last dispatched an entry, ms (0: never).
    last_ms: u64,
    /// The mean gap between its dispatches, ms (0: fewer than two dispatches yet).
    mean_gap_ms: u64,
}

impl Drain {
    /// One dispatch at `now`.
    pub(super) fn dispatched(&mut self, now: u64) {
        if self.last_ms != 0 {
            let gap = now.saturating_sub(self.last_ms).max(1);
            // Recent dispatches count most (weight 1/4), so the rate follows a limit change
            // within a few dispatches.
            self.mean_gap_ms = if self.mean_gap_ms == 0 {
                gap
            } else {
                self.mean_gap_ms.saturating_mul(3).saturating_add(gap) / 4
            };
        }
        self.last_ms = now.max(1);
    }

    /// The mean gap between its dispatches, ms (`None` before it dispatched twice).
    pub(super) fn mean_gap_ms(&self) -> Option<u64> {
        (self.mean_gap_ms != 0).then_some(self.mean_gap_ms)
    }

    /// When the entry `position` places from the head should be dispatched, ms from `now`:
    /// `position` gaps after the last dispatch. A queue that has not moved for longer than
    /// its mean gap (blocked for a minute does not drain every 10 ms) is expected to take
    /// that long per entry from now. `None` before it has dispatched twice.
    pub(super) fn eta_ms(&self, position: u64, now: u64) -> Option<u64> {
        let mean = self.mean_gap_ms()?;
        let stalled = now.saturating_sub(self.last_ms);
        Some(if stalled <= mean {
            (self.last_ms + mean.saturating_mul(position)).saturating_sub(now)
        } else {
            stalled.saturating_mul(position)
        })
    }
}

/// Where a waiting entry stands in its queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Position {
    /// 1 for the head: resumed entries first, then new ones, each in arrival order.
    pub position: usize,
    /// Entries of its queue per second lately (`None` before it dispatched twice).
    pub drain_per_second: Option<f64>,
    /// When it should start, ms from now: its position times the mean gap between the queue's
    /// dispatches, counted from the last one (`None` without a drain rate yet).
    pub eta_ms: Option<u64>,
}

impl Scheduler {
    /// Where `entry` waits in queue `q` (`None` when it is not waiting there: delayed,
    /// running or gone).
    pub fn position(&self, q: QueueId, entry: EntryId, now: u64) -> Option<Position> {
        let queue = self.queues.get(q.0 as usize)?.as_ref()?;
        let at = queue
            .resumed
            .iter()
            .chain(&queue.new)
            .position(|e| *e == entry)?;
        let position = at + 1;
        Some(Position {
            position,
            drain_per_second: queue.drain.mean_gap_ms().map(|g| 1000.0 / g as f64),
            eta_ms: queue.drain.eta_ms(position as u64, now),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Drain;

    #[test]
    fn the_eta_counts_gaps_from_the_last_dispatch_and_a_stalled_queue_stretches_them() {
        let mut drain = Drain::default();
        assert_eq!(drain.eta_ms(1, 1_000), None);
        drain.dispatched(1_000);
        assert_eq!(drain.eta_ms(1, 1_000), None, "one dispatch says no rate");
        drain.dispatched(1_100);
        assert_eq!(drain.mean_gap_ms(), Some(100));
        assert_eq!(drain.eta_ms(3, 1_150), Some(250), "1 100 + 3 × 100 − 1 150");
        drain.dispatched(1_300);
        assert_eq!(drain.mean_gap_ms(), Some(125), "(3 × 100 + 200) / 4");
        // Stalled for 2 s: each place is expected to take that long.
        assert_eq!(drain.eta_ms(2, 3_300), Some(4_000));
    }

    #[test]
    fn dispatches_in_the_same_millisecond_count_as_one_millisecond_apart() {
        let mut drain = Drain::default();
        drain.dispatched(5);
        drain.dispatched(5);
        assert_eq!(drain.mean_gap_ms(), Some(1));
    }
}
