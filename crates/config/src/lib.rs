//! Configuration: defaults, then the TOML file, then `SERVICE_…`/`RESTATE_…` environment
//! variables, then command-line flags. Every key is kebab-case; nested keys are tables in the
//! file and `__`-separated in the environment (`SERVICE_WORKER__INVOKER__ABORT_TIMEOUT=30s`).
//! Anything unknown or invalid fails with RT0002 naming the key path and where it came from.

pub mod cluster;
pub mod flow;
pub mod kafka;
mod load;
pub mod plugins;
mod security;
mod values;

use std::net::SocketAddr;
use std::num::{NonZeroU16, NonZeroU32, NonZeroUsize};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use load::{ConfigSource, Overrides, file_error, load, pem_certificates};
pub use security::{
    AdminRole, AuthToken, AuthTokens, ConnectionLimits, DeploymentAddressPolicy, MIN_TOKEN_LENGTH,
    NodeSecret,
};
pub use values::{
    AdvertisedEndpoint, ByteSize, FriendlyDuration, LogFormat, LogLevel, OnMaxAttempts,
};

/// The whole effective configuration of a `sluice serve` process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Directory that holds the redb store (`sluice.redb`).
    pub data_dir: PathBuf,
    /// The name `GET /cluster-health` reports (the reference server's `cluster-name`).
    pub cluster_name: String,
    /// Log filter directive; `RUST_LOG`, when set, wins.
    pub log_level: LogLevel,
    /// `human` or `json`.
    pub log_format: LogFormat,
    /// How long a graceful shutdown waits for in-flight requests before it stops anyway.
    pub shutdown_grace_period: FriendlyDuration,
    /// After a store write fails (STO0001), how long sluice keeps answering 503 on `/health`,
    /// `/ready` and the ingress before it shuts down and exits 74, so probes and load balancers
    /// see the failure.
    pub failure_exit_delay: FriendlyDuration,
    /// A PEM file of CA certificates trusted for `https://` deployments (discovery and
    /// invocations), beside the system's roots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deployment_ca_file: Option<PathBuf>,
    /// Accepted and ignored: protocol V7, flow control and scoped objects are always on (the
    /// reference server removed the switches in 1.8). Set, it is logged once at start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experimental_enable_protocol_v7: Option<bool>,
    /// Accepted and ignored, like `experimental-enable-protocol-v7`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experimental_enable_vqueues: Option<bool>,
    /// Accepted and ignored, like `experimental-enable-protocol-v7`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experimental_enable_scoped_virtual_objects: Option<bool>,
    /// The ingress listener.
    pub ingress: IngressConfig,
    /// The admin listener.
    pub admin: AdminConfig,
    /// Partitions and the invoker.
    pub worker: WorkerConfig,
    /// Node-wide flow-control settings.
    pub flow: flow::FlowConfig,
    /// `GET /metrics` on the admin listener.
    pub metrics: MetricsConfig,
    /// Exporting spans over OTLP.
    pub tracing: TracingConfig,
    /// Most a plugin loaded through the admin API may ask for.
    pub plugin_limits: PluginLimits,
    /// Policy plugins loaded at start-up, in order (`[[plugins]]`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plugins: Vec<plugins::ConfiguredPlugin>,
    /// Several nodes over Kafka (`docs/cluster.md`); embedded by default.
    pub cluster: cluster::ClusterConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("sluice-data"),
            cluster_name: "localcluster".into(),
            log_level: "info".parse().expect("valid default"),
            log_format: LogFormat::Human,
            shutdown_grace_period: FriendlyDuration::from_secs(30),
            failure_exit_delay: FriendlyDuration::from_secs(2),
            deployment_ca_file: None,
            experimental_enable_protocol_v7: None,
            experimental_enable_vqueues: None,
            experimental_enable_scoped_virtual_objects: None,
            ingress: IngressConfig::default(),
            admin: AdminConfig::default(),
            worker: WorkerConfig::default(),
            flow: flow::FlowConfig::default(),
            metrics: MetricsConfig::default(),
            tracing: TracingConfig::default(),
            plugin_limits: PluginLimits::default(),
            plugins: Vec::new(),
            cluster: cluster::ClusterConfig::default(),
        }
    }
}

/// The request body the ingress takes when `ingress.max-body-size` is not set (and nothing
/// smaller bounds it).
pub const DEFAULT_MAX_BODY: u64 = 10 * 1024 * 1024;

