//! Wall-clock time as Sluice stores it: milliseconds since the UNIX epoch.

/// Now, in milliseconds since the epoch.
pub fn now_ms() -> u64 {
    u64::try_from(jiff::Timestamp::now().as_millisecond()).unwrap_or(0)
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
    #[test]
    fn formats_epoch_millis() {
        assert_eq!(
            super::rfc3339(1_500).as_deref(),
            Some("1970-01-01T00:00:01.5Z")
        );
        assert_eq!(super::rfc3339(u64::MAX), None);
    }
}
