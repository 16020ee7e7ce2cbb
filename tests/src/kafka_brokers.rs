//! A real Apache Kafka cluster for the cluster tests: brokers in KRaft mode (each broker also a
//! controller, one quorum of all of them), each a JVM process of its own on loopback ports with
//! its own data dir, `min.insync.replicas = 2` and topics replicated 3 times. `scripts/setup`
//! puts the pinned broker's jars (`tests/kafka-broker/pom.xml`) in
//! `~/.cache/sluice-kafka/<version>/libs`; `SLUICE_KAFKA_LIBS` names another folder.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::cut::Links;

/// The broker version `tests/kafka-broker/pom.xml` pins.
pub const KAFKA_VERSION: &str = "4.1.1";

/// How long a broker may take to answer after its start (a JVM on a busy 2-core box).
const READY_WITHIN: Duration = Duration::from_secs(90);

/// The folder holding the broker's jars.
fn libs() -> PathBuf {
    if let Some(dir) = std::env::var_os("SLUICE_KAFKA_LIBS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/sluice-kafka")
        .join(KAFKA_VERSION)
        .join("libs")
}

/// One broker: its id, ports, data dir, and process while it runs.
struct Broker {
    id: u32,
    port: u16,
    properties: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// Brokers of one cluster, stopped (SIGKILL) when dropped.
pub struct KafkaCluster {
    brokers: Vec<Broker>,
    /// Per client that can be cut off: links to every broker, on a listener of their own.
    cuts: Vec<Links>,
    _dir: tempfile::TempDir,
}

impl KafkaCluster {
    /// Starts `count` brokers (at least 3 for `min.insync.replicas = 2` with a spare) and waits
    /// until every one is in the cluster's metadata.
    pub fn start(count: u32) -> Self {
        Self::start_with_cuts(count, 0)
    }

