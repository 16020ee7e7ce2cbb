//! Wall-clock time as Sluice stores it: milliseconds since the UNIX epoch.
//!
//! The process's wall clock can be moved by a fixed offset ([`OFFSET_ENV`]): a test that starts
//! the server on a store written at another time (a fixture) or that must not cross a quota's
//! window gives the server a clock of its own, so its result never depends on the day it runs.
//! Every stored and compared time reads [`now_ms`]; only trace export and the monotonic timers
//! use the host's clocks directly.

use std::sync::atomic::{AtomicI64, Ordering};

/// The environment variable that moves this process's wall clock: a signed number of
/// milliseconds added to the host's clock (`-86400000` runs a day behind).
pub const OFFSET_ENV: &str = "SLUICE_CLOCK_OFFSET_MS";

/// The largest offset accepted either way: about 200 years, far past any window or retention,
/// well inside what a `u64` of milliseconds holds.
pub const MAX_OFFSET_MS: i64 = 200 * 366 * 24 * 3_600_000;

static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// Now, in milliseconds since the epoch (the host's clock plus the offset, if one was set).
pub fn now_ms() -> u64 {
    let host = jiff::Timestamp::now().as_millisecond();
    u64::try_from(host.saturating_add(OFFSET_MS.load(Ordering::Relaxed))).unwrap_or(0)
}

/// Moves this process's wall clock by `ms` (see [`OFFSET_ENV`]); set once, at start-up.
pub fn set_offset_ms(ms: i64) {
    OFFSET_MS.store(ms, Ordering::Relaxed);
}

/// Reads an offset as [`OFFSET_ENV`] gives it: a signed integer of milliseconds within
/// ±[`MAX_OFFSET_MS`]. The error says what to fix.
pub fn parse_offset(text: &str) -> Result<i64, String> {
    let ms: i64 = text.trim().parse().map_err(|_| {
        format!("{OFFSET_ENV} = {text:?} is not a whole number of milliseconds (e.g. -86400000)")
    })?;
    if ms.unsigned_abs() > MAX_OFFSET_MS.unsigned_abs() {
        return Err(format!(
            "{OFFSET_ENV} = {ms} moves the clock by more than {MAX_OFFSET_MS} ms (about 200 years)"
        ));
    }
    Ok(ms)
}

/// A point in time written as ms since the epoch or as RFC 3339 (`2026-11-27T10:00:00Z`), in
/// ms since the epoch (before the epoch: 0); why not when it is neither.
pub fn parse_time_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map_err(|_| format!("'{text}' is too large for ms since the epoch"));
    }
    let at: jiff::Timestamp = text.parse().map_err(|e| {
        format!(
            "'{text}' is neither ms since the epoch nor an RFC 3339 time such as 2026-11-27T10:00:00Z: {e}"
        )
    })?;
    Ok(u64::try_from(at.as_millisecond()).unwrap_or(0))
}

/// `ms` as RFC 3339 text, `None` when out of range.
pub fn rfc3339(ms: u64) -> Option<String> {
    let ms = i64::try_from(ms).ok()?;
    jiff::Timestamp::from_millisecond(ms)
        .ok()
        .map(|t| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_millis_or_rfc_3339() {
        assert_eq!(parse_time_ms(" 1500 "), Ok(1_500));
        assert_eq!(parse_time_ms("1970-01-01T00:00:01.5Z"), Ok(1_500));
        assert_eq!(parse_time_ms("1960-01-01T00:00:00Z"), Ok(0));
        assert!(parse_time_ms("99999999999999999999999").is_err());
        assert!(parse_time_ms("yesterday").unwrap_err().contains("RFC 3339"));
    }

    #[test]
    fn formats_epoch_millis() {
        assert_eq!(rfc3339(1_500).as_deref(), Some("1970-01-01T00:00:01.5Z"));
        assert_eq!(rfc3339(u64::MAX), None);
    }

    #[test]
    fn offsets_parse_within_their_bound_and_refuse_the_rest() {
        assert_eq!(parse_offset("-86400000"), Ok(-86_400_000));
        assert_eq!(parse_offset(" 5 "), Ok(5));
        assert!(parse_offset("1d").unwrap_err().contains("whole number"));
        assert!(
            parse_offset(&(MAX_OFFSET_MS + 1).to_string())
                .unwrap_err()
                .contains("more than")
        );
        assert!(parse_offset(&i64::MIN.to_string()).is_err());
    }
}
