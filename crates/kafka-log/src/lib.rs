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
mod membership;
mod meta;
mod meta_chunks;
mod reader;
mod snapshots;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
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

    /// Creates the topics if they are missing (where the brokers allow it), then checks that
    /// both have exactly the node's partition count.
    fn check_topics(&self, replication: u16) -> Result<(), CodedError> {
        let consumer: BaseConsumer = self
            .client
            .create()
            .map_err(|e| join_failed(format!("cannot create a client: {e}")))?;
        for (topic, want) in [
            (&self.log_topic, self.partitions),
            (&self.leaders_topic, self.partitions),
            (&self.inbox_topic, self.partitions),
            (&self.meta_topic, 1),
            (&self.epochs_topic, 1),
            (&self.snapshot_topic, self.partitions),
        ] {
            let count = topic_partitions(&consumer, topic)?;
            let count = match count {
                Some(count) => count,
                None => {
                    self.create_topic(topic, want, replication, self.compacted(topic))?;
                    created_partitions(&consumer, topic)?
                }
            };
            if count != want {
                let why = if want == 1 {
                    "the meta and epochs topics have exactly one".to_owned()
                } else {
                    format!(
                        "worker.partitions is {want}: every node of a cluster runs with the partition count the cluster was created with"
                    )
                };
                return Err(CodedError::new(
                    Code::CLU0002,
                    format!("topic {topic} has {count} partitions but {why}"),
                ));
            }
        }
        Ok(())
    }

    /// Refuses topics the brokers say delete or compact records: the log, the inbox and the
    /// meta topic are the cluster's truth and must keep every record. Brokers that cannot
    /// describe configs (DescribeConfigs unsupported or denied) are refused too, unless
    /// `cluster.allow-unconfirmed-retention` says the operator checked: until the log is
    /// bounded by snapshots, a record deleted before a replica read it stops that partition
    /// for good (CLU0004).
    fn check_retention(&self, describer: &Describer) -> Result<(), CodedError> {
        let unconfirmed = |topic: &str, e: &dyn std::fmt::Display| {
            if self.allow_unconfirmed_retention {
                tracing::warn!(topic, error = %e, "cannot read the topic's retention (cluster.allow-unconfirmed-retention is on): make sure it keeps every record (a gap stops following a partition, CLU0004)");
                Ok(())
            } else {
                Err(join_failed(format!(
                    "cannot confirm that topic {topic} keeps every record (the brokers did not describe its settings: {e}); allow DescribeConfigs on the cluster's topics, or check retention.ms=-1, retention.bytes=-1 and cleanup.policy=delete yourself and set cluster.allow-unconfirmed-retention = true"
                )))
            }
        };
        use rdkafka::admin::ResourceSpecifier;
        let topics = [
            &self.log_topic,
            &self.inbox_topic,
            &self.meta_topic,
            &self.epochs_topic,
            &self.snapshot_topic,
        ];
        let specifiers: Vec<_> = topics
            .iter()
            .map(|topic| ResourceSpecifier::Topic(topic))
            .collect();
        let described = match describer.describe(&specifiers) {
            Ok(described) => described,
            Err(e) => return unconfirmed(&self.log_topic, &e),
        };
        for (topic, result) in topics.iter().zip(described) {
            let config = match result {
                Ok(config) => config,
                Err(e) => {
                    unconfirmed(topic, &format!("{e:?}"))?;
                    continue;
                }
            };
            let setting = |name: &str| config.get(name).and_then(|entry| entry.value.clone());
            let compactable = self.compacted(topic);
            if let Some(problem) = retention_problem(topic, setting, compactable)
                .or_else(|| size_problem(topic, setting, self.max_record))
            {
                return Err(join_failed(problem));
            }
            // A setting the brokers did not list is not taken to keep every record.
            if let Some(key) = unlisted_retention_setting(setting) {
                unconfirmed(topic, &format!("its description does not list {key}"))?;
            }
        }
        Ok(())
    }

    /// Checks the brokers' topic and group settings before this node joins the group (so
    /// before it leads or stands by for any partition); false when it must not join (the
    /// failure is in `health`, which stops the process). With
    /// `cluster.allow-unconfirmed-retention` on, the node joins at once and the check runs
    /// beside it: brokers that cannot describe settings (librdkafka's mock among them) take
    /// their whole request timeout to say so, and the operator said they checked.
    fn brokers_checked(&self, health: &Arc<sluice_store::health::Health>) -> bool {
        if !self.allow_unconfirmed_retention {
            return match self.check_brokers() {
                Ok(()) => true,
                Err(e) => {
                    health.fail(e);
                    false
                }
            };
        }
        let beside = {
            let (settings, health) = (self.clone(), Arc::clone(health));
            std::thread::Builder::new()
                .name("sluice-retention-check".into())
                .spawn(move || {
                    if let Err(e) = settings.check_brokers() {
                        health.fail(e);
                    }
                })
        };
        if let Err(e) = beside {
            health.fail(join_failed(format!(
                "cannot check the topics' retention: {e}"
            )));
            return false;
        }
        true
    }

    /// Asks the brokers for the topics' and the group's settings and checks them.
    fn check_brokers(&self) -> Result<(), CodedError> {
        let describer = Describer::new(&self.client)?;
        self.check_retention(&describer)?;
        self.check_session_timeout(&describer)
    }

    /// Refuses a `cluster.session-timeout` the brokers would refuse: they take a group member's
    /// session only within `group.min.session.timeout.ms` and `group.max.session.timeout.ms`,
    /// and a node whose join they refuse never leads anything, saying so only in its log.
    /// Brokers that do not describe their settings (librdkafka's mock) are not asked again.
    fn check_session_timeout(&self, describer: &Describer) -> Result<(), CodedError> {
        use rdkafka::admin::ResourceSpecifier;
        let consumer: BaseConsumer = self
            .client
            .create()
            .map_err(|e| join_failed(format!("cannot create a client: {e}")))?;
        let Some(broker) = consumer
            .fetch_metadata(None, METADATA_TIMEOUT)
            .ok()
            .and_then(|m| m.brokers().first().map(|b| b.id()))
        else {
            return Ok(());
        };
        let described = describer.describe(&[ResourceSpecifier::Broker(broker)]);
        let Some(Ok(config)) = described.ok().and_then(|mut all| all.pop()) else {
            tracing::warn!(
                "the brokers did not describe their group session bounds; cluster.session-timeout is not checked against them"
            );
            return Ok(());
        };
        let ms = |name: &str| {
            config
                .get(name)
                .and_then(|entry| entry.value.as_deref())
                .and_then(|value| value.parse::<u64>().ok())
        };
        let session = u64::try_from(self.session_timeout.as_millis()).unwrap_or(u64::MAX);
        session_problem(
            session,
            ms("group.min.session.timeout.ms"),
            ms("group.max.session.timeout.ms"),
        )
        .map_or(Ok(()), |problem| Err(join_failed(problem)))
    }

    fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
        replication: u16,
        compacted: bool,
    ) -> Result<(), CodedError> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let batch_bytes = largest_batch(self.max_record).to_string();
        let admin: AdminClient<_> = self
            .client
            .create()
            .map_err(|e| join_failed(format!("cannot create an admin client: {e}")))?;
        let new = NewTopic::new(
            topic,
            i32::try_from(partitions).unwrap_or(i32::MAX),
            TopicReplication::Fixed(i32::from(replication)),
        )
        .set("retention.ms", "-1")
        .set("max.message.bytes", &batch_bytes);
        // The meta and epochs topics keep the newest record of each key; their segments roll
        // hourly so that what a newer record replaced can go (a segment is compacted only once
        // it is no longer the one written to).
        let new = if compacted {
            new.set("cleanup.policy", "compact")
                .set("segment.ms", "3600000")
        } else {
            new.set("cleanup.policy", "delete")
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| join_failed(format!("cannot create topic {topic}: {e}")))?;
        let created = runtime
            .block_on(admin.create_topics([&new], &AdminOptions::new()))
            .map_err(|e| join_failed(format!("cannot create topic {topic}: {e}")))?;
        for result in created {
            if let Err((name, error)) = result
                && error != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists
            {
                return Err(join_failed(format!("cannot create topic {name}: {error}")));
            }
        }
        tracing::info!(topic, partitions, replication, "created a cluster topic");
        Ok(())
    }
}