/// Room a protocol message needs around its payload (headers, ids, a key), and a record around
/// its values: what [`Config::record_value_limit`] keeps back, and what an explicit
/// `ingress.max-body-size` must leave under the message size limit.
pub const ENVELOPE: u64 = 64 * 1024;

/// How [`Config::record_value_limit`] is derived, as error messages say it.
pub const RECORD_VALUE_RULE: &str = "a quarter of cluster.max-record-bytes less 64 KiB";

impl Config {
    /// The largest value (an input, an output, a state value, a run result) one write of a
    /// partition may hold in cluster mode, where every write set goes into one log record: a
    /// quarter of `cluster.max-record-bytes` less room for the rest, so that an invocation's
    /// completion (its output in the journal and in its record) and whatever shares its write
    /// set fit. `None` in embedded mode, where no record bounds a write.
    pub fn record_value_limit(&self) -> Option<usize> {
        self.cluster.is_kafka().then(|| {
            usize::try_from((self.cluster.max_record_bytes.0 / 4).saturating_sub(ENVELOPE))
                .unwrap_or(usize::MAX)
        })
    }

    /// No input larger than a deployment message can ever be sent: one over it would be
    /// accepted and then never run. (An explicit `ingress.max-body-size` must also leave room
    /// for the message's envelope; the default only never exceeds the message.)
    fn message_value_limit(&self) -> u64 {
        self.worker.invoker.message_size_limit.0
    }

    /// The largest request body the ingress takes (413 `SEC0004` beyond): `ingress.max-body-size`
    /// when set; else 10 MiB, lowered to `worker.invoker.message-size-limit` and (in cluster
    /// mode) to what a log record can carry.
    pub fn ingress_body_limit(&self) -> usize {
        let limit = match self.ingress.max_body_size {
            Some(size) => size.0,
            None => {
                let record = self
                    .record_value_limit()
                    .map_or(u64::MAX, |l| u64::try_from(l).unwrap_or(u64::MAX));
                DEFAULT_MAX_BODY.min(self.message_value_limit()).min(record)
            }
        };
        usize::try_from(limit).unwrap_or(usize::MAX)
    }

    /// The retired switches this configuration sets (to any value): they are accepted so that
    /// configurations written for earlier versions still start, and have no effect.
    pub fn ignored_switches(&self) -> Vec<&'static str> {
        [
            (
                "experimental-enable-protocol-v7",
                self.experimental_enable_protocol_v7,
            ),
            (
                "experimental-enable-vqueues",
                self.experimental_enable_vqueues,
            ),
            (
                "experimental-enable-scoped-virtual-objects",
                self.experimental_enable_scoped_virtual_objects,
            ),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.map(|_| name))
        .collect()
    }

    /// The ingress address clients should use: the configured one, else derived from the bind.
    pub fn ingress_endpoint(&self) -> String {
        match &self.ingress.advertised_endpoint {
            Some(endpoint) => endpoint.to_string(),
            None if self.ingress.tls_cert_file.is_some() => {
                format!("https://{}/", self.ingress.bind)
            }
            None => format!("http://{}/", self.ingress.bind),
        }
    }

    /// The effective configuration as TOML (what `--dump-config` prints).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("the config always serializes")
    }
}

/// Prometheus metrics (`GET /metrics` on the admin listener).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Record metrics and serve `GET /metrics`; off, nothing is recorded and it answers 404.
    pub enabled: bool,
    /// Also export the waiting invocations of the busiest this-many scopes, one series each
    /// (`sluice_flow_scope_held{scope}`); 0, the default, exports none. At most 1000.
    pub top_scopes: u16,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            top_scopes: 0,
        }
    }
}

/// Spans of ingress requests, invocations, queue waits and attempts, exported over OTLP/HTTP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct TracingConfig {
    /// Where to send spans, an OTLP/HTTP traces URL (`http://127.0.0.1:4318/v1/traces`);
    /// unset (the default), no span is recorded and a caller's `traceparent` is passed to the
    /// deployment unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `http/protobuf` (the default) or `http/json`.
    pub protocol: TracingProtocol,
    /// `service.name` of the spans.
    pub service_name: String,
    /// How long finished spans wait before they are sent in one batch.
    pub export_interval: FriendlyDuration,
    /// Most finished spans waiting to be sent; more are dropped (and counted in the logs).
    pub max_queue_size: NonZeroUsize,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            protocol: TracingProtocol::HttpProtobuf,
            service_name: "sluice".into(),
            export_interval: FriendlyDuration::from_secs(1),
            max_queue_size: NonZeroUsize::new(65_536).expect("non-zero"),
        }
    }
}

