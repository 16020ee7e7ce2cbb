//! Cluster mode (`docs/cluster.md`) against a real Apache Kafka cluster (three KRaft brokers
//! as processes on loopback, `KafkaCluster`), each case on a cluster of its own. Two cases run
//! on librdkafka's mock brokers (hosted by `sluice-test-kafka`) because only they can stage
//! them: brokers that cannot describe topic settings, and records deleted whatever a topic's
//! settings say.

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::{
    Builder, KafkaBroker, KafkaCluster, Sluice, TestDeployment, assert_once_but_in_flight,
    assert_startup_error, connect_from, effects_once_quiet, effects_per_invocation, get_json,
    head_within, status_within,
};
use tokio::io::AsyncWriteExt as _;

const PARTITIONS: i32 = 4;

/// librdkafka's mock brokers (three, in a process of their own) with the cluster's topics,
/// for the cases only they can stage.
fn broker() -> KafkaBroker {
    let partitions = PARTITIONS as u32;
    KafkaBroker::start(
        3,
        &[
            ("sluice.log", partitions),
            ("sluice.leaders", partitions),
            ("sluice.inbox", partitions),
            ("sluice.meta", 1),
            ("sluice.epochs", 1),
            ("sluice.snapshots", partitions),
        ],
    )
}

/// A node of a cluster on the mock brokers.
fn node(bootstrap: &str, id: &str) -> Builder {
    Sluice::builder()
        .env("SERVICE_WORKER__PARTITIONS", &PARTITIONS.to_string())
        .env("SERVICE_CLUSTER__MODE", "kafka")
        .env("SERVICE_CLUSTER__BOOTSTRAP_SERVERS", bootstrap)
        .env("SERVICE_CLUSTER__NODE_ID", id)
        .env("SERVICE_CLUSTER__SESSION_TIMEOUT", "3s")
        .env("SERVICE_CLUSTER__SECRET", NODE_SECRET)
        // The mock brokers cannot describe topic settings.
        .env("SERVICE_CLUSTER__ALLOW_UNCONFIRMED_RETENTION", "true")
}

/// A node of a cluster on real brokers: they describe the topics' settings, so the node checks
/// their retention itself.
fn real_node(bootstrap: &str, id: &str) -> Builder {
    Sluice::builder()
        .env("SERVICE_WORKER__PARTITIONS", &PARTITIONS.to_string())
        .env("SERVICE_CLUSTER__MODE", "kafka")
        .env("SERVICE_CLUSTER__BOOTSTRAP_SERVERS", bootstrap)
        .env("SERVICE_CLUSTER__NODE_ID", id)
        .env("SERVICE_CLUSTER__SESSION_TIMEOUT", "3s")
        .env("SERVICE_CLUSTER__SECRET", NODE_SECRET)
}

/// What the test cluster's nodes share to prove requests they forward to each other.
const NODE_SECRET: &str = "the-test-cluster-node-secret";

/// Waits until every node's store shows every invocation of `ids` completed.
async fn completed_on_every_node(nodes: &[Sluice], ids: &[String]) {
    for id in ids {
        for sluice in nodes {
            sluice
                .invocation_until(id, "completed on every node", |seen| {
                    seen["status"] == "completed"
                })
                .await;
        }
    }
}

/// Waits until `sluice` knows `count` deployments (registered on any node).
async fn deployments(sluice: &Sluice, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, listed) = sluice.get_admin("/deployments").await;
        if listed["deployments"]
            .as_array()
            .is_some_and(|d| d.len() == count)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the deployment never reached {}: {listed}",
            sluice.admin_url
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a node from each builder of `nodes` (named by its id), registers `uri` on the first,
/// and waits until every node knows the deployment and the partitions are spread over them all.
async fn cluster_of(nodes: Vec<(&str, Builder)>, uri: &str) -> Vec<Sluice> {
    let ids: Vec<&str> = nodes.iter().map(|(id, _)| *id).collect();
    let mut started = Vec::new();
    for (_, builder) in nodes {
        started.push(builder.start().await.unwrap());
    }
    started[0].register(uri, false).await;
    for sluice in &started {
        deployments(sluice, 1).await;
    }
    spread_over(&started[0], &ids).await;
    agreed_on_leaders(&started).await;
    started
}

