//! The pingora background services that run the node's long-lived tasks: each one only hands
//! pingora's shutdown watch to a task that knows nothing of pingora.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::kafka::Kafka;
use crate::node::Node;
use crate::partition::Receivers;

/// Runs the partitions, on pingora's runtime for them.
pub struct PartitionsService {
    node: Node,
    receivers: Mutex<Option<Receivers>>,
}

impl PartitionsService {
    /// A service running the partitions of `receivers` with `node`'s parts.
    pub fn new(node: Node, receivers: Receivers) -> Self {
        Self {
            node,
            receivers: Mutex::new(Some(receivers)),
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
            self.node.serve_partitions(receivers, shutdown).await;
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
pub struct MetricsUpkeepService(pub Arc<crate::scrape::Metrics>);

#[async_trait]
impl BackgroundService for MetricsUpkeepService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            () = Arc::clone(&self.0).upkeep() => {}
            _ = shutdown.changed() => {}
        }
    }
}