/// How spans are encoded over OTLP/HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TracingProtocol {
    /// Protobuf, what collectors expect by default.
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// JSON.
    #[serde(rename = "http/json")]
    HttpJson,
}

/// Most `metrics.top-scopes`: a series per scope is what the per-rule series avoid.
pub const MAX_TOP_SCOPES: u16 = 1000;

/// Server-side maxima of what `PUT /plugins/{name}` may set (a plugin loaded over the API
/// cannot take a core for seconds a call or gigabytes of memory), and where plugin calls run:
/// threads of their own behind a bounded queue, never the shards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct PluginLimits {
    /// Longest `deadline`; also what instantiating a plugin may take (its start functions: a
    /// language runtime's set-up), when longer than the plugin's own deadline.
    pub max_deadline: FriendlyDuration,
    /// Largest `memory-limit`.
    pub max_memory: ByteSize,
    /// Largest `.wasm` body `PUT /plugins/{name}` takes (413 beyond). A Rust plugin is tens
    /// of KiB; one that carries a language's runtime (Python through componentize-py) about
    /// 20 MiB.
    pub max_size: ByteSize,
    /// Most `fuel`.
    pub max_fuel: u64,
    /// Threads that run `extract` calls (and refill warm instances): a plugin that loops to
    /// its deadline takes one of these, not a shard.
    pub threads: NonZeroUsize,
    /// Calls that may wait for one of those threads; the next is refused (503 PLG0011).
    pub call_queue: NonZeroUsize,
    /// Failed calls in a row after which a plugin is not called for `breaker-cooldown`: its
    /// `on-error` applies at once (PLG0010 when `fail`). 0 never opens the breaker.
    pub breaker_failures: u32,
    /// How long a plugin's open breaker keeps it from being called.
    pub breaker_cooldown: FriendlyDuration,
}

impl Default for PluginLimits {
    fn default() -> Self {
        Self {
            max_deadline: FriendlyDuration::from_secs(1),
            max_memory: ByteSize::mib(256),
            max_size: ByteSize::mib(64),
            max_fuel: 10_000_000_000,
            threads: NonZeroUsize::new(2).expect("2 is not zero"),
            call_queue: NonZeroUsize::new(1024).expect("1024 is not zero"),
            breaker_failures: 5,
            breaker_cooldown: FriendlyDuration::from_secs(10),
        }
    }
}

/// The ingress listener (pingora).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct IngressConfig {
    /// Address to listen on.
    pub bind: SocketAddr,
    /// Address reported as `ingress_endpoint` by `GET /version`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertised_endpoint: Option<AdvertisedEndpoint>,
    /// Shards: threads that each serve the ingress connections they accept, the partitions
    /// they own (partition `p` on shard `p % threads`) and those partitions' deployment
    /// connections (default: one per core; `ARCHITECTURE.md`, "Shards").
    pub threads: NonZeroUsize,
    /// Kafka clusters subscriptions may consume from (`[[ingress.kafka-clusters]]`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kafka_clusters: Vec<kafka::ConfiguredCluster>,
    /// Bounds on the listener's connections.
    pub connections: ConnectionLimits,
    /// Longest `idempotency-key` header accepted (SEC0004 beyond).
    pub idempotency_key_max_length: usize,
    /// Largest body of an awakeable's resolve or reject (SEC0004 beyond).
    pub awakeable_payload_limit: ByteSize,
    /// Awakeable completions one invocation accepts from outside in its life (AWK0001 beyond),
    /// which bounds how much a client can grow one journal.
    pub max_awakeable_completions: u32,
    /// Bytes of awakeable completions one invocation accepts from outside in its life, in all
    /// (AWK0001 beyond): with the count above, what a client forging completions can add to one
    /// journal.
    pub max_awakeable_completion_bytes: ByteSize,
    /// Largest request body of a call or send (413 `SEC0004` beyond). Unset: 10 MiB, lowered
    /// to what a deployment message and, in cluster mode, a log record can carry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_size: Option<ByteSize>,
    /// Longest an attach (`/attach`, a workflow's `/attach`) waits for an invocation to
    /// complete; then it is answered 470 as `/output` is, and the client may attach again.
    pub attach_max_wait: FriendlyDuration,
    /// Most targets one `POST /service/status` list may ask about (400 beyond).
    pub max_status_targets: usize,
    /// Largest body of a `POST …/status`, `…/attach`, `…/output` or `…/lookup` (a target, or a
    /// list of them): read no further before it is parsed (SEC0004 beyond).
    pub target_body_limit: ByteSize,
    /// A PEM certificate chain: with `tls-key-file`, the ingress speaks TLS only (HTTP/2 or
    /// HTTP/1.1 by ALPN). Read again on SIGHUP and when the file changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<PathBuf>,
    /// The certificate's PEM private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// API keys that bind a caller to a scope and a highest priority (`[[ingress.api-keys]]`):
    /// a call that presents one in `x-sluice-api-key` runs in its scope, whatever it asked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub api_keys: Vec<ApiKey>,
    /// Calls and sends without a known API key are refused (401 `SEC0009`).
    pub require_api_key: bool,
}

