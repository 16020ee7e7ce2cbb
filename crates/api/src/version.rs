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
    /// Cluster mode (`docs/cluster.md`): the nodes, who leads each partition, and how far this
    /// node's replica is behind. Absent on a single embedded node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sluice_cluster: Option<ClusterView>,
}

/// A cluster-mode node's view of its cluster.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterView {
    /// This node's id.
    pub node: String,
    /// The nodes leading partitions, this one included, by id.
    pub nodes: Vec<String>,
    /// Each partition.
    pub partitions: Vec<PartitionView>,
    /// Events this node posted to a partition's inbox that Kafka has not taken yet (tried
    /// again until it does).
    #[serde(default)]
    pub posts_retrying: u64,
}

/// One partition as this node sees it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PartitionView {
    /// Its index.
    pub partition: u32,
    /// The node its accepted epoch names (none before the first takeover).
    pub leader: Option<String>,
    /// That epoch.
    pub epoch: u64,
    /// Whether this node leads it now.
    pub led_here: bool,
    /// Whether this node keeps it in its store (it leads it or stands by for it;
    /// `cluster.standbys`). Not kept, this node knows only its leader.
    #[serde(default = "kept")]
    pub held_here: bool,
    /// The offset of the next log record this node's store has not got.
    pub stored_offset: i64,
    /// The offset of the next log record this node's reader is to read. It stands still while
    /// this node leads the partition (a leader does not read its own records back) and moves
    /// on from the store's position after it steps down.
    #[serde(default)]
    pub read_offset: i64,
    /// The log's end as last seen (`-1`: not yet known).
    pub log_end: i64,
    /// Records this node's store is behind the log's end (0 while it leads).
    pub lag: i64,
    /// Why this node stopped following the partition (`CLU0003`, `CLU0004`); it never leads it.
    #[serde(default)]
    pub broken: Option<String>,
}

/// A partition view without `held_here` (from a node before standbys) was kept there.
fn kept() -> bool {
    true
}

/// Members of the metadata cluster, by plain node id.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MetadataClusterHealth {
    /// Plain node ids.
    pub members: Vec<u32>,
}

/// What the admin API reports of this node's part of a cluster (cluster mode). The cluster is
/// the Kafka provider's (`sluice-kafka-log`), which the admin API does not name: it reaches it
/// through this.
pub trait ClusterReport: Send + Sync + std::fmt::Debug {
    /// This node's view: members, partitions it follows or leads, lag.
    fn view(&self) -> ClusterView;
    /// Why this node stopped following a partition, and how many it stopped following.
    fn broken(&self) -> Option<(sluice_core::errors::CodedError, usize)>;
}
