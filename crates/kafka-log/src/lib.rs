//! Cluster mode on Kafka (`docs/cluster.md`): each partition's Kafka log is the truth and this
//! node's store a view of it; a partition of the log topic is the store's `PartitionLog`
//! (`leader.rs`'s `KafkaLog`). [`Cluster::join`] checks the topics; [`Cluster::run`] runs the replica
//! reader (`reader.rs`), the membership consumer (`membership.rs`) and, for each partition the
//! group gives this node, a takeover and then the partition's log writer (`leader.rs`).

mod assignment;
mod epochs;
mod group;
mod inbox;
mod leader;
mod link;
mod membership;
mod meta;
mod meta_chunks;
mod reader;
mod snapshots;
mod topics;
mod wire;

use topics::batch_size;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::FutureProducer;
use tokio::sync::watch;

use sluice_config::Config;
use sluice_core::errors::{Code, CodedError};
use sluice_runtime::partition::Lead;
use sluice_runtime::partition::Runtime;
use sluice_runtime::partition::placement::Placement;
use sluice_runtime::replication::replica::Replica;
use sluice_store::storage::Store;
use sluice_store::storage::fencing::Position;
use sluice_store::storage::writer::Writer;

/// How long joining waits for the brokers' metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// What every part of the cluster machinery shares.
struct Shared {
    settings: Settings,
    store: Arc<Store>,
    /// The store's writer: replicas and leaders store through it.
    writer: Writer,
    producer: FutureProducer,
    /// Deletes what the inbox, log and snapshot topics no longer need ([`delete_before`]).
    admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>,
    /// Per partition: what this node knows of its log, and whether it leads it.
    partitions: Vec<Mutex<Replica>>,
    /// The epochs reader read the topic to its end once: every partition's leader is known as
    /// far as the cluster announced it, and leaders may be planned (`membership.rs`).
    epochs_read: std::sync::atomic::AtomicBool,
    /// Signalled whenever the reader stored progress.
    progress: tokio::sync::Notify,
    /// Held from building a set of positions to handing it to the writer, and while a takeover
    /// turns a partition led: a position the reader saved before cannot land after the
    /// leader's first write.
    hand_over: Mutex<()>,
    /// Partitions whose leader stopped: the reader reads them again from the store's position.
    rewinds: Mutex<Vec<u32>>,
    /// The writer of each partition's log while led here (what the runtime's partitions watch).
    leads: Vec<watch::Sender<Option<Writer>>>,
    /// Where each partition runs, for the doors (forwarding).
    placement: Arc<Placement>,
    /// Reloads what memory keeps of the metadata tables named (after another node's change).
    on_meta: std::sync::OnceLock<MetaReload>,
    /// The partitions, which the inboxes deliver to.
    runtime: Runtime,
    /// Events posted to an inbox that Kafka has not taken yet, tried again until it does.
    posts_retrying: Arc<std::sync::atomic::AtomicU64>,
    /// The partitions this node keeps in its store (`None`: every one, until the membership
    /// knows; `assignment.rs`).
    held: watch::Sender<Option<BTreeSet<u32>>>,
    /// Which broker leads each partition of the log, for the leaders' own links (`link.rs`):
    /// asked of the brokers when first needed and again after a link's error.
    routes: Mutex<Option<Arc<Vec<Option<String>>>>>,
    /// The node is stopping: it leaves the group so the others take its partitions over while
    /// it still answers (and forwards) requests ([`Cluster::hand_on`]).
    leaving: std::sync::atomic::AtomicBool,
}

/// Reloads what memory keeps of the metadata tables named.
pub type MetaReload = Box<dyn Fn(&[&str]) + Send + Sync>;

/// The cluster settings a node runs with.
#[derive(Debug, Clone)]
struct Settings {
    node: String,
    ingress: String,
    admin: String,
    log_topic: String,
    leaders_topic: String,
    /// Each partition's newest leader, announced by the winner of its takeover (`epochs.rs`).
    epochs_topic: String,
    meta_topic: String,
    inbox_topic: String,
    /// Each partition's snapshots (`snapshots.rs`).
    snapshot_topic: String,
    partitions: u32,
    max_record: usize,
    records_in_flight: usize,
    /// Whether the shards send their leaders' records themselves (`link.rs`): asked for by
    /// `cluster.log-producer = "shard"`, and only over plaintext connections.
    shard_links: bool,
    client: ClientConfig,
    session_timeout: Duration,
    /// `cluster.write-timeout`: how long the producer tries to store a record.
    write_timeout: Duration,
    /// `cluster.snapshot-interval`: how often a leader snapshots its partitions.
    snapshot_interval: Duration,
    /// `cluster.snapshot-full-every`: every how many snapshots one is whole.
    snapshot_full_every: u32,
    /// `cluster.snapshot-changes-max`: most bytes of changed keys noted between snapshots.
    snapshot_changes_max: usize,
    /// `cluster.allow-unconfirmed-retention`.
    allow_unconfirmed_retention: bool,
    /// `cluster.standbys`: nodes beside the leader that keep each partition.
    standbys: usize,
}

