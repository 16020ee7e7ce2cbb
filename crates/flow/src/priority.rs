//! A call's priority among the waiters of a counter: `0` (lowest) to `9` (highest), `normal`
//! (5) when the call says nothing.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How urgent a call is, `0..=9`; higher is admitted first among waiters of one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub struct Priority(u8);

impl Priority {
    /// The lowest, also `low`.
    pub const LOW: Priority = Priority(0);
    /// The default, also `normal`.
    pub const NORMAL: Priority = Priority(5);
    /// The highest, also `high`.
    pub const HIGH: Priority = Priority(9);

    /// Its number.
    pub fn get(self) -> u8 {
        self.0
    }

    /// Levels below the highest: how far back it queues.
    pub(crate) fn below_high(self) -> u64 {
        u64::from(Self::HIGH.0 - self.0)
    }
}

impl Default for Priority {
    fn default() -> Self {
        Self::NORMAL
    }
}

/// A priority that is neither `0..=9` nor `low`, `normal` or `high`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("priority '{0}' is not 0..9, low, normal or high")]
pub struct PriorityError(String);

impl TryFrom<u8> for Priority {
    type Error = PriorityError;

    fn try_from(n: u8) -> Result<Self, Self::Error> {
        if n <= Self::HIGH.0 {
            Ok(Priority(n))
        } else {
            Err(PriorityError(n.to_string()))
        }
    }
}

impl From<Priority> for u8 {
    fn from(p: Priority) -> u8 {
        p.0
    }
}

impl FromStr for Priority {
    type Err = PriorityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        match trimmed.to_ascii_lowercase().as_str() {
            "low" => Ok(Self::LOW),
            "normal" => Ok(Self::NORMAL),
            "high" => Ok(Self::HIGH),
            digits => digits
                .parse::<u8>()
                .ok()
                .and_then(|n| Priority::try_from(n).ok())
                .ok_or_else(|| PriorityError(trimmed.chars().take(32).collect())),
        }
    }
}

/// The header a call states its priority in.
pub const PRIORITY_HEADER: &str = "x-service-priority";

impl Priority {
    /// The priority among `headers` (name, value), if one is there; its name is matched
    /// ignoring case.
    pub fn from_headers<'a>(
        mut headers: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Result<Option<Priority>, PriorityError> {
        headers
            .find(|(name, _)| name.eq_ignore_ascii_case(PRIORITY_HEADER))
            .map(|(_, value)| value.parse())
            .transpose()
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_and_digits_parse() {
        assert_eq!("high".parse(), Ok(Priority::HIGH));
        assert_eq!(" Normal ".parse(), Ok(Priority::NORMAL));
        assert_eq!("low".parse(), Ok(Priority::LOW));
        assert_eq!("7".parse::<Priority>().map(Priority::get), Ok(7));
        for bad in ["", "10", "-1", "urgent", "5.0", "０"] {
            assert!(bad.parse::<Priority>().is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn any_text_parses_or_errs_and_round_trips(text in "\\PC{0,12}") {
            if let Ok(p) = text.parse::<Priority>() {
                prop_assert_eq!(p.to_string().parse::<Priority>(), Ok(p));
            }
        }
    }
}
