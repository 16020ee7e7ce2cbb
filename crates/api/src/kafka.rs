//! Kafka clusters and subscriptions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A Kafka cluster.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClusterResponse {
    /// Its name.
    pub name: String,
    /// librdkafka properties.
    pub properties: BTreeMap<String, String>,
    /// When it was added.
    pub created_at: String,
    /// From the config file (read-only).
    pub from_config: bool,
    /// Its subscriptions, with `include_subscriptions=true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscriptions: Option<Vec<SubscriptionResponse>>,
}

/// `POST /kafka-clusters`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreateClusterRequest {
    /// Its name.
    pub name: String,
    /// librdkafka properties; `bootstrap.servers` is required.
    pub properties: BTreeMap<String, String>,
}

/// `PATCH /kafka-clusters/{name}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UpdateClusterRequest {
    /// The new properties (replace the old ones).
    pub properties: BTreeMap<String, String>,
}

/// `GET /kafka-clusters`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListClustersResponse {
    /// Every cluster.
    pub clusters: Vec<ClusterResponse>,
}

/// A subscription.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SubscriptionResponse {
    /// `sub_…`.
    pub id: String,
    /// `kafka://<cluster>/<topic>`.
    pub source: String,
    /// `service://<service>/<handler>`.
    pub sink: String,
    /// Its options.
    pub options: BTreeMap<String, String>,
    /// Consumption is paused on some partition: the sink's queue in the scope it feeds holds
    /// more than `max-queued`.
    #[serde(default)]
    pub paused: bool,
    /// The paused Kafka partitions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paused_partitions: Vec<i32>,
}

/// `POST /subscriptions`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreateSubscriptionRequest {
    /// `kafka://<cluster>/<topic>`.
    pub source: String,
    /// `service://<service>/<handler>`.
    pub sink: String,
    /// `scope`, `limit-key`, `auto.offset.reset`.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

/// `GET /subscriptions`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListSubscriptionsResponse {
    /// The subscriptions.
    pub subscriptions: Vec<SubscriptionResponse>,
}

/// Filters of `GET /subscriptions` (exact match).
#[derive(Debug, Serialize, Deserialize)]
pub struct SubscriptionFilter {
    /// Only subscriptions with this sink.
    pub sink: Option<String>,
    /// Only subscriptions with this source.
    pub source: Option<String>,
}

/// Options of `GET /kafka-clusters/{name}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ClusterQuery {
    /// Also list the cluster's subscriptions.
    #[serde(default)]
    pub include_subscriptions: bool,
}

/// Options of `DELETE /kafka-clusters/{name}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeleteClusterQuery {
    /// Delete its subscriptions too.
    #[serde(default)]
    pub force: bool,
}
