//! `[cluster]`: several nodes over one Kafka cluster (`docs/cluster.md`). Embedded (one node,
//! one redb file) is the default and needs none of it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{ByteSize, FriendlyDuration};

/// How this node stores what it acknowledges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterMode {
    /// One node: the redb file under `data-dir` is the truth.
    #[default]
    Embedded,
    /// Several nodes: each partition's Kafka log is the truth, the redb file a view of it.
    Kafka,
}

/// What sends a partition leader's records to the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogProducer {
    /// The shard that leads the partition, over its own connection to the broker: one request
    /// per loop turn for all of its partitions, no client thread in between. Used only while
    /// the cluster's connections are plaintext (no `security.protocol`, `sasl.*` or `ssl.*`
    /// in `cluster.properties`); otherwise the node uses `librdkafka`.
    #[default]
    Shard,
    /// librdkafka's idempotent producer (its broker threads send, its polling thread reports).
    Librdkafka,
}

/// The cluster this node joins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// `embedded` or `kafka`.
    pub mode: ClusterMode,
    /// `host:port` list of the Kafka cluster (`bootstrap.servers`); needed in `kafka` mode.
    pub bootstrap_servers: String,
    /// Names the cluster's topics: `<prefix>log`, `<prefix>leaders`, ...
    pub topic_prefix: String,
    /// This node's name, unique in the cluster; empty: the host name.
    pub node_id: String,
    /// The ingress URL other nodes forward calls to; empty: derived from `ingress.bind`.
    pub advertised_ingress: String,
    /// The admin URL other nodes forward admin requests to; empty: from `admin.bind`.
    pub advertised_admin: String,
    /// How long a node may be silent before the group gives its partitions to others.
    pub session_timeout: FriendlyDuration,
    /// Replication factor of the topics Sluice creates.
    pub replication_factor: u16,
    /// Largest record this node writes to or accepts from the log.
    pub max_record_bytes: ByteSize,
    /// Records a partition's leader may have sent to the log and not yet seen confirmed
    /// (1 to 5: Kafka's idempotent producer keeps a partition's order for up to five).
    pub records_in_flight: u32,
    /// What sends a leader's records to the log: `shard` (default) or `librdkafka`.
    pub log_producer: LogProducer,
    /// How long a record may take to be stored by the brokers (`acks=all`) before the write
    /// fails: the calls it carries are answered `CLU0001` and the leader steps down. Long
    /// enough to ride out a broker's leader election.
    pub write_timeout: FriendlyDuration,
    /// How often a partition's leader writes a snapshot of its state to the snapshot topic
    /// (when its log moved) and deletes the log it covers.
    pub snapshot_interval: FriendlyDuration,
    /// Every how many snapshots a leader writes its partition's whole state (1 to
    /// [`MAX_SNAPSHOT_FULL_EVERY`]); between them it writes only the rows that changed, and
    /// also a whole one once those add up to half the last whole one.
    pub snapshot_full_every: u32,
    /// Most bytes of changed keys a leader notes per partition between two snapshots; past it
    /// the next snapshot is whole.
    pub snapshot_changes_max: ByteSize,
    /// Nodes beside its leader that apply each partition's log to their store (warm standbys,
    /// 0 to [`MAX_STANDBYS`]); a node's store holds only the partitions it leads or stands by
    /// for. At least the node count less one: every node holds every partition.
    pub standbys: u16,
    /// More librdkafka properties for the cluster's clients (security, timeouts).
    #[serde(
        skip_serializing_if = "BTreeMap::is_empty",
        serialize_with = "crate::kafka::redacted_properties"
    )]
    pub properties: BTreeMap<String, String>,
    /// Start even when the brokers cannot say whether the cluster's topics keep every record
    /// (DescribeConfigs unsupported or denied). Off: such a node stops with CLU0002; the
    /// operator who has checked the topics' settings by other means turns it on.
    pub allow_unconfirmed_retention: bool,
    /// The secret every node of the cluster shares (at least 16 characters): a request one
    /// node forwards to another proves itself with it. Needed in `kafka` mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<crate::NodeSecret>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            mode: ClusterMode::Embedded,
            bootstrap_servers: String::new(),
            topic_prefix: "sluice.".into(),
            node_id: String::new(),
            advertised_ingress: String::new(),
            advertised_admin: String::new(),
            session_timeout: FriendlyDuration::from_secs(10),
            replication_factor: 3,
            max_record_bytes: ByteSize::mib(8),
            records_in_flight: 4,
            log_producer: LogProducer::Shard,
            write_timeout: FriendlyDuration::from_secs(30),
            snapshot_interval: FriendlyDuration::from_secs(600),
            snapshot_full_every: 10,
            snapshot_changes_max: ByteSize::mib(64),
            standbys: 1,
            properties: BTreeMap::new(),
            allow_unconfirmed_retention: false,
            secret: None,
        }
    }
}

