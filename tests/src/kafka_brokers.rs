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

use crate::binaries::free_port;

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
    _dir: tempfile::TempDir,
}

impl KafkaCluster {
    /// Starts `count` brokers (at least 3 for `min.insync.replicas = 2` with a spare) and waits
    /// until every one is in the cluster's metadata.
    pub fn start(count: u32) -> Self {
        let libs = libs();
        assert!(
            libs.join(format!("kafka_2.13-{KAFKA_VERSION}.jar"))
                .exists(),
            "no Kafka {KAFKA_VERSION} jars in {}: run ./scripts/setup",
            libs.display()
        );
        let dir = tempfile::tempdir().expect("a temp dir");
        let ports: Vec<(u16, u16)> = (0..count).map(|_| (free_port(), free_port())).collect();
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
            let data = dir.path().join(format!("broker-{id}"));
            std::fs::create_dir_all(&data).expect("the broker's data dir");
            let properties = dir.path().join(format!("broker-{id}.properties"));
            std::fs::write(
                &properties,
                format!(
                    "process.roles=broker,controller\n\
                     node.id={id}\n\
                     controller.quorum.voters={voters}\n\
                     listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
                     advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
                     controller.listener.names=CONTROLLER\n\
                     listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
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
        let mut cluster = Self { brokers, _dir: dir };
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
        for i in 0..self.brokers.len() {
            self.kill_9(i);
        }
    }
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
