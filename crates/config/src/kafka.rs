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
    #[serde(default, serialize_with = "redacted_properties")]
    pub properties: BTreeMap<String, String>,
}

/// Whether librdkafka property `key` holds a secret (`sasl.password`, `ssl.key.password`,
/// `ssl.key.pem`, `sasl.oauthbearer.client.secret`, `sasl.jaas.config`, a token…): its value
/// never appears in `--dump-config`.
pub fn secret_like(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "key.pem",
        "jaas",
        "token",
        "credential",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// Serializes librdkafka properties with every [`secret_like`] value as `<redacted>`.
pub fn redacted_properties<S: serde::Serializer>(
    properties: &BTreeMap<String, String>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(properties.iter().map(|(key, value)| {
        let shown = if secret_like(key) {
            "<redacted>"
        } else {
            value.as_str()
        };
        (key, shown)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_shows_no_secret_property() {
        let mut properties = BTreeMap::new();
        for (key, value) in [
            ("sasl.password", "hunter2"),
            ("ssl.key.password", "hunter3"),
            ("sasl.oauthbearer.client.secret", "hunter4"),
            ("sasl.username", "ada"),
        ] {
            properties.insert(key.to_owned(), value.to_owned());
        }
        let cluster = ConfiguredCluster {
            name: "c".into(),
            brokers: vec!["k:9092".into()],
            properties: properties.clone(),
        };
        let dumped = toml::to_string(&cluster).unwrap();
        assert!(!dumped.contains("hunter"), "{dumped}");
        assert!(dumped.contains("ada"), "{dumped}");
        let config = crate::cluster::ClusterConfig {
            properties,
            ..Default::default()
        };
        let dumped = toml::to_string(&config).unwrap();
        assert!(!dumped.contains("hunter"), "{dumped}");
        assert!(dumped.contains("ada"), "{dumped}");
    }
}
