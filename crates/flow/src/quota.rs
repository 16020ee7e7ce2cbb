//! Long-window quotas: `10000/day`, `500/h`, `1000000/month` admissions per counter, counted
//! in calendar windows of UTC (an hour, a day, a month) that start again at their boundary.
//! What a counter used in its window is kept durably by the partition (`flow_quotas`), so a
//! restart or a leader change does not hand out a fresh quota.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A calendar window of UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuotaWindow {
    /// From the top of each hour.
    Hour,
    /// From each midnight.
    Day,
    /// From the first of each month.
    Month,
}

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 86_400_000;

impl QuotaWindow {
    /// The start of the window holding `now_ms` (ms since the epoch).
    pub fn start(self, now_ms: u64) -> u64 {
        match self {
            QuotaWindow::Hour => now_ms - now_ms % HOUR_MS,
            QuotaWindow::Day => now_ms - now_ms % DAY_MS,
            QuotaWindow::Month => {
                let (y, m, _) = civil(now_ms / DAY_MS);
                days_from_civil(y, m, 1) * DAY_MS
            }
        }
    }

    /// The start of the window after the one starting at `start` (saturating).
    pub fn next(self, start: u64) -> u64 {
        match self {
            QuotaWindow::Hour => start.saturating_add(HOUR_MS),
            QuotaWindow::Day => start.saturating_add(DAY_MS),
            QuotaWindow::Month => {
                let (y, m, _) = civil(start / DAY_MS);
                let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                days_from_civil(y, m, 1).saturating_mul(DAY_MS)
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            QuotaWindow::Hour => "h",
            QuotaWindow::Day => "day",
            QuotaWindow::Month => "month",
        }
    }
}

/// Year, month (1-12) and day (1-31) of day `days` since 1970-01-01 (Howard Hinnant's
/// civil-from-days, for days on or after the epoch).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of a date on or after it.
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).saturating_sub(719_468)
}

/// At most `amount` admissions per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Quota {
    /// Admissions allowed in a window.
    pub amount: NonZeroU64,
    /// The window.
    pub window: QuotaWindow,
    /// A new invocation past the quota is refused (429) instead of waiting for the next window.
    #[serde(default)]
    pub reject: bool,
}

/// Why a quota does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct QuotaError(String);

impl FromStr for Quota {
    type Err = QuotaError;

    /// `<count>/<window>`: `10000/day`, `500/h`, `1000000/month`.
    fn from_str(text: &str) -> Result<Self, QuotaError> {
        let bad = |why: &str| {
            QuotaError(format!(
                "quota '{}' is not valid: {why} (write it as <count>/h, <count>/day or <count>/month, e.g. 10000/day)",
                text.chars().take(40).collect::<String>()
            ))
        };
        let (count, per) = text.trim().split_once('/').ok_or_else(|| bad("no '/'"))?;
        let amount = count
            .trim()
            .parse::<u64>()
            .ok()
            .and_then(NonZeroU64::new)
            .ok_or_else(|| bad("the count is not a whole number of at least 1"))?;
        let window = match per.trim() {
            "h" | "hour" => QuotaWindow::Hour,
            "d" | "day" => QuotaWindow::Day,
            "month" | "mo" => QuotaWindow::Month,
            _ => return Err(bad("the window is h, day or month")),
        };
        Ok(Quota {
            amount,
            window,
            reject: false,
        })
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.amount, self.window.name())
    }
}

/// What a counter used of its quota: in the window from `window_start` to `window_end`,
/// `used`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaUse {
    /// The window's start, ms since the epoch.
    pub window_start: u64,
    /// Its end (the next window's start).
    pub window_end: u64,
    /// Admissions in it.
    pub used: u64,
}

impl QuotaUse {
    /// What is used in the window holding `now_ms` (nothing once the window moved on).
    pub fn at(self, quota: &Quota, now_ms: u64) -> QuotaUse {
        let start = quota.window.start(now_ms);
        if self.window_start == start && self.window_end > start {
            self
        } else {
            QuotaUse {
                window_start: start,
                window_end: quota.window.next(start),
                used: 0,
            }
        }
    }

