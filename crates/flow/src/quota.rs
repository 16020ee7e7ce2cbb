//! Long-window quotas and budgets, counted in calendar windows of UTC (a minute, an hour, a
//! day, a month) that start again at their boundary. A quota (`10000/day`) counts a counter's
//! new admissions; a budget (`1000000/day`) sums what its calls spent, as their handlers
//! report it (`sluice:cost` steps), charged when each call ends. What a counter used in its
//! window is kept durably by the partition (`flow_quotas`, `flow_budgets`), so a restart or a
//! leader change does not hand out a fresh quota or budget.

use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A calendar window of UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuotaWindow {
    /// From the top of each minute.
    Minute,
    /// From the top of each hour.
    Hour,
    /// From each midnight.
    Day,
    /// From the first of each month.
    Month,
}

const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 86_400_000;

impl QuotaWindow {
    /// The start of the window holding `now_ms` (ms since the epoch).
    pub fn start(self, now_ms: u64) -> u64 {
        match self {
            QuotaWindow::Minute => now_ms - now_ms % MINUTE_MS,
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
            QuotaWindow::Minute => start.saturating_add(MINUTE_MS),
            QuotaWindow::Hour => start.saturating_add(HOUR_MS),
            QuotaWindow::Day => start.saturating_add(DAY_MS),
            QuotaWindow::Month => {
                let (y, m, _) = civil(start / DAY_MS);
                let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                days_from_civil(y, m, 1).saturating_mul(DAY_MS)
            }
        }
    }

    /// Its shortest length, ms (a month: 28 days).
    pub fn shortest_ms(self) -> u64 {
        match self {
            QuotaWindow::Minute => MINUTE_MS,
            QuotaWindow::Hour => HOUR_MS,
            QuotaWindow::Day => DAY_MS,
            QuotaWindow::Month => 28 * DAY_MS,
        }
    }

    fn name(self) -> &'static str {
        match self {
            QuotaWindow::Minute => "min",
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

    /// `<count>/<window>`: `10000/day`, `500/h`, `1000000/month`, `50/min`.
    fn from_str(text: &str) -> Result<Self, QuotaError> {
        amount_per_window(text, "quota", "count", "10000/day")
    }
}

/// `<amount>/<window>` as a [`Quota`], or what is wrong with it (`what` names the setting).
fn amount_per_window(
    text: &str,
    what: &str,
    amount: &str,
    example: &str,
) -> Result<Quota, QuotaError> {
    let bad = |why: &str| {
        QuotaError(format!(
            "{what} '{}' is not valid: {why} (write it as <{amount}>/min, <{amount}>/h, <{amount}>/day or <{amount}>/month, e.g. {example})",
            text.chars().take(40).collect::<String>()
        ))
    };
    let (count, per) = text.trim().split_once('/').ok_or_else(|| bad("no '/'"))?;
    let amount = count
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(NonZeroU64::new)
        .ok_or_else(|| bad("the amount is not a whole number of at least 1"))?;
    let window =
        window_named(per.trim()).ok_or_else(|| bad("the window is min, h, day or month"))?;
    Ok(Quota {
        amount,
        window,
        reject: false,
    })
}

/// The window `name` names (`min`, `h`, `day`, `month`, or their long forms).
fn window_named(name: &str) -> Option<QuotaWindow> {
    Some(match name {
        "min" | "minute" => QuotaWindow::Minute,
        "h" | "hour" => QuotaWindow::Hour,
        "d" | "day" => QuotaWindow::Day,
        "month" | "mo" => QuotaWindow::Month,
        _ => return None,
    })
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.amount, self.window.name())
    }
}

/// What a counter's calls may spend per window, in the unit their handlers report
/// (`budget = "1000000/day"`): a new call is admitted while what was spent, plus what the
/// calls running hold reserved, leaves room for its own reservation (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Budget {
    /// The amount per window, and whether a new call past it is refused (429) instead of
    /// waiting.
    pub limit: Quota,
    /// Charged to the counter when a call is admitted and settled when it ends (`reserve =
    /// 2000`): with calls spending at most this, the budget is never overshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<NonZeroU64>,
}