/// One API key of `[[ingress.api-keys]]`: the key itself is never configured, only its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ApiKey {
    /// SHA-256 of the key, 64 hex digits (`printf %s "$KEY" | sha256sum`).
    pub sha256: String,
    /// The flow-control scope every call made with the key runs in.
    pub scope: String,
    /// The highest priority a call made with the key may ask for (`0`..`9`, `low`, `normal`,
    /// `high`); `normal` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_priority: Option<String>,
    /// The first level of the limit key every call made with the key runs under: a key the
    /// call names becomes its second level (`acme` + `x` is `acme/x`), and a two-level key
    /// must start with it. Unset, the call names its limit key freely.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_key: Option<String>,
}

impl Default for IngressConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            advertised_endpoint: None,
            threads: std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN),
            kafka_clusters: Vec::new(),
            connections: ConnectionLimits::with_max(10_000),
            idempotency_key_max_length: 256,
            awakeable_payload_limit: ByteSize::mib(1),
            max_awakeable_completions: 1_000,
            max_awakeable_completion_bytes: ByteSize::mib(16),
            attach_max_wait: FriendlyDuration::from_secs(5 * 60),
            max_status_targets: 100,
            target_body_limit: ByteSize::kib(256),
            tls_cert_file: None,
            tls_key_file: None,
            max_body_size: None,
            api_keys: Vec::new(),
            require_api_key: false,
        }
    }
}

/// The admin listener (axum).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Address to listen on.
    pub bind: SocketAddr,
    /// Longest a `POST /query` may run.
    pub query_timeout: FriendlyDuration,
    /// Most rows a `POST /query` may answer.
    pub query_row_limit: usize,
    /// Longest SQL text `POST /query` accepts.
    pub query_max_length: ByteSize,
    /// Most operators and opening parentheses one query may have (bounds expression depth).
    pub query_max_operators: usize,
    /// Memory one query may use: joins, sorts and aggregations, string functions' results and
    /// the answer.
    pub query_memory_limit: ByteSize,
    /// Largest one value a function of a query may build (a longer one fails the query before
    /// another function sees it).
    pub query_max_value_size: ByteSize,
    /// Queries that may run at once, each on a thread of its own; one past its timeout is
    /// abandoned at once and gives its place back when it stops.
    pub query_concurrency: usize,
    /// Bearer tokens with their roles (`role:token`, role `read` or `admin`). With none, the
    /// admin listener must be on loopback.
    pub auth_tokens: AuthTokens,
    /// A file of more tokens, one `role:token` a line (`#` comments), read at start-up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_tokens_file: Option<std::path::PathBuf>,
    /// Serve the admin API without tokens on a non-loopback address (a warning at start-up).
    pub allow_unauthenticated: bool,
    /// Host names (beside IP addresses and `localhost`) the admin listener answers to.
    pub allowed_hosts: Vec<String>,
    /// Which addresses deployments may be registered on.
    pub deployment_address_policy: DeploymentAddressPolicy,
    /// Bounds on the listener's connections.
    pub connections: ConnectionLimits,
    /// A PEM certificate chain: with `tls-key-file`, the admin listener serves HTTPS only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// The PEM private key of `tls-cert-file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<std::path::PathBuf>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 9070)),
            query_timeout: FriendlyDuration::from_secs(10),
            query_row_limit: 100_000,
            query_max_length: ByteSize::kib(64),
            query_max_operators: 256,
            query_memory_limit: ByteSize::mib(128),
            query_max_value_size: ByteSize::mib(16),
            query_concurrency: 4,
            auth_tokens: AuthTokens::default(),
            auth_tokens_file: None,
            allow_unauthenticated: false,
            allowed_hosts: Vec::new(),
            deployment_address_policy: DeploymentAddressPolicy::default(),
            connections: ConnectionLimits::with_max(256),
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