    /// Encoded for the store: window start, window end and used, u64 BE each.
    pub fn encode(self) -> [u8; 24] {
        let mut out = [0; 24];
        out[..8].copy_from_slice(&self.window_start.to_be_bytes());
        out[8..16].copy_from_slice(&self.window_end.to_be_bytes());
        out[16..].copy_from_slice(&self.used.to_be_bytes());
        out
    }

    /// Decodes [`QuotaUse::encode`]'s form.
    pub fn decode(raw: &[u8]) -> Option<QuotaUse> {
        let raw: &[u8; 24] = raw.try_into().ok()?;
        let word = |at: usize| raw[at..at + 8].try_into().ok().map(u64::from_be_bytes);
        Some(QuotaUse {
            window_start: word(0)?,
            window_end: word(8)?,
            used: word(16)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 2026-11-27T13:45:00Z.
    const NOW: u64 = 1_795_787_100_000;

    #[test]
    fn windows_follow_the_utc_calendar() {
        let q: Quota = "10000/day".parse().unwrap();
        assert_eq!(q.to_string(), "10000/day");
        // 2026-11-27T00:00:00Z and 2026-11-28T00:00:00Z.
        assert_eq!(q.window.start(NOW), 1_795_737_600_000);
        assert_eq!(q.window.next(q.window.start(NOW)), 1_795_824_000_000);
        let h = QuotaWindow::Hour;
        assert_eq!(h.start(NOW), 1_795_784_400_000);
        // 2026-11-01T00:00:00Z, then 2026-12-01, then 2027-01-01 (a year turns).
        let m = QuotaWindow::Month;
        assert_eq!(m.start(NOW), 1_793_491_200_000);
        assert_eq!(m.next(m.start(NOW)), 1_796_083_200_000);
        assert_eq!(m.next(1_796_083_200_000), 1_798_761_600_000);
        for bad in ["", "10", "0/day", "-1/day", "10/week", "x/h", "10/"] {
            assert!(bad.parse::<Quota>().is_err(), "{bad}");
        }
        assert_eq!("5/h".parse::<Quota>().unwrap().window, QuotaWindow::Hour);
        assert_eq!("5/month".parse::<Quota>().unwrap().to_string(), "5/month");
    }

    #[test]
    fn use_starts_again_in_a_new_window_and_round_trips() {
        let q: Quota = "3/h".parse().unwrap();
        let start = QuotaWindow::Hour.start(NOW);
        let used = QuotaUse {
            window_start: start,
            window_end: start + HOUR_MS,
            used: 3,
        };
        assert_eq!(used.at(&q, NOW).used, 3);
        assert_eq!(used.at(&q, NOW + HOUR_MS).used, 0);
        assert_eq!(QuotaUse::decode(&used.encode()), Some(used));
        assert_eq!(QuotaUse::decode(b"short"), None);
    }

    proptest! {
        /// Every instant lies in its window, which ends where the next one starts; a month
        /// window starts on a day boundary and lasts 28 to 31 days.
        #[test]
        fn an_instant_is_inside_its_window(now in 0u64..4_000_000_000_000) {
            for w in [QuotaWindow::Hour, QuotaWindow::Day, QuotaWindow::Month] {
                let start = w.start(now);
                let next = w.next(start);
                prop_assert!(start <= now && now < next, "{w:?} {start} {now} {next}");
                prop_assert_eq!(w.start(next), next);
            }
            let m = QuotaWindow::Month.start(now);
            let days = (QuotaWindow::Month.next(m) - m) / DAY_MS;
            prop_assert!(m.is_multiple_of(DAY_MS) && (28..=31).contains(&days), "{days}");
        }

        #[test]
        fn any_text_parses_or_says_why(text in ".{0,30}") {
            let _ = text.parse::<Quota>();
        }
    }
}