impl Budget {
    /// What a new call needs free in the window: its reservation, or 1.
    pub fn needs(&self) -> u64 {
        self.reserve.map_or(1, NonZeroU64::get)
    }
}

impl FromStr for Budget {
    type Err = QuotaError;

    /// `<amount>/<window>`: `1000000/day`, `5000/min`.
    fn from_str(text: &str) -> Result<Self, QuotaError> {
        Ok(Budget {
            limit: amount_per_window(text, "budget", "amount", "1000000/day")?,
            reserve: None,
        })
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.limit.fmt(f)
    }
}

/// What a window counts at a counter: new admissions (a quota), what calls spent (a budget),
/// or how long it ran above its concurrency limit (a burst budget, ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Measure {
    /// A quota: one per new admission, counted when it is admitted.
    Calls = 0,
    /// A budget: what each call's handler reported it spent, charged when it ends.
    Cost = 1,
    /// A burst budget: the ms the counter ran more calls than its limit, counted as it runs.
    Burst = 2,
}

impl Measure {
    /// Every measure, quota first.
    pub const ALL: [Measure; 3] = [Measure::Calls, Measure::Cost, Measure::Burst];

    /// The measures that hold a new call back when used up (a burst budget only lowers the
    /// limit back to itself).
    pub const GATES: [Measure; 2] = [Measure::Calls, Measure::Cost];

    /// `quota`, `budget` or `burst`.
    pub fn as_str(self) -> &'static str {
        match self {
            Measure::Calls => "quota",
            Measure::Cost => "budget",
            Measure::Burst => "burst",
        }
    }
}

/// A burst budget on a concurrency limit (`burst_budget = { factor = 2, budget = "10m/day" }`):
/// the counter may run up to `factor` times its limit while the time it has spent above its
/// limit in the current window of UTC is under `budget`; then its limit is itself again until
/// the next window (nothing running is stopped). Every other counter's limit still holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BurstBudget {
    /// The limit while bursting, in hundredths of the limit (200: twice it); more than 100.
    pub factor_pct: NonZeroU32,
    /// Ms above the limit per window.
    pub budget: Quota,
}

/// The largest burst factor, in hundredths (a hundredfold).
pub const MAX_BURST_FACTOR_PCT: u32 = 10_000;

impl BurstBudget {
    /// The limit while bursting above `base`: at least one more.
    pub fn raised(&self, base: u32) -> u32 {
        let raised = u64::from(base) * u64::from(self.factor_pct.get()) / 100;
        u32::try_from(raised)
            .unwrap_or(u32::MAX)
            .max(base.saturating_add(1))
    }
}

impl fmt::Display for BurstBudget {
    /// `2x 10m/day`, as [`BurstBudget::from_str`] reads it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let time = sluice_core::units::FriendlyDuration::from_millis(self.budget.amount.get());
        write!(
            f,
            "{}x {time}/{}",
            f64::from(self.factor_pct.get()) / 100.0,
            self.budget.window.name()
        )
    }
}

impl FromStr for BurstBudget {
    type Err = QuotaError;

