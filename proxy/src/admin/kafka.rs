//! `/kafka-clusters` and `/subscriptions`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use http::{StatusCode, header};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AdminState;
use super::error::AdminError;
use super::json::Json;
use crate::clock::rfc3339;
use crate::ids::SubscriptionId;
use crate::kafka::{KafkaCluster, KafkaError, Subscription};

fn refused(error: KafkaError) -> AdminError {
    match error {
        KafkaError::NotFound(m) => AdminError::new(StatusCode::NOT_FOUND, m),
        KafkaError::Conflict(m) => AdminError::new(StatusCode::CONFLICT, m),
        KafkaError::Invalid(e) if e.code.is_some() => e.into(),
        KafkaError::Invalid(e) => AdminError::new(StatusCode::BAD_REQUEST, e.message),
    }
}

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

impl From<KafkaCluster> for ClusterResponse {
    fn from(c: KafkaCluster) -> Self {
        Self {
            name: c.name,
            properties: crate::kafka::properties::redacted(&c.properties),
            created_at: rfc3339(c.created_at_ms).unwrap_or_default(),
            from_config: c.from_config,
            subscriptions: None,
        }
    }
}

/// `POST /kafka-clusters`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CreateClusterRequest {
    /// Its name.
    pub name: String,
    /// librdkafka properties; `bootstrap.servers` is required.
    pub properties: BTreeMap<String, String>,
}

/// `PATCH /kafka-clusters/{name}`.
#[derive(Debug, Deserialize, ToSchema)]
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

impl From<Subscription> for SubscriptionResponse {
    fn from(s: Subscription) -> Self {
        Self {
            id: s.id.to_string(),
            source: s.source,
            sink: s.sink,
            options: s.options,
            paused: false,
            paused_partitions: Vec::new(),
        }
    }
}

fn shown(kafka: &crate::kafka::Kafka, s: Subscription) -> SubscriptionResponse {
    let paused_partitions = kafka.paused_partitions(s.id);
    SubscriptionResponse {
        paused: !paused_partitions.is_empty(),
        paused_partitions,
        ..s.into()
    }
}

/// `POST /subscriptions`.
#[derive(Debug, Deserialize, ToSchema)]
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
#[derive(Debug, Deserialize)]
pub struct SubscriptionFilter {
    sink: Option<String>,
    source: Option<String>,
}

/// Options of `GET /kafka-clusters/{name}`.
#[derive(Debug, Deserialize)]
pub struct ClusterQuery {
    #[serde(default)]
    include_subscriptions: bool,
}

/// Options of `DELETE /kafka-clusters/{name}`.
#[derive(Debug, Deserialize)]
pub struct DeleteClusterQuery {
    #[serde(default)]
    force: bool,
}

fn subscription_id(id: &str) -> Result<SubscriptionId, AdminError> {
    id.parse().map_err(|e| {
        AdminError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid subscription id: {e}"),
        )
    })
}

/// Adds a Kafka cluster.
#[utoipa::path(post, path = "/kafka-clusters", tag = "kafka_cluster", operation_id = "create_kafka_cluster",
    request_body = CreateClusterRequest,
    responses((status = 201, body = ClusterResponse), (status = 409, description = "Exists already, or from the config file")))]
pub async fn create_cluster(
    State(state): State<Arc<AdminState>>,
    Json(req): Json<CreateClusterRequest>,
) -> Result<(StatusCode, Json<ClusterResponse>), AdminError> {
    let cluster = state
        .kafka
        .put_cluster(&req.name, req.properties, false)
        .map_err(refused)?;
    Ok((StatusCode::CREATED, Json(cluster.into())))
}

/// Every Kafka cluster.
#[utoipa::path(get, path = "/kafka-clusters", tag = "kafka_cluster", operation_id = "list_kafka_clusters",
    responses((status = 200, body = ListClustersResponse)))]
pub async fn list_clusters(State(state): State<Arc<AdminState>>) -> Json<ListClustersResponse> {
    Json(ListClustersResponse {
        clusters: state.kafka.clusters().into_iter().map(Into::into).collect(),
    })
}

/// One Kafka cluster.
#[utoipa::path(get, path = "/kafka-clusters/{name}", tag = "kafka_cluster", operation_id = "get_kafka_cluster",
    params(("name" = String, Path, description = "Cluster name"), ("include_subscriptions" = Option<bool>, Query, description = "List its subscriptions too")),
    responses((status = 200, body = ClusterResponse), (status = 404)))]
