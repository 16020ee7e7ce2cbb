//! A rule's `debounce`: calls of one target arriving at one counter within `wait` of each
//! other make one delayed run. With `last` (the default: trailing) the newest call is the one
//! that runs, each arrival pushing the run back; with `first` (leading) the first call's input
//! runs, pushed back the same way. `max` bounds how far a busy key's run is pushed from the
//! first call of its burst. The partition decides (`partition/debounce.rs`).

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sluice_core::units::FriendlyDuration;

/// Longest `wait` or `max`: a day.
pub const MAX_DEBOUNCE_MS: u64 = 24 * 60 * 60 * 1000;

/// Which call of a burst runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// The first call (leading): the later ones complete at once, absorbed into it.
    First,
    /// The last call (trailing): each new call takes the place of the one waiting.
    Last,
}

/// A rule's `debounce`, as written: `2s`, `500ms first`, `2s last max 30s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Debounce {
    /// How long after the latest call of a burst its run starts, ms.
    pub wait_ms: NonZeroU64,
    /// Which call runs.
    pub keep: Keep,
    /// The latest a burst's run starts after its first call, ms (none: no bound).
    pub max_ms: Option<NonZeroU64>,
}

impl Debounce {
    /// When the run of a burst that began at `since` starts if a call arrives at `now`.
    pub fn run_at(&self, since: u64, now: u64) -> u64 {
        let at = now.saturating_add(self.wait_ms.get());
        match self.max_ms {
            Some(max) => at.min(since.saturating_add(max.get())),
            None => at,
        }
    }
}

impl fmt::Display for Debounce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |ms: NonZeroU64| FriendlyDuration(std::time::Duration::from_millis(ms.get()));
        write!(f, "{}", ms(self.wait_ms))?;
        if self.keep == Keep::First {
            f.write_str(" first")?;
        }
        if let Some(max) = self.max_ms {
            write!(f, " max {}", ms(max))?;
        }
        Ok(())
    }
}

/// A `debounce` that does not parse, or is out of bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "debounce '{text}' is not valid: {why} (write it as <wait>[ first|last][ max <time>], e.g. 2s, 500ms first or 2s max 30s; wait and max at most 1 day, max at least the wait)"
)]
pub struct DebounceError {
    text: String,
    why: &'static str,
}

impl FromStr for Debounce {
    type Err = DebounceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why| DebounceError {
            text: text.chars().take(48).collect(),
            why,
        };
        let ms = |word: Option<&str>| -> Result<NonZeroU64, DebounceError> {
            let duration: FriendlyDuration = word
                .ok_or_else(|| bad("a time is missing"))?
                .parse()
                .map_err(|_| bad("a time is not a duration such as 500ms, 2s or 1m"))?;
            let ms = u64::try_from(duration.0.as_millis()).unwrap_or(u64::MAX);
            NonZeroU64::new(ms)
                .filter(|ms| ms.get() <= MAX_DEBOUNCE_MS)
                .ok_or_else(|| bad("a time is at least 1ms and at most 1 day"))
        };
        let mut words = text.split_whitespace();
        let wait_ms = ms(words.next())?;
        let mut keep = Keep::Last;
        let mut max_ms = None;
        let mut word = words.next();
        if let Some(k @ ("first" | "last")) = word {
            keep = if k == "first" {
                Keep::First
            } else {
                Keep::Last
            };
            word = words.next();
        }
        if word == Some("max") {
            let max = ms(words.next())?;
            if max < wait_ms {
                return Err(bad("max is at least the wait"));
            }
            max_ms = Some(max);
            word = words.next();
        }
        if word.is_some() {
            return Err(bad("a word is not first, last or max"));
        }
        Ok(Debounce {
            wait_ms,
            keep,
            max_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_debounce_reads_back_as_written_and_is_refused_out_of_bounds() {
        for text in ["2s", "500ms first", "2s max 30s", "1m first max 1h"] {
            let d: Debounce = text.parse().unwrap();
            assert_eq!(d.to_string(), text);
        }
        assert_eq!("2s last".parse::<Debounce>().unwrap().to_string(), "2s");
        for (text, why) in [
            ("", "missing"),
            ("soon", "not a duration"),
            ("2s max 1s", "at least the wait"),
            ("2s later", "not first, last or max"),
            ("2d", "at most 1 day"),
            ("2s max", "missing"),
        ] {
            let err = text.parse::<Debounce>().unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn a_run_is_pushed_back_by_each_call_up_to_max_after_the_first() {
        let d: Debounce = "2s max 5s".parse().unwrap();
        assert_eq!(d.run_at(0, 0), 2_000);
        assert_eq!(d.run_at(0, 1_500), 3_500);
        assert_eq!(d.run_at(0, 4_000), 5_000, "never past 5 s after the first");
        let unbounded: Debounce = "2s".parse().unwrap();
        assert_eq!(unbounded.run_at(0, 10_000), 12_000);
    }
}
