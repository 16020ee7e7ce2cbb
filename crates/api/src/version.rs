//! What the server is and can do.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What `GET /version` answers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionInformation {
    /// The Sluice version.
    pub version: String,
    /// Oldest admin API version served.
    pub min_admin_api_version: u16,
    /// Newest admin API version served.
    pub max_admin_api_version: u16,
    /// Experimental switches and derived features, each on or off.
    pub features: BTreeMap<String, bool>,
    /// Where clients reach the ingress: `http://host:port/`, `https://host/` or `unix:<path>`.
    pub ingress_endpoint: Option<String>,
}