pub async fn get_cluster(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    Query(query): Query<ClusterQuery>,
) -> Result<Json<ClusterResponse>, AdminError> {
    let mut shown = ClusterResponse::from(state.kafka.cluster(&name).map_err(refused)?);
    if query.include_subscriptions {
        shown.subscriptions = Some(
            state
                .kafka
                .subscriptions()
                .into_iter()
                .filter(|s| s.cluster == name)
                .map(Into::into)
                .collect(),
        );
    }
    Ok(Json(shown))
}

/// Replaces a Kafka cluster's properties.
#[utoipa::path(patch, path = "/kafka-clusters/{name}", tag = "kafka_cluster", operation_id = "update_kafka_cluster",
    params(("name" = String, Path, description = "Cluster name")), request_body = UpdateClusterRequest,
    responses((status = 200, body = ClusterResponse), (status = 404), (status = 409, description = "From the config file")))]
pub async fn update_cluster(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    Json(req): Json<UpdateClusterRequest>,
) -> Result<Json<ClusterResponse>, AdminError> {
    let cluster = state
        .kafka
        .put_cluster(&name, req.properties, true)
        .map_err(refused)?;
    Ok(Json(cluster.into()))
}

/// Removes a Kafka cluster; one with subscriptions only with `force=true` (they go too).
#[utoipa::path(delete, path = "/kafka-clusters/{name}", tag = "kafka_cluster", operation_id = "delete_kafka_cluster",
    params(("name" = String, Path, description = "Cluster name"), ("force" = Option<bool>, Query, description = "Delete its subscriptions too")),
    responses((status = 202), (status = 404), (status = 409, description = "Has subscriptions, or from the config file")))]
pub async fn delete_cluster(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    Query(query): Query<DeleteClusterQuery>,
) -> Result<StatusCode, AdminError> {
    state
        .kafka
        .delete_cluster(&name, query.force)
        .map_err(refused)?;
    Ok(StatusCode::ACCEPTED)
}

/// Creates a subscription and starts consuming (META0009 on a bad source, sink or option).
#[utoipa::path(post, path = "/subscriptions", tag = "subscription", operation_id = "create_subscription",
    request_body = CreateSubscriptionRequest,
    responses((status = 201, body = SubscriptionResponse), (status = 400, description = "META0009")))]
pub async fn create_subscription(
    State(state): State<Arc<AdminState>>,
    Json(req): Json<CreateSubscriptionRequest>,
) -> Result<impl IntoResponse, AdminError> {
    let sub = state
        .kafka
        .create_subscription(&req.source, &req.sink, req.options)
        .map_err(refused)?;
    let location = format!("subscriptions/{}", sub.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(SubscriptionResponse::from(sub)),
    ))
}

/// Subscriptions, optionally only those with this sink and/or source.
#[utoipa::path(get, path = "/subscriptions", tag = "subscription", operation_id = "list_subscriptions",
    params(("sink" = Option<String>, Query, description = "Exact sink"), ("source" = Option<String>, Query, description = "Exact source")),
    responses((status = 200, body = ListSubscriptionsResponse)))]
pub async fn list_subscriptions(
    State(state): State<Arc<AdminState>>,
    Query(filter): Query<SubscriptionFilter>,
) -> Json<ListSubscriptionsResponse> {
    let subscriptions = state
        .kafka
        .subscriptions()
        .into_iter()
        .filter(|s| filter.sink.as_ref().is_none_or(|sink| &s.sink == sink))
        .filter(|s| {
            filter
                .source
                .as_ref()
                .is_none_or(|source| &s.source == source)
        })
        .map(|s| shown(&state.kafka, s))
        .collect();
    Json(ListSubscriptionsResponse { subscriptions })
}

/// One subscription.
#[utoipa::path(get, path = "/subscriptions/{id}", tag = "subscription", operation_id = "get_subscription",
    params(("id" = String, Path, description = "sub_…")),
    responses((status = 200, body = SubscriptionResponse), (status = 404)))]
pub async fn get_subscription(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
) -> Result<Json<SubscriptionResponse>, AdminError> {
    let sub = state
        .kafka
        .subscription(subscription_id(&id)?)
        .map_err(refused)?;
    Ok(Json(shown(&state.kafka, sub)))
}

/// Stops and deletes a subscription.
#[utoipa::path(delete, path = "/subscriptions/{id}", tag = "subscription", operation_id = "delete_subscription",
    params(("id" = String, Path, description = "sub_…")),
    responses((status = 202), (status = 404)))]
pub async fn delete_subscription(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
) -> Result<StatusCode, AdminError> {
    state
        .kafka
        .delete_subscription(subscription_id(&id)?)
        .map_err(refused)?;
    Ok(StatusCode::ACCEPTED)
}
