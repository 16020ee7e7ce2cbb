//! A server clock moved to a fixed moment, so a test never depends on today's date.

/// A loopback port that was free a moment ago.
/// The clock offset that makes a server started now read `at_ms` (milliseconds since the
/// epoch): what a test passes to [`Builder::clock_offset_ms`] so its result does not depend on
/// the day or the hour it runs.
pub fn clock_offset_to(at_ms: i64) -> i64 {
    let host = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the host clock is after 1970")
        .as_millis();
    at_ms - i64::try_from(host).expect("milliseconds fit an i64")
}

/// Noon UTC on 2030-01-15 (a Tuesday), in milliseconds: a server whose clock starts here is
/// twelve hours from any day's window, a fortnight from any month's.
pub const MIDDAY_MS: i64 = 1_894_708_800_000;
