//! `[flow]`: node-wide flow-control settings (the rule book holds the per-scope ones).

use serde::{Deserialize, Serialize};

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
}

impl FlowConfig {
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
}
