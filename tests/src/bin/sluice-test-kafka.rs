//! A Kafka-protocol cluster for benches: librdkafka's mock brokers in a process of their own,
//! with topics created up front (the mock answers no CreateTopics). Prints
//! `bootstrap.servers=<list>` on stdout, then serves until killed.
//!
//! Usage: `sluice-test-kafka <brokers> [<topic>:<partitions>]...`

use std::io::Write as _;

use rdkafka::mocking::MockCluster;

fn main() {
    let mut args = std::env::args().skip(1);
    let brokers: i32 = args
        .next()
        .and_then(|n| n.parse().ok())
        .expect("usage: sluice-test-kafka <brokers> [<topic>:<partitions>]...");
    let cluster = MockCluster::new(brokers).expect("the mock brokers start");
    for spec in args {
        let (topic, partitions) = spec
            .split_once(':')
            .and_then(|(t, p)| Some((t.to_owned(), p.parse::<i32>().ok()?)))
            .expect("a topic is <name>:<partitions>");
        cluster
            .create_topic(&topic, partitions, brokers.min(3))
            .expect("the topic is created");
    }
    let mut out = std::io::stdout();
    writeln!(out, "bootstrap.servers={}", cluster.bootstrap_servers()).expect("stdout");
    out.flush().expect("stdout");
    loop {
        std::thread::park();
    }
}