/// The worker: partitions and the invoker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Partitions of this process; invocations are spread over them by key.
    pub partitions: NonZeroU16,
    /// How attempts against deployments run.
    pub invoker: InvokerConfig,
    /// How long a completed invocation (its record and outcome) stays in the store, when no
    /// idempotency key or workflow keeps it longer; `0s` purges it at completion.
    pub completion_retention: FriendlyDuration,
    /// Longest journal retention a service or handler may ask for (`journal_retention`); longer
    /// ones are lowered to it and reported as RT0022 on the service.
    pub max_journal_retention: FriendlyDuration,
    /// How often the purger looks for completed invocations and journals whose time is up.
    pub purge_interval: FriendlyDuration,
    /// Most due purges one look at the store reads; a backlog is worked off a batch at a time.
    pub purge_batch_size: NonZeroU32,
    /// Invocations a bulk cancel looks at per partition command
    /// (`POST /invocations/bulk-cancel`): the partition serves other work between two.
    pub bulk_cancel_batch: NonZeroU32,
    /// Most purges of one partition in flight at once (written together, not yet stored): a
    /// retention sweep of a million goes in small writes that interleave with calls instead of
    /// queueing them behind it. The reference's `cleanup-max-in-flight-purges` is read too.
    #[serde(alias = "cleanup-max-in-flight-purges")]
    pub cleanup_max_in_flight: NonZeroU32,
    /// Bytes of held (queued) invocations' inputs kept in memory, across partitions; past it
    /// inputs wait in the store only and are read back when their turn comes. Delayed sends
    /// never keep theirs in memory.
    pub held_memory_budget: ByteSize,
    /// Bytes one invocation's journal may hold; an attempt whose message would go past it
    /// fails (JNL0001) and is retried under the retry policy.
    pub max_journal_bytes: ByteSize,
    /// Entries one invocation's journal may hold; past it, as `max-journal-bytes`.
    pub max_journal_entries: u32,
    /// Bytes all running attempts may add to their journals in memory at once, across
    /// partitions; an attempt whose message does not fit fails (JNL0001, retried) and gives its
    /// share back, so a few huge journals cannot take the node's memory.
    pub running_journals_budget: ByteSize,
    /// Invocations held (queued or delayed, at rest) in all; new ones are refused with 429
    /// FLO0001 beyond.
    pub max_held_invocations: usize,
    /// Invocations held in one flow-control scope; new ones in it are refused with 429 FLO0001
    /// beyond.
    pub max_held_per_scope: usize,
    /// Requests (calls, attaches) waiting at once for one invocation's outcome; one more is
    /// refused with 429 SEC0008. Waits whose client left are pruned first.
    pub max_waiters_per_invocation: usize,
    /// Embedded mode: bytes a segment of the local log (`<data-dir>/log/`) is preallocated to.
    pub log_segment_size: ByteSize,
    /// Embedded mode: longest time the store (the view of the local log) goes without being
    /// made durable; also every eight segments of log. What the log holds beyond it is
    /// replayed at start.
    pub log_checkpoint_interval: FriendlyDuration,
    /// Embedded mode: how long the store's applier gathers answered writes before applying
    /// them to the store in one transaction (0: at once). No answer and no read waits for it.
    pub log_apply_delay: FriendlyDuration,
    /// Embedded mode: start even when the local log is damaged before its end (STO0003),
    /// dropping every record from the damage on. Off: such a log refuses to start.
    pub truncate_damaged_log: bool,
}