/// One admin client and the runtime its answers come on, for the start-up's questions about
/// the brokers' and topics' settings.
struct Describer {
    admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>,
    runtime: tokio::runtime::Runtime,
}

impl Describer {
    fn new(client: &ClientConfig) -> Result<Self, CodedError> {
        Ok(Self {
            admin: client
                .create()
                .map_err(|e| join_failed(format!("cannot create an admin client: {e}")))?,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| join_failed(format!("cannot read the brokers' settings: {e}")))?,
        })
    }

    fn describe(
        &self,
        resources: &[rdkafka::admin::ResourceSpecifier<'_>],
    ) -> rdkafka::error::KafkaResult<Vec<rdkafka::admin::ConfigResourceResult>> {
        let options = rdkafka::admin::AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
        self.runtime
            .block_on(self.admin.describe_configs(resources, &options))
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

/// The partition count of `topic` just created: the brokers answer a creation once their
/// controller took it, and list the topic in their metadata a moment later.
fn created_partitions(consumer: &BaseConsumer, topic: &str) -> Result<u32, CodedError> {
    let deadline = std::time::Instant::now() + METADATA_TIMEOUT;
    loop {
        if let Some(count) = topic_partitions(consumer, topic)? {
            return Ok(count);
        }
        if std::time::Instant::now() > deadline {
            return Err(join_failed(format!(
                "topic {topic} was created but the brokers did not list it within {} s",
                METADATA_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The partition count of `topic`; `None` when it does not exist.
fn topic_partitions(consumer: &BaseConsumer, topic: &str) -> Result<Option<u32>, CodedError> {
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|e| {
            join_failed(format!(
                "cannot read the metadata of topic {topic}: {e}; check cluster.bootstrap-servers"
            ))
        })?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    if found.error().is_some() || found.partitions().is_empty() {
        return Ok(None);
    }
    Ok(Some(
        u32::try_from(found.partitions().len()).unwrap_or(u32::MAX),
    ))
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

/// What a record batch of one record of `max_record` bytes may take beside it (the batch's and
/// the record's headers), with room to spare.
const BATCH_OVERHEAD: usize = 16 * 1024;

/// The `max.message.bytes` a cluster topic needs: a batch holding the largest record Sluice
/// writes (the producers' `batch.size` is at most `max_record`, so a batch of several records
/// is no larger).
fn largest_batch(max_record: usize) -> usize {
    max_record.saturating_add(BATCH_OVERHEAD)
}

/// The producers' `batch.size`: librdkafka's default, but never more than a topic takes.
fn batch_size(max_record: usize) -> String {
    max_record.min(1_000_000).to_string()
}

/// Why `topic`'s `max.message.bytes` refuses records this node writes, if it does: the broker
/// would refuse such a record, and its partition's leader could not go on.
fn size_problem(
    topic: &str,
    setting: impl Fn(&str) -> Option<String>,
    max_record: usize,
) -> Option<String> {
    let takes = setting("max.message.bytes")?.trim().parse::<usize>().ok()?;
    let needs = largest_batch(max_record);
    (takes < needs).then(|| {
        format!(
            "topic {topic} takes record batches of at most {takes} bytes (max.message.bytes) but cluster.max-record-bytes is {max_record}, which needs {needs}: raise it with `kafka-configs --alter --entity-type topics --entity-name {topic} --add-config max.message.bytes={needs}`, or lower cluster.max-record-bytes on every node"
        )
    })
}

/// What is wrong with a cluster topic's settings (read through `setting`), if anything: it must
/// keep every record, neither deleted by time or size nor compacted; the meta topic
/// (`compactable`) may be compacted, since each of its records holds whole tables under the key
/// of their group, so the newest record of each group is the group.
fn retention_problem(
    topic: &str,
    setting: impl Fn(&str) -> Option<String>,
    compactable: bool,
) -> Option<String> {
    let policy = if compactable { "compact" } else { "delete" };
    let fix = format!(
        "the cluster's log is its only truth and must keep every record: set it with `kafka-configs --alter --entity-type topics --entity-name {topic} --add-config retention.ms=-1,retention.bytes=-1,cleanup.policy={policy}`"
    );
    for (key, keeps_all) in [("retention.ms", "-1"), ("retention.bytes", "-1")] {
        if let Some(value) = setting(key)
            && value.trim() != keeps_all
        {
            return Some(format!("topic {topic} has {key}={value}; {fix}"));
        }
    }
    if let Some(value) = setting("cleanup.policy")
        && value.trim() != "delete"
        && !(compactable && value.trim() == "compact")
    {
        return Some(format!("topic {topic} has cleanup.policy={value}; {fix}"));
    }
    None
}

/// The first of the settings that decide what a topic keeps that its description (read
/// through `setting`) does not list, if any.
fn unlisted_retention_setting(setting: impl Fn(&str) -> Option<String>) -> Option<&'static str> {
    ["retention.ms", "retention.bytes", "cleanup.policy"]
        .into_iter()
        .find(|key| setting(key).is_none())
}

/// Why a session of `session` ms is one the brokers (taking `min..=max` ms) refuse, if it is.
fn session_problem(session: u64, min: Option<u64>, max: Option<u64>) -> Option<String> {
    let (min, max) = (min.unwrap_or(0), max.unwrap_or(u64::MAX));
    (session < min || session > max).then(|| {
        format!(
            "cluster.session-timeout is {session} ms, but the brokers take group sessions of {min} to {max} ms (their group.min.session.timeout.ms and group.max.session.timeout.ms): this node could never join the group that assigns partitions. Set cluster.session-timeout within, or change the brokers' settings"
        )
    })
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
    use super::{retention_problem, session_problem, size_problem, unlisted_retention_setting};

    fn settings<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v).to_owned())
        }
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

    #[test]
    fn a_session_timeout_outside_the_brokers_bounds_is_refused_naming_both_settings() {
        assert_eq!(session_problem(6_000, Some(6_000), Some(1_800_000)), None);
        assert_eq!(
            session_problem(3_000, None, None),
            None,
            "nothing known, nothing refused"
        );
        let short = session_problem(3_000, Some(6_000), Some(1_800_000)).unwrap();
        assert!(
            short.contains("3000 ms")
                && short.contains("group.min.session.timeout.ms")
                && short.contains("cluster.session-timeout"),
            "{short}"
        );
        assert!(session_problem(2_000_000, Some(6_000), Some(1_800_000)).is_some());
    }

    #[test]
    fn topics_that_keep_every_record_pass() {
        let keeps = [
            ("retention.ms", "-1"),
            ("retention.bytes", "-1"),
            ("cleanup.policy", "delete"),
        ];
        assert_eq!(retention_problem("s.log", settings(&keeps), false), None);
        assert_eq!(unlisted_retention_setting(settings(&keeps)), None);
        // Settings the brokers did not list are not guessed at: they leave the retention
        // unconfirmed.
        assert_eq!(retention_problem("s.log", settings(&[]), false), None);
        assert_eq!(
            unlisted_retention_setting(settings(&keeps[..2])),
            Some("cleanup.policy")
        );
        assert_eq!(
            unlisted_retention_setting(settings(&[])),
            Some("retention.ms")
        );
    }

    #[test]
    fn retention_by_time_size_or_compaction_is_refused_naming_the_fix() {
        for (key, value) in [
            ("retention.ms", "604800000"),
            ("retention.bytes", "1073741824"),
            ("cleanup.policy", "compact"),
            ("cleanup.policy", "compact,delete"),
        ] {
            let problem = retention_problem("s.log", settings(&[(key, value)]), false)
                .unwrap_or_else(|| panic!("{key}={value} passed"));
            assert!(problem.contains(&format!("{key}={value}")), "{problem}");
            assert!(problem.contains("retention.ms=-1"), "{problem}");
        }
    }

    #[test]
    fn the_meta_topic_alone_may_be_compacted_but_never_deleted_by_time() {
        let compact = [("cleanup.policy", "compact")];
        assert_eq!(retention_problem("s.meta", settings(&compact), true), None);
        assert!(retention_problem("s.log", settings(&compact), false).is_some());
        let both = [("cleanup.policy", "compact,delete")];
        assert!(retention_problem("s.meta", settings(&both), true).is_some());
        let timed = [("retention.ms", "86400000")];
        let problem = retention_problem("s.meta", settings(&timed), true).unwrap();
        assert!(problem.contains("cleanup.policy=compact"), "{problem}");
    }

    #[test]
    fn a_topic_that_takes_smaller_batches_than_the_largest_record_is_refused_naming_the_fix() {
        let mib = 1024 * 1024;
        // The brokers' default (1 MiB and 12 bytes) against the default 8 MiB records.
        let problem = size_problem(
            "s.log",
            settings(&[("max.message.bytes", "1048588")]),
            8 * mib,
        )
        .expect("refused");
        assert!(
            problem.contains("max.message.bytes=8404992")
                && problem.contains("cluster.max-record-bytes"),
            "{problem}"
        );
        let enough = (8 * mib + 16 * 1024).to_string();
        assert_eq!(
            size_problem(
                "s.log",
                settings(&[("max.message.bytes", &enough)]),
                8 * mib
            ),
            None
        );
        assert_eq!(size_problem("s.log", settings(&[]), 8 * mib), None);
    }
}
