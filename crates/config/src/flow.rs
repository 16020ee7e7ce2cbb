//! `[flow]`: node-wide flow-control settings (the rule book holds the per-scope ones).

use serde::{Deserialize, Serialize};

/// Node-wide flow-control settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct FlowConfig {
    /// A call or send made by a handler that names no scope runs under its caller's scope
    /// (and, unless it names its own, its caller's limit key), so one rule governs a whole
    /// call chain. `false`: such calls are unscoped, as before.
    pub inherit_scope: bool,
}

impl Default for FlowConfig {
    fn default() -> Self {
        Self {
            inherit_scope: true,
        }
    }
}
