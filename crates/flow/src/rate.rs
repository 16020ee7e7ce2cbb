//! Rate limits: `100/s`, `6000/min`, `10/h` with a burst, kept per counter as one number (the
//! generic cell rate algorithm): the time at which the bucket would be full again. A take is
//! allowed when that time is at most `(burst − 1)` intervals ahead of now; it moves the time one
//! interval on. So in any window of `w` ms at most `burst + w / interval` takes are allowed.
//!
//! Time is an argument in milliseconds; the bucket counts in microseconds so `3/s` does not
//! round to `1 per 333 ms` and drift.

use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};
use std::str::FromStr;

/// Longest period a rate may name: a day.
const MAX_PERIOD_MS: u64 = 86_400_000;

/// `count` admissions per `period_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    count: NonZeroU32,
    period_ms: NonZeroU64,
    /// µs between two tokens, worked out once: the admission path divides nothing.
    interval_us: u64,
}

impl Rate {
    /// `count` per `period_ms` (at most a day).
    pub fn new(count: NonZeroU32, period_ms: NonZeroU64) -> Result<Self, RateError> {
        if period_ms.get() > MAX_PERIOD_MS {
            return Err(RateError("the period may be at most a day (1d)".into()));
        }
        let interval_us = (period_ms.get().saturating_mul(1000) / u64::from(count.get())).max(1);
        Ok(Self {
            count,
            period_ms,
            interval_us,
        })
    }

    /// Admissions per period.
    pub fn count(self) -> u32 {
        self.count.get()
    }

    /// The period, ms.
    pub fn period_ms(self) -> u64 {
        self.period_ms.get()
    }

    /// Microseconds between two tokens (at least 1).
    pub fn interval_us(self) -> u64 {
        self.interval_us
    }
}

/// Units a rate may be written in, with their length in ms; the first spelling is the one shown.
const UNITS: [(&[&str], u64); 5] = [
    (&["ms", "millisecond", "milliseconds"], 1),
    (&["s", "sec", "second", "seconds"], 1_000),
    (&["min", "m", "minute", "minutes"], 60_000),
    (&["h", "hour", "hours"], 3_600_000),
    (&["d", "day", "days"], 86_400_000),
];

/// Why a rate does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RateError(String);

impl FromStr for Rate {
    type Err = RateError;

    /// `<count>/<unit>` or `<count>/<n><unit>`, e.g. `100/s`, `6000/min`, `10/h`, `5/10s`.
    fn from_str(text: &str) -> Result<Self, RateError> {
        let bad = |why: &str| {
            RateError(format!(
                "rate '{}' is not valid: {why} (write it as <count>/<unit>, e.g. 100/s, 6000/min, 10/h, 5/10s)",
                text.chars().take(40).collect::<String>()
            ))
        };
        let (count, per) = text.trim().split_once('/').ok_or_else(|| bad("no '/'"))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| bad("the count is not a whole number"))?;
        let count = NonZeroU32::new(count).ok_or_else(|| bad("the count must be at least 1"))?;
        let per = per.trim();
        let digits = per.find(|c: char| !c.is_ascii_digit()).unwrap_or(per.len());
        let (n, unit) = per.split_at(digits);
        let n: u64 = if n.is_empty() {
            1
        } else {
            n.parse().map_err(|_| bad("the period is too long"))?
        };
        let unit_ms = UNITS
            .iter()
            .find(|(names, _)| names.contains(&unit))
            .map(|(_, ms)| *ms)
            .ok_or_else(|| bad("the unit must be ms, s, min, h or d"))?;
        let period = NonZeroU64::new(n.saturating_mul(unit_ms))
            .ok_or_else(|| bad("the period must be longer than 0"))?;
        Rate::new(count, period).map_err(|e| bad(&e.0))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let period = self.period_ms.get();
        // The largest unit that divides the period, so `6000/min` reads back as written.
        for (names, ms) in UNITS.iter().rev() {
            if period.is_multiple_of(*ms) {
                return match period / ms {
                    1 => write!(f, "{}/{}", self.count, names[0]),
                    n => write!(f, "{}/{n}{}", self.count, names[0]),
                };
            }
        }
        unreachable!("every period is a whole number of ms")
    }
}

sluice_core::serde_via_str!(Rate);

/// A rule's rate with its burst: how many may be admitted at once after a quiet spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RateLimit {
    /// Admissions per period.
    pub rate: Rate,
    /// Tokens the bucket holds when full (default 1: evenly spaced admissions).
    pub burst: NonZeroU32,
    /// A new invocation that finds no token is refused (429) instead of waiting for one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reject: bool,
}

impl RateLimit {
    /// `rate` with a burst of one, throttling.
    pub fn new(rate: Rate) -> Self {
        Self {
            rate,
            burst: NonZeroU32::MIN,
            reject: false,
        }
    }

    fn tolerance_us(self) -> u64 {
        u64::from(self.burst.get() - 1).saturating_mul(self.rate.interval_us())
    }
}

/// One counter's bucket: when it would be full again, µs since the epoch (0: full).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    full_at_us: u64,
}

fn us(ms: u64) -> u64 {
    ms.saturating_mul(1000)
}

