//! Cluster mode (`docs/cluster.md`) against a Kafka-protocol broker outside Sluice's process
//! (librdkafka's mock cluster, hosted by this test process, three brokers).

use std::time::{Duration, Instant};

use rdkafka::mocking::MockCluster;
use serde_json::Value;
use sluice_tests::{Builder, Sluice, TestDeployment, assert_startup_error};

const PARTITIONS: i32 = 4;

fn broker() -> MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
    let cluster = MockCluster::new(3).unwrap();
    for topic in ["sluice.log", "sluice.leaders"] {
        cluster.create_topic(topic, PARTITIONS, 3).unwrap();
    }
    cluster
}

fn node(bootstrap: &str, id: &str) -> Builder {
    Sluice::builder()
        .env("SERVICE_WORKER__PARTITIONS", &PARTITIONS.to_string())
        .env("SERVICE_CLUSTER__MODE", "kafka")
        .env("SERVICE_CLUSTER__BOOTSTRAP_SERVERS", bootstrap)
        .env("SERVICE_CLUSTER__NODE_ID", id)
        .env("SERVICE_CLUSTER__SESSION_TIMEOUT", "3s")
}

/// Posts until the answer is not a 5xx (partitions are taken over after start-up).
async fn post(sluice: &Sluice, path: &str, body: &str) -> (u16, String) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut request = client.post(format!("{}{path}", sluice.ingress_url));
        if !body.is_empty() {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        let sent = request.send().await;
        if let Ok(resp) = sent {
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            if status < 500 {
                return (status, text);
            }
            assert!(Instant::now() < deadline, "{path}: {status} {text}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_node_rebuilds_its_store_from_the_log() {
    let broker = broker();
    let bootstrap = broker.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = node(&bootstrap, "n1").start().await.unwrap();
    sluice.register(&dep.uri, false).await;

    // State of three objects, written by calls through the log.
    for key in ["a", "b", "c"] {
        for by in 1..=3 {
            let (status, body) =
                post(&sluice, &format!("/Counter/{key}/add"), &by.to_string()).await;
            assert_eq!(status, 200, "{body}");
        }
    }
    // Sends, each acknowledged once its record is in the log and the store.
    let mut sent = Vec::new();
    for i in 0..20 {
        let (status, body) = post(&sluice, "/Greeter/greet/send", &format!("\"n{i}\"")).await;
        assert_eq!(status, 202, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        sent.push(body["invocationId"].as_str().unwrap().to_owned());
    }
    for id in &sent {
        sluice
            .invocation_until(id, "completed", |seen| seen["status"] == "completed")
            .await;
    }

    // The machine is lost with its disk: a new node with an empty data dir.
    sluice.kill_9();
    let data = sluice.data_dir.clone();
    std::fs::remove_dir_all(&data).unwrap();
    let sluice = node(&bootstrap, "n1")
        .data_dir(&data)
        .start()
        .await
        .unwrap();
    // Deployments are not in the log yet (the meta topic is the next step).
    sluice.register(&dep.uri, false).await;
    for (key, want) in [("a", "6"), ("b", "6"), ("c", "6")] {
        let (status, body) = post(&sluice, &format!("/Counter/{key}/get"), "").await;
        assert_eq!((status, body.as_str()), (200, want), "object {key}");
    }
    for id in &sent {
        let seen = sluice
            .invocation_until(id, "found again", |seen| seen["status"] == "completed")
            .await;
        assert_eq!(seen["status"], "completed");
    }
    // Work goes on where the log left it.
    let (status, body) = post(&sluice, "/Counter/a/add", "4").await;
    assert_eq!((status, body.as_str()), (200, "10"));
}

#[tokio::test]
async fn a_node_with_another_partition_count_does_not_join() {
    let broker = broker();
    let finished = node(&broker.bootstrap_servers(), "n1")
        .env("SERVICE_WORKER__PARTITIONS", "2")
        .run_to_exit()
        .unwrap();
    assert_startup_error(&finished, "CLU0002");
    assert!(
        finished
            .stderr
            .contains("has 4 partitions but worker.partitions is 2"),
        "{}",
        finished.stderr
    );
}

/// Reads `Counter/{key}/get` until it answers (its partition may be moving).
async fn counter(sluice: &Sluice, key: &str) -> String {
    let (status, body) = post(sluice, &format!("/Counter/{key}/get"), "").await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn a_second_node_takes_every_partition_over_when_the_first_dies() {
    let broker = broker();
    let bootstrap = broker.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut first = node(&bootstrap, "n1").start().await.unwrap();
    first.register(&dep.uri, false).await;
    // Objects spread over the partitions, all led by the only node.
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    for key in &keys {
        let (status, body) = post(&first, &format!("/Counter/{key}/add"), "5").await;
        assert_eq!((status, body.as_str()), (200, "5"), "{key}");
    }
    // A second node joins: it replicates every partition and the group gives it some.
    let second = node(&bootstrap, "n2").start().await.unwrap();
    second.register(&dep.uri, false).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !second.stderr().contains("took the partition over") {
        assert!(
            Instant::now() < deadline,
            "n2 never led a partition: {}",
            second.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        first.stderr().contains("stopped leading the partition"),
        "n1 kept every partition: {}",
        first.stderr()
    );

    first.kill_9();
    let killed = Instant::now();
    // Every object is served by the survivor, with the state the first node wrote.
    for key in &keys {
        assert_eq!(counter(&second, key).await, "5", "{key}");
    }
    let failover = killed.elapsed();
    eprintln!("every partition served again {failover:?} after the kill");
    assert!(failover < Duration::from_secs(20), "{failover:?}");
    for key in &keys {
        let (status, body) = post(&second, &format!("/Counter/{key}/add"), "1").await;
        assert_eq!((status, body.as_str()), (200, "6"), "{key}");
    }
}
