//! The pingora background services that run the node's long-lived tasks: each one only hands
//! pingora's shutdown watch to a task that knows nothing of pingora.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use sluice_kafka::Kafka;
use sluice_kafka_log::Cluster;
use sluice_runtime::node::Node;
use sluice_runtime::partition::Lead;
use sluice_runtime::partition::Receivers;

/// Recovers the partitions and starts each on its shard (`sluice_runtime::shards`); then
/// watches them on pingora's runtime for this service.
pub struct PartitionsService {
    node: Node,
    receivers: Mutex<Option<Receivers>>,
    leads: Option<Vec<Lead>>,
}

impl PartitionsService {
    /// A service running the partitions of `receivers` with `node`'s parts; in cluster mode,
    /// each only while `leads` says this node leads it.
    pub fn new(node: Node, receivers: Receivers, leads: Option<Vec<Lead>>) -> Self {
        Self {
            node,
            receivers: Mutex::new(Some(receivers)),
            leads,
        }
    }
}

#[async_trait]
impl BackgroundService for PartitionsService {
    async fn start(&self, shutdown: ShutdownWatch) {
        let receivers = self
            .receivers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(receivers) = receivers {
            self.node
                .serve_partitions(receivers, shutdown, self.leads.clone())
                .await;
        }
    }
}

/// Runs the Kafka consumers, on pingora's runtime for them.
pub struct KafkaService(pub Arc<Kafka>);

#[async_trait]
impl BackgroundService for KafkaService {
    async fn start(&self, shutdown: ShutdownWatch) {
        self.0.run(shutdown).await;
    }
}

/// Drains the metrics recorder's histograms between scrapes.
pub struct MetricsUpkeepService(pub Arc<sluice_admin::scrape::Metrics>);

#[async_trait]
impl BackgroundService for MetricsUpkeepService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            () = Arc::clone(&self.0).upkeep() => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Samples the flow charts' history (`flow.history`).
pub struct FlowHistoryService(
    pub Arc<sluice_admin::flow_history::FlowHistory>,
    pub sluice_runtime::partition::Runtime,
);

#[async_trait]
impl BackgroundService for FlowHistoryService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            () = Arc::clone(&self.0).run(self.1.clone()) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Runs this node's part of the cluster (cluster mode).
pub struct ClusterService(pub Arc<Cluster>);

#[async_trait]
impl BackgroundService for ClusterService {
    async fn start(&self, shutdown: ShutdownWatch) {
        self.0.run(shutdown).await;
    }
}