/// Smallest and largest `worker.log-segment-size`.
pub const LOG_SEGMENT_SIZES: (u64, u64) = (64 * 1024, 1024 * 1024 * 1024);

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            partitions: NonZeroU16::new(8).expect("non-zero"),
            invoker: InvokerConfig::default(),
            completion_retention: FriendlyDuration::from_secs(24 * 60 * 60),
            max_journal_retention: FriendlyDuration::from_secs(30 * 24 * 60 * 60),
            purge_interval: FriendlyDuration::from_secs(1),
            purge_batch_size: NonZeroU32::new(1000).expect("non-zero"),
            bulk_cancel_batch: NonZeroU32::new(500).expect("non-zero"),
            cleanup_max_in_flight: NonZeroU32::new(32).expect("non-zero"),
            held_memory_budget: ByteSize::mib(64),
            max_journal_bytes: ByteSize::mib(256),
            max_journal_entries: 100_000,
            running_journals_budget: ByteSize::mib(1024),
            max_held_invocations: 1_000_000,
            max_held_per_scope: 100_000,
            max_waiters_per_invocation: 1_000,
            log_segment_size: ByteSize::mib(8),
            log_checkpoint_interval: FriendlyDuration::from_millis(100),
            log_apply_delay: FriendlyDuration::from_millis(2),
            truncate_damaged_log: false,
        }
    }
}

/// How the invoker runs attempts against deployments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct InvokerConfig {
    /// Largest protocol message accepted from or sent to a deployment (RT0003 beyond).
    pub message_size_limit: ByteSize,
    /// An attempt that hears nothing from its deployment for this long is aborted (RT0001).
    pub abort_timeout: FriendlyDuration,
    /// A bidi attempt idle this long is suspended.
    pub inactivity_timeout: FriendlyDuration,
    /// A connection to a deployment no attempt used for this long is closed before the next
    /// attempt opens a fresh one (a load balancer may drop idle connections silently).
    pub connection_idle_timeout: FriendlyDuration,
    /// State of a keyed target sent with the Start message, in key and value bytes; the SDK
    /// reads the rest lazily. Unset: half the message size limit (the Start message must fit
    /// under it); 0: all state is read lazily.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eager_state_size_limit: Option<ByteSize>,
    /// Attempts running at once across all partitions.
    pub concurrent_invocations_limit: NonZeroU32,
    /// Retries of failed attempts.
    pub retry_policy: RetryPolicy,
    /// How a deployment's backlog is released after it failed (connection errors, 5xx,
    /// 429/503).
    pub drain: DrainConfig,
}

/// Paced drains after an outage (`worker.invoker.drain`): an AIMD window on the attempts a
/// deployment runs at once, per node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct DrainConfig {
    /// Pace at all; off, every retry of a backlog goes out as soon as its back-off ends.
    pub enabled: bool,
    /// The window after an outage, and the smallest a halving leaves.
    pub initial_window: NonZeroU32,
    /// The window at which the deployment is trusted again and pacing ends.
    pub open_window: NonZeroU32,
    /// Longest `Retry-After` of a 429/503 that holds the whole deployment's new attempts.
    pub max_closed: FriendlyDuration,
    /// While a deployment stays unreachable, its next round of probes waits 100 ms, then
    /// twice as long each round, at most this long.
    pub max_probe_interval: FriendlyDuration,
}

impl Default for DrainConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            initial_window: NonZeroU32::new(2).expect("non-zero"),
            open_window: NonZeroU32::new(64).expect("non-zero"),
            max_closed: FriendlyDuration::from_secs(60),
            max_probe_interval: FriendlyDuration::from_secs(2),
        }
    }
}

impl Default for InvokerConfig {
    fn default() -> Self {
        Self {
            message_size_limit: ByteSize::mib(32),
            abort_timeout: FriendlyDuration::from_secs(600),
            inactivity_timeout: FriendlyDuration::from_secs(60),
            connection_idle_timeout: FriendlyDuration::from_secs(90),
            eager_state_size_limit: None,
            concurrent_invocations_limit: NonZeroU32::new(1000).expect("non-zero"),
            retry_policy: RetryPolicy::default(),
            drain: DrainConfig::default(),
        }
    }
}

/// Exponential back-off between attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Delay before the first retry.
    pub initial_interval: FriendlyDuration,
    /// Growth of the delay per attempt.
    pub exponentiation_factor: f64,
    /// Longest delay between attempts.
    pub max_interval: FriendlyDuration,
    /// Attempts before `on-max-attempts` applies.
    pub max_attempts: NonZeroU32,
    /// `pause` or `kill`.
    pub on_max_attempts: OnMaxAttempts,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial_interval: FriendlyDuration::from_millis(500),
            exponentiation_factor: 2.0,
            max_interval: FriendlyDuration::from_secs(60),
            max_attempts: NonZeroU32::new(70).expect("non-zero"),
            on_max_attempts: OnMaxAttempts::Pause,
        }
    }
}