/// Posts until the answer is not a 5xx (partitions are taken over after start-up, and move in
/// a rebalance). Every try carries the same idempotency key: a 5xx may come after the call
/// ran (its leader stepped down before answering), and a try again must not run it twice.
async fn post(sluice: &Sluice, path: &str, body: &str) -> (u16, String) {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let key = format!(
        "t{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    post_keyed(sluice, path, body, &key).await
}

/// [`post`] with the idempotency key `key`.
async fn post_keyed(sluice: &Sluice, path: &str, body: &str, key: &str) -> (u16, String) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut request = client
            .post(format!("{}{path}", sluice.ingress_url))
            .header("idempotency-key", key);
        if !body.is_empty() {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        match request.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let text = resp.text().await.unwrap_or_default();
                if status < 500 {
                    return (status, text);
                }
                assert!(Instant::now() < deadline, "{path}: {status} {text}");
            }
            Err(e) => assert!(
                Instant::now() < deadline,
                "{path}: {e}; the node said:\n{}",
                sluice.stderr()
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_node_rebuilds_its_store_from_the_log() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = real_node(&bootstrap, "n1").start().await.unwrap();
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
    let sluice = real_node(&bootstrap, "n1")
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
    let kafka = KafkaCluster::start(3);
    for (topic, partitions) in [
        ("sluice.log", PARTITIONS),
        ("sluice.leaders", PARTITIONS),
        ("sluice.inbox", PARTITIONS),
        ("sluice.meta", 1),
    ] {
        kafka.create_topic(topic, partitions, &[]).await;
    }
    let finished = real_node(&kafka.bootstrap_servers(), "n1")
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

/// Brokers that cannot say whether the cluster's topics keep every record (the mock brokers
/// cannot describe topic settings) are not trusted: the node stops with CLU0002 naming the
/// setting an operator who checked turns on. Before, it only warned, and a topic's retention
/// could delete records before a replica read them (CLU0004, the partition out for good).
#[tokio::test]
async fn a_node_that_cannot_confirm_the_topics_retention_stops() {
    let broker = broker();
    let finished = node(&broker.bootstrap_servers(), "n1")
        .env("SERVICE_CLUSTER__ALLOW_UNCONFIRMED_RETENTION", "false")
        .run_to_exit()
        .unwrap();
    // It may have become ready first (the brokers take their request timeout to not answer),
    // but it never joined the group, so it led nothing.
    assert_stopped_saying(
        &finished,
        &[
            "[CLU0002] cannot confirm that topic",
            "cluster.allow-unconfirmed-retention = true",
        ],
    );
    assert!(
        !finished.stderr.contains("this node leads the partitions"),
        "{}",
        finished.stderr
    );
}

/// The node stopped as after any store failure (exit 74, for its supervisor) and said each of
/// `phrases`.
fn assert_stopped_saying(finished: &sluice_tests::Finished, phrases: &[&str]) {
    assert_eq!(finished.status.code(), Some(74), "{}", finished.stderr);
    for phrase in phrases {
        assert!(
            finished.stderr.contains(phrase),
            "no {phrase:?} in:\n{}",
            finished.stderr
        );
    }
}

/// Reads `Counter/{key}/get` until it answers (its partition may be moving).
async fn counter(sluice: &Sluice, key: &str) -> String {
    let (status, body) = post(sluice, &format!("/Counter/{key}/get"), "").await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn a_second_node_takes_every_partition_over_when_the_first_dies() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut first = real_node(&bootstrap, "n1").start().await.unwrap();
    first.register(&dep.uri, false).await;
    // Objects spread over the partitions, all led by the only node.
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    for key in &keys {
        let (status, body) = post(&first, &format!("/Counter/{key}/add"), "5").await;
        assert_eq!((status, body.as_str()), (200, "5"), "{key}");
    }
    // A second node joins: it replicates every partition and the group gives it some.
    let second = real_node(&bootstrap, "n2").start().await.unwrap();
    deployments(&second, 1).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    second
        .until_said(
            "took the partition over",
            deadline,
            "n2 never led a partition",
        )
        .await;
    // n1 hands the partitions on: it steps down before n2 takes them (or is fenced by it).
    first
        .until_said(
            "stopped leading the partition",
            deadline,
            "n1 kept every partition",
        )
        .await;

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

/// Who leads each partition, as `sluice` sees it (`GET /cluster-health`).
async fn leaders(sluice: &Sluice) -> Vec<Option<String>> {
    let (status, health) = sluice.get_admin("/cluster-health").await;
    assert_eq!(status, 200, "{health}");
    health["sluice_cluster"]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["leader"].as_str().map(str::to_owned))
        .collect()
}

/// Waits until every partition is led by one of `nodes` and each of them leads at least one,
/// as `sluice` sees it: the group's assignment after the last of them joined.
async fn spread_over(sluice: &Sluice, nodes: &[&str]) {
    let started = Instant::now();
    loop {
        let now = leaders(sluice).await;
        let each_leads = nodes
            .iter()
            .all(|n| now.iter().any(|l| l.as_deref() == Some(*n)));
        let all_led = now
            .iter()
            .all(|l| l.as_deref().is_some_and(|l| nodes.contains(&l)));
        if each_leads && all_led {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never spread over {nodes:?}: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every node of `nodes` sees the same leader for every partition (each learns
/// leaders from the log, so their views settle one after the other).
async fn agreed_on_leaders(nodes: &[Sluice]) {
    let started = Instant::now();
    loop {
        let mut views = Vec::new();
        for sluice in nodes {
            views.push(leaders(sluice).await);
        }
        if views.windows(2).all(|pair| pair[0] == pair[1]) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the nodes never agreed on the leaders: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the group's assignment after the last of `ids` joined is in force, and answers
/// it: every partition led by one of them, each leading at least its round-robin share
/// (`PARTITIONS / ids.len()`), and every one of `nodes` seeing the same leaders. Until then a
/// node may still be taking its share over. [`led_by`] alone is met at once by a first node
/// that led every partition before the others joined.
async fn assignment_in_force(nodes: &[&Sluice], ids: &[&str]) -> Vec<Option<String>> {
    assignment_of_in_force(nodes, ids, PARTITIONS as usize).await
}

/// [`assignment_in_force`] on a cluster of `partitions` partitions.
async fn assignment_of_in_force(
    nodes: &[&Sluice],
    ids: &[&str],
    partitions: usize,
) -> Vec<Option<String>> {
    let share = partitions / ids.len();
    let started = Instant::now();
    loop {
        let mut views = Vec::new();
        for sluice in nodes {
            views.push(leaders(sluice).await);
        }
        let led = &views[0];
        let count = |id: &str| led.iter().filter(|l| l.as_deref() == Some(id)).count();
        let all_led = led
            .iter()
            .all(|l| l.as_deref().is_some_and(|l| ids.contains(&l)));
        if all_led
            && ids.iter().all(|id| count(id) >= share)
            && views.windows(2).all(|pair| pair[0] == pair[1])
        {
            return views.swap_remove(0);
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the assignment over {ids:?} never came into force: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every partition is led by one of `nodes`, as `sluice` sees it; how long it took.
async fn led_by(sluice: &Sluice, nodes: &[&str]) -> Duration {
    let started = Instant::now();
    loop {
        let now = leaders(sluice).await;
        if now
            .iter()
            .all(|leader| leader.as_deref().is_some_and(|l| nodes.contains(&l)))
        {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never led by {nodes:?}: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Three nodes on real brokers; one killed -9 while its partitions are busy: the survivors
/// lead every partition within the session timeout and a takeover (the failover time printed
/// and bounded), lose nothing acknowledged, and keep every object's state.
#[tokio::test]
async fn three_nodes_serve_every_call_and_lose_nothing_when_a_leader_dies() {
    const SENDS: usize = 90;
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let log = tempfile::tempdir().unwrap();
    let effects = log.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    let mut nodes = Vec::new();
    for id in ["n1", "n2", "n3"] {
        nodes.push(real_node(&bootstrap, id).start().await.unwrap());
    }
    // Registered on one node, known to all.
    nodes[0].register(&dep.uri, false).await;
    for sluice in &nodes {
        deployments(sluice, 1).await;
    }
    // Every node leads a share once the group settled, and each knows who leads what.
    assignment_in_force(&[&nodes[0], &nodes[1], &nodes[2]], &["n1", "n2", "n3"]).await;

    // Calls to objects through every node: each is forwarded to its partition's leader.
    for (i, sluice) in nodes.iter().enumerate() {
        for key in ["x", "y", "z", "w"] {
            let (status, body) = post(sluice, &format!("/Counter/{key}/add"), "1").await;
            assert_eq!(
                (status, body.as_str()),
                (200, (i + 1).to_string().as_str()),
                "{key} via node {i}"
            );
        }
    }
    // Sends through every node, each acknowledged once in the log.
    let mut acknowledged = Vec::new();
    for i in 0..SENDS {
        let sluice = &nodes[i % 3];
        let millis = 300 + (i % 10) * 100;
        let (status, body) = post(sluice, "/Meter/work/send", &millis.to_string()).await;
        assert_eq!(status, 202, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        acknowledged.push(body["invocationId"].as_str().unwrap().to_owned());
    }
    // Kill the first node while its partitions are busy.
    sluice_tests::until_done(&effects, SENDS / 10, "the sends never got going").await;
    let mut first = nodes.remove(0);
    first.kill_9();
    let killed = Instant::now();
    let before = effects_once_quiet(&effects, Duration::from_millis(500)).await;
    led_by(&nodes[0], &["n2", "n3"]).await;
    let failover = killed.elapsed();
    eprintln!("the survivors lead every partition {failover:?} after the kill");
    assert!(failover < Duration::from_secs(10), "{failover:?}");
    // The same view in SQL: every partition led by a survivor, this node led some.
    let (status, rows) = nodes[0]
        .query("SELECT partition, leader, epoch, led_here, lag FROM sys_cluster ORDER BY partition")
        .await;
    assert_eq!(status, 200, "{rows}");
    let rows = rows["rows"].as_array().unwrap();
    assert_eq!(rows.len(), PARTITIONS as usize, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r["leader"] == "n2" || r["leader"] == "n3"),
        "{rows:?}"
    );
    assert!(
        rows.iter().all(|r| r["epoch"].as_u64().unwrap() >= 1),
        "{rows:?}"
    );

    // Every acknowledged invocation completes, each side effect once (one under way at the
    // kill may run again), and both survivors see it in their stores.
    if let Err(finished) =
        sluice_tests::all_done(&effects, &acknowledged, Duration::from_secs(90)).await
    {
        let seen = effects_per_invocation(&effects);
        for id in acknowledged
            .iter()
            .filter(|id| seen.get(*id).is_none_or(|(_, done)| *done == 0))
            .take(5)
        {
            let (_, described) = nodes[0].describe(id).await;
            eprintln!("unfinished {id}: {described}");
        }
        panic!("{finished} of {SENDS} finished after the kill");
    }
    completed_on_every_node(&nodes, &acknowledged).await;
    // Settled: an attempt the kill cut off may still be finishing its side effect in the
    // deployment; the effects log stops growing once it did.
    let after = effects_once_quiet(&effects, Duration::from_millis(500)).await;
    let reruns = assert_once_but_in_flight(&acknowledged, &before, &after);
    eprintln!("{reruns} side effects under way at the kill ran again");
    // The objects kept their state, and calls go on through both survivors.
    for (i, sluice) in nodes.iter().enumerate() {
        for key in ["x", "y", "z", "w"] {
            let (status, body) = post(sluice, &format!("/Counter/{key}/add"), "1").await;
            assert_eq!(
                (status, body.as_str()),
                (200, (i + 4).to_string().as_str()),
                "{key} via survivor {i}"
            );
        }
    }
}

/// Sticky assignment on real brokers: when one of three nodes is killed, only the partitions
/// it led move (before: round-robin moved survivors' partitions too), and a node that joins
/// takes partitions to make its share while every other partition keeps its leader.
#[tokio::test]
async fn a_lost_node_moves_only_its_partitions_and_a_joining_one_takes_only_its_share() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let mut nodes = Vec::new();
    for id in ["n1", "n2", "n3"] {
        nodes.push(real_node(&bootstrap, id).start().await.unwrap());
    }
    let before = assignment_in_force(&[&nodes[0], &nodes[1], &nodes[2]], &["n1", "n2", "n3"]).await;
    let mut first = nodes.remove(0);
    first.kill_9();
    let after = assignment_in_force(&[&nodes[0], &nodes[1]], &["n2", "n3"]).await;
    eprintln!("leaders before the kill {before:?}, after {after:?}");
    for (p, (was, is)) in before.iter().zip(&after).enumerate() {
        if was.as_deref() != Some("n1") {
            assert_eq!(
                was, is,
                "partition {p} of a survivor moved: {before:?} -> {after:?}"
            );
        }
    }
    nodes.push(real_node(&bootstrap, "n4").start().await.unwrap());
    let joined = assignment_in_force(&[&nodes[0], &nodes[1], &nodes[2]], &["n2", "n3", "n4"]).await;
    eprintln!("leaders after n4 joined {joined:?}");
    let taken = joined.iter().filter(|l| l.as_deref() == Some("n4")).count();
    assert_eq!(
        taken,
        PARTITIONS as usize / 3,
        "n4 took its share: {joined:?}"
    );
    for (p, (was, is)) in after.iter().zip(&joined).enumerate() {
        if is.as_deref() != Some("n4") {
            assert_eq!(
                was, is,
                "partition {p} moved between survivors: {after:?} -> {joined:?}"
            );
        }
    }
}

/// A relay lasts no longer than its client: attaches forwarded to the leader whose clients
/// left are dropped there too, so they do not pile up against the leader's
/// `worker.max-waiters-per-invocation` (before, each held its wait until `attach-max-wait`).
/// Nodes n1 and n2 on real brokers at `bootstrap`, each with the setting `env`, `uri`
/// registered and the partitions spread over both; then a send of `Meter/work` with `body`
/// through n2. A fresh send lands on a partition the node it came to leads, so reads of it
/// through n1 are forwarded to n2. The nodes and the send's id.
async fn two_nodes_and_a_send_on_n2(
    bootstrap: &str,
    (key, value): (&str, &str),
    uri: &str,
    body: &'static str,
) -> (Vec<Sluice>, String) {
    let mut nodes = Vec::new();
    for id in ["n1", "n2"] {
        nodes.push(
            real_node(bootstrap, id)
                .env(key, value)
                .start()
                .await
                .unwrap(),
        );
    }
    nodes[0].register(uri, false).await;
    deployments(&nodes[1], 1).await;
    assignment_in_force(&[&nodes[0], &nodes[1]], &["n1", "n2"]).await;
    let sent = reqwest::Client::new()
        .post(format!("{}/Meter/work/send", nodes[1].ingress_url))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 202);
    let id = invocation_id(&sent.text().await.unwrap());
    (nodes, id)
}

#[tokio::test]
async fn a_forwarded_attach_whose_client_left_leaves_no_wait_at_the_leader() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let (nodes, id) = two_nodes_and_a_send_on_n2(
        &bootstrap,
        ("SERVICE_WORKER__MAX_WAITERS_PER_INVOCATION", "2"),
        &dep.uri,
        "8000",
    )
    .await;
    let attach = format!("{}/restate/invocation/{id}/attach", nodes[0].ingress_url);
    for round in 0..4 {
        // The client gives up after a moment; its relay must end with it.
        let gone = reqwest::Client::new()
            .get(&attach)
            .timeout(Duration::from_millis(500))
            .send()
            .await;
        assert!(
            gone.is_err(),
            "round {round}: answered before the work ended: {gone:?}"
        );
    }
    // Four clients came and went; the leader holds none of their waits, so a fifth waits
    // for the outcome rather than being refused SEC0008.
    let answer = reqwest::Client::new()
        .get(&attach)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let text = answer.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
}

/// A request another node forwards counts at the leader under its client's address (one
/// place per client connection), beside that address's own connections there: a client that
/// holds every place of its address at the leader is refused 429 `ING0012` with Retry-After
/// when it comes through another node, while another client of that node is served, and it
/// is served again once its connections to the leader close. Before, the leader counted only
/// the forwarding node's connections, so a client went past its address's cap there through
/// any other node.
#[tokio::test]
async fn a_forwarded_request_counts_under_its_clients_address_at_the_leader() {
    // Room for a peer's eight connections and the harness's own, all from 127.0.0.1.
    const CAP: usize = 16;
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let (nodes, id) = two_nodes_and_a_send_on_n2(
        &bootstrap,
        ("SERVICE_INGRESS__CONNECTIONS__MAX_PER_IP", &CAP.to_string()),
        &dep.uri,
        "1",
    )
    .await;
    nodes[1]
        .invocation_until(&id, "completed", |seen| seen["status"] == "completed")
        .await;
    let leader = nodes[1]
        .ingress_url
        .trim_start_matches("http://")
        .to_owned();
    let via = nodes[0]
        .ingress_url
        .trim_start_matches("http://")
        .to_owned();
    let attach_via_n1 = |from: [u8; 4]| {
        let (via, id) = (via.clone(), id.clone());
        async move {
            let mut stream = connect_from(from, &via).await.unwrap();
            let request =
                format!("GET /restate/invocation/{id}/attach HTTP/1.1\r\nhost: {via}\r\n\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
            head_within(&mut stream, Duration::from_secs(30))
                .await
                .expect("an answer")
                .to_ascii_lowercase()
        }
    };
    assert!(
        attach_via_n1([127, 0, 0, 2])
            .await
            .starts_with("http/1.1 200"),
        "client A through n1 before it holds anything at n2"
    );
    // Client A (127.0.0.2) takes every place of its address at n2, each connection answered
    // once so the place is surely held.
    let mut held = Vec::new();
    for _ in 0..CAP {
        let mut stream = connect_from([127, 0, 0, 2], &leader).await.unwrap();
        let health = format!("GET /restate/health HTTP/1.1\r\nhost: {leader}\r\n\r\n");
        stream.write_all(health.as_bytes()).await.unwrap();
        assert_eq!(
            status_within(&mut stream, Duration::from_secs(30)).await,
            Some(200)
        );
        held.push(stream);
    }
    let refused = attach_via_n1([127, 0, 0, 2]).await;
    assert!(refused.starts_with("http/1.1 429"), "{refused}");
    assert!(
        refused.contains("x-service-error-code: ing0012"),
        "{refused}"
    );
    assert!(refused.contains("retry-after: 1"), "{refused}");
    // Another client of n1 is served: the forwarding node's address is not what counts.
    let other = attach_via_n1([127, 0, 0, 3]).await;
    assert!(other.starts_with("http/1.1 200"), "{other}");
    // A's connections to n2 close, and its places come back.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let again = attach_via_n1([127, 0, 0, 2]).await;
        if again.starts_with("http/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A's places never came back: {again}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a client of a rolling restart saw: each send's id when acknowledged, and every
/// answer that was not an acknowledgement.
#[derive(Default)]
struct Seen {
    acknowledged: Vec<String>,
    refused: Vec<String>,
    unanswered: Vec<String>,
}

/// Sends one send after another through the nodes whose ingress is in `up` (as a load
/// balancer does, leaving out a node while it restarts), until `stop` is set.
async fn steady_sends(
    up: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Seen {
    sends(up, stop, 1, "50", Duration::from_millis(10)).await
}

/// Every node of three restarted in turn (SIGTERM, then started again on its store) under a
/// steady stream of sends: every send is acknowledged or refused with a code and `Retry-After`,
/// and every acknowledged one runs to completion, its side effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_nothing_and_answers_every_send() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let log = tempfile::tempdir().unwrap();
    let effects = log.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    let ids = ["n1", "n2", "n3"];
    let mut nodes = Vec::new();
    for id in ids {
        nodes.push(real_node(&bootstrap, id).start().await.unwrap());
    }
    nodes[0].register(&dep.uri, false).await;
    for sluice in &nodes {
        deployments(sluice, 1).await;
    }
    assignment_in_force(&[&nodes[0], &nodes[1], &nodes[2]], &ids).await;
    let up = std::sync::Arc::new(std::sync::Mutex::new(
        nodes
            .iter()
            .map(|n| n.ingress_url.clone())
            .collect::<Vec<_>>(),
    ));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = tokio::spawn(steady_sends(up.clone(), stop.clone()));
    sluice_tests::until_done(&effects, 20, "the sends never got going").await;
    for i in 0..nodes.len() {
        // Out of the balancer, then drained and stopped.
        up.lock().unwrap().retain(|u| *u != nodes[i].ingress_url);
        nodes[i].signal(nix::sys::signal::Signal::SIGTERM).unwrap();
        let finished = nodes[i].wait_exit(Duration::from_secs(60)).unwrap();
        assert!(
            finished.status.success(),
            "{} stopped with {}; it said:\n{}",
            ids[i],
            finished.status,
            finished.stderr
        );
        let restarted = nodes[i].restart(real_node(&bootstrap, ids[i])).await;
        nodes[i] = restarted;
        deployments(&nodes[i], 1).await;
        assignment_in_force(&[&nodes[0], &nodes[1], &nodes[2]], &ids).await;
        up.lock().unwrap().push(nodes[i].ingress_url.clone());
        eprintln!("{} restarted", ids[i]);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = load.await.unwrap();
    eprintln!(
        "{} sends acknowledged, {} refused with a code through the rolling restart",
        seen.acknowledged.len(),
        seen.refused.len()
    );
    for line in seen.refused.iter().take(5) {
        eprintln!("refused: {line}");
    }
    assert!(
        seen.unanswered.is_empty(),
        "not answered with a code: {:?}",
        seen.unanswered
    );
    if let Err(finished) =
        sluice_tests::all_done(&effects, &seen.acknowledged, Duration::from_secs(90)).await
    {
        panic!(
            "{finished} of {} acknowledged sends finished",
            seen.acknowledged.len()
        );
    }
    let after = effects_once_quiet(&effects, Duration::from_millis(500)).await;
    for id in &seen.acknowledged {
        let done = after.get(id).map_or(0, |(_, done)| *done);
        assert!(done >= 1, "{id} never finished");
    }
}

/// The partition of `Counter/{key}`.
fn counter_partition(key: &str) -> usize {
    (sluice_store::invocation::identity::partition_key(&["Counter", key]) % PARTITIONS as u64)
        as usize
}

/// The log end and the reader's position of partition `p` as `sluice` sees it, once its log
/// end has reached `end` (the log's end is asked for every 2 s).
async fn read_and_end(sluice: &Sluice, p: usize, end: i64) -> (i64, i64) {
    let what = format!("the log's end reaching {end}");
    let partitions = partitions_until(sluice, &what, |ps| {
        ps[p]["log_end"].as_i64().is_some_and(|e| e >= end)
    })
    .await;
    let part = &partitions[p];
    assert_eq!(part["led_here"], true, "{part}");
    (
        part["read_offset"].as_i64().unwrap(),
        part["log_end"].as_i64().unwrap(),
    )
}

#[tokio::test]
async fn a_zombie_leader_cannot_commit_anything() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut zombie = real_node(&bootstrap, "n1").start().await.unwrap();
    zombie.register(&dep.uri, false).await;
    let survivor = real_node(&bootstrap, "n2").start().await.unwrap();
    deployments(&survivor, 1).await;
    // An object on a partition the first node leads, picked once the assignment is in force:
    // a pick made while the second node was still taking its half over could land on a
    // partition about to move to it.
    let led = assignment_in_force(&[&zombie, &survivor], &["n1", "n2"]).await;
    let key = (0..64)
        .map(|i| format!("z{i}"))
        .find(|k| led[counter_partition(k)].as_deref() == Some("n1"))
        .unwrap_or_else(|| panic!("no key of z0..z63 on the first node's partitions: {led:?}"));
    let (status, body) = post(&zombie, &format!("/Counter/{key}/add"), "1").await;
    assert_eq!((status, body.as_str()), (200, "1"));

    // A leader does not read its own records back: its reader stays where the takeover left
    // it while the leader's records grow the log past it.
    let p = counter_partition(&key);
    let (read, end) = read_and_end(&zombie, p, 0).await;
    for _ in 0..3 {
        let (status, _) = post(&zombie, &format!("/Counter/{key}/get"), "").await;
        assert_eq!(status, 200);
    }
    let (read_later, end_later) = read_and_end(&zombie, p, end + 3).await;
    assert_eq!(
        read_later, read,
        "the leader read its own records (log end {end} then {end_later})"
    );
    assert!(read < end_later, "{read} {end_later}");

    // Frozen: the group gives its partitions to the survivor, which appends a new epoch.
    zombie.signal(nix::sys::signal::Signal::SIGSTOP).unwrap();
    led_by(&survivor, &["n2"]).await;
    let (status, body) = post(&survivor, &format!("/Counter/{key}/add"), "1").await;
    assert_eq!((status, body.as_str()), (200, "2"));

    // Thawed, it may still believe it leads: a write through it must not count as its own.
    // Either it writes and is fenced (the record lands past the survivor's epoch: CLU0001),
    // or the survivor's announcement on the epochs topic reached it first: it stepped down
    // and forwarded the write to the survivor, where it counts once.
    zombie.signal(nix::sys::signal::Signal::SIGCONT).unwrap();
    let answer = reqwest::Client::new()
        .post(format!("{}/Counter/{key}/add", zombie.ingress_url))
        .header("content-type", "application/json")
        .body("100")
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    let body = answer.text().await.unwrap();
    let counted = if status == 200 {
        assert_eq!(body, "102", "forwarded to the survivor, counted there once");
        eprintln!("the zombie learnt of the new leader first and forwarded the write");
        100
    } else {
        assert!(body.contains("CLU0001") || status >= 500, "{status} {body}");
        eprintln!("the zombie wrote and was fenced: {status} {body}");
        0
    };
    // Nothing of its own counts anywhere: the survivor's state goes on, and the zombie, once
    // it has stepped down, reads the same through the log.
    let want = (3 + counted).to_string();
    let (status, body) = post(&survivor, &format!("/Counter/{key}/add"), "1").await;
    assert_eq!((status, body.as_str()), (200, want.as_str()));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = post(&zombie, &format!("/Counter/{key}/get"), "").await;
        if (status, body.as_str()) == (200, want.as_str()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old leader reads {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        zombie.stderr().contains("stopped leading the partition"),
        "{}",
        zombie.stderr()
    );
    // Stepped down, it follows the partition again: its reader reads on past its own records
    // (and past its next epoch record, when the group gives the partition back to it).
    partitions_until(
        &zombie,
        "the old leader reading its partition again",
        |ps| ps[p]["read_offset"].as_i64().is_some_and(|r| r > end_later),
    )
    .await;
}

/// Runs `calls` scoped `Meter/hold` calls of 400 ms at once, spread over `nodes`; answers the
/// most that ran at once in the deployment.
async fn scoped_peak(nodes: &[&Sluice], calls: usize) -> u64 {
    let client = reqwest::Client::new();
    let running: Vec<_> = (0..calls)
        .map(|i| {
            let request = client
                .post(format!(
                    "{}/service/scope/acme/call/Meter/hold",
                    nodes[i % nodes.len()].ingress_url
                ))
                .header("content-type", "application/json")
                .body("400");
            tokio::spawn(async move {
                let resp = request.send().await.expect("the call answers");
                (
                    resp.status().as_u16(),
                    resp.text().await.unwrap_or_default(),
                )
            })
        })
        .collect();
    for call in running {
        let (status, body) = call.await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    sluice_tests::peak(&nodes[0].ingress_url).await
}

#[tokio::test]
async fn a_scope_limit_holds_across_nodes_before_during_and_after_a_failover() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut nodes = Vec::new();
    for id in ["n1", "n2", "n3"] {
        nodes.push(real_node(&bootstrap, id).start().await.unwrap());
    }
    nodes[0].register(&dep.uri, false).await;
    nodes[0]
        .set_rules(serde_json::json!([{"pattern": "acme", "limits": {"concurrency": 2}}]))
        .await;
    for sluice in &nodes {
        deployments(sluice, 1).await;
    }
    // Settled: the group has given every node its share (n1 led everything until the others
    // joined; a call forwarded while a partition moves is refused with CLU0001), and every
    // node has read who leads what: a node that still believes an old leader forwards to it,
    // and the old leader refuses what was forwarded once (CLU0001).
    spread_over(&nodes[0], &["n1", "n2", "n3"]).await;
    agreed_on_leaders(&nodes).await;
    // The rule reached every node (the meta topic), and scoped calls from all three meet at
    // the scope's partition: at most two run at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    for sluice in &nodes {
        loop {
            let (_, rules) = sluice.get_admin("/limits/rules").await;
            if rules.to_string().contains("acme") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no rule on {}: {rules}",
                sluice.admin_url
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let all: Vec<&Sluice> = nodes.iter().collect();
    let peak = scoped_peak(&all, 12).await;
    assert_eq!(peak, 2, "before the failover");

    // Kill whichever node leads the scope's partition; the limit holds on the survivors.
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/service/scope/acme/call/Meter/hold",
            nodes[0].ingress_url
        ))
        .header("content-type", "application/json")
        .body("1")
        .send()
        .await
        .unwrap();
    let id: sluice_core::ids::InvocationId = resp.headers()["x-service-id"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let partition = (id.partition_key() % PARTITIONS as u64) as usize;
    let leader = leaders(&nodes[0]).await[partition].clone().unwrap();
    let index = ["n1", "n2", "n3"]
        .iter()
        .position(|n| *n == leader)
        .unwrap();
    let mut killed = nodes.remove(index);
    let alive: Vec<&str> = ["n1", "n2", "n3"]
        .into_iter()
        .filter(|n| *n != leader)
        .collect();
    // During the failover: scoped calls keep coming through the survivors (refused or cut
    // while nobody leads the scope's partition); the deployment's peak is read at the end.
    let urls: Vec<String> = nodes.iter().map(|n| n.ingress_url.clone()).collect();
    sluice_tests::peak(&urls[0]).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..6)
        .map(|worker| {
            let url = urls[worker % urls.len()].clone();
            let stop = std::sync::Arc::clone(&stop);
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut served = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let answer = client
                        .post(format!("{url}/service/scope/acme/call/Meter/hold"))
                        .header("content-type", "application/json")
                        .body("200")
                        .send()
                        .await;
                    match answer {
                        Ok(resp) if resp.status() == 200 => served += 1,
                        _ => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
                served
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    killed.kill_9();
    led_by(&nodes[0], &alive).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut served = 0;
    for worker in load {
        served += worker.await.unwrap();
    }
    let peak = sluice_tests::peak(&urls[0]).await;
    eprintln!("{served} scoped calls served across the failover, peak {peak}");
    assert!(served > 0);
    assert!(peak <= 2, "during the failover: {peak}");
    let survivors: Vec<&Sluice> = nodes.iter().collect();
    let peak = scoped_peak(&survivors, 12).await;
    assert_eq!(peak, 2, "after the failover");
}

#[tokio::test]
async fn handlers_call_objects_led_by_other_nodes() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut nodes = Vec::new();
    for id in ["n1", "n2"] {
        nodes.push(real_node(&bootstrap, id).start().await.unwrap());
    }
    nodes[0].register(&dep.uri, false).await;
    deployments(&nodes[1], 1).await;
    // Every call below must find its partitions' leaders settled: one made while the second
    // node still took its share over is answered CLU0001, to be retried.
    assignment_in_force(&[&nodes[0], &nodes[1]], &["n1", "n2"]).await;
    // A caller on one node, its callee's object on any partition: the child invocation and
    // its result travel through the inboxes.
    for round in 1..=2 {
        for (i, sluice) in nodes.iter().enumerate() {
            for key in ["p", "q", "r", "s", "t"] {
                let (status, body) = post(sluice, "/Greeter/addVia", &format!("\"{key}\"")).await;
                let want = (round - 1) * 2 + i + 1;
                assert_eq!(
                    (status, body.as_str()),
                    (200, want.to_string().as_str()),
                    "{key} via node {i}"
                );
            }
        }
    }

    // An operator's kill, sent to the node that does not lead the caller, reaches its leader
    // (the admin API forwards it), and the kill goes on to the child through its inbox.
    let (status, body) = post(&nodes[0], "/Meter/callSlow/send", "30000").await;
    assert_eq!(status, 202, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    let parent = body["invocationId"].as_str().unwrap().to_owned();
    let other = &nodes[1];
    let deadline = Instant::now() + Duration::from_secs(20);
    // The child: the one Greeter/slow this parent called (the replica may still show earlier
    // calls running for a moment, so it is picked by target and caller).
    let child = loop {
        let (_, rows) = other
            .query(&format!(
                "SELECT id FROM sys_invocation WHERE target = 'Greeter/slow' AND invoked_by_id = '{parent}'"
            ))
            .await;
        if let Some(first) = rows["rows"].as_array().and_then(|a| a.first()) {
            break first["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "the child never ran: {rows}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let killed = reqwest::Client::new()
        .patch(format!("{}/invocations/{parent}/kill", other.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status(), 200, "{}", killed.text().await.unwrap());
    for id in [&parent, &child] {
        let seen = other
            .invocation_until(id, "killed", |v| v["status"] == "completed")
            .await;
        assert!(seen["completion"].to_string().contains("killed"), "{seen}");
    }
}

/// Polls `path` on `sluice`'s admin API until its answer contains `needle`; how long it took.
/// `give_up` only guards against a hang: what the test promises, it asserts on the answer.
async fn admin_shows(sluice: &Sluice, path: &str, needle: &str, give_up: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let (_, body) = sluice.get_admin(path).await;
        if body.to_string().contains(needle) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < give_up,
            "{path} never showed {needle}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn metadata_made_on_one_node_reaches_every_node_within_a_second() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let a = real_node(&bootstrap, "n1").start().await.unwrap();
    let b = real_node(&bootstrap, "n2").start().await.unwrap();
    // A deployment registered on the second node, a rule and a plugin on the first.
    b.register(&dep.uri, false).await;
    let seen = admin_shows(&a, "/deployments", &dep.uri, Duration::from_secs(10)).await;
    eprintln!("deployment: {seen:?}");
    assert!(seen < Duration::from_secs(1), "{seen:?}");
    a.set_rules(serde_json::json!([{"pattern": "gold", "limits": {"concurrency": 3}}]))
        .await;
    let seen = admin_shows(&b, "/limits/rules", "gold", Duration::from_secs(10)).await;
    eprintln!("rule: {seen:?}");
    assert!(seen < Duration::from_secs(1), "{seen:?}");
    // A weight override set on the second node travels with the rule book.
    let set = b
        .admin(reqwest::Method::PUT, "/limits/weights")
        .json(&serde_json::json!([{"counter": "gold/vip", "weight": 7}]))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    let seen = admin_shows(&a, "/limits/weights", "gold/vip", Duration::from_secs(10)).await;
    eprintln!("weight override: {seen:?}");
    assert!(seen < Duration::from_secs(1), "{seen:?}");
    // A bulk cancel asked of the first node cancels on the partitions the second leads too,
    // and its record reaches the second node.
    for n in 0..24 {
        let (status, body) = post(
            &a,
            "/service/send/Greeter/greet?delay=10m",
            &format!("\"d{n}\""),
        )
        .await;
        assert_eq!(status, 202, "{body}");
    }
    let cancel = a
        .admin(reqwest::Method::POST, "/invocations/bulk-cancel")
        .json(&serde_json::json!({"service": "Greeter", "handler": "greet", "statuses": ["scheduled"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 200);
    let cancel: serde_json::Value = cancel.json().await.unwrap();
    assert_eq!(cancel["cancelled"], 24, "{cancel}");
    // Every partition answered, by whichever node led it.
    let partitions = cancel["partitions"].as_object().unwrap().len();
    assert_eq!(partitions, PARTITIONS as usize, "{cancel}");
    let canceled = a
        .count("SELECT count(*) AS n FROM sys_invocation WHERE completion_result LIKE '%FLO0006%'")
        .await;
    assert_eq!(canceled, 24);
    let id = cancel["id"].as_str().unwrap().to_owned();
    let asked = Instant::now();
    loop {
        let (_, rows) = b
            .query_local("SELECT id, state, cancelled FROM sys_bulk_cancels")
            .await;
        if rows["rows"][0]["id"] == id.as_str() {
            assert_eq!(rows["rows"][0]["state"], "done", "{rows}");
            break;
        }
        assert!(asked.elapsed() < Duration::from_secs(1), "{rows}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("bulk cancel record: {:?}", asked.elapsed());
    let bytes = std::fs::read(sluice_tests::plugin_wasm("tenant-header")).unwrap();
    let put = Instant::now();
    let (status, loaded) = sluice_tests::put_plugin(
        &a,
        "tenants",
        bytes,
        "hook=extract&deadline=1s&config.scope-header=x-tenant",
    )
    .await;
    assert_eq!(status, 200, "{loaded}");
    // Each node compiles the component itself (slow in a debug build, and slower on a busy
    // box): from the first's answer, the second gets a second beyond its own compile, which it
    // logs (before, the first's compile stood in for the second's).
    let load = put.elapsed();
    // The second node compiles the component before it shows it: in a debug build on a box
    // whose cores are all busy that alone took over 10 s, so only a hang ends this wait.
    let seen = admin_shows(&b, "/plugins", "tenants", Duration::from_secs(120)).await;
    // A plugin is in force (listed) a moment before its load is logged: await the line. Only
    // a hang ends this wait.
    let logged = Instant::now();
    let compile_ms: u64 = loop {
        let stderr = b.stderr();
        let logged_ms = stderr
            .lines()
            .filter(|l| l.contains("plugin loaded") && l.contains("tenants"))
            .filter_map(|l| {
                l.split("compile_ms=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .next_back();
        if let Some(ms) = logged_ms {
            break ms;
        }
        assert!(
            logged.elapsed() < Duration::from_secs(30),
            "n2 logged no compile of the plugin:\n{stderr}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let compile = Duration::from_millis(compile_ms);
    eprintln!("plugin: {seen:?} after a load of {load:?}; n2 compiled it in {compile:?}");
    assert!(seen < compile + Duration::from_secs(1), "{seen:?}");
    // And gone everywhere once unloaded.
    let unloaded = reqwest::Client::new()
        .delete(format!("{}/plugins/tenants", b.admin_url))
        .send()
        .await
        .unwrap();
    assert!(unloaded.status().is_success());
    let started = Instant::now();
    loop {
        let (_, body) = get_json(&format!("{}/plugins", a.admin_url)).await;
        if !body.to_string().contains("tenants") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(1), "{body}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("plugin unloaded everywhere after {:?}", started.elapsed());
}

/// A Python plugin (18 MiB, CPython inside) is larger than one record of the meta topic
/// (`cluster.max-record-bytes`, 8 MiB by default): it goes out as chunks, and a node that
/// joins afterwards reads them back from the topic, puts the plugin together and runs it.
#[tokio::test]
async fn a_plugin_larger_than_a_record_reaches_a_node_that_joins_later() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let a = real_node(&bootstrap, "n1").start().await.unwrap();
    a.register(&dep.uri, false).await;
    let bytes = std::fs::read(sluice_tests::python_plugin_wasm("tenant_header")).unwrap();
    assert!(bytes.len() > 8 << 20, "{} bytes", bytes.len());
    let (status, loaded) = sluice_tests::put_plugin(
        &a,
        "tenants",
        bytes,
        "hook=extract&deadline=1s&config.require=true",
    )
    .await;
    assert_eq!(status, 200, "{loaded}");
    let sha256 = loaded["sha256"].as_str().unwrap().to_owned();

    let c = real_node(&bootstrap, "n3").start().await.unwrap();
    // It compiles the plugin before it shows it: only a hang ends this wait.
    admin_shows(&c, "/plugins", &sha256, Duration::from_secs(120)).await;
    // And runs it: a call without the tenant header is refused by the plugin on its ingress.
    let (status, _, body) = sluice_tests::greet(&c, &[]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("missing tenant header 'x-tenant'"), "{body}");
    let (status, _, body) = sluice_tests::greet(&c, &[("x-tenant", "acme")]).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_subscription_made_on_one_node_runs_on_every_node() {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    const RECORDS: u64 = 40;
    let kafka = KafkaCluster::start(3);
    kafka.create_topic("orders", 4, &[]).await;
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let a = real_node(&bootstrap, "n1").start().await.unwrap();
    let b = real_node(&bootstrap, "n2").start().await.unwrap();
    a.register(&dep.uri, false).await;
    deployments(&b, 1).await;
    led_by(&a, &["n1", "n2"]).await;
    let (status, body) = sluice_tests::post_json(
        &format!("{}/kafka-clusters", a.admin_url),
        serde_json::json!({"name": "shop", "properties": {"bootstrap.servers": bootstrap}}),
    )
    .await;
    assert!(status < 300, "{status} {body}");
    let (status, sub) = sluice_tests::post_json(
        &format!("{}/subscriptions", a.admin_url),
        serde_json::json!({"source": "kafka://shop/orders", "sink": "service://Greeter/greet"}),
    )
    .await;
    assert_eq!(status, 201, "{sub}");
    admin_shows(
        &b,
        "/subscriptions",
        "kafka://shop/orders",
        Duration::from_secs(10),
    )
    .await;
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for i in 0..RECORDS {
        producer
            .send(
                FutureRecord::to("orders")
                    .key(&format!("k{i}"))
                    .payload(&format!("\"r{i}\"")),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    // Each record becomes one invocation, whichever node consumed it and wherever its
    // partition is led; both replicas see them all completed.
    for (name, sluice) in [("n1", &a), ("n2", &b)] {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let done = sluice
                .count_local("SELECT count(*) AS n FROM sys_invocation WHERE target_service_name = 'Greeter' AND status = 'completed'")
                .await;
            if done == RECORDS {
                break;
            }
            assert!(done < RECORDS, "{done} invocations for {RECORDS} records");
            if Instant::now() >= deadline {
                let (_, rest) = sluice
                    .query_local("SELECT id, status, created_at FROM sys_invocation WHERE target_service_name = 'Greeter' AND status <> 'completed'")
                    .await;
                let (_, ran) = sluice
                    .query_local(
                        "SELECT id FROM sys_invocation WHERE target_service_name = 'Greeter'",
                    )
                    .await;
                let (_, other) = if name == "n1" { &b } else { &a }
                    .query_local("SELECT id, status FROM sys_invocation WHERE target_service_name = 'Greeter'")
                    .await;
                let (_, health) = sluice.get_admin("/cluster-health").await;
                panic!(
                    "{done} of {RECORDS} records ran on {name}; not completed: {rest}; all: {ran}; the other node: {other}; health: {health}\n{}\n{}",
                    a.stderr(),
                    b.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Polls `sluice`'s `/cluster-health` until `done` holds for its partitions; them.
async fn partitions_until(
    sluice: &Sluice,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, health) = sluice.get_admin("/cluster-health").await;
        let partitions = health["sluice_cluster"]["partitions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if done(&partitions) {
            return partitions;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never happened: {health}\n{}",
            sluice.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_node_that_missed_deleted_records_never_leads_and_says_so() {
    let broker = broker();
    let bootstrap = broker.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut first = node(&bootstrap, "n1").start().await.unwrap();
    first.register(&dep.uri, false).await;
    // The mock brokers keep the last 5 MiB of each partition: 48 sends of 1 MB (each stored
    // twice: the input, then the output that echoes it) push the first records out of every
    // partition, as a topic's retention would.
    let big = format!("\"{}\"", "x".repeat(1_000_000));
    for _ in 0..48 {
        let (status, body) = post(&first, "/Greeter/greet/send", &big).await;
        assert_eq!(status, 202, "{body}");
        // One at a time, each completed (read back) before the next: the node that writes
        // must itself read every record before the brokers drop it, however busy the box.
        let id: Value = serde_json::from_str(&body).unwrap();
        first
            .invocation_until(id["invocationId"].as_str().unwrap(), "completed", |v| {
                v["status"] == "completed"
            })
            .await;
    }
    let (status, _) = get_json(&format!("{}/health", first.admin_url)).await;
    assert_eq!(status, 200, "the node that read everything is healthy");

    // A fresh node cannot rebuild what was deleted: it says so, and never serves it stale.
    let second = node(&bootstrap, "n2").start().await.unwrap();
    let broken = partitions_until(&second, "a broken partition", |ps| {
        ps.iter().any(|p| p["broken"].is_string())
    })
    .await;
    let broken: Vec<u64> = broken
        .iter()
        .filter(|p| p["broken"].is_string())
        .map(|p| p["partition"].as_u64().unwrap())
        .collect();
    let (status, health) = get_json(&format!("{}/health", second.admin_url)).await;
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["restate_code"], "CLU0004", "{health}");
    let (status, ready) = get_json(&format!("{}/ready", second.admin_url)).await;
    assert_eq!(
        (status, &ready["restate_code"]),
        (503, &Value::from("CLU0004"))
    );
    // More partitions may break meanwhile (they are read a few seconds apart under load).
    let metrics = second.metrics().await;
    let counted = metrics["sluice_cluster_partitions_broken"];
    assert!(
        counted >= broken.len() as f64 && counted <= f64::from(PARTITIONS as u32),
        "{counted} broken partitions in /metrics, {} before",
        broken.len()
    );

    // With the first node gone the group gives the second every partition: it leads none of
    // those it could not follow (before this, it led them from an empty store at epoch 1).
    first.kill_9();
    let deadline = Instant::now() + Duration::from_secs(30);
    while second.stderr().matches("but it will not lead it").count() < broken.len() {
        assert!(
            Instant::now() < deadline,
            "n2 never refused the broken partitions {broken:?}: {}",
            second.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = partitions_until(&second, "the refusals seen", |_| true).await;
    for p in now
        .iter()
        .filter(|p| broken.contains(&p["partition"].as_u64().unwrap()))
    {
        assert_eq!(p["led_here"], false, "{p}");
    }
}

#[tokio::test]
async fn values_too_large_for_a_record_fail_their_call_never_the_partition() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    // 1 MiB records: one value may be a quarter, less 64 KiB (192 KiB).
    let sluice = real_node(&bootstrap, "n1")
        .env("SERVICE_CLUSTER__MAX_RECORD_BYTES", "1MiB")
        .env("SERVICE_INGRESS__AWAKEABLE_PAYLOAD_LIMIT", "64KiB")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let too_large = 300_000;

    // The door refuses a body that could not be stored (the default is the value limit).
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{}/Greeter/greet", sluice.ingress_url))
        .header("content-type", "application/json")
        .body(format!("\"{}\"", "x".repeat(too_large)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);

    // A handler's large output, a large call it makes, and a large result it is sent each fail
    // the invocation that made them, terminally and with the code, at once.
    for (path, expected) in [
        ("/Meter/inflate", "CLU0005"),
        ("/Meter/callInflated", "CLU0005"),
        ("/Meter/inflateVia", "CLU0005"),
    ] {
        let started = Instant::now();
        let (status, body) = loop {
            let resp = client
                .post(format!("{}{path}", sluice.ingress_url))
                .header("content-type", "application/json")
                .body(too_large.to_string())
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            // 503 only until the partitions are taken over after start-up.
            if status != 503 || started.elapsed() > Duration::from_secs(10) {
                break (status, resp.text().await.unwrap());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(status, 500, "{path}: {body}");
        assert!(body.contains(expected), "{path}: {body}");
        assert!(started.elapsed() < Duration::from_secs(10), "{path}");
    }
    // Values that fit still go through, and the partitions never changed hands.
    let (status, body) = post(&sluice, "/Meter/inflateVia", "150000").await;
    assert_eq!((status, body.as_str()), (200, "\"150000\""));
    let (status, body) = post(&sluice, "/Counter/k/add", "2").await;
    assert_eq!((status, body.as_str()), (200, "2"));
    let stderr = sluice.stderr();
    assert!(
        !stderr.contains("stopped leading the partition"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("took the partition over").count(),
        PARTITIONS as usize
    );
}

#[tokio::test]
async fn a_real_broker_killed_under_load_loses_nothing_acknowledged() {
    const SENDS: usize = 120;
    let mut kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let log = tempfile::tempdir().unwrap();
    let effects = log.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    // The nodes create the topics (replicated 3 times; the brokers hold min.insync.replicas = 2).
    let nodes = cluster_of(
        vec![
            ("n1", real_node(&bootstrap, "n1")),
            ("n2", real_node(&bootstrap, "n2")),
        ],
        &dep.uri,
    )
    .await;
    // Sends through both nodes; a third of the way in, the broker leading the log's first
    // partition dies. A send answered 202 is acknowledged; one answered 5xx is tried again
    // with its idempotency key until it is answered (`post`).
    let mut acknowledged = Vec::new();
    let mut killed = None;
    for i in 0..SENDS {
        if i == SENDS / 3 {
            let leader = kafka.leader_of("sluice.log", 0);
            kafka.kill_9(leader);
            killed = Some((leader, Instant::now()));
        }
        let sluice = &nodes[i % 2];
        let millis = 100 + (i % 5) * 50;
        let (status, body) = post(sluice, "/Meter/work/send", &millis.to_string()).await;
        assert_eq!(status, 202, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        acknowledged.push(body["invocationId"].as_str().unwrap().to_owned());
    }
    let (leader, at) = killed.expect("a broker was killed");
    eprintln!(
        "{} sends acknowledged after broker {} died {:?} ago",
        SENDS - SENDS / 3,
        leader + 1,
        at.elapsed()
    );
    // Every acknowledged send completes, on both nodes' stores. No node died, but a leader
    // whose record Kafka refused while it elected steps down and the partition is recovered
    // from the log: an attempt it cut off runs again from its journal, as often as leadership
    // moved under it (under load, more than once).
    let reruns = nothing_acknowledged_lost(&nodes, &effects, &acknowledged).await;
    eprintln!("{reruns} side effects ran again (attempts cut off by a step-down)");
    // The broker comes back; the cluster goes on with all three.
    kafka.restart(leader);
    let (status, body) = post(&nodes[1], "/Counter/after/add", "1").await;
    assert_eq!((status, body.as_str()), (200, "1"));
    // A node whose session timeout the brokers would refuse (past their 30 min maximum) could
    // never join the group that assigns partitions: it stops, saying which settings disagree.
    let refused = real_node(&bootstrap, "n3")
        .env("SERVICE_CLUSTER__SESSION_TIMEOUT", "1860s")
        .run_to_exit()
        .unwrap();
    assert_stopped_saying(
        &refused,
        &[
            "[CLU0002] cluster.session-timeout is 1860000 ms",
            "group.max.session.timeout.ms",
        ],
    );
}

/// Every send of `acknowledged` completes (in the deployment's side effects, and on every
/// node's store), and what the journals hold never ran again; how many side effects did
/// ([`journal_held`]).
async fn nothing_acknowledged_lost(
    nodes: &[Sluice],
    effects: &std::path::Path,
    acknowledged: &[String],
) -> u32 {
    if let Err(finished) =
        sluice_tests::all_done(effects, acknowledged, Duration::from_secs(90)).await
    {
        panic!(
            "{finished} of {} acknowledged sends finished; n1 said:\n{}",
            acknowledged.len(),
            nodes[0].stderr()
        );
    }
    completed_on_every_node(nodes, acknowledged).await;
    journal_held(effects).await
}

/// What the journal holds never runs again: once an invocation's `done` ran, its `run`
/// (journaled before `done` began) does not. Read once the side effects went quiet (no attempt
/// still running); how many side effects ran more than once (attempts cut off mid-way).
async fn journal_held(effects: &std::path::Path) -> u32 {
    effects_once_quiet(effects, Duration::from_millis(500)).await;
    let log = std::fs::read_to_string(effects).unwrap();
    let mut done = std::collections::HashSet::new();
    let mut reruns = 0;
    let mut seen_run = std::collections::HashSet::new();
    for line in log.lines() {
        let first = match line.split_once(' ') {
            Some(("done", id)) => done.insert(id),
            Some(("run", id)) => {
                assert!(
                    !done.contains(id),
                    "{id}: its journaled `run` ran again after its `done` had run"
                );
                seen_run.insert(id)
            }
            _ => true,
        };
        reruns += u32::from(!first);
    }
    reruns
}

/// Sends `path` once through `sluice` with idempotency key `key`: its status, body and how
/// long the answer took (a transport error is status 0).
/// What [`send_once`] got back.
struct Sent {
    status: u16,
    body: String,
    took: Duration,
    retry_after: Option<String>,
}

impl Sent {
    /// One line saying what came back, and when.
    fn line(&self) -> String {
        format!(
            "{} after {:?} (retry-after {:?}): {}",
            self.status, self.took, self.retry_after, self.body
        )
    }

    /// A 503 with `CLU0001` that says when to try again.
    fn refused_clu0001(&self) -> bool {
        self.status == 503
            && self.body.contains("\"error_code\":\"CLU0001\"")
            && self.retry_after.is_some()
    }
}

async fn send_once(sluice: &Sluice, path: &str, body: &str, key: &str) -> Sent {
    let started = Instant::now();
    let sent = reqwest::Client::new()
        .post(format!("{}{path}", sluice.ingress_url))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .timeout(Duration::from_secs(120))
        .send()
        .await;
    match sent {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            Sent {
                status,
                body: resp.text().await.unwrap_or_default(),
                took: started.elapsed(),
                retry_after,
            }
        }
        Err(e) => Sent {
            status: 0,
            body: e.to_string(),
            took: started.elapsed(),
            retry_after: None,
        },
    }
}

/// Two of three brokers down leaves the log's partitions below `min.insync.replicas` (and, the
/// brokers being KRaft controllers too, without a controller quorum): no record can be stored,
/// so no call is acknowledged; each is refused with `CLU0001` once `cluster.write-timeout`
/// passed. When one broker returns, service resumes, and the refused calls, sent again with
/// their idempotency keys, run once (a refused call's record may have landed after all).
#[tokio::test]
async fn below_min_insync_replicas_calls_are_refused_with_a_code_and_resume_when_a_broker_returns()
{
    const DOWN_SENDS: usize = 6;
    let mut kafka = KafkaCluster::start(3);
    let log = tempfile::tempdir().unwrap();
    let effects = log.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    let sluice = real_node(&kafka.bootstrap_servers(), "n1")
        .env("SERVICE_CLUSTER__WRITE_TIMEOUT", "5s")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let (status, body) = post(&sluice, "/Counter/before/add", "1").await;
    assert_eq!((status, body.as_str()), (200, "1"));
    kafka.kill_9(1);
    kafka.kill_9(2);
    let down = Instant::now();
    // The first calls wait for their records; the later ones find the partitions stepped
    // down (their takeovers cannot append an epoch record either).
    let keys: Vec<String> = (0..DOWN_SENDS).map(|i| format!("down-{i}")).collect();
    for wave in keys.chunks(DOWN_SENDS / 2) {
        let answers = futures_util::future::join_all(
            wave.iter()
                .map(|key| send_once(&sluice, "/Meter/work/send", "100", key)),
        )
        .await;
        for (key, sent) in wave.iter().zip(&answers) {
            eprintln!("{key}: {}", sent.line());
            assert!(
                sent.refused_clu0001(),
                "{key} with two brokers down: {}",
                sent.line()
            );
            // Within the write timeout (5 s) and a second, however the brokers died.
            let took = sent.took;
            assert!(
                took <= Duration::from_secs(6),
                "{key} was answered {took:?} after it was sent"
            );
        }
    }
    eprintln!("refused within {:?} of the brokers' death", down.elapsed());
    kafka.restart(1);
    let back = Instant::now();
    let mut ids = Vec::new();
    for key in &keys {
        let (status, body) = post_keyed(&sluice, "/Meter/work/send", "100", key).await;
        assert_eq!(status, 202, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        ids.push(body["invocationId"].as_str().unwrap().to_owned());
    }
    eprintln!("served again {:?} after a broker returned", back.elapsed());
    if let Err(finished) = sluice_tests::all_done(&effects, &ids, Duration::from_secs(60)).await {
        panic!(
            "{finished} of {DOWN_SENDS} sends finished; the node said:\n{}",
            sluice.stderr()
        );
    }
    let seen = effects_once_quiet(&effects, Duration::from_millis(500)).await;
    for id in &ids {
        assert_eq!(
            seen.get(id).map(|(_, done)| *done),
            Some(1),
            "{id} ran {seen:?}"
        );
    }
}

/// Every broker killed -9 and started again: while none runs, nothing is acknowledged (calls
/// are refused with `CLU0001`); once they are back, both nodes serve again, every send
/// acknowledged before the outage completes, an object's state is what it was, and what the
/// journals hold never runs again.
#[tokio::test]
async fn all_brokers_restarted_lose_nothing_acknowledged_and_service_resumes() {
    const SENDS: usize = 20;
    let mut kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let log = tempfile::tempdir().unwrap();
    let effects = log.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    let quick = |id| real_node(&bootstrap, id).env("SERVICE_CLUSTER__WRITE_TIMEOUT", "5s");
    let nodes = cluster_of(vec![("n1", quick("n1")), ("n2", quick("n2"))], &dep.uri).await;
    let (status, body) = post(&nodes[0], "/Counter/kept/add", "5").await;
    assert_eq!((status, body.as_str()), (200, "5"));
    // Sends of up to a second each: some still run when the brokers die.
    let mut acknowledged = Vec::new();
    for i in 0..SENDS {
        let millis = 200 + (i % 5) * 200;
        let (status, body) = post(&nodes[i % 2], "/Meter/work/send", &millis.to_string()).await;
        assert_eq!(status, 202, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        acknowledged.push(body["invocationId"].as_str().unwrap().to_owned());
    }
    kafka.kill_all();
    for (i, sluice) in nodes.iter().enumerate() {
        let key = format!("outage-{i}");
        let sent = send_once(sluice, "/Meter/work/send", "100", &key).await;
        eprintln!("{key}: {}", sent.line());
        assert!(
            sent.refused_clu0001(),
            "{key} with every broker down: {}",
            sent.line()
        );
    }
    let restarted = Instant::now();
    kafka.start_all();
    let (status, body) = post(&nodes[1], "/Counter/kept/add", "1").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "6"),
        "the object's state survived"
    );
    eprintln!(
        "served again {:?} after the brokers' start",
        restarted.elapsed()
    );
    for i in 0..SENDS {
        let (status, body) = post(&nodes[i % 2], "/Meter/work/send", "100").await;
        assert_eq!(status, 202, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        acknowledged.push(body["invocationId"].as_str().unwrap().to_owned());
    }
    let reruns = nothing_acknowledged_lost(&nodes, &effects, &acknowledged).await;
    eprintln!("{reruns} side effects ran again (attempts cut off by the outage)");
}

/// A node cut off from every broker (its links to them go silent) while its clients still
/// reach it: it acknowledges nothing it cannot store (a call through it is refused with
/// `CLU0001`, or served by the other node it forwards to), the other node takes its partitions
/// over, and once the links are mended it rejoins, catches up from the log and serves again.
/// Every acknowledged send completes on both nodes, and what the journals hold never runs
/// again.
#[tokio::test]
async fn a_node_cut_off_from_the_brokers_stops_acknowledging_and_rejoins() {
    const SENDS: usize = 12;
    let kafka = KafkaCluster::start_with_cuts(3, 1);
    let log = tempfile::tempdir().unwrap();
    let effects = log.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    let quick = |bootstrap: String, id| {
        real_node(&bootstrap, id).env("SERVICE_CLUSTER__WRITE_TIMEOUT", "5s")
    };
    let nodes = cluster_of(
        vec![
            ("n1", quick(kafka.bootstrap_through(0), "n1")),
            ("n2", quick(kafka.bootstrap_servers(), "n2")),
        ],
        &dep.uri,
    )
    .await;
    let mut acknowledged = Vec::new();
    for i in 0..SENDS {
        let (status, body) = post(&nodes[i % 2], "/Meter/work/send", "300").await;
        assert_eq!(status, 202, "{body}");
        acknowledged.push(invocation_id(&body));
    }
    kafka.cut(0);
    let cut = Instant::now();
    // Through the cut-off node: refused, or served by the node it forwards to.
    let keys: Vec<String> = (0..SENDS / 2).map(|i| format!("cut-{i}")).collect();
    let (answers, failover) = tokio::join!(
        futures_util::future::join_all(keys.iter().map(|key| send_once(
            &nodes[0],
            "/Meter/work/send",
            "100",
            key
        )),),
        async {
            led_by(&nodes[1], &["n2"]).await;
            cut.elapsed()
        }
    );
    eprintln!("n2 led every partition {failover:?} after the cut");
    let mut refused = 0;
    for (key, sent) in keys.iter().zip(&answers) {
        eprintln!("{key}: {}", sent.line());
        match sent.status {
            202 => acknowledged.push(invocation_id(&sent.body)),
            503 if sent.refused_clu0001() => refused += 1,
            _ => panic!("{key} by the cut-off node: {}", sent.line()),
        }
    }
    assert!(refused > 0, "the cut-off node refused nothing");
    for _ in 0..SENDS {
        let (status, body) = post(&nodes[1], "/Meter/work/send", "100").await;
        assert_eq!(status, 202, "{body}");
        acknowledged.push(invocation_id(&body));
    }
    kafka.mend(0);
    let mended = Instant::now();
    spread_over(&nodes[1], &["n1", "n2"]).await;
    let (status, body) = post(&nodes[0], "/Counter/after/add", "1").await;
    assert_eq!((status, body.as_str()), (200, "1"));
    eprintln!("n1 served again {:?} after the mend", mended.elapsed());
    let reruns = nothing_acknowledged_lost(&nodes, &effects, &acknowledged).await;
    eprintln!("{reruns} side effects ran again (attempts cut off by the step-down)");
}

/// The invocation id of a send's answer.
fn invocation_id(body: &str) -> String {
    let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    body["invocationId"]
        .as_str()
        .unwrap_or_else(|| panic!("no invocation id in {body}"))
        .to_owned()
}

/// Real brokers take record batches of about 1 MiB unless a topic says more, and a node's
/// records may be `cluster.max-record-bytes` (8 MiB): the topics a node creates take its
/// largest record, so a call whose body is near the door's limit is stored and answered, and
/// topics made with the brokers' default stop a node at start-up with `CLU0002` naming the
/// fix. Before, each such record was refused and its partition's leader stepped down, again
/// with every try.
#[tokio::test]
async fn records_past_the_brokers_default_batch_size_are_stored_and_smaller_topics_refused() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    for (topic, partitions) in [
        ("small.log", PARTITIONS),
        ("small.leaders", PARTITIONS),
        ("small.inbox", PARTITIONS),
        ("small.meta", 1),
    ] {
        kafka
            .create_topic(topic, partitions, &[("retention.ms", "-1")])
            .await;
    }
    let refused = real_node(&bootstrap, "n0")
        .env("SERVICE_CLUSTER__TOPIC_PREFIX", "small.")
        .run_to_exit()
        .unwrap();
    assert_stopped_saying(
        &refused,
        &[
            "[CLU0002] topic small.log takes record batches of at most 1048588 bytes",
            "max.message.bytes=8404992",
        ],
    );
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = real_node(&bootstrap, "n1").start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    // The door takes bodies up to a quarter of a record less 64 KiB (1.94 MiB).
    let name = "x".repeat(1_900_000);
    let (status, body) = post(&sluice, "/Greeter/greet", &format!("\"{name}\"")).await;
    assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);
    assert!(body.contains(&name), "the answer echoes the name");
    let stderr = sluice.stderr();
    assert!(
        !stderr.contains("stopped leading the partition"),
        "{stderr}"
    );
}

/// Two of the cluster's topics stay bounded without snapshots: a leader deletes what its inbox
/// partition delivered (the partition stored it and the committed offset is past it), and the
/// meta topic, compacted, keeps the newest record of each table group; a fresh node reads the
/// metadata from what compaction left, gaps and all.
#[tokio::test]
async fn delivered_inbox_records_are_deleted_and_a_fresh_node_reads_the_compacted_meta_topic() {
    const RULE_CHANGES: u64 = 30;
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    // The meta topic as a node creates it, but with segments that roll at once: the brokers'
    // cleaner compacts it while the test runs, not after an hour.
    kafka
        .create_topic(
            "sluice.meta",
            1,
            &[
                ("cleanup.policy", "compact"),
                ("retention.ms", "-1"),
                ("segment.ms", "100"),
                ("min.cleanable.dirty.ratio", "0.01"),
                ("max.message.bytes", "8404992"),
            ],
        )
        .await;
    let dep = TestDeployment::start("v1").await.unwrap();
    let first = real_node(&bootstrap, "n1").start().await.unwrap();
    first.register(&dep.uri, false).await;
    for concurrency in 1..=RULE_CHANGES {
        first
            .set_rules(
                serde_json::json!([{"pattern": "gold", "limits": {"concurrency": concurrency}}]),
            )
            .await;
    }
    // Calls between partitions (each child call and its result go through the inboxes) until
    // the leaders deleted some of what they delivered.
    let started = Instant::now();
    let mut calls = 0;
    loop {
        let (status, body) = post(&first, "/Greeter/addVia", &format!("\"k{}\"", calls % 8)).await;
        assert_eq!(status, 200, "{body}");
        calls += 1;
        let deleted: i64 = kafka
            .watermarks("sluice.inbox", PARTITIONS)
            .iter()
            .map(|(start, _)| start)
            .sum();
        if deleted > 0 {
            eprintln!("{deleted} delivered inbox records deleted after {calls} calls");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no inbox record deleted after {calls} calls: {:?}",
            kafka.watermarks("sluice.inbox", PARTITIONS)
        );
    }
    // Compaction left fewer records than were published (one per rule change, one for the
    // deployment, one for the first rule book's version).
    let published = kafka.watermarks("sluice.meta", 1)[0].1;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let kept = kafka.count_records("sluice.meta", 0);
        if (kept as i64) < published {
            eprintln!("the meta topic keeps {kept} of {published} records");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the meta topic was never compacted: {kept} of {published} records"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        // A record more rolls the segment the last ones are in.
        first
            .set_rules(
                serde_json::json!([{"pattern": "gold", "limits": {"concurrency": RULE_CHANGES}}]),
            )
            .await;
    }
    let fresh = real_node(&bootstrap, "n2").start().await.unwrap();
    deployments(&fresh, 1).await;
    admin_shows(
        &fresh,
        "/limits/rules",
        &format!("\"concurrency\":{RULE_CHANGES}"),
        Duration::from_secs(10),
    )
    .await;
    let (status, health) = get_json(&format!("{}/health", fresh.admin_url)).await;
    assert_eq!(status, 200, "{health}");
    let (status, body) = post(&fresh, "/Greeter/addVia", "\"k0\"").await;
    assert_eq!(status, 200, "{body}");
}

/// Snapshots bound the log: every partition's leader writes its state to the snapshot topic
/// each `cluster.snapshot-interval` and deletes the log it covers, so under a steady load the
/// log keeps a small part of what was written, and once idle, none. A fresh node, whose log
/// position was deleted before it ever read it (with no record after it to show the gap),
/// catches up from the snapshots; when the first node, snapshotting every second, is killed
/// -9, it takes every partition over with every object's state and every acknowledged call.
#[tokio::test]
async fn snapshots_bound_the_log_and_a_fresh_node_catches_up_from_them() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let log = tempfile::tempdir().unwrap();
    let effects = log.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    let snapshotting = |id| {
        real_node(&bootstrap, id)
            .env("SERVICE_CLUSTER__SNAPSHOT_INTERVAL", "1s")
            .start()
    };
    let mut first = snapshotting("n1").await.unwrap();
    first.register(&dep.uri, false).await;
    // A steady load of object calls and sends until the log keeps less than half of what was
    // written to it.
    let mut counts = std::collections::BTreeMap::new();
    let mut acknowledged = Vec::new();
    let started = Instant::now();
    let (kept, written) = loop {
        for i in 0..8 {
            let key = format!("k{}", (acknowledged.len() + i) % 8);
            let (status, body) = post(&first, &format!("/Counter/{key}/add"), "1").await;
            assert_eq!(status, 200, "{body}");
            *counts.entry(key).or_insert(0) += 1;
        }
        let (status, body) = post(&first, "/Meter/work/send", "10").await;
        assert_eq!(status, 202, "{body}");
        acknowledged.push(invocation_id(&body));
        let marks = kafka.watermarks("sluice.log", PARTITIONS);
        let kept: i64 = marks.iter().map(|(start, end)| end - start).sum();
        let written: i64 = marks.iter().map(|(_, end)| end).sum();
        if marks.iter().all(|(start, _)| *start > 0) && kept * 2 < written {
            break (kept, written);
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the log was never truncated: {marks:?}; n1 said:\n{}",
            first.stderr()
        );
    };
    eprintln!(
        "the log keeps {kept} of {written} records after {} calls in {:?}",
        acknowledged.len() * 9,
        started.elapsed()
    );
    // Idle now: the next snapshots cover each partition's whole log, which is deleted, so a
    // node that starts now finds no record to read at all: it must see that the log's start
    // passed its own.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let marks = kafka.watermarks("sluice.log", PARTITIONS);
        if marks.iter().all(|(start, end)| start == end) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle log was never snapshotted whole: {marks:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A node with an empty store: the log's head is gone, so it starts from the snapshots.
    let second = snapshotting("n2").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while second.stderr().matches("caught up from a snapshot").count() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "n2 did not load a snapshot of every partition:\n{}",
            second.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let partitions = partitions_until(&second, "no partition given up", |_| true).await;
    assert!(
        partitions.iter().all(|p| p["broken"].is_null()),
        "{partitions:?}"
    );
    // After each partition's first snapshot, whole, its leader wrote only what changed.
    let wrote = first.stderr();
    let snapshots: Vec<&str> = wrote
        .lines()
        .filter(|line| line.contains("wrote a snapshot"))
        .collect();
    assert!(
        snapshots.iter().any(|line| line.contains("whole=false")),
        "no incremental snapshot among {} written:\n{wrote}",
        snapshots.len()
    );
    first.kill_9();
    let nodes = [second];
    led_by(&nodes[0], &["n2"]).await;
    for (key, count) in &counts {
        let (status, body) = post(&nodes[0], &format!("/Counter/{key}/get"), "").await;
        assert_eq!(
            (status, body.as_str()),
            (200, count.to_string().as_str()),
            "object {key}"
        );
    }
    if let Err(finished) =
        sluice_tests::all_done(&effects, &acknowledged, Duration::from_secs(60)).await
    {
        panic!("{finished} of {} sends finished", acknowledged.len());
    }
    completed_on_every_node(&nodes, &acknowledged).await;
}

/// A budget or quota reset asked of one node reaches the partitions every node leads: two
/// scopes whose counters live on partitions led by different nodes each spend a rejecting
/// budget, then use up a rejecting quota, and one reset of each through the first node lets
/// both run again. Before, a reset reached only the partitions of the node asked.
#[tokio::test]
async fn budget_and_quota_resets_asked_of_one_node_reach_every_node() {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    // Both clocks at noon of a fixed day: no quota window ends while the test runs.
    let offset = sluice_tests::clock_offset_to(sluice_tests::MIDDAY_MS);
    let dep = TestDeployment::start("v1").await.unwrap();
    // With admin tokens: a node passes its caller's on when it asks the others.
    let at_noon = |id| {
        real_node(&bootstrap, id)
            .clock_offset_ms(offset)
            .with_tokens()
    };
    let nodes = cluster_of(vec![("n1", at_noon("n1")), ("n2", at_noon("n2"))], &dep.uri).await;
    nodes[0]
        .set_rules(serde_json::json!([{"pattern": "*", "limits": {"quota": "2/day", "budget": "1000/day", "on_exceed": "reject"}}]))
        .await;
    admin_shows(
        &nodes[1],
        "/limits/rules",
        "1000/day",
        Duration::from_secs(10),
    )
    .await;
    // A scope on a partition each node leads.
    let led = leaders(&nodes[0]).await;
    let scope_led_by = |node: &str| {
        (0..256)
            .map(|i| format!("t{i}"))
            .find(|scope| {
                let p =
                    sluice_store::invocation::identity::partition_key(&[scope]) % PARTITIONS as u64;
                led[p as usize].as_deref() == Some(node)
            })
            .unwrap_or_else(|| panic!("no scope on a partition {node} leads: {led:?}"))
    };
    let scopes = [scope_led_by("n1"), scope_led_by("n2")];
    let call = |scope: &str| format!("/service/scope/{scope}/call/Greeter/greet");
    for scope in &scopes {
        let spend = format!("/service/scope/{scope}/call/Meter/spend");
        let (status, body) = post(&nodes[0], &spend, "1000").await;
        assert_eq!(status, 200, "{scope}: {body}");
        let (status, body) = post(&nodes[0], &call(scope), "\"a\"").await;
        assert_eq!(status, 429, "{scope}'s budget is spent: {body}");
        assert!(body.contains("FLO0005"), "{body}");
    }
    // Each scope's counter lives on its leader; either node's query shows both.
    for sluice in &nodes {
        let (status, rows) = sluice
            .query("SELECT scope, quota_used, budget_spent FROM sys_user_limits WHERE level = 'Scope' ORDER BY scope")
            .await;
        assert_eq!(status, 200, "{rows}");
        let mut seen: Vec<(String, u64, u64)> = rows["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["scope"].as_str().unwrap().to_owned(),
                    r["quota_used"].as_u64().unwrap(),
                    r["budget_spent"].as_u64().unwrap(),
                )
            })
            .collect();
        seen.sort();
        let mut wanted: Vec<(String, u64, u64)> =
            scopes.iter().map(|s| (s.clone(), 1, 1000)).collect();
        wanted.sort();
        assert_eq!(seen, wanted, "{}", sluice.admin_url);
        // A query naming one scope, and a bare LIMIT, are asked of the other node as such:
        // each node gets the scope the other leads, and one row of a LIMIT 1.
        for scope in &scopes {
            let sql =
                format!("SELECT scope, budget_spent FROM sys_user_limits WHERE scope = '{scope}'");
            let (status, rows) = sluice.query(&sql).await;
            assert_eq!(status, 200, "{rows}");
            let rows = rows["rows"].as_array().unwrap();
            assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
            assert_eq!(
                (rows[0]["scope"].as_str(), rows[0]["budget_spent"].as_u64()),
                (Some(scope.as_str()), Some(1000))
            );
        }
        let (status, rows) = sluice
            .query("SELECT scope FROM sys_user_limits LIMIT 1")
            .await;
        assert_eq!(status, 200, "{rows}");
        assert_eq!(rows["rows"].as_array().unwrap().len(), 1, "{rows}");
        // Counts that read no column here, and a filter the store's reader keeps, asked of the
        // other node as such: both agree with the rows listed.
        for sql in [
            "FROM sys_user_limits".to_owned(),
            format!("FROM sys_invocation WHERE scope = '{}'", scopes[0]),
            format!(
                "FROM sys_invocation WHERE limit_key = 'none' OR scope = '{}'",
                scopes[1]
            ),
        ] {
            let n = sluice.count(&format!("SELECT count(*) AS n {sql}")).await;
            let (status, rows) = sluice.query(&format!("SELECT scope {sql}")).await;
            assert_eq!(status, 200, "{rows}");
            let listed = rows["rows"].as_array().unwrap().len();
            assert_eq!(n as usize, listed, "{sql}");
            assert!(n >= 1, "{sql}: {n}");
        }
    }
    for what in ["budget", "quota"] {
        let (status, body) = post_admin(
            &nodes[0],
            &format!("/limits/rules/reset-{what}"),
            &serde_json::json!({"pattern": "*"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert!(body["reset"].as_u64().unwrap() >= 2, "{body}");
        for scope in &scopes {
            let (status, body) = post(&nodes[0], &call(scope), "\"c\"").await;
            assert_eq!(
                status, 200,
                "{scope} runs again after the {what} reset: {body}"
            );
        }
        if what == "budget" {
            // Its second call today: the quota of 2 is used up now.
            for scope in &scopes {
                let (status, body) = post(&nodes[0], &call(scope), "\"d\"").await;
                assert_eq!(status, 429, "{scope}'s quota is used up: {body}");
                assert!(body.contains("FLO0002"), "{body}");
            }
        }
    }
}

/// Posts `body` to the admin API of `sluice`: the status and the JSON answered.
async fn post_admin(sluice: &Sluice, path: &str, body: &Value) -> (u16, Value) {
    let resp = sluice
        .admin(reqwest::Method::POST, path)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A concurrency limit a deployment's manifest declares holds across the cluster, measured in
/// the deployment: two nodes each run their partitions' part of it (2 + 2 of 4), not the whole
/// limit each. Before, each node held the limit alone and the deployment saw up to twice it.
#[tokio::test]
async fn a_deployments_declared_limit_holds_across_nodes() {
    const SENDS: usize = 16;
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start_with(
        sluice_tests::free_port(),
        "v1",
        &[("SLUICE_TEST_LIMITS", "deployment=4")],
    )
    .await
    .unwrap();
    let nodes = cluster_of(
        vec![
            ("n1", real_node(&bootstrap, "n1")),
            ("n2", real_node(&bootstrap, "n2")),
        ],
        &dep.uri,
    )
    .await;
    let _: Value = sluice_tests::call_json(&nodes[0], "Meter/timings").await;
    // Sends through both nodes, each placed on a partition its node leads: both nodes have
    // more than their part waiting.
    let mut acknowledged = Vec::new();
    for i in 0..SENDS {
        let (status, body) =
            post(&nodes[i % 2], "/Meter/timed/send", &format!("\"t{i} 400\"")).await;
        assert_eq!(status, 202, "{body}");
        acknowledged.push(invocation_id(&body));
    }
    for id in &acknowledged {
        nodes[0]
            .invocation_until(id, "completed", |seen| seen["status"] == "completed")
            .await;
    }
    let peak = sluice_tests::peak_in_handler(&nodes[0], SENDS).await;
    eprintln!("the deployment ran at most {peak} at once");
    assert!(
        peak <= 4,
        "the deployment ran {peak} at once, over its limit of 4"
    );
    assert!(peak >= 2, "the nodes ran their parts at once: {peak}");
}

/// Which nodes keep each partition in their store, as each of `nodes` says (`held_here`).
async fn keepers(nodes: &[&Sluice]) -> Vec<usize> {
    let mut kept = Vec::new();
    for sluice in nodes {
        let (_, health) = sluice.get_admin("/cluster-health").await;
        let partitions = health["sluice_cluster"]["partitions"].as_array().unwrap();
        kept.resize(partitions.len(), 0);
        for (p, view) in partitions.iter().enumerate() {
            if view["held_here"] == true {
                kept[p] += 1;
            }
        }
    }
    kept
}

/// Which of `nodes` (named `ids`) keep each partition in their store (`held_here`).
async fn holders(nodes: &[&Sluice], ids: &[&str]) -> Vec<std::collections::BTreeSet<String>> {
    let mut held = Vec::new();
    for (sluice, id) in nodes.iter().zip(ids) {
        let (_, health) = sluice.get_admin("/cluster-health").await;
        let partitions = health["sluice_cluster"]["partitions"].as_array().unwrap();
        held.resize(partitions.len(), std::collections::BTreeSet::new());
        for (p, view) in partitions.iter().enumerate() {
            if view["held_here"] == true {
                held[p].insert((*id).to_owned());
            }
        }
    }
    held
}

/// Waits until each node's store holds `want(i)` of the `total` Greeter invocations; the
/// counts.
async fn stored_greets(nodes: &[&Sluice], want: impl Fn(&[u64]) -> bool) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut counts = Vec::new();
        for sluice in nodes {
            counts.push(
                sluice
                    .count_local("SELECT count(*) AS n FROM sys_invocation WHERE target_service_name = 'Greeter' AND status = 'completed'")
                    .await,
            );
        }
        if want(&counts) {
            return counts;
        }
        assert!(
            Instant::now() < deadline,
            "the stores never settled: {counts:?} ({:?} keepers per partition)",
            keepers(nodes).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each partition is kept by its leader and one standby (`cluster.standbys = 1`), not by every
/// node: of three nodes' stores each holds part of the completed calls, and together they hold
/// each twice. A node killed -9 loses nothing: the survivors lead every partition, and the one
/// that stood by for none of a partition's state loads it (a snapshot and the log's tail)
/// until both hold every call.
#[tokio::test]
async fn three_nodes_each_keep_their_share_and_losing_one_loses_nothing() {
    const SENDS: usize = 60;
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let builders = ["n1", "n2", "n3"].map(|id| {
        (
            id,
            real_node(&bootstrap, id).env("SERVICE_CLUSTER__SNAPSHOT_INTERVAL", "1s"),
        )
    });
    let mut nodes = cluster_of(builders.into(), &dep.uri).await;
    let all: Vec<&Sluice> = nodes.iter().collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let kept = keepers(&all).await;
        if kept.iter().all(|k| *k == 2) {
            break;
        }
        assert!(Instant::now() < deadline, "keepers per partition: {kept:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut acknowledged = Vec::new();
    for i in 0..SENDS {
        let (status, body) = post(&nodes[i % 3], "/Greeter/greet/send", &format!("\"s{i}\"")).await;
        assert_eq!(status, 202, "{body}");
        acknowledged.push(invocation_id(&body));
    }
    let total = SENDS as u64;
    // Each node sends to the partitions it leads, so every partition holds some calls and
    // every store misses one partition's.
    let counts = stored_greets(&all, |counts| counts.iter().sum::<u64>() == 2 * total).await;
    eprintln!("completed calls per store: {counts:?} of {total}");
    assert!(counts.iter().all(|n| *n < total), "{counts:?}");
    // A query asked of any node reads each partition from its leader: every node answers
    // about every call, once, although its store holds only its share.
    for sluice in &all {
        let seen = sluice
            .count("SELECT count(*) AS n FROM sys_invocation WHERE target_service_name = 'Greeter' AND status = 'completed'")
            .await;
        assert_eq!(seen, total, "{}", sluice.admin_url);
        let (status, rows) = sluice
            .query("SELECT id FROM sys_invocation WHERE target_service_name = 'Greeter'")
            .await;
        assert_eq!(status, 200, "{rows}");
        let mut ids: Vec<&str> = rows["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["id"].as_str().unwrap())
            .collect();
        ids.sort_unstable();
        let mut sent: Vec<&str> = acknowledged.iter().map(String::as_str).collect();
        sent.sort_unstable();
        assert_eq!(ids, sent, "{}", sluice.admin_url);
        // A client's own forwarding header is worth nothing: it is answered as any client is,
        // about the whole cluster, not as a node's share (which has no row cap of the answer).
        for forged in ["1", "not-the-secret-of-the-nodes"] {
            let resp = sluice
                .admin(reqwest::Method::POST, "/query")
                .header("accept", "application/json")
                .header("x-sluice-forwarded", forged)
                .json(&serde_json::json!({"query": "SELECT count(*) AS n FROM sys_invocation WHERE target_service_name = 'Greeter' AND status = 'completed'"}))
                .send()
                .await
                .unwrap();
            assert!(resp.headers().get("x-sluice-led").is_none(), "{forged}");
            let answer: serde_json::Value = resp.json().await.unwrap();
            assert_eq!(answer["rows"][0]["n"], total, "{forged}: {answer}");
        }
    }

    let mut first = nodes.remove(0);
    first.kill_9();
    let survivors: Vec<&Sluice> = nodes.iter().collect();
    led_by(survivors[0], &["n2", "n3"]).await;
    // Two nodes, one standby each: both keep every partition, and hold every call.
    let counts = stored_greets(&survivors, |counts| counts.iter().all(|n| *n == total)).await;
    eprintln!("after the kill: {counts:?}");
    // Each survivor had let a partition go, and kept it again once the kill left two nodes.
    for sluice in &survivors {
        let said = sluice.stderr();
        assert!(said.contains("no longer kept here"), "{said}");
        assert!(said.contains("kept here again"), "{said}");
    }
    for id in &acknowledged {
        let (status, described) = survivors[1].describe(id).await;
        assert_eq!(status, 200, "{described}");
        assert_eq!(described["status"], "completed", "{described}");
    }
    let (status, body) = post(survivors[0], "/Greeter/greet", "\"after\"").await;
    assert_eq!(status, 200, "{body}");
}

/// Sends `body` to `Meter/work` from `senders` clients at once, each to the nodes of `up` in
/// turn with `pause` between its sends, until `stop`: what was acknowledged, what was refused
/// with a code and `Retry-After`, and what was not (a send is tried once).
async fn sends(
    up: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    senders: usize,
    body: &'static str,
    pause: Duration,
) -> Seen {
    let mut tasks = tokio::task::JoinSet::new();
    for sender in 0..senders {
        let (up, stop) = (up.clone(), stop.clone());
        tasks.spawn(async move {
            let client = reqwest::Client::new();
            let mut seen = Seen::default();
            let mut i = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let target = {
                    let up = up.lock().unwrap();
                    up[(i + sender) % up.len()].clone()
                };
                i += 1;
                let sent = client
                    .post(format!("{target}/Meter/work/send"))
                    .header("idempotency-key", format!("sends-{sender}-{i}"))
                    .header("content-type", "application/json")
                    .body(body)
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await;
                match sent {
                    Ok(resp) if resp.status() == 202 => {
                        // An answer cut off after its head (its node killed) acknowledged
                        // nothing the client can name.
                        let body = resp.text().await;
                        match body.as_deref().map(serde_json::from_str::<Value>) {
                            Ok(Ok(answer)) if answer["invocationId"].is_string() => seen
                                .acknowledged
                                .push(answer["invocationId"].as_str().unwrap().to_owned()),
                            _ => seen
                                .unanswered
                                .push(format!("{target}: a 202 without its body: {body:?}")),
                        }
                    }
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let coded = resp.headers().contains_key("x-service-error-code");
                        let retry_after = resp.headers().contains_key("retry-after");
                        let body = resp.text().await.unwrap_or_default();
                        let line = format!("{status} (retry-after {retry_after}): {body}");
                        if (status == 503 || status == 429) && coded && retry_after {
                            seen.refused.push(line);
                        } else {
                            seen.unanswered.push(line);
                        }
                    }
                    Err(e) => seen.unanswered.push(format!("{target}: {e}")),
                }
                tokio::time::sleep(pause).await;
            }
            seen
        });
    }
    let mut all = Seen::default();
    while let Some(seen) = tasks.join_next().await {
        let seen = seen.unwrap();
        all.acknowledged.extend(seen.acknowledged);
        all.refused.extend(seen.refused);
        all.unanswered.extend(seen.unanswered);
    }
    all
}

/// What `nodes` wrote to the snapshot topic so far, as their `/metrics` count it: bytes and
/// rows of incremental snapshots, then of whole ones.
async fn snapshots_written(nodes: &[&Sluice]) -> [f64; 4] {
    let mut written = [0.0; 4];
    for sluice in nodes {
        let metrics = sluice.metrics().await;
        for (i, (name, kind)) in [
            ("bytes", "incremental"),
            ("rows", "incremental"),
            ("bytes", "whole"),
            ("rows", "whole"),
        ]
        .into_iter()
        .enumerate()
        {
            let series = format!("sluice_cluster_snapshot_{name}_total{{kind=\"{kind}\"}}");
            written[i] += metrics.get(&series).copied().unwrap_or(0.0);
        }
    }
    written
}

/// Waits until no node's replica of a partition it keeps is behind that partition's log
/// (`sluice_cluster_lag_records` all 0).
async fn caught_up(nodes: &[&Sluice]) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let mut behind = 0.0;
        for sluice in nodes {
            behind += sluice
                .metrics()
                .await
                .iter()
                .filter(|(series, _)| series.starts_with("sluice_cluster_lag_records"))
                .map(|(_, lag)| lag)
                .sum::<f64>();
        }
        if behind == 0.0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the standbys are still {behind} records behind"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Completes `count` calls of `Greeter/greet`, each with a name of `name_bytes`, through
/// `nodes` in turn, 32 at a time: the state the cluster then holds (each call kept for
/// `worker.completion-retention`).
async fn retain_calls(nodes: &[&Sluice], count: usize, name_bytes: usize) {
    let urls: Vec<String> = nodes.iter().map(|n| n.ingress_url.clone()).collect();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (urls, next) = (urls.clone(), next.clone());
        tasks.spawn(async move {
            let client = reqwest::Client::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    return;
                }
                let name = format!("\"{i:0>name_bytes$}\"");
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let answer = client
                        .post(format!("{}/Greeter/greet", urls[i % urls.len()]))
                        .header("content-type", "application/json")
                        .header("idempotency-key", format!("retained-{i}"))
                        .body(name.clone())
                        .send()
                        .await;
                    if answer.is_ok_and(|a| a.status() == 200) {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "call {i} to retain never completed"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// Six nodes on three real brokers, 24 partitions, one standby each, under a steady load: each
/// node takes in from the brokers about its share of what the cluster writes (what it leads
/// and stands by for, `(1 + standbys) / 6`), not the whole log: it reads only the partitions it
/// keeps and learns the others' leaders from the epochs topic. The incremental snapshots of
/// the steady part write no more than the rows that changed (bounded by the log's growth);
/// with `SLUICE_SIX_NODES_RETAINED=n` completed calls retained first (of 1 KiB names), the
/// state held is reported beside them. Then a node killed -9 moves only its own partitions,
/// each to the node that stood by for it where that one has room (the failover time
/// printed), a seventh that joins takes only its share, and every acknowledged send
/// completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_nodes_each_read_their_share_and_a_lost_node_moves_only_its_partitions() {
    const NODES: usize = 6;
    const SIX_PARTITIONS: usize = 24;
    const STEADY: Duration = Duration::from_secs(30);
    const SNAPSHOTS: Duration = Duration::from_secs(10);
    // What a node takes in beyond its share of the log, per second: empty fetches, the
    // group's heartbeats, metadata, the acknowledgements of its own writes.
    const OVERHEAD_PER_SECOND: u64 = 8 * 1024;
    let kafka = KafkaCluster::start_with_cuts(3, NODES + 1);
    let log = tempfile::tempdir().unwrap();
    let effects = log.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    let ids = ["n1", "n2", "n3", "n4", "n5", "n6", "n7"];
    let node = |i: usize| {
        real_node(&kafka.bootstrap_through(i), ids[i])
            .env("SERVICE_WORKER__PARTITIONS", &SIX_PARTITIONS.to_string())
            .env("SERVICE_CLUSTER__STANDBYS", "1")
            .env(
                "SERVICE_CLUSTER__SNAPSHOT_INTERVAL",
                &format!("{}s", SNAPSHOTS.as_secs()),
            )
    };
    let mut nodes = Vec::new();
    for i in 0..NODES {
        nodes.push(node(i).start().await.unwrap());
    }
    nodes[0].register(&dep.uri, false).await;
    for sluice in &nodes {
        deployments(sluice, 1).await;
    }
    let all: Vec<&Sluice> = nodes.iter().collect();
    let before = assignment_of_in_force(&all, &ids[..NODES], SIX_PARTITIONS).await;
    // Each partition kept by its leader and one standby, and no more.
    let deadline = Instant::now() + Duration::from_secs(60);
    while keepers(&all).await.iter().any(|k| *k != 2) {
        assert!(
            Instant::now() < deadline,
            "the partitions are not kept twice each: {:?}",
            keepers(&all).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let up = std::sync::Arc::new(std::sync::Mutex::new(
        nodes
            .iter()
            .map(|n| n.ingress_url.clone())
            .collect::<Vec<_>>(),
    ));
    // A large state for the snapshots to leave alone, when asked for (a release build makes
    // tens of thousands in a minute or two; the suite's debug build runs without).
    let retained: usize = std::env::var("SLUICE_SIX_NODES_RETAINED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if retained > 0 {
        let started = Instant::now();
        retain_calls(&all, retained, 1024).await;
        eprintln!(
            "{retained} calls retained in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        // Standbys that fell behind while the calls were made read the rest before the
        // steady part: what they take in then is what the cluster writes meanwhile.
        caught_up(&all).await;
        eprintln!(
            "every standby caught up {:.1} s after",
            started.elapsed().as_secs_f64()
        );
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = tokio::spawn(sends(up.clone(), stop.clone(), 8, "1", Duration::ZERO));
    sluice_tests::until_done(&effects, 50, "the sends never got going").await;
    // The steady part: what each node sent to the brokers and took in from them.
    let start: Vec<(u64, u64)> = (0..NODES).map(|i| kafka.carried(i)).collect();
    let stored = kafka.stored_bytes("sluice.");
    let (log, snapshots) = (
        kafka.stored_bytes("sluice.log-"),
        kafka.stored_bytes("sluice.snapshots-"),
    );
    let snapshotted = snapshots_written(&all).await;
    let started = Instant::now();
    tokio::time::sleep(STEADY).await;
    let end: Vec<(u64, u64)> = (0..NODES).map(|i| kafka.carried(i)).collect();
    let seconds = started.elapsed().as_secs_f64();
    let snapshotted: Vec<f64> = snapshots_written(&all)
        .await
        .iter()
        .zip(snapshotted)
        .map(|(end, start)| end - start)
        .collect();
    // What the cluster wrote: the record batches its topics grew by.
    let written = kafka.stored_bytes("sluice.") - stored;
    let requests: u64 = start.iter().zip(&end).map(|(s, e)| e.0 - s.0).sum();
    eprintln!(
        "the cluster wrote {written} bytes of records in {seconds:.1} s ({requests} bytes of requests)"
    );
    // An incremental snapshot holds the rows that changed since the one before, as they are
    // at its position; the log holds every write of them. Over the steady part its bytes are
    // bounded by the log's growth, stretched by the interval before the part began whose
    // changes its first snapshots carry. Whole ones (each leader's first, then every
    // `cluster.snapshot-full-every` or at half the chain) hold the state and are reported.
    let intervals = seconds / SNAPSHOTS.as_secs_f64();
    let log_grew = (kafka.stored_bytes("sluice.log-") - log) as f64;
    eprintln!(
        "per {} s snapshot interval: the log grew {:.0} bytes, the snapshot topic {:.0}; incremental snapshots {:.0} bytes ({:.0} rows), whole ones {:.0} bytes ({:.0} rows)",
        SNAPSHOTS.as_secs(),
        log_grew / intervals,
        (kafka.stored_bytes("sluice.snapshots-") - snapshots) as f64 / intervals,
        snapshotted[0] / intervals,
        snapshotted[1] / intervals,
        snapshotted[2] / intervals,
        snapshotted[3] / intervals,
    );
    eprintln!(
        "the state held: {} completed calls",
        nodes[0]
            .count("SELECT count(*) AS n FROM sys_invocation WHERE status = 'completed'")
            .await
    );
    assert!(
        snapshotted[0] > 0.0,
        "no incremental snapshot in the steady part"
    );
    let stretched = (seconds + SNAPSHOTS.as_secs_f64()) / seconds;
    assert!(
        snapshotted[0] <= log_grew * stretched,
        "incremental snapshots wrote {} bytes, more than the log's growth {log_grew} × {stretched:.2}",
        snapshotted[0]
    );
    let share = written as f64 * 2.0 / NODES as f64;
    let overhead = OVERHEAD_PER_SECOND as f64 * seconds;
    let intakes: Vec<u64> = start.iter().zip(&end).map(|(s, e)| e.1 - s.1).collect();
    for (i, intake) in intakes.iter().enumerate() {
        eprintln!(
            "{}: took in {intake} bytes in {seconds:.1} s, {:.3} of the {written} the cluster wrote (its share {:.3})",
            ids[i],
            *intake as f64 / written as f64,
            2.0 / NODES as f64
        );
    }
    for (i, intake) in intakes.iter().enumerate() {
        assert!(
            (*intake as f64) <= share + overhead,
            "{} took in {intake} bytes, more than its share {share:.0} of {written} written plus {overhead:.0}",
            ids[i]
        );
    }
    // kill -9 of n1: only its partitions move, each to the node that stood by for it.
    let held = holders(&all, &ids[..NODES]).await;
    let mut first = nodes.remove(0);
    let killed_url = first.ingress_url.clone();
    up.lock().unwrap().retain(|u| *u != first.ingress_url);
    first.kill_9();
    let killed = Instant::now();
    let survivors: Vec<&Sluice> = nodes.iter().collect();
    let after = assignment_of_in_force(&survivors, &ids[1..NODES], SIX_PARTITIONS).await;
    eprintln!(
        "every partition led by a survivor {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    let (mut warm, mut takers) = (0, std::collections::BTreeSet::new());
    for (p, (was, is)) in before.iter().zip(&after).enumerate() {
        if was.as_deref() != Some("n1") {
            assert_eq!(was, is, "partition {p} of a survivor moved");
        } else if let Some(is) = is
            && held[p].contains(is)
        {
            warm += 1;
            takers.insert(is.clone());
        }
    }
    // A partition went cold only when each node standing by for it had taken another of n1's
    // already (one each keeps every survivor within its share).
    for (p, was) in before.iter().enumerate() {
        let went_warm = after[p].as_ref().is_some_and(|is| held[p].contains(is));
        if was.as_deref() == Some("n1") && !went_warm {
            let standing_by: Vec<&String> = held[p].iter().filter(|h| *h != "n1").collect();
            assert!(
                standing_by.iter().all(|h| takers.contains(*h)),
                "partition {p} went to {:?}, not to {standing_by:?} that stood by for it",
                after[p]
            );
        }
    }
    eprintln!(
        "{warm} of n1's {} partitions went to the node that stood by for them",
        before.iter().filter(|l| l.as_deref() == Some("n1")).count()
    );
    // n7 joins: it takes its share and nothing else moves.
    nodes.push(node(NODES).start().await.unwrap());
    deployments(&nodes[NODES - 1], 1).await;
    let all: Vec<&Sluice> = nodes.iter().collect();
    let joined = assignment_of_in_force(&all, &ids[1..=NODES], SIX_PARTITIONS).await;
    let taken = joined.iter().filter(|l| l.as_deref() == Some("n7")).count();
    assert_eq!(
        taken,
        SIX_PARTITIONS / NODES,
        "n7 took its share: {joined:?}"
    );
    for (p, (was, is)) in after.iter().zip(&joined).enumerate() {
        if is.as_deref() != Some("n7") {
            assert_eq!(was, is, "partition {p} moved between the others");
        }
    }
    up.lock()
        .unwrap()
        .push(nodes[NODES - 1].ingress_url.clone());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut seen = load.await.unwrap();
    // Sends n1 was serving when it was killed have no answer to give: their connection broke.
    let before_kill = seen.unanswered.len();
    seen.unanswered
        .retain(|line| !line.starts_with(&killed_url));
    eprintln!(
        "{} sends acknowledged, {} refused with a code, {} cut off by the kill",
        seen.acknowledged.len(),
        seen.refused.len(),
        before_kill - seen.unanswered.len()
    );
    assert!(
        seen.unanswered.is_empty(),
        "not answered with a code: {:?}",
        &seen.unanswered[..seen.unanswered.len().min(5)]
    );
    if let Err(finished) =
        sluice_tests::all_done(&effects, &seen.acknowledged, Duration::from_secs(120)).await
    {
        panic!(
            "{finished} of {} acknowledged sends finished",
            seen.acknowledged.len()
        );
    }
}

/// Waits until invocation `id` completed as `sluice` sees it: its `completion` text.
async fn completion_of(sluice: &Sluice, id: &str) -> String {
    let seen = sluice
        .invocation_until(id, "completed", |seen| seen["status"] == "completed")
        .await;
    seen["completion"].as_str().unwrap_or_default().to_owned()
}

/// The scope on the same partition as `scope`: the first `{prefix}{i}` that is.
fn scope_beside(scope: &str, prefix: &str) -> String {
    (0..1024)
        .map(|i| format!("{prefix}{i}"))
        .find(|s| scope_partition(s) == scope_partition(scope))
        .unwrap()
}

/// Sends `n` calls of 600 ms to `scope` through the nodes in turn, half under key `a` and half
/// under `c`, labelled `<phase><key><i>`; once all ran, the most that ran at once, and the
/// most under one key.
async fn burst_across(nodes: &[Sluice], scope: &str, phase: &str, n: usize) -> (usize, usize) {
    for i in 0..n {
        let key = if i % 2 == 0 { "a" } else { "c" };
        let (status, answer) = post(
            &nodes[i % nodes.len()],
            &format!("/service/scope/{scope}/send/Meter/timed?limit-key={key}"),
            &format!("\"{phase}{key}{i} 600\""),
        )
        .await;
        assert_eq!(status, 202, "{answer}");
    }
    let runs = sluice_tests::timings(&nodes[0], n, Duration::from_secs(60)).await;
    let peak = |prefix: &str| sluice_tests::peak_among(&runs, prefix);
    let per_key = peak(&format!("{phase}a")).max(peak(&format!("{phase}c")));
    (peak(phase), per_key)
}

/// A rule's `on_full`, `debounce` and `burst_budget` decide at the scope's partition whichever
/// node a call comes through, and outlive its leader: the node that takes the partition over
/// finds a burst of debounced calls in the store, and the next call joins it; it finds the
/// burst budget spent as it was, and holds the scope to it.
#[tokio::test]
async fn on_full_debounce_and_burst_budgets_decide_at_the_scopes_partition_from_either_node_and_after_its_leader_dies()
 {
    let kafka = KafkaCluster::start(3);
    let bootstrap = kafka.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    // The servers' day starts twelve hours before their clock: no budget window ends here.
    let offset = sluice_tests::clock_offset_to(sluice_tests::MIDDAY_MS);
    let at_noon = |id| real_node(&bootstrap, id).clock_offset_ms(offset);
    let mut nodes = cluster_of(vec![("n1", at_noon("n1")), ("n2", at_noon("n2"))], &dep.uri).await;
    // The burst budget's scope shares the debounced scope's partition: one leader to kill.
    let bursting = scope_beside("cd", "bb");
    // The burst's wait outlasts a failover (the session timeout and a takeover).
    nodes[0]
        .set_rules(serde_json::json!([
            {"pattern": "co/*", "limits": {"concurrency": 1, "on_full": "keep_newest"}},
            {"pattern": "cd/*", "limits": {"debounce": "30s"}},
            {"pattern": bursting, "limits": {"concurrency": 2, "burst_budget": "2x 1h/day"}},
            {"pattern": format!("{bursting}/*"), "limits": {"concurrency": 3}},
        ]))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, rules) = nodes[1].get_admin("/limits/rules").await;
        if rules.to_string().contains("cd/*") {
            break;
        }
        assert!(Instant::now() < deadline, "no rules on n2: {rules}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The burst budget: calls through both nodes run 4 at once (twice the limit, not twice
    // per node), each key at most 3; either node reads the same time spent above 2.
    let (at_once, per_key) = burst_across(&nodes, &bursting, "p1", 8).await;
    assert_eq!(at_once, 4, "the scope bursts to twice its limit");
    assert!(per_key <= 3, "{per_key} at once under one key");
    let spent = sluice_tests::burst_of(&nodes[0], &bursting).await;
    assert!(
        spent.0 >= 300 && spent.0 + spent.1 == 3_600_000,
        "{spent:?}"
    );
    assert_eq!(sluice_tests::burst_of(&nodes[1], &bursting).await, spent);
    let send = |node: usize, scope: &'static str, path: &'static str, body: &'static str| {
        let sluice = &nodes[node];
        async move {
            let (status, answer) = post(
                sluice,
                &format!("/service/scope/{scope}/send/{path}?limit-key=k"),
                body,
            )
            .await;
            assert_eq!(status, 202, "{answer}");
            invocation_id(&answer)
        }
    };

    // keep_newest: a call waiting behind the key's run, replaced by one through the other node.
    let holder = send(0, "co", "Meter/hold", "600000").await;
    nodes[0]
        .invocation_until(&holder, "running", |seen| seen["status"] == "running")
        .await;
    let o1 = send(0, "co", "Meter/timed", "\"o1 10\"").await;
    let o2 = send(1, "co", "Meter/timed", "\"o2 10\"").await;
    let replaced = completion_of(&nodes[1], &o1).await;
    assert!(
        replaced.contains("FLO0008") && replaced.contains(&o2),
        "{replaced}"
    );

    // debounce: a burst begun through n1 is joined through n2.
    let d1 = send(0, "cd", "Meter/timed", "\"d1 10\"").await;
    let d2 = send(1, "cd", "Meter/timed", "\"d2 10\"").await;
    let joined = completion_of(&nodes[0], &d1).await;
    assert!(
        joined.contains("FLO0009") && joined.contains(&d2),
        "{joined}"
    );

    // The leader of the burst's partition dies; the survivor finds the burst.
    let id: sluice_core::ids::InvocationId = d2.parse().unwrap();
    let partition = (id.partition_key() % PARTITIONS as u64) as usize;
    let leader = leaders(&nodes[0]).await[partition].clone().unwrap();
    let index = ["n1", "n2"].iter().position(|n| *n == leader).unwrap();
    let mut killed = nodes.remove(index);
    killed.kill_9();
    let survivor = if leader == "n1" { "n2" } else { "n1" };
    led_by(&nodes[0], &[survivor]).await;
    let (status, answer) = post(
        &nodes[0],
        "/service/scope/cd/send/Meter/timed?limit-key=k",
        "\"d3 10\"",
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let d3 = invocation_id(&answer);
    let joined = completion_of(&nodes[0], &d2).await;
    assert!(
        joined.contains("FLO0009") && joined.contains(&d3),
        "the burst outlived its leader: {joined}"
    );
    let waits = nodes[0].describe(&d3).await.1;
    assert_eq!(waits["status"], "scheduled", "{waits}");

    // The new leader of the budget's partition read what was spent, and bursts from there.
    assert_eq!(
        partition,
        scope_partition(&bursting),
        "the leader that died led the burst budget's scope too"
    );
    assert_eq!(
        sluice_tests::burst_of(&nodes[0], &bursting).await,
        spent,
        "after the failover"
    );
    let (at_once, per_key) = burst_across(&nodes, &bursting, "p2", 8).await;
    assert_eq!(at_once, 4, "the survivor bursts as the leader did");
    assert!(per_key <= 3, "{per_key} at once under one key");
    let now = sluice_tests::burst_of(&nodes[0], &bursting).await;
    assert!(now.0 >= spent.0 + 300, "{now:?} after {spent:?}");
}

/// The partition of `scope`'s counters.
fn scope_partition(scope: &str) -> usize {
    (sluice_store::invocation::identity::partition_key(&[scope]) % PARTITIONS as u64) as usize
}
