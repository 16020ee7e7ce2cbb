//! `[flow]`: node-wide flow-control settings (the rule book holds the per-scope ones).

use serde::{Deserialize, Serialize};

use crate::FriendlyDuration;

/// Most points a flow history series keeps, whatever the window and interval say.
pub const MAX_HISTORY_POINTS: usize = 3_600;

/// Node-wide flow-control settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct FlowConfig {
    /// A call or send made by a handler that names no scope runs under its caller's scope
    /// (and, unless it names its own, its caller's limit key), so one rule governs a whole
    /// call chain. `false`: such calls are unscoped, as before.
    pub inherit_scope: bool,
    /// Shedding by priority: from this share of `worker.max-held-invocations` held, new work
    /// from outside is refused (429 FLO0001) by priority, lowest first. Priority `p` (0-9) is
    /// refused from `max × (shed-from + (1 − shed-from) × (p + 1) / 10)` held, so `high` (9)
    /// only at the bound itself. `1.0` turns it off (every priority up to the bound).
    pub shed_from: f64,
    /// How far back the dashboard's flow charts (`GET /limits/history`) reach: per rule and
    /// level, admitted/s, running, waiting, refused/s, p99 wait and the adaptive limit; per
    /// queue, what it holds. `0s` turns the sampling off.
    pub history: FriendlyDuration,
    /// How often the history is sampled (at least 1 s). A sample reads every live counter,
    /// as a `/metrics` scrape does.
    pub history_interval: FriendlyDuration,
    /// A request's deadline orders it before earlier arrivals of its queue only when it is at
    /// most this far from when its wait began; one further out waits in arrival order (and
    /// still expires at its time), so a far-future deadline cannot jump a queue.
    pub deadline_horizon: FriendlyDuration,
    /// Idle counters (no call running or waiting under them) whose quota use one partition
    /// keeps until their window ends, so a key that comes back finds its count. At this
    /// bound, a new call on a quota counter that has used nothing in its window is refused
    /// (429 FLO0004) until a kept window ends. Each costs its name plus about 80 bytes.
    pub max_idle_quota_counters: usize,
    /// Of those, how many one scope may have kept, so a tenant minting limit keys fills its
    /// own bound and other scopes still start fresh keys (at most `max-idle-quota-counters`).
    pub max_idle_quota_counters_per_scope: usize,
}

impl FlowConfig {
    /// The history's sampling interval (at least 1 s) and how many points a series keeps (at
    /// most [`MAX_HISTORY_POINTS`]); `None` when it is off.
    pub fn history_points(&self) -> Option<(std::time::Duration, usize)> {
        let interval = self
            .history_interval
            .0
            .max(std::time::Duration::from_secs(1));
        let window = self.history.0;
        if window.is_zero() {
            return None;
        }
        let points = (window.as_millis() / interval.as_millis()).max(1);
        Some((
            interval,
            usize::try_from(points).map_or(MAX_HISTORY_POINTS, |p| p.min(MAX_HISTORY_POINTS)),
        ))
    }

    /// How many held invocations a new one of priority `priority` (0-9) may find and still
    /// be taken, under a bound of `max`.
    pub fn shed_bound(&self, max: usize, priority: u8) -> usize {
        // Out of range (or NaN) means off: the bound alone.
        let from = if (0.0..=1.0).contains(&self.shed_from) {
            self.shed_from
        } else {
            1.0
        };
        let share = from + (1.0 - from) * f64::from(priority.min(9) + 1) / 10.0;
        ((max as f64) * share).floor().min(max as f64) as usize
    }
}

impl Default for FlowConfig {
    fn default() -> Self {
        Self {
            inherit_scope: true,
            shed_from: 0.8,
            history: FriendlyDuration::from_secs(300),
            history_interval: FriendlyDuration::from_secs(2),
            deadline_horizon: FriendlyDuration::from_secs(5 * 60),
            max_idle_quota_counters: 100_000,
            max_idle_quota_counters_per_scope: 10_000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FlowConfig;

    #[test]
    fn lower_priorities_are_shed_first_and_high_only_at_the_bound() {
        let flow = FlowConfig {
            shed_from: 0.5,
            ..FlowConfig::default()
        };
        assert_eq!(flow.shed_bound(20, 0), 11);
        assert_eq!(flow.shed_bound(20, 5), 16);
        assert_eq!(flow.shed_bound(20, 9), 20);
        let off = FlowConfig {
            shed_from: 1.0,
            ..FlowConfig::default()
        };
        assert_eq!(off.shed_bound(20, 0), 20);
        let nonsense = FlowConfig {
            shed_from: f64::NAN,
            ..FlowConfig::default()
        };
        assert_eq!(nonsense.shed_bound(1_000_000, 0), 1_000_000);
    }

    #[test]
    fn the_history_keeps_a_bounded_number_of_points() {
        use crate::FriendlyDuration;
        let d = FlowConfig::default().history_points().unwrap();
        assert_eq!(d, (std::time::Duration::from_secs(2), 150));
        let off = FlowConfig {
            history: FriendlyDuration::from_secs(0),
            ..FlowConfig::default()
        };
        assert_eq!(off.history_points(), None);
        let huge = FlowConfig {
            history: FriendlyDuration::from_secs(365 * 86_400),
            history_interval: FriendlyDuration::from_millis(1),
            ..FlowConfig::default()
        };
        assert_eq!(
            huge.history_points(),
            Some((std::time::Duration::from_secs(1), super::MAX_HISTORY_POINTS))
        );
    }
}
