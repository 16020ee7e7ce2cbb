//! `/kafka-clusters` and `/subscriptions`.

use std::sync::Arc;

use super::extract::{Path, Query};
use axum::extract::State;
use axum::response::IntoResponse;
use http::{StatusCode, header};

use super::AdminState;
use super::error::AdminError;
use super::json::Json;
pub use sluice_api::kafka::{
    ClusterQuery, ClusterResponse, CreateClusterRequest, CreateSubscriptionRequest,
    DeleteClusterQuery, ListClustersResponse, ListSubscriptionsResponse, SubscriptionFilter,
    SubscriptionResponse, UpdateClusterRequest,
};
use sluice_core::clock::rfc3339;
use sluice_core::errors::Code;
use sluice_core::ids::SubscriptionId;
use sluice_kafka::{KafkaCluster, KafkaError, Subscription};

fn refused(error: KafkaError) -> AdminError {
    match error {
        KafkaError::NotFound(m) => AdminError::coded(Code::ADM0003, m),
        KafkaError::Conflict(m) => AdminError::coded(Code::ADM0004, m),
        KafkaError::Invalid(e) if e.code.is_some() => e.into(),
        KafkaError::Invalid(e) => AdminError::coded(Code::ADM0002, e.message),
    }
}

/// How the admin API shows `KafkaCluster`.
pub fn cluster_response(c: KafkaCluster) -> ClusterResponse {
    ClusterResponse {
        name: c.name,
        properties: sluice_kafka::properties::redacted(&c.properties),
        created_at: rfc3339(c.created_at_ms).unwrap_or_default(),
        from_config: c.from_config,
        subscriptions: None,
    }
}

/// How the admin API shows `Subscription`.
pub fn subscription_response(s: Subscription) -> SubscriptionResponse {
    SubscriptionResponse {
        id: s.id.to_string(),
        source: s.source,
        sink: s.sink,
        options: s.options,
        paused: false,
        paused_partitions: Vec::new(),
    }
}

fn shown(kafka: &sluice_kafka::Kafka, s: Subscription) -> SubscriptionResponse {
    let paused_partitions = kafka.paused_partitions(s.id);
    SubscriptionResponse {
        paused: !paused_partitions.is_empty(),
        paused_partitions,
        ..subscription_response(s)
    }
}

fn subscription_id(id: &str) -> Result<SubscriptionId, AdminError> {
    id.parse()
        .map_err(|e| AdminError::coded(Code::ADM0002, format!("invalid subscription id: {e}")))
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
    Ok((StatusCode::CREATED, Json(cluster_response(cluster))))
}

/// Every Kafka cluster.
#[utoipa::path(get, path = "/kafka-clusters", tag = "kafka_cluster", operation_id = "list_kafka_clusters",
    responses((status = 200, body = ListClustersResponse)))]
pub async fn list_clusters(State(state): State<Arc<AdminState>>) -> Json<ListClustersResponse> {
    Json(ListClustersResponse {
        clusters: state
            .kafka
            .clusters()
            .into_iter()
            .map(cluster_response)
            .collect(),
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
    let mut shown = cluster_response(state.kafka.cluster(&name).map_err(refused)?);
    if query.include_subscriptions {
        shown.subscriptions = Some(
            state
                .kafka
                .subscriptions()
                .into_iter()
                .filter(|s| s.cluster == name)
                .map(subscription_response)
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
    Ok(Json(cluster_response(cluster)))
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

/// Creates a subscription and starts consuming (META0009 on a bad source, sink or option); one
/// with the same source, sink and effective `group.id` is answered (200) instead of a second.
#[utoipa::path(post, path = "/subscriptions", tag = "subscription", operation_id = "create_subscription",
    request_body = CreateSubscriptionRequest,
    responses((status = 201, body = SubscriptionResponse), (status = 200, description = "It existed already.", body = SubscriptionResponse), (status = 400, description = "META0009")))]
pub async fn create_subscription(
    State(state): State<Arc<AdminState>>,
    Json(req): Json<CreateSubscriptionRequest>,
) -> Result<impl IntoResponse, AdminError> {
    let (sub, created) = state
        .kafka
        .create_subscription(&req.source, &req.sink, req.options)
        .map_err(refused)?;
    let location = format!("subscriptions/{}", sub.id);
    Ok((
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        [(header::LOCATION, location)],
        Json(subscription_response(sub)),
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
