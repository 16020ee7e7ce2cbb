//! Host bindings of `wit/policy.wit` and the imports every plugin gets.

use std::collections::BTreeMap;
use std::sync::Arc;

use wasmtime::StoreLimits;

wasmtime::component::bindgen!({
    world: "plugin",
    path: "wit",
});

pub use self::sluice::policy::host::LogLevel;
pub use self::sluice::policy::types;

/// The longest log line a plugin writes, in bytes; the rest is cut.
const MAX_LOG_LINE: usize = 1024;

/// What a plugin's store holds: who it is (for logs), its config, its memory cap.
pub struct HostState {
    pub(super) name: Arc<str>,
    pub(super) config: Arc<BTreeMap<String, String>>,
    pub(super) limits: StoreLimits,
}

impl self::sluice::policy::types::Host for HostState {}

impl self::sluice::policy::host::Host for HostState {
    fn log(&mut self, level: LogLevel, mut message: String) {
        let plugin = &*self.name;
        // A plugin runs on every request: one line may not fill the logs.
        if message.len() > MAX_LOG_LINE {
            let cut = message.len() - MAX_LOG_LINE;
            let mut end = MAX_LOG_LINE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str(&format!("… ({cut} more bytes)"));
        }
        match level {
            LogLevel::Trace => tracing::trace!(plugin, "{message}"),
            LogLevel::Debug => tracing::debug!(plugin, "{message}"),
            LogLevel::Info => tracing::info!(plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin, "{message}"),
            LogLevel::Error => tracing::error!(plugin, "{message}"),
        }
    }

    fn config(&mut self, key: String) -> Option<String> {
        self.config.get(&key).cloned()
    }

    fn now_ms(&mut self) -> u64 {
        sluice_core::clock::now_ms()
    }
}