impl Bucket {
    /// When the next token is there, ms (at or before `now` when one is there now).
    pub fn next_token_ms(&self, limit: RateLimit, now_ms: u64) -> u64 {
        let at_us = self.full_at_us.saturating_sub(limit.tolerance_us());
        if at_us <= us(now_ms) {
            now_ms
        } else {
            at_us.div_ceil(1000)
        }
    }

    /// Whether a token is there at `now_ms`.
    pub fn has_token(&self, limit: RateLimit, now_ms: u64) -> bool {
        self.next_token_ms(limit, now_ms) <= now_ms
    }

    /// Takes a token (after [`Bucket::has_token`]; taking without one borrows from the future).
    pub fn take(&mut self, limit: RateLimit, now_ms: u64) {
        self.full_at_us = self
            .full_at_us
            .max(us(now_ms))
            .saturating_add(limit.rate.interval_us());
    }

    /// Tokens there at `now_ms`, at most the burst.
    pub fn tokens(&self, limit: RateLimit, now_ms: u64) -> u32 {
        let empty_for = self.full_at_us.saturating_sub(us(now_ms));
        let missing = empty_for.div_ceil(limit.rate.interval_us());
        u32::try_from(u64::from(limit.burst.get()).saturating_sub(missing)).unwrap_or(0)
    }

    /// Whether the bucket is full at `now_ms`, so forgetting it changes nothing.
    pub fn is_full(&self, now_ms: u64) -> bool {
        self.full_at_us <= us(now_ms)
    }

    /// When it is full again, ms.
    pub fn full_at_ms(&self) -> u64 {
        self.full_at_us.div_ceil(1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rate(text: &str) -> Rate {
        text.parse().unwrap()
    }

    #[test]
    fn rates_parse_and_read_back_as_written() {
        for (text, count, period) in [
            ("100/s", 100, 1_000),
            ("6000/min", 6000, 60_000),
            ("10/h", 10, 3_600_000),
            ("5/10s", 5, 10_000),
            ("1/d", 1, 86_400_000),
            ("3/250ms", 3, 250),
        ] {
            let r = rate(text);
            assert_eq!((r.count(), r.period_ms()), (count, period), "{text}");
            assert_eq!(r.to_string(), text);
        }
        assert_eq!(rate("60/minute").to_string(), "60/min");
        assert_eq!(rate("2/60s").to_string(), "2/min");
    }

    #[test]
    fn bad_rates_say_what_to_write() {
        for text in [
            "",
            "100",
            "0/s",
            "-1/s",
            "1/0s",
            "1/week",
            "1/2d",
            "x/s",
            "1/99999999999999999999s",
        ] {
            let err = text.parse::<Rate>().unwrap_err().to_string();
            assert!(err.contains("<count>/<unit>"), "{text}: {err}");
        }
    }

    #[test]
    fn a_bucket_spaces_takes_by_the_interval_after_its_burst() {
        let limit = RateLimit {
            rate: rate("10/s"),
            burst: NonZeroU32::new(3).unwrap(),
            reject: false,
        };
        let mut bucket = Bucket::default();
        let now = 1_000_000;
        assert_eq!(bucket.tokens(limit, now), 3);
        for _ in 0..3 {
            assert!(bucket.has_token(limit, now));
            bucket.take(limit, now);
        }
        assert!(!bucket.has_token(limit, now));
        assert_eq!(bucket.next_token_ms(limit, now), now + 100);
        assert!(bucket.has_token(limit, now + 100));
        assert!(!bucket.is_full(now + 299));
        assert!(bucket.is_full(now + 300));
        assert_eq!(bucket.tokens(limit, now + 300), 3);
    }

    proptest! {
        /// However takes are timed, a window of `w` ms never holds more than
        /// `burst + w / interval` of them (rounded up for the partial interval).
        #[test]
        fn takes_in_any_window_stay_within_rate_and_burst(
            count in 1u32..50,
            period in prop::sample::select(vec![100u64, 1_000, 60_000]),
            burst in 1u32..6,
            gaps in prop::collection::vec(0u64..400, 1..300),
        ) {
            let limit = RateLimit {
                rate: Rate::new(NonZeroU32::new(count).unwrap(), NonZeroU64::new(period).unwrap()).unwrap(),
                burst: NonZeroU32::new(burst).unwrap(),
                reject: false,
            };
            let mut bucket = Bucket::default();
            let mut now = 5_000_000u64;
            let mut taken = Vec::new();
            for gap in gaps {
                now += gap;
                while bucket.has_token(limit, now) {
                    bucket.take(limit, now);
                    taken.push(now);
                }
            }
            let interval_us = limit.rate.interval_us();
            for (i, start) in taken.iter().enumerate() {
                for w in [0u64, 1, 50, 1_000, 10_000] {
                    let inside = taken[i..].iter().take_while(|t| **t <= start + w).count() as u64;
                    let bound = u64::from(burst) + (w * 1000).div_ceil(interval_us);
                    prop_assert!(inside <= bound, "{inside} takes in {w} ms from {start}, bound {bound}");
                }
            }
        }
    }
}
