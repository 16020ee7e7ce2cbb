//! A mock Kafka cluster (librdkafka's) for the subscription and cluster tests.

use std::process::{Command, Stdio};

use crate::binaries::sibling_binary;

/// A Kafka-protocol cluster in a process of its own (`sluice-test-kafka`: librdkafka's mock
/// brokers), stopped when dropped.
pub struct KafkaBroker {
    child: std::process::Child,
    bootstrap: String,
}

impl KafkaBroker {
    /// `brokers` brokers with `topics` (name, partitions) created.
    pub fn start(brokers: u32, topics: &[(&str, u32)]) -> Self {
        use std::io::BufRead as _;
        let mut child = Command::new(sibling_binary("sluice-test-kafka"))
            .arg(brokers.to_string())
            .args(topics.iter().map(|(name, n)| format!("{name}:{n}")))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("sluice-test-kafka starts");
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("it prints its address");
        let bootstrap = line
            .trim()
            .strip_prefix("bootstrap.servers=")
            .unwrap_or_else(|| panic!("no address from sluice-test-kafka: {line:?}"))
            .to_owned();
        Self { child, bootstrap }
    }

    /// Its `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> String {
        self.bootstrap.clone()
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
