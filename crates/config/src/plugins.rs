//! How a plugin is loaded: its hook, what happens when it fails, its limits and its config.
//! Shared by `[[plugins]]` in the config file and `PUT /plugins/{name}`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{ByteSize, FriendlyDuration};

/// Which hook a plugin serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hook {
    /// Classifies ingress requests (`extract`).
    Extract,
    /// Decides counters' limits (`match-rule`).
    MatchRule,
}

impl Hook {
    /// The component export the hook calls.
    pub fn export(self) -> &'static str {
        match self {
            Hook::Extract => "extract",
            Hook::MatchRule => "match-rule",
        }
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.export())
    }
}

impl FromStr for Hook {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "extract" => Ok(Hook::Extract),
            "match-rule" => Ok(Hook::MatchRule),
            other => Err(format!(
                "unknown hook '{other}': use 'extract' or 'match-rule'"
            )),
        }
    }
}

/// What a plugin error does to the request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnError {
    /// Refuse it (503 with the plugin's error code).
    #[default]
    Fail,
    /// Pass it through as if the plugin were not loaded.
    Skip,
}

impl FromStr for OnError {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "fail" => Ok(OnError::Fail),
            "skip" => Ok(OnError::Skip),
            other => Err(format!("unknown on-error '{other}': use 'fail' or 'skip'")),
        }
    }
}

impl fmt::Display for OnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnError::Fail => "fail",
            OnError::Skip => "skip",
        })
    }
}

/// A plugin's settings (everything but its bytes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct PluginSpec {
    /// The hook it serves.
    pub hook: Hook,
    /// What its errors do.
    #[serde(default)]
    pub on_error: OnError,
    /// Longest a single call may run.
    #[serde(default = "default_deadline")]
    pub deadline: FriendlyDuration,
    /// Largest linear memory an instance may grow to.
    #[serde(default = "default_memory_limit")]
    pub memory_limit: ByteSize,
    /// Fuel (roughly, wasm instructions) a single call may burn; none: only the deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Read by the plugin through the `config` import.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Also hand an extract plugin the caller's credentials (`x-sluice-api-key`,
    /// `authorization`); off, they are left out of the headers it sees.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub credentials: bool,
}

fn default_deadline() -> FriendlyDuration {
    FriendlyDuration::from_millis(10)
}

fn default_memory_limit() -> ByteSize {
    ByteSize::mib(16)
}

impl PluginSpec {
    /// A spec for `hook` with every default.
    pub fn new(hook: Hook) -> Self {
        Self {
            hook,
            on_error: OnError::Fail,
            deadline: default_deadline(),
            memory_limit: default_memory_limit(),
            fuel: None,
            config: BTreeMap::new(),
            credentials: false,
        }
    }
}

/// A `[[plugins]]` entry of the config file: a name, a file, and the [`PluginSpec`] fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ConfiguredPlugin {
    /// Its name (admin API, metrics, logs).
    pub name: String,
    /// The `.wasm` component file.
    pub path: PathBuf,
    /// See [`PluginSpec::hook`].
    pub hook: Hook,
    /// See [`PluginSpec::on_error`].
    #[serde(default)]
    pub on_error: OnError,
    /// See [`PluginSpec::deadline`].
    #[serde(default = "default_deadline")]
    pub deadline: FriendlyDuration,
    /// See [`PluginSpec::memory_limit`].
    #[serde(default = "default_memory_limit")]
    pub memory_limit: ByteSize,
    /// See [`PluginSpec::fuel`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// See [`PluginSpec::config`].
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// See [`PluginSpec::credentials`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub credentials: bool,
}

impl ConfiguredPlugin {
    /// Its settings.
    pub fn spec(&self) -> PluginSpec {
        PluginSpec {
            hook: self.hook,
            on_error: self.on_error,
            deadline: self.deadline,
            memory_limit: self.memory_limit,
            fuel: self.fuel,
            config: self.config.clone(),
            credentials: self.credentials,
        }
    }
}

/// Checks a plugin name: 1-64 bytes of `[a-zA-Z0-9_.-]`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid plugin name '{name}': 1-64 bytes of [a-zA-Z0-9_.-]"
        ))
    }
}