/// A node's membership in a cluster, before it runs.
pub struct Cluster {
    shared: Arc<Shared>,
    leads: Vec<Lead>,
}

impl Cluster {
    /// Joins the cluster `config` names: checks the topics (creating them where the brokers
    /// allow) and reads this node's positions from `store`.
    pub fn join(
        config: &Config,
        store: &Arc<Store>,
        runtime: &Runtime,
    ) -> Result<Self, CodedError> {
        let placement = Arc::clone(runtime.placement());
        let settings = Settings::from_config(config);
        let partitions = settings.partitions;
        settings.check_topics(config.cluster.replication_factor)?;
        let producer = settings.producer()?;
        let admin = settings
            .client
            .create()
            .map_err(|e| join_failed(format!("cannot create an admin client: {e}")))?;
        let positions = store.with_db(Position::load_all)??;
        for (p, position) in &positions {
            if position.leader.epoch > 0 {
                placement.set_leader(
                    *p as usize,
                    position.leader.ingress.clone(),
                    position.leader.admin.clone(),
                );
            }
        }
        let states = (0..partitions)
            .map(|p| Mutex::new(Replica::at(positions.get(&p).cloned().unwrap_or_default())))
            .collect();
        let (senders, leads) = (0..partitions).map(|_| watch::channel(None)).unzip();
        let shared = Arc::new(Shared {
            settings,
            store: Arc::clone(store),
            writer: Writer::start_view(
                Arc::clone(store),
                sluice_runtime::partition::checkpoints(config),
            ),
            producer,
            admin,
            partitions: states,
            progress: tokio::sync::Notify::new(),
            hand_over: Mutex::new(()),
            rewinds: Mutex::new(Vec::new()),
            leads: senders,
            placement,
            on_meta: std::sync::OnceLock::new(),
            runtime: runtime.clone(),
            posts_retrying: Arc::default(),
            held: watch::channel(None).0,
            routes: Mutex::new(None),
            epochs_read: std::sync::atomic::AtomicBool::new(false),
            leaving: std::sync::atomic::AtomicBool::new(false),
        });
        runtime.set_outbox(Arc::new(inbox::KafkaOutbox::new(&shared)));
        store.set_meta_log(Arc::new(meta::KafkaMetaLog::new(&shared.settings)?));
        tracing::info!(node = %shared.settings.node, partitions, topic = %shared.settings.log_topic, "joined the cluster");
        Ok(Self { shared, leads })
    }

    /// What the runtime's partitions watch: partition `i` runs while `leads[i]` holds a writer.
    pub fn leads(&self) -> Vec<Lead> {
        self.leads.clone()
    }