    /// `<factor>x <time>/<window>`: `2x 10m/day` (twice the concurrency, for ten minutes above
    /// it a day), `1.5x 90s/h`. The factor is more than 1 and at most 100 (hundredths kept);
    /// the time at least a second and at most the window.
    fn from_str(text: &str) -> Result<Self, QuotaError> {
        let bad = |why: &str| {
            QuotaError(format!(
                "burst budget '{}' is not valid: {why} (write it as <factor>x <time>/<window>, e.g. 2x 10m/day: twice the concurrency for ten minutes a day; the window is min, h, day or month)",
                text.chars().take(40).collect::<String>()
            ))
        };
        let (factor, rest) = text
            .trim()
            .split_once(['x', 'X'])
            .ok_or_else(|| bad("no 'x' after the factor"))?;
        let factor: f64 = factor
            .trim()
            .parse()
            .map_err(|_| bad("the factor is not a number"))?;
        if !factor.is_finite() || factor <= 1.0 || factor * 100.0 > f64::from(MAX_BURST_FACTOR_PCT)
        {
            return Err(bad("the factor is more than 1 and at most 100"));
        }
        // Whole hundredths, and never 1x after rounding.
        let factor_pct = NonZeroU32::new(((factor * 100.0).round() as u32).max(101))
            .ok_or_else(|| bad("the factor is more than 1"))?;
        let (time, window) = rest
            .rsplit_once('/')
            .ok_or_else(|| bad("no '/' before the window"))?;
        let window =
            window_named(window.trim()).ok_or_else(|| bad("the window is min, h, day or month"))?;
        let time: sluice_core::units::FriendlyDuration = time
            .trim()
            .parse()
            .map_err(|_| bad("the time is not a duration such as 10m or 90s"))?;
        let ms = u64::try_from(time.0.as_millis()).unwrap_or(u64::MAX);
        if ms < 1_000 || ms > window.shortest_ms() {
            return Err(bad("the time is at least 1s and at most its window"));
        }
        Ok(BurstBudget {
            factor_pct,
            budget: Quota {
                amount: NonZeroU64::new(ms).ok_or_else(|| bad("the time is at least 1s"))?,
                window,
                reject: false,
            },
        })
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
            assert!(bad.parse::<Budget>().is_err(), "{bad}");
        }
        let b: Budget = "1000000/day".parse().unwrap();
        assert_eq!((b.to_string(), b.needs()), ("1000000/day".to_owned(), 1));
        let err = "5/week".parse::<Budget>().unwrap_err().to_string();
        assert!(
            err.starts_with("budget '5/week'") && err.contains("<amount>/min"),
            "{err}"
        );
        let min: Quota = "50/min".parse().unwrap();
        assert_eq!(min.to_string(), "50/min");
        assert_eq!(QuotaWindow::Minute.start(NOW), NOW);
        assert_eq!(QuotaWindow::Minute.next(NOW), NOW + 60_000);
        assert_eq!("5/h".parse::<Quota>().unwrap().window, QuotaWindow::Hour);
        assert_eq!("5/month".parse::<Quota>().unwrap().to_string(), "5/month");
    }

    #[test]
    fn a_burst_raises_by_its_factor_and_at_least_one() {
        let burst = |pct: u32| BurstBudget {
            factor_pct: NonZeroU32::new(pct).unwrap(),
            budget: "600000/day".parse().unwrap(),
        };
        assert_eq!(burst(200).raised(4), 8);
        assert_eq!(burst(150).raised(3), 4);
        assert_eq!(burst(101).raised(2), 3, "at least one more");
        assert_eq!(burst(10_000).raised(u32::MAX), u32::MAX);
        assert_eq!(burst(200).to_string(), "2x 10m/day");
        assert_eq!(burst(150).to_string(), "1.5x 10m/day");
        for text in ["2x 10m/day", "1.5x 90s/h", "3x 1h 30m/day", "100x 1s/min"] {
            let parsed: BurstBudget = text.parse().unwrap();
            assert_eq!(
                parsed.to_string().parse::<BurstBudget>(),
                Ok(parsed),
                "{text}"
            );
        }
        assert_eq!(
            "2X 10m/day"
                .parse::<BurstBudget>()
                .unwrap()
                .budget
                .amount
                .get(),
            600_000
        );
        for bad in [
            "",
            "2 10m/day",
            "1x 10m/day",
            "0.5x 1m/h",
            "101x 1m/h",
            "2x 10m",
            "2x 10m/week",
            "2x soon/day",
            "2x 500ms/day",
            "2x 2h/h",
            "nanx 1m/h",
        ] {
            let err = bad.parse::<BurstBudget>().unwrap_err().to_string();
            assert!(err.contains("<factor>x <time>/<window>"), "{bad}: {err}");
        }
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
            for w in [QuotaWindow::Minute, QuotaWindow::Hour, QuotaWindow::Day, QuotaWindow::Month] {
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
            let _ = text.parse::<Budget>();
        }
    }
}
