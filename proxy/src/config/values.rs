//! Value types of the configuration that validate themselves while deserializing, so a bad value
//! fails with the key path (and file line) that holds it.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use jiff::fmt::friendly::{Designator, SpanPrinter};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Implements serde for a type through its `FromStr` and `Display`.
macro_rules! serde_via_str {
    ($ty:ty) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

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

serde_via_str!(FriendlyDuration);

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

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// A `tracing` filter directive such as `info` or `info,sluice::ingress=debug`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLevel(String);

impl LogLevel {
    /// The directive text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for LogLevel {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        tracing_subscriber::EnvFilter::try_new(text)
            .map(|_| Self(text.to_owned()))
            .map_err(|e| {
                format!("invalid log level '{text}': {e} (use e.g. 'info', 'debug' or 'info,sluice=debug')")
            })
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

serde_via_str!(LogLevel);

/// The address clients should use for the ingress, reported by `GET /version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdvertisedEndpoint {
    /// `http://host:port/` or `https://host/`, normalised with a trailing `/`.
    Http(url::Url),
    /// `unix:<path>`.
    Unix(PathBuf),
}

impl FromStr for AdvertisedEndpoint {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "invalid advertised endpoint '{text}': {why} (accepted: 'http://host:port/', 'https://host/' or 'unix:<path>')"
            )
        };
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(bad("the unix socket path is empty"));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        let url = url::Url::parse(text).map_err(|e| bad(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad(&format!(
                "scheme '{}' is not http or https",
                url.scheme()
            )));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("it has no host"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad("it must not carry credentials"));
        }
        if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return Err(bad("it must not have a path, query or fragment"));
        }
        Ok(Self::Http(url))
    }
}

impl fmt::Display for AdvertisedEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Http(url) => f.write_str(url.as_str()),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

serde_via_str!(AdvertisedEndpoint);

/// What the invoker does once an invocation ran out of retry attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnMaxAttempts {
    /// Pause the invocation; an operator resumes it.
    Pause,
    /// Kill the invocation.
    Kill,
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

    #[test]
    fn advertised_endpoints() {
        let ok = |s: &str| s.parse::<AdvertisedEndpoint>().unwrap().to_string();
        assert_eq!(ok("http://127.0.0.1:8080/"), "http://127.0.0.1:8080/");
        assert_eq!(ok("http://localhost:8080"), "http://localhost:8080/");
        assert_eq!(ok("https://ingress.example/"), "https://ingress.example/");
        assert_eq!(ok("unix:/run/sluice.sock"), "unix:/run/sluice.sock");
        for bad in [
            "ftp://host/",
            "host:8080",
            "unix:",
            "http://host/path",
            "http://u:p@host/",
            "",
        ] {
            let err = bad.parse::<AdvertisedEndpoint>().unwrap_err();
            assert!(
                err.starts_with("invalid advertised endpoint"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn log_levels_are_filter_directives() {
        assert!("info,sluice=debug".parse::<LogLevel>().is_ok());
        assert!("info,[".parse::<LogLevel>().is_err());
    }
}
