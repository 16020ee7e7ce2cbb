//! Log set-up: `tracing` to stderr, human or JSON; `RUST_LOG` wins over the configured level.
//! Pingora logs through the `log` crate; the subscriber bridges those records too.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use sluice_config::{LogFormat, LogLevel};

/// Pingora is chatty at `info` about its own start-up; keep it to warnings unless asked. It
/// also logs an error for every client that closes or stalls while sending its headers: a
/// client would choose how many lines the logs get (one per connection it opens), so those are
/// off unless a `RUST_LOG` directive names pingora.
const QUIET_DEPENDENCIES: &str =
    "pingora_core=warn,pingora_proxy=warn,pingora_core::apps::http_app=off";

/// Installs the global subscriber. Later calls do nothing.
pub fn init(format: LogFormat, level: &LogLevel) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directive) if !directive.trim().is_empty() => {
            // Pingora stays quiet unless the directive asks for it by name.
            let full = if directive.contains("pingora") {
                directive.clone()
            } else {
                format!("{directive},{QUIET_DEPENDENCIES}")
            };
            EnvFilter::try_new(&full).unwrap_or_else(|e| {
                eprintln!("warning: ignoring RUST_LOG='{directive}': {e}");
                default_filter(level)
            })
        }
        _ => default_filter(level),
    };
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

fn default_filter(level: &LogLevel) -> EnvFilter {
    let directive = if level.as_str().contains("pingora") {
        level.as_str().to_owned()
    } else {
        format!("{},{QUIET_DEPENDENCIES}", level.as_str())
    };
    EnvFilter::try_new(directive).unwrap_or_else(|_| EnvFilter::new("info"))
}