    /// Before this node stops (SIGTERM): it leaves the group, so the other nodes take its
    /// partitions over at once instead of after a rebalance that finds it gone, and waits, at
    /// most `within`, until every partition it led is led elsewhere as far as this node knows.
    /// Meanwhile it goes on answering: a request for a partition that moved is forwarded to
    /// its new leader rather than refused by a node that already left.
    pub async fn hand_on(&self, within: Duration) {
        let shared = &self.shared;
        let me = shared.settings.node.clone();
        let led: Vec<u32> = (0..shared.settings.partitions)
            .filter(|p| lock(&shared.partitions[*p as usize]).leads())
            .collect();
        shared
            .leaving
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if led.is_empty() {
            return;
        }
        tracing::info!(partitions = ?led, "stopping: handing this node's partitions on before draining");
        let started = tokio::time::Instant::now();
        let handed_on = || {
            led.iter().all(|p| {
                let state = lock(&shared.partitions[*p as usize]);
                let leader = state.leader();
                !state.leads() && leader.epoch > 0 && leader.node != me
            })
        };
        while !handed_on() {
            if started.elapsed() >= within {
                tracing::warn!(waited = ?within, "stopping: not every partition was taken over by another node; draining anyway");
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tracing::info!(took = ?started.elapsed(), "stopping: every partition this node led is led elsewhere");
    }

    /// Calls `reload` with the metadata tables each change from the cluster touched.
    pub fn on_meta(&self, reload: MetaReload) {
        let _ = self.shared.on_meta.set(reload);
    }

    /// Runs the reader, the membership and the takeovers until `stopping` turns true.
    pub async fn run(&self, mut stopping: watch::Receiver<bool>) {
        let shared = Arc::clone(&self.shared);
        let (stop_reader, reader_stopping) = watch::channel(false);
        let reader = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("sluice-log-reader".into())
                .spawn(move || reader::run(&shared, &reader_stopping))
        };
        let (desired_tx, desired) = watch::channel(BTreeSet::new());
        let membership = {
            let shared = Arc::clone(&shared);
            let stopping = stopping.clone();
            std::thread::Builder::new()
                .name("sluice-membership".into())
                .spawn(move || {
                    if shared.settings.brokers_checked(shared.store.health()) {
                        membership::run(
                            &shared.settings,
                            &|| shared.leaders(),
                            &desired_tx,
                            &shared.held,
                            &stopping,
                            &shared.leaving,
                        );
                    }
                })
        };
        let (stop_meta, meta_stopping) = watch::channel(false);
        let meta = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("sluice-meta-reader".into())
                .spawn(move || meta::read(&shared, &meta_stopping))
        };
        let epochs = {
            let shared = Arc::clone(&shared);
            let stopping = stop_meta.subscribe();
            std::thread::Builder::new()
                .name("sluice-epochs-reader".into())
                .spawn(move || epochs::follow(&shared, &stopping))
        };
        if reader.is_err() || membership.is_err() || meta.is_err() || epochs.is_err() {
            shared
                .store
                .health()
                .fail(join_failed("cannot start the cluster's threads"));
            return;
        }
        tokio::select! {
            () = leader::reconcile(Arc::clone(&shared), desired) => {}
            _ = stopping.wait_for(|down| *down) => {}
        }
        let _ = stop_reader.send(true);
        let _ = stop_meta.send(true);
    }
}

