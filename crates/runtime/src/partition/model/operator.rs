//! Operator control of one invocation: cancel (a CANCEL signal the handler sees as a terminal
//! 409 "canceled"), kill (ends it now with 409 "killed"), purge (forgets a completed one),
//! pause (no more attempts until resumed), resume, and purge-journal (drops a completed one's
//! journal and keeps its record and result).

/// What the operator asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Append the CANCEL signal.
    Cancel,
    /// End it now.
    Kill,
    /// Forget a completed invocation.
    Purge,
    /// Drop a completed invocation's journal; keep its record and result.
    PurgeJournal,
    /// Stop attempting it.
    Pause,
    /// Attempt it again.
    Resume,
}

impl Control {
    /// Parses the operation's name as it appears in paths and `?mode=`.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "cancel" => Self::Cancel,
            "kill" => Self::Kill,
            "purge" => Self::Purge,
            "purge-journal" => Self::PurgeJournal,
            "pause" => Self::Pause,
            "resume" => Self::Resume,
            _ => return None,
        })
    }
}

/// How a control request went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Controlled {
    /// Done (200).
    Done,
    /// Under way (202): the signal is appended, or a running attempt is being stopped.
    Accepted,
    /// No such invocation (404).
    NotFound,
    /// Not possible in its state (409), and why.
    Conflict(String),
}