/// `value` of `key` is at least a second and at most `max`; otherwise the key and why not.
fn within(
    key: &str,
    value: std::time::Duration,
    max: std::time::Duration,
) -> Result<(), (String, String)> {
    if value < std::time::Duration::from_secs(1) || value > max {
        return Err((
            key.into(),
            format!(
                "must be between 1s and {}s, got {}ms",
                max.as_secs(),
                value.as_millis()
            ),
        ));
    }
    Ok(())
}

/// The longest `cluster.write-timeout`: a call waits for its record at most this long.
pub const MAX_WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The longest `cluster.snapshot-interval` (a day): the log a partition keeps is about what it
/// writes in one interval.
pub const MAX_SNAPSHOT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(86_400);

/// The most snapshots between two whole ones (`cluster.snapshot-full-every`): a node that
/// catches up reads the whole one and every one after it.
pub const MAX_SNAPSHOT_FULL_EVERY: u32 = 1_000;

/// The most standbys a partition may have (a cluster of more nodes than this plus one holds
/// each partition on at most this many beside the leader).
pub const MAX_STANDBYS: u16 = 64;

/// Most bytes of a node id or topic prefix (they name Kafka groups and topics).
pub const MAX_NAME: usize = 100;

impl ClusterConfig {
    /// Checks what `kafka` mode needs; the key that is wrong and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.mode == ClusterMode::Embedded {
            return Ok(());
        }
        self.validate_addresses()?;
        self.validate_bounds()?;
        if self.secret.is_none() {
            return Err((
                "cluster.secret".into(),
                "is needed when cluster.mode = \"kafka\": the same secret of at least 16 characters on every node (SERVICE_CLUSTER__SECRET); a node forwards requests to another with it, and honours forwarded requests only with it".into(),
            ));
        }
        Ok(())
    }

    /// The brokers, names and URLs a node goes by.
    fn validate_addresses(&self) -> Result<(), (String, String)> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err((
                "cluster.bootstrap-servers".into(),
                "is needed when cluster.mode = \"kafka\" (host:port,host:port)".into(),
            ));
        }
        let valid_name = |name: &str| {
            name.len() <= MAX_NAME
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        if self.topic_prefix.is_empty() || !valid_name(&self.topic_prefix) {
            return Err((
                "cluster.topic-prefix".into(),
                format!(
                    "must be 1-{MAX_NAME} bytes of [a-zA-Z0-9._-], got '{}'",
                    self.topic_prefix
                ),
            ));
        }
        if !valid_name(&self.node_id) {
            return Err((
                "cluster.node-id".into(),
                format!(
                    "must be at most {MAX_NAME} bytes of [a-zA-Z0-9._-], got '{}'",
                    self.node_id
                ),
            ));
        }
        for (key, url) in [
            ("cluster.advertised-ingress", &self.advertised_ingress),
            ("cluster.advertised-admin", &self.advertised_admin),
        ] {
            if !url.is_empty()
                && (url.len() > 2048
                    || !(url.starts_with("http://") || url.starts_with("https://")))
            {
                return Err((
                    key.into(),
                    format!("must be an http:// or https:// URL, got '{url}'"),
                ));
            }
        }
        Ok(())
    }

    /// The sizes, counts and times within their ranges.
    fn validate_bounds(&self) -> Result<(), (String, String)> {
        if self.replication_factor == 0 {
            return Err((
                "cluster.replication-factor".into(),
                "must be at least 1".into(),
            ));
        }
        if self.max_record_bytes.0 < 64 * 1024 || self.max_record_bytes.0 > 1 << 30 {
            return Err((
                "cluster.max-record-bytes".into(),
                format!(
                    "must be between 64KiB and 1GiB, got {}",
                    self.max_record_bytes.0
                ),
            ));
        }
        if !(1..=5).contains(&self.records_in_flight) {
            return Err((
                "cluster.records-in-flight".into(),
                format!(
                    "must be between 1 and 5 (the idempotent producer keeps order for at most 5), got {}",
                    self.records_in_flight
                ),
            ));
        }
        if self.session_timeout.0 < std::time::Duration::from_secs(1) {
            return Err((
                "cluster.session-timeout".into(),
                "must be at least 1s".into(),
            ));
        }
        within(
            "cluster.write-timeout",
            self.write_timeout.0,
            MAX_WRITE_TIMEOUT,
        )?;
        within(
            "cluster.snapshot-interval",
            self.snapshot_interval.0,
            MAX_SNAPSHOT_INTERVAL,
        )?;
        if !(1..=MAX_SNAPSHOT_FULL_EVERY).contains(&self.snapshot_full_every) {
            return Err((
                "cluster.snapshot-full-every".into(),
                format!(
                    "must be between 1 and {MAX_SNAPSHOT_FULL_EVERY}, got {}",
                    self.snapshot_full_every
                ),
            ));
        }
        if self.standbys > MAX_STANDBYS {
            return Err((
                "cluster.standbys".into(),
                format!(
                    "must be between 0 and {MAX_STANDBYS}, got {}",
                    self.standbys
                ),
            ));
        }
        Ok(())
    }

    /// Whether this node runs in a cluster.
    pub fn is_kafka(&self) -> bool {
        self.mode == ClusterMode::Kafka
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_needs_nothing_and_kafka_needs_brokers() {
        assert!(ClusterConfig::default().validate().is_ok());
        let mut kafka = ClusterConfig {
            mode: ClusterMode::Kafka,
            ..ClusterConfig::default()
        };
        assert_eq!(kafka.validate().unwrap_err().0, "cluster.bootstrap-servers");
        kafka.bootstrap_servers = "127.0.0.1:9092".into();
        assert_eq!(kafka.validate().unwrap_err().0, "cluster.secret");
        kafka.secret = Some("a-secret-of-the-nodes".parse().unwrap());
        assert!(kafka.validate().is_ok());
        kafka.node_id = "a b".into();
        assert_eq!(kafka.validate().unwrap_err().0, "cluster.node-id");
        kafka.node_id = "n1".into();
        kafka.advertised_ingress = "ftp://x".into();
        assert_eq!(
            kafka.validate().unwrap_err().0,
            "cluster.advertised-ingress"
        );
        kafka.advertised_ingress = String::new();
        for (records, ok) in [(0, false), (1, true), (5, true), (6, false)] {
            kafka.records_in_flight = records;
            assert_eq!(kafka.validate().is_ok(), ok, "{records} records in flight");
        }
        assert_eq!(kafka.validate().unwrap_err().0, "cluster.records-in-flight");
        kafka.records_in_flight = 4;
        for (millis, ok) in [
            (999, false),
            (1000, true),
            (600_000, true),
            (600_001, false),
        ] {
            kafka.write_timeout = FriendlyDuration(std::time::Duration::from_millis(millis));
            assert_eq!(
                kafka.validate().is_ok(),
                ok,
                "a write timeout of {millis} ms"
            );
        }
        assert_eq!(kafka.validate().unwrap_err().0, "cluster.write-timeout");
        kafka.write_timeout = FriendlyDuration::from_secs(30);
        for (secs, ok) in [(0, false), (1, true), (86_400, true), (86_401, false)] {
            kafka.snapshot_interval = FriendlyDuration::from_secs(secs);
            assert_eq!(
                kafka.validate().is_ok(),
                ok,
                "a snapshot interval of {secs} s"
            );
        }
        assert_eq!(kafka.validate().unwrap_err().0, "cluster.snapshot-interval");
        kafka.snapshot_interval = FriendlyDuration::from_secs(600);
        for (every, ok) in [(0, false), (1, true), (1_000, true), (1_001, false)] {
            kafka.snapshot_full_every = every;
            assert_eq!(
                kafka.validate().is_ok(),
                ok,
                "a whole snapshot every {every}"
            );
        }
        assert_eq!(
            kafka.validate().unwrap_err().0,
            "cluster.snapshot-full-every"
        );
        kafka.snapshot_full_every = 10;
        for (standbys, ok) in [(0, true), (64, true), (65, false)] {
            kafka.standbys = standbys;
            assert_eq!(kafka.validate().is_ok(), ok, "{standbys} standbys");
        }
        assert_eq!(kafka.validate().unwrap_err().0, "cluster.standbys");
    }

    #[test]
    fn the_secret_is_long_hidden_and_matched_exactly() {
        assert!("short".parse::<crate::NodeSecret>().is_err());
        assert!(
            "has a space in it, long"
                .parse::<crate::NodeSecret>()
                .is_err()
        );
        let secret: crate::NodeSecret = "0123456789abcdef".parse().unwrap();
        assert!(secret.matches(b"0123456789abcdef"));
        assert!(!secret.matches(b"0123456789abcdeX"));
        assert!(!secret.matches(b"1"));
        assert_eq!(format!("{secret:?}"), "<redacted>");
        let config = ClusterConfig {
            secret: Some(secret),
            ..ClusterConfig::default()
        };
        let dumped = toml::to_string(&config).unwrap();
        assert!(!dumped.contains("0123456789abcdef"), "{dumped}");
    }
}
