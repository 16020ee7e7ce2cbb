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

/// What `GET /cluster-health` answers: the reference server's shape, for a single node that
/// is its own metadata cluster.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterHealthResponse {
    /// `cluster-name` from the configuration.
    pub cluster_name: String,
    /// The members of the metadata cluster: this node, `1`.
    pub metadata_cluster_health: Option<MetadataClusterHealth>,
}

/// Members of the metadata cluster, by plain node id.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MetadataClusterHealth {
    /// Plain node ids.
    pub members: Vec<u32>,
}