impl sluice_api::version::ClusterReport for Cluster {
    /// This node's view of the cluster (`GET /cluster-health`).
    fn view(&self) -> sluice_api::version::ClusterView {
        use sluice_api::version::{ClusterView, PartitionView};
        let shared = &self.shared;
        let mut nodes = std::collections::BTreeSet::from([shared.settings.node.clone()]);
        let partitions = (0..shared.settings.partitions)
            .map(|p| {
                let state = lock(&shared.partitions[p as usize]);
                let leader = state.leader();
                if leader.epoch > 0 {
                    nodes.insert(leader.node.clone());
                }
                PartitionView {
                    partition: p,
                    leader: (leader.epoch > 0).then(|| leader.node.clone()),
                    epoch: leader.epoch,
                    led_here: state.leads(),
                    held_here: state.held(),
                    stored_offset: state.stored(),
                    read_offset: state.read_next(),
                    log_end: state.end(),
                    lag: state.lag(),
                    broken: state.broken().map(ToString::to_string),
                }
            })
            .collect();
        ClusterView {
            node: shared.settings.node.clone(),
            nodes: nodes.into_iter().collect(),
            partitions,
            posts_retrying: shared
                .posts_retrying
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Why this node stopped following a partition, for the first such partition (what
    /// `/health` answers), with how many there are.
    fn broken(&self) -> Option<(CodedError, usize)> {
        let mut found = None;
        let mut count = 0;
        for slot in &self.shared.partitions {
            if let Some(why) = lock(slot).broken() {
                count += 1;
                found.get_or_insert_with(|| why.clone());
            }
        }
        found.map(|why| (why, count))
    }
}

impl Shared {
    /// Each partition's newest known leader (its node id), once the epochs topic was read to
    /// its end; `None` before (a node that just started would take every partition for
    /// leaderless).
    fn leaders(&self) -> Option<Vec<Option<String>>> {
        if !self.epochs_read.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let leaders = self.partitions.iter().map(|slot| {
            let replica = lock(slot);
            let leader = replica.leader();
            (leader.epoch > 0).then(|| leader.node.clone())
        });
        Some(leaders.collect())
    }
}

impl Settings {
    /// The settings `config` names; the node id defaults to the host's name.
    fn from_config(config: &Config) -> Self {
        let cluster = &config.cluster;
        let partitions = u32::from(config.worker.partitions.get());
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|name| name.trim().to_owned())
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| "localhost".into());
        let node = if cluster.node_id.is_empty() {
            host.clone()
        } else {
            cluster.node_id.clone()
        };
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", &cluster.bootstrap_servers);
        for (key, value) in &cluster.properties {
            client.set(key, value);
        }
        let ingress = match (
            cluster.advertised_ingress.is_empty(),
            &config.ingress.advertised_endpoint,
        ) {
            (false, _) => cluster.advertised_ingress.clone(),
            (true, Some(endpoint)) => endpoint.to_string(),
            (true, None) => advertised("http", config.ingress.bind, &host),
        };
        let admin = if cluster.advertised_admin.is_empty() {
            let tls = config.admin.tls_cert_file.is_some();
            advertised(if tls { "https" } else { "http" }, config.admin.bind, &host)
        } else {
            cluster.advertised_admin.clone()
        };
        Settings {
            ingress,
            admin,
            node,
            log_topic: format!("{}log", cluster.topic_prefix),
            leaders_topic: format!("{}leaders", cluster.topic_prefix),
            epochs_topic: format!("{}epochs", cluster.topic_prefix),
            meta_topic: format!("{}meta", cluster.topic_prefix),
            inbox_topic: format!("{}inbox", cluster.topic_prefix),
            snapshot_topic: format!("{}snapshots", cluster.topic_prefix),
            partitions,
            max_record: cluster.max_record_bytes.as_usize(),
            records_in_flight: cluster.records_in_flight as usize,
            shard_links: cluster.log_producer == sluice_config::cluster::LogProducer::Shard
                && plaintext(&cluster.properties),
            client,
            session_timeout: cluster.session_timeout.0,
            write_timeout: cluster.write_timeout.0,
            snapshot_interval: cluster.snapshot_interval.0,
            snapshot_full_every: cluster.snapshot_full_every,
            snapshot_changes_max: cluster.snapshot_changes_max.as_usize(),
            allow_unconfirmed_retention: cluster.allow_unconfirmed_retention,
            standbys: usize::from(cluster.standbys),
        }
    }

    /// The log's producer: idempotent, every replica acknowledging, records up to
    /// `max_record`, tried for `write_timeout`.
    fn producer(&self) -> Result<FutureProducer, CodedError> {
        self.client
            .clone()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0")
            .set(
                "message.timeout.ms",
                self.write_timeout.as_millis().to_string(),
            )
            .set("message.max.bytes", self.max_record.to_string())
            .set("batch.size", batch_size(self.max_record))
            .create()
            .map_err(|e| join_failed(format!("cannot create the log producer: {e}")))
    }

    /// A consumer that reads `topic` by assignment (no group membership; `group` names it
    /// and keeps the offsets it commits), records of up to `max-record-bytes`; a partition
    /// without a committed offset is read from its start.
    ///
    /// A fetch that finds nothing waits at the broker up to 100 ms, which the broker cuts short
    /// as soon as a record arrives: a record is read as soon as it lands whatever the wait. The
    /// wait bounds only how long a partition just assigned, resumed or sought waits for the
    /// fetch in flight to that broker. At 10 ms the idle fetches alone were most of what a
    /// node took in from the brokers (about 37 KB/s a node in the six-node test, against
    /// its share of the log) and woke the client's threads a hundred times a second per broker.
    fn reader(&self, topic: &str, group: &str) -> Result<BaseConsumer, CodedError> {
        self.reader_with(topic, group, "100")
    }

    /// [`Settings::reader`] whose fetches wait at most `fetch_wait_ms` at a broker with nothing
    /// to give.
    fn reader_with(
        &self,
        topic: &str,
        group: &str,
        fetch_wait_ms: &str,
    ) -> Result<BaseConsumer, CodedError> {
        let fetch = self.max_record.saturating_mul(2).max(1 << 20);
        self.client
            .clone()
            .set("group.id", group)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("fetch.wait.max.ms", fetch_wait_ms)
            .set("message.max.bytes", self.max_record.to_string())
            .set("fetch.max.bytes", fetch.to_string())
            // Per partition too: its default (1 MiB) is below one record (a group of write
            // sets goes up to half of max-record-bytes), and a broker that does not hand out an
            // oversized first record anyway leaves the replica stuck behind it.
            .set("max.partition.fetch.bytes", fetch.to_string())
            .set(
                "receive.message.max.bytes",
                fetch.saturating_add(1024).to_string(),
            )
            .create()
            .map_err(|e| join_failed(format!("cannot create a reader of {topic}: {e}")))
    }

    /// Whether `topic` keeps only the newest record of each key: the meta topic (one per table
    /// group) and the epochs topic (one per partition).
    fn compacted(&self, topic: &str) -> bool {
        topic == self.meta_topic || topic == self.epochs_topic
    }

    /// The group a replica reader of `topic` on this node is named by (it commits nothing).
    fn replica_group(&self, topic: &str) -> String {
        format!("{topic}-replica-{}", self.node)
    }
}

/// The URL other nodes reach a listener bound to `bind` at: a wildcard address (0.0.0.0, ::)
/// names no host, so this machine's host name stands in for it.
fn advertised(scheme: &str, bind: std::net::SocketAddr, host: &str) -> String {
    let port = bind.port();
    match bind.ip() {
        ip if ip.is_unspecified() => format!("{scheme}://{host}:{port}/"),
        std::net::IpAddr::V6(ip) => format!("{scheme}://[{ip}]:{port}/"),
        std::net::IpAddr::V4(ip) => format!("{scheme}://{ip}:{port}/"),
    }
}

/// Whether the cluster's connections, as `properties` set them, are plaintext: what a leader's
/// own link to a broker speaks (`link.rs`). TLS and SASL stay with librdkafka.
fn plaintext(properties: &std::collections::BTreeMap<String, String>) -> bool {
    properties.iter().all(|(key, value)| {
        let key = key.to_ascii_lowercase();
        if key == "security.protocol" {
            return value.eq_ignore_ascii_case("plaintext");
        }
        !(key.starts_with("ssl.") || key.starts_with("sasl."))
    })
}

/// Deletes partition `p` of `topic` before `offset` (DeleteRecords): what the node no longer
/// needs of it. Why not, when the brokers refused.
async fn delete_before(shared: &Shared, topic: &str, p: u32, offset: i64) -> Result<(), String> {
    let mut before = rdkafka::TopicPartitionList::new();
    before
        .add_partition_offset(topic, p as i32, rdkafka::Offset::Offset(offset))
        .map_err(|e| e.to_string())?;
    let options = rdkafka::admin::AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
    let result = shared
        .admin
        .delete_records(&before, &options)
        .await
        .map_err(|e| e.to_string())?;
    result
        .elements()
        .iter()
        .find_map(|e| e.error().err().map(|e| e.to_string()))
        .map_or(Ok(()), Err)
}

fn join_failed(message: impl Into<String>) -> CodedError {
    CodedError::new(Code::CLU0002, message)
}

/// Where a reader starts in a partition whose next record to read is at `next` (0: nothing read).
fn from_offset(next: i64) -> rdkafka::Offset {
    if next <= 0 {
        rdkafka::Offset::Beginning
    } else {
        rdkafka::Offset::Offset(next)
    }
}

/// Locks `mutex`, through a poisoned lock (a panicked holder left valid data behind: every
/// update of a partition state is one assignment).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.shared.settings.node)
            .field("partitions", &self.shared.settings.partitions)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_plaintext_properties_leave_the_log_to_the_shards_links() {
        use super::plaintext;
        let of = |pairs: &[(&str, &str)]| {
            plaintext(
                &pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        assert!(of(&[]));
        assert!(of(&[("socket.timeout.ms", "5000")]));
        assert!(of(&[("security.protocol", "PLAINTEXT")]));
        assert!(!of(&[("security.protocol", "SSL")]));
        assert!(!of(&[("security.protocol", "sasl_plaintext")]));
        assert!(!of(&[("sasl.mechanism", "PLAIN")]));
        assert!(!of(&[("SSL.CA.LOCATION", "/ca.pem")]));
    }

    #[test]
    fn wildcard_binds_advertise_the_node_and_tls_its_scheme() {
        use super::advertised;
        let bind = |text: &str| text.parse().unwrap();
        assert_eq!(
            advertised("http", bind("0.0.0.0:8080"), "n1"),
            "http://n1:8080/"
        );
        assert_eq!(
            advertised("https", bind("[::]:9070"), "n1"),
            "https://n1:9070/"
        );
        assert_eq!(
            advertised("http", bind("10.0.0.7:8080"), "n1"),
            "http://10.0.0.7:8080/"
        );
        assert_eq!(
            advertised("http", bind("[fd00::1]:8080"), "n1"),
            "http://[fd00::1]:8080/"
        );
    }
}
