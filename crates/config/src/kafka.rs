//! Kafka clusters named in the config file.

use std::collections::BTreeMap;

/// A cluster from the config file (`[[ingress.kafka-clusters]]`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ConfiguredCluster {
    /// Its name.
    pub name: String,
    /// `host:port` list, set as `bootstrap.servers`.
    pub brokers: Vec<String>,
    /// More librdkafka properties.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}
