//! What a counter does with a new call when it is full (`on_full`): by default the call waits
//! in its queue; a rule may instead keep one active run per key (drop the newcomer), bound
//! what waits and keep the oldest or the newest of it, or let the newcomer cancel what runs.
//! The decision is the scheduler's (`limiter/crowd.rs`), taken when a new call joins its queue.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A rule's `on_full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFull {
    /// While the counter's running and waiting calls reach its concurrency, a new call is
    /// dropped: it completes at once, never run (409 `FLO0007`). With `concurrency = 1`, a
    /// singleton per key that skips what comes while one is active.
    DropNew,
    /// At most `max_queued` (1 by default) new calls wait at the counter; one more beyond
    /// that is dropped (the newest goes: 409 `FLO0007`).
    KeepOldest,
    /// At most `max_queued` (1 by default) new calls wait at the counter; one more beyond
    /// that replaces the oldest waiting one (409 `FLO0008`).
    KeepNewest,
    /// While the counter is full, a new call cancels the calls running there (they get the
    /// cancel signal) and replaces those waiting (409 `FLO0008`); it runs once they end.
    CancelRunning,
}

impl OnFull {
    /// Every value, as written.
    pub const ALL: [OnFull; 4] = [
        OnFull::DropNew,
        OnFull::KeepOldest,
        OnFull::KeepNewest,
        OnFull::CancelRunning,
    ];

    /// As written in a rule.
    pub fn as_str(self) -> &'static str {
        match self {
            OnFull::DropNew => "drop_new",
            OnFull::KeepOldest => "keep_oldest",
            OnFull::KeepNewest => "keep_newest",
            OnFull::CancelRunning => "cancel_running",
        }
    }

    /// Whether it bounds the calls waiting at the counter (by `max_queued`, 1 by default)
    /// rather than refusing past `max_queued` with a 429.
    pub fn bounds_waiting(self) -> bool {
        matches!(self, OnFull::KeepOldest | OnFull::KeepNewest)
    }
}

impl fmt::Display for OnFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `on_full` that is none of the values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "'{0}' is not an on_full: use queue (the default), drop_new, keep_oldest, keep_newest or cancel_running"
)]
pub struct OnFullError(pub String);

impl FromStr for OnFull {
    type Err = OnFullError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        OnFull::ALL
            .into_iter()
            .find(|v| v.as_str() == text.trim())
            .ok_or_else(|| OnFullError(text.chars().take(64).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_reads_back_as_written_and_others_are_refused_by_name() {
        for value in OnFull::ALL {
            assert_eq!(value.to_string().parse::<OnFull>(), Ok(value));
        }
        let err = "drop".parse::<OnFull>().unwrap_err();
        assert!(
            err.to_string().contains("'drop' is not an on_full"),
            "{err}"
        );
        assert!("x".repeat(10_000).parse::<OnFull>().unwrap_err().0.len() <= 64);
    }
}