    /// [`KafkaCluster::start`], and `cuts` sets of links a test can cut: each broker gets a
    /// listener per set that advertises the set's link to it, so a client bootstrapped
    /// through [`KafkaCluster::bootstrap_through`] reaches every broker only through them.
    pub fn start_with_cuts(count: u32, cuts: usize) -> Self {
        let libs = libs();
        assert!(
            libs.join(format!("kafka_2.13-{KAFKA_VERSION}.jar"))
                .exists(),
            "no Kafka {KAFKA_VERSION} jars in {}: run ./scripts/setup",
            libs.display()
        );
        let dir = tempfile::tempdir().expect("a temp dir");
        let ports: Vec<(u16, u16)> = (0..count)
            .map(|_| (listener_port(), listener_port()))
            .collect();
        // Per set of links: per broker, the listener's own port and the link in front of it.
        let mut cut_targets = Vec::new();
        let mut cut_links = Vec::new();
        for _ in 0..cuts {
            let own: Vec<u16> = (0..count).map(|_| listener_port()).collect();
            let links: Vec<std::net::TcpListener> = (0..count)
                .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a link's port"))
                .collect();
            cut_targets.push(own);
            cut_links.push(links);
        }
        let voters = ports
            .iter()
            .enumerate()
            .map(|(i, (_, controller))| format!("{}@127.0.0.1:{controller}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let cluster_id = cluster_id();
        let replication = count.min(3);
        let mut brokers = Vec::new();
        for (i, (port, controller)) in ports.iter().enumerate() {
            let id = i as u32 + 1;
            let (mut listeners, mut advertised, mut protocols) =
                (String::new(), String::new(), String::new());
            for (c, (own, links)) in cut_targets.iter().zip(&cut_links).enumerate() {
                let link = links[i].local_addr().expect("a link's address").port();
                listeners.push_str(&format!(",CUT{c}://127.0.0.1:{}", own[i]));
                advertised.push_str(&format!(",CUT{c}://127.0.0.1:{link}"));
                protocols.push_str(&format!(",CUT{c}:PLAINTEXT"));
            }
            let data = dir.path().join(format!("broker-{id}"));
            std::fs::create_dir_all(&data).expect("the broker's data dir");
            let properties = dir.path().join(format!("broker-{id}.properties"));
            std::fs::write(
                &properties,
                format!(
                    "process.roles=broker,controller\n\
                     node.id={id}\n\
                     controller.quorum.voters={voters}\n\
                     listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}{listeners}\n\
                     advertised.listeners=PLAINTEXT://127.0.0.1:{port}{advertised}\n\
                     controller.listener.names=CONTROLLER\n\
                     listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT{protocols}\n\
                     inter.broker.listener.name=PLAINTEXT\n\
                     log.dirs={data}\n\
                     default.replication.factor={replication}\n\
                     min.insync.replicas={min_isr}\n\
                     offsets.topic.replication.factor={replication}\n\
                     transaction.state.log.replication.factor={replication}\n\
                     transaction.state.log.min.isr={min_isr}\n\
                     group.initial.rebalance.delay.ms=0\n\
                     # The nodes' 3 s session timeout (a node's death noticed within seconds)\n\
                     # is below the default floor of 6 s.\n\
                     group.min.session.timeout.ms=1000\n\
                     # A broker killed -9 is fenced, and its partitions given new leaders, within\n\
                     # a few seconds rather than the default nine.\n\
                     broker.heartbeat.interval.ms=500\n\
                     broker.session.timeout.ms=3000\n\
                     replica.lag.time.max.ms=5000\n\
                     # The cleaner looks for topics to compact every half second, not fifteen.\n\
                     log.cleaner.backoff.ms=500\n\
                     # Small segments and memory: several brokers share a 2-core test box.\n\
                     log.segment.bytes=16777216\n\
                     num.network.threads=2\n\
                     num.io.threads=2\n\
                     num.recovery.threads.per.data.dir=1\n",
                    data = data.display(),
                    min_isr = replication.saturating_sub(1).max(1),
                ),
            )
            .expect("the broker's properties");
            let formatted = java(&libs)
                .arg("kafka.tools.StorageTool")
                .args(["format", "--ignore-formatted", "-t", &cluster_id, "-c"])
                .arg(&properties)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("java runs");
            assert!(
                formatted.success(),
                "formatting broker {id}'s storage failed"
            );
            brokers.push(Broker {
                id,
                port: *port,
                log: dir.path().join(format!("broker-{id}.log")),
                properties,
                child: None,
            });
        }
        let cuts = cut_links
            .into_iter()
            .zip(cut_targets)
            .map(|(links, own)| {
                let targets = own
                    .iter()
                    .map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], *port)))
                    .collect();
                Links::start(links, targets)
            })
            .collect();
        let mut cluster = Self {
            brokers,
            cuts,
            _dir: dir,
        };
        for i in 0..cluster.brokers.len() {
            cluster.spawn(i);
        }
        cluster.wait_for_brokers(count as usize);
        cluster
    }

    /// The `bootstrap.servers` of every broker.
    pub fn bootstrap_servers(&self) -> String {
        self.brokers
            .iter()
            .map(|b| format!("127.0.0.1:{}", b.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The `bootstrap.servers` of the links of set `cut`: a client given these reaches the
    /// brokers only through them.
    pub fn bootstrap_through(&self, cut: usize) -> String {
        self.cuts[cut]
            .addresses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Cuts the client of set `cut` off from every broker (its links go silent).
    pub fn cut(&self, cut: usize) {
        self.cuts[cut].cut();
    }

    /// The bytes the client of set `cut` sent to the brokers and took in from them so far.
    pub fn carried(&self, cut: usize) -> (u64, u64) {
        self.cuts[cut].carried()
    }

    /// Mends the links of set `cut`.
    pub fn mend(&self, cut: usize) {
        self.cuts[cut].mend();
    }

    /// Kills broker `index` (0-based) with SIGKILL.
    pub fn kill_9(&mut self, index: usize) {
        if let Some(mut child) = self.brokers[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts broker `index` again on its data dir and waits until the cluster lists it.
    pub fn restart(&mut self, index: usize) {
        self.spawn(index);
        let running = self.brokers.iter().filter(|b| b.child.is_some()).count();
        self.wait_for_brokers(running);
    }

    /// Creates `topic` with `partitions`, replicated 3 times, with the settings `configs` (the
    /// brokers' defaults for the rest).
    pub async fn create_topic(&self, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<_> = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap_servers())
            .create()
            .expect("an admin client");
        let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(3));
        for (key, value) in configs {
            new = new.set(key, value);
        }
        let created = admin
            .create_topics([&new], &AdminOptions::new())
            .await
            .expect("the brokers answer");
        for result in created {
            result.unwrap_or_else(|(name, e)| panic!("cannot create {name}: {e}"));
        }
    }

    /// Kills every broker with SIGKILL.
    pub fn kill_all(&mut self) {
        for i in 0..self.brokers.len() {
            self.kill_9(i);
        }
    }

    /// Starts every broker that is not running, on its data dir, and waits until the cluster
    /// lists them all (a KRaft quorum needs most of its voters at once).
    pub fn start_all(&mut self) {
        for i in 0..self.brokers.len() {
            if self.brokers[i].child.is_none() {
                self.spawn(i);
            }
        }
        self.wait_for_brokers(self.brokers.len());
    }

    /// The index of the broker leading partition `partition` of `topic`.
    pub fn leader_of(&self, topic: &str, partition: i32) -> usize {
        let consumer = self.client();
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("the cluster's metadata");
        let leader = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
            .map(|p| p.leader())
            .unwrap_or_else(|| panic!("{topic} has no partition {partition}"));
        self.brokers
            .iter()
            .position(|b| i64::from(b.id) == i64::from(leader))
            .unwrap_or_else(|| panic!("{topic}/{partition} has no leader now ({leader})"))
    }

    /// Where each partition of `topic` starts and ends now (its low and high watermarks):
    /// records before the start were deleted.
    pub fn watermarks(&self, topic: &str, partitions: i32) -> Vec<(i64, i64)> {
        let consumer = self.client();
        (0..partitions)
            .map(|p| {
                consumer
                    .fetch_watermarks(topic, p, Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("the watermarks of {topic}/{p}: {e}"))
            })
            .collect()
    }

    /// The bytes of record batches the first broker holds of the topics whose names start with
    /// `prefix` (their segment files; every broker holds every partition when there are three).
    pub fn stored_bytes(&self, prefix: &str) -> u64 {
        let data = self.brokers[0]
            .properties
            .with_file_name(format!("broker-{}", self.brokers[0].id));
        let mut total = 0;
        for dir in std::fs::read_dir(&data)
            .expect("the broker's data dir")
            .flatten()
        {
            if !dir.file_name().to_string_lossy().starts_with(prefix) {
                continue;
            }
            for file in std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if file.path().extension().is_some_and(|e| e == "log") {
                    total += file.metadata().map_or(0, |m| m.len());
                }
            }
        }
        total
    }

    /// How many records partition `partition` of `topic` holds now, read from its start to
    /// its end (fewer than the offsets between them once compaction dropped some).
    pub fn count_records(&self, topic: &str, partition: i32) -> usize {
        use rdkafka::{Offset, TopicPartitionList};
        let (_, end) = self.watermarks(topic, partition + 1)[partition as usize];
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap_servers())
            .set("group.id", "sluice-tests-count")
            .set("enable.auto.commit", "false")
            .set("log_level", "0")
            .create()
            .expect("a counting consumer");
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .expect("an assignment");
        consumer.assign(&assignment).expect("assigned");
        let started = Instant::now();
        let mut count = 0;
        let mut next = 0;
        while next < end {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{topic}/{partition}: read to {next} of {end} in 30 s"
            );
            if let Some(message) = consumer.poll(Duration::from_millis(200)) {
                let message = message.expect("a record");
                count += 1;
                next = rdkafka::message::Message::offset(&message) + 1;
            }
        }
        count
    }

    /// What broker `index` printed (its JVM's output).
    pub fn output(&self, index: usize) -> String {
        std::fs::read_to_string(&self.brokers[index].log).unwrap_or_default()
    }

    fn spawn(&mut self, index: usize) {
        let libs = libs();
        let broker = &mut self.brokers[index];
        let log = std::fs::File::create(&broker.log).expect("the broker's log");
        let child = java(&libs)
            .arg("kafka.Kafka")
            .arg(&broker.properties)
            .stdout(log.try_clone().expect("the log again"))
            .stderr(log)
            .spawn()
            .expect("the broker starts");
        broker.child = Some(child);
    }

    fn client(&self) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap_servers())
            .set("log_level", "0")
            .create()
            .expect("a metadata client")
    }

    /// Waits until the metadata lists `count` brokers; a broker that exited meanwhile fails
    /// the test with what it printed.
    fn wait_for_brokers(&mut self, count: usize) {
        let started = Instant::now();
        let client = self.client();
        loop {
            let listed = client
                .fetch_metadata(None, Duration::from_secs(2))
                .map(|m| m.brokers().len())
                .unwrap_or(0);
            if listed >= count {
                return;
            }
            for i in 0..self.brokers.len() {
                if let Some(child) = self.brokers[i].child.as_mut()
                    && let Ok(Some(exit)) = child.try_wait()
                {
                    panic!("broker {} exited ({exit}):\n{}", i + 1, self.output(i));
                }
            }
            assert!(
                started.elapsed() < READY_WITHIN,
                "{listed} of {count} brokers after {READY_WITHIN:?}; broker 1 said:\n{}",
                self.output(0)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// A free loopback port below the kernel's ephemeral range, for a broker's listener. A port
/// from the ephemeral range (what binding port 0 gives) stays free only until the kernel hands
/// it to an outgoing connection: a broker that takes seconds to start, or one restarted after a
/// kill, could then find its port taken by another broker's client and exit at start-up (seen
/// about once in 25 clusters under load). Each port is handed out once per test process.
fn listener_port() -> u16 {
    use std::sync::Mutex;
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let low = 10_000u16.min(ephemeral_from / 2);
    let span = u128::from(ephemeral_from.saturating_sub(low).max(1));
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..10_000 {
        let offset = sluice_core::ids::InvocationId::new_uuid() % span;
        let port = low + u16::try_from(offset).expect("below the span");
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free port below {ephemeral_from}");
}

/// `java` with the broker's class path and a small heap.
fn java(libs: &Path) -> Command {
    let mut command = Command::new("java");
    command
        .args([
            "-Xms64m",
            "-Xmx384m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            // slf4j-simple (tests/kafka-broker/pom.xml) prints to stderr: why a broker
            // stopped shows in the test's failure.
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        ])
        .arg("-cp")
        .arg(format!("{}/*", libs.display()));
    command
}

/// A cluster id in Kafka's form: 16 random bytes, base64url without padding.
fn cluster_id() -> String {
    use base64::Engine as _;
    let bytes = sluice_core::ids::InvocationId::new_uuid().to_be_bytes();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}
