//! Value types written by people (configuration, the admin API) that validate themselves while
//! parsing: durations such as `10s` or `1h 30m`, sizes such as `32 MiB`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use jiff::fmt::friendly::{Designator, SpanPrinter};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written `500ms`, `10s`, `1h 30m`, `1d` or ISO-8601 (`PT10S`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FriendlyDuration(pub Duration);

impl FriendlyDuration {
    /// A duration of whole seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    /// A duration of milliseconds.
    pub const fn from_millis(millis: u64) -> Self {
        Self(Duration::from_millis(millis))
    }
}

impl FromStr for FriendlyDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: String| {
            format!(
                "invalid duration '{text}': {why} (write e.g. '500ms', '10s', '1h 30m', '1d' or ISO-8601 'PT10S')"
            )
        };
        let span: jiff::Span = text
            .trim()
            .parse()
            .map_err(|e: jiff::Error| bad(e.to_string()))?;
        let signed = span
            .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
            .map_err(|e| bad(e.to_string()))?;
        let duration = Duration::try_from(signed).map_err(|_| bad("it is negative".to_owned()))?;
        Ok(Self(duration))
    }
}

impl fmt::Display for FriendlyDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let printer = SpanPrinter::new().designator(Designator::Compact);
        f.write_str(&printer.unsigned_duration_to_string(&self.0))
    }
}

crate::serde_via_str!(FriendlyDuration);

/// A byte size written `32 MiB`, `512kB` or a plain number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        Self(n * 1024 * 1024)
    }

    /// `n` kibibytes.
    pub const fn kib(n: u64) -> Self {
        Self(n * 1024)
    }

    /// The size as a `usize`, saturating on a 32-bit target.
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", bytesize::ByteSize(self.0).display().iec())
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(n) => Ok(Self(n)),
            Raw::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        text.trim()
            .parse::<bytesize::ByteSize>()
            .map(|b| Self(b.as_u64()))
            .map_err(|e| {
                format!("invalid size '{text}': {e} (write e.g. '32 MiB', '512 KiB' or a number of bytes)")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_friendly_and_iso() {
        let d = |s: &str| s.parse::<FriendlyDuration>().unwrap().0;
        assert_eq!(d("500ms"), Duration::from_millis(500));
        assert_eq!(d("10s"), Duration::from_secs(10));
        assert_eq!(d("1h 30m"), Duration::from_secs(5400));
        assert_eq!(d("1d"), Duration::from_secs(86_400));
        assert_eq!(d("PT10S"), Duration::from_secs(10));
        let err = "ten".parse::<FriendlyDuration>().unwrap_err();
        assert!(err.starts_with("invalid duration 'ten'"), "{err}");
        assert!(
            "-5s"
                .parse::<FriendlyDuration>()
                .unwrap_err()
                .contains("negative")
        );
    }

    #[test]
    fn durations_print_compactly_and_round_trip() {
        for text in ["500ms", "10s", "1m", "10m", "1h 30m"] {
            let d: FriendlyDuration = text.parse().unwrap();
            assert_eq!(d.to_string(), text);
        }
    }

    #[test]
    fn sizes_parse_text_and_numbers() {
        let size: ByteSize = serde_json::from_str("\"32 MiB\"").unwrap();
        assert_eq!(size, ByteSize::mib(32));
        let size: ByteSize = serde_json::from_str("1024").unwrap();
        assert_eq!(size.0, 1024);
        let err = serde_json::from_str::<ByteSize>("\"lots\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid size 'lots'"), "{err}");
        assert_eq!(ByteSize::mib(32).to_string(), "32.0 MiB");
    }
}
