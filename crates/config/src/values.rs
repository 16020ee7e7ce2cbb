//! Value types of the configuration that validate themselves while deserializing, so a bad value
//! fails with the key path (and file line) that holds it.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use sluice_core::serde_via_str;

pub use sluice_core::units::{ByteSize, FriendlyDuration};

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// A `tracing` filter directive such as `info` or `info,sluice_ingress=debug`.
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
