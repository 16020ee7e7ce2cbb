//! Policy plugins.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A loaded plugin.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PluginResponse {
    /// Its name.
    pub name: String,
    /// `extract` or `match-rule`.
    pub hook: String,
    /// `fail` or `skip`.
    pub on_error: String,
    /// Hex sha256 of the component.
    pub sha256: String,
    /// Component size, bytes.
    pub size: usize,
    /// `config` (the config file) or `admin` (this API).
    pub source: String,
    /// Deadline of one call, milliseconds.
    pub deadline_ms: u64,
    /// Memory cap, bytes.
    pub memory_limit: u64,
    /// Fuel per call, if metered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// What the plugin reads through `config`.
    pub config: BTreeMap<String, String>,
    /// Whether an extract plugin sees the caller's `x-sluice-api-key` and `authorization`.
    #[serde(default)]
    pub credentials: bool,
    /// When this version was loaded, ms since the epoch.
    pub loaded_at_millis_since_epoch: u64,
    /// Calls, errors and latency.
    pub metrics: MetricsSnapshot,
}

/// `GET /plugins`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListPluginsResponse {
    /// In the order they run.
    pub plugins: Vec<PluginResponse>,
}

/// What `GET /plugins` shows.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct MetricsSnapshot {
    /// Calls so far.
    pub calls: u64,
    /// Calls that failed (trap, deadline, memory cap, bad output).
    pub errors: u64,
    /// Median latency, microseconds (bucket upper bound).
    pub p50_us: f64,
    /// 99th percentile latency, microseconds (bucket upper bound).
    pub p99_us: f64,
}
