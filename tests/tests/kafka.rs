//! Kafka subscriptions against a real Kafka-protocol broker (librdkafka's mock cluster, in this
//! test process, on loopback): records become invocations, each exactly once, across a kill -9.

use std::path::Path;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};
use sluice_tests::{
    Sluice, TestDeployment, assert_once_but_in_flight, effects_once_quiet, effects_per_invocation,
    get_json, post_json,
};

async fn produce(bootstrap: &str, topic: &str, records: u32) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let sends: Vec<_> = (0..records)
        .map(|i| {
            let key = format!("k{}", i % 7);
            let producer = producer.clone();
            let topic = topic.to_owned();
            async move {
                producer
                    .send(
                        FutureRecord::to(&topic).key(&key).payload("0"),
                        Duration::from_secs(10),
                    )
                    .await
                    .map(|_| ())
                    .map_err(|(e, _)| e)
            }
        })
        .collect();
    for send in futures_util::future::join_all(sends).await {
        send.unwrap();
    }
}

/// Waits until `want` distinct invocations finished their `Meter/work` (from the effects log).
async fn wait_for_done(effects: &Path, want: usize, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let done = effects_per_invocation(effects)
            .values()
            .filter(|(_, done)| *done > 0)
            .count();
        if done >= want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{done} of {want} records ran"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Tells `sluice` about the Kafka cluster at `bootstrap` (as `local`) and subscribes `sink` to
/// `topic` with `options`; the subscription.
async fn subscribe_to(
    sluice: &Sluice,
    bootstrap: &str,
    topic: &str,
    sink: &str,
    options: Value,
) -> Value {
    let admin = &sluice.admin_url;
    let (status, body) = post_json(
        &format!("{admin}/kafka-clusters"),
        json!({"name": "local", "properties": {"bootstrap.servers": bootstrap}}),
    )
    .await;
    assert!(status < 300, "creating the cluster: {status} {body}");
    let (status, sub) = post_json(
        &format!("{admin}/subscriptions"),
        json!({"source": format!("kafka://local/{topic}"), "sink": sink, "options": options}),
    )
    .await;
    assert_eq!(status, 201, "{sub}");
    sub
}

#[tokio::test]
async fn records_become_invocations_exactly_once_across_kill_9() {
    const RECORDS: usize = 10_000;
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("orders", 3, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let data = tempfile::tempdir().unwrap();
    let effects = data.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    let start = || Sluice::builder().data_dir(data.path().join("data")).start();
    let sluice = start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let sub = subscribe_to(
        &sluice,
        &bootstrap,
        "orders",
        "service://Meter/work",
        json!({}),
    )
    .await;
    assert!(sub["id"].as_str().unwrap().starts_with("sub_1"));

    produce(&bootstrap, "orders", RECORDS as u32 / 2).await;
    // Kill it while consuming: some records done, some not yet.
    wait_for_done(&effects, RECORDS / 20, Duration::from_secs(60)).await;
    // Dropping the handle is a SIGKILL.
    drop(sluice);
    let before = effects_once_quiet(&effects, Duration::from_millis(500)).await;
    let done_before = before.values().filter(|(_, done)| *done > 0).count();
    assert!(
        done_before > 0 && done_before < RECORDS / 2,
        "the kill must land mid-stream: {done_before} of {} records done",
        RECORDS / 2
    );
    // Produce the rest meanwhile, and restart on the same store.
    produce(&bootstrap, "orders", RECORDS as u32 / 2).await;
    let sluice = start().await.unwrap();
    wait_for_done(&effects, RECORDS, Duration::from_secs(120)).await;
    // Settled: each record became one invocation, which completed; each side effect ran once,
    // except one under way at the kill (its result not yet journaled), which may run once more.
    // The log stopped growing for a second: no handler is still running a side effect.
    let after = effects_once_quiet(&effects, Duration::from_secs(1)).await;
    assert_eq!(
        after.len(),
        RECORDS,
        "records became more invocations than records"
    );
    let completed = sluice
        .count("SELECT count(*) AS n FROM sys_invocation WHERE target_service_name = 'Meter' AND status = 'completed'")
        .await;
    assert_eq!(completed, RECORDS as u64);
    let reruns = assert_once_but_in_flight(after.keys(), &before, &after);
    println!(
        "kill -9 with {done_before} records done; {reruns} side effects under way at the kill ran again"
    );
}

#[tokio::test]
async fn bad_subscriptions_are_meta0009_and_clusters_are_managed() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .config("[[ingress.kafka-clusters]]\nname = \"fixed\"\nbrokers = [\"127.0.0.1:1\"]\n")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let admin = &sluice.admin_url;
    let subscriptions = format!("{admin}/subscriptions");
    let subscribe = |source: &str, sink: &str, options: Value| {
        post_json(
            &subscriptions,
            json!({"source": source, "sink": sink, "options": options}),
        )
    };
    for (source, sink, options, want) in [
        (
            "http://fixed/t",
            "service://Greeter/greet",
            json!({}),
            "supported schemes: [kafka]",
        ),
        (
            "kafka://nope/t",
            "service://Greeter/greet",
            json!({}),
            "no Kafka cluster named 'nope'",
        ),
        (
            "kafka://fixed",
            "service://Greeter/greet",
            json!({}),
            "kafka://<cluster>/<topic>",
        ),
        (
            "kafka://fixed/t",
            "greeter",
            json!({}),
            "supported schemes: [service]",
        ),
        (
            "kafka://fixed/t",
            "service://Nope/greet",
            json!({}),
            "cannot find service/handler",
        ),
        (
            "kafka://fixed/t",
            "service://Greeter/nope",
            json!({}),
            "cannot find service/handler",
        ),
        (
            "kafka://fixed/t",
            "service://Signup/run",
            json!({}),
            "workflow's run handler",
        ),
        (
            "kafka://fixed/t",
            "service://Greeter/greet",
            json!({"scope": "bad scope"}),
            "invalid scope",
        ),
        (
            "kafka://fixed/t",
            "service://Greeter/greet",
            json!({"limit-key": "gold"}),
            "requires a scope",
        ),
        (
            "kafka://fixed/t",
            "service://Greeter/greet",
            json!({"max-queued": "0"}),
            "invalid option max-queued",
        ),
    ] {
        let (status, body) = subscribe(source, sink, options).await;
        assert_eq!(status, 400, "{source} {sink}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains("META0009") && message.contains(want),
            "{want}: {message}"
        );
    }
    let (status, sub) = subscribe("kafka://fixed/t", "service://Greeter/greet", json!({})).await;
    assert_eq!(status, 201, "{sub}");
    // Idempotent on source, sink and effective group.id: the same again is the same one (its
    // other options ignored); another group.id is another subscription.
    let (status, again) = subscribe(
        "kafka://fixed/t",
        "service://Greeter/greet",
        json!({"auto.offset.reset": "latest"}),
    )
    .await;
    assert_eq!((status, &again["id"]), (200, &sub["id"]), "{again}");
    let (status, grouped) = subscribe(
        "kafka://fixed/t",
        "service://Greeter/greet",
        json!({"group.id": "billing"}),
    )
    .await;
    assert_eq!(status, 201, "{grouped}");
    assert_ne!(grouped["id"], sub["id"]);
    let (status, again) = subscribe(
        "kafka://fixed/t",
        "service://Greeter/greet",
        json!({"group.id": "billing"}),
    )
    .await;
    assert_eq!((status, &again["id"]), (200, &grouped["id"]), "{again}");
    let resp = reqwest::Client::new()
        .delete(format!(
            "{admin}/subscriptions/{}",
            grouped["id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());

    let client = reqwest::Client::new();
    // Config-file clusters are read-only; admin ones are managed.
    let resp = client
        .delete(format!("{admin}/kafka-clusters/fixed"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409);
    let (status, _) = post_json(
        &format!("{admin}/kafka-clusters"),
        json!({"name": "mine", "properties": {"bootstrap.servers": "127.0.0.1:1"}}),
    )
    .await;
    assert_eq!(status, 201);
    let (status, body) = post_json(
        &format!("{admin}/kafka-clusters"),
        json!({"name": "mine", "properties": {"bootstrap.servers": "127.0.0.1:1"}}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = post_json(
        &format!("{admin}/kafka-clusters"),
        json!({"name": "x", "properties": {}}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (_, other) = subscribe("kafka://mine/t", "service://Greeter/greet", json!({})).await;
    let resp = client
        .delete(format!("{admin}/kafka-clusters/mine"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409, "it has a subscription");
    let listed: Value = client
        .get(format!(
            "{admin}/kafka-clusters/mine?include_subscriptions=true"
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["subscriptions"][0]["id"], other["id"]);
    let resp = client
        .delete(format!("{admin}/kafka-clusters/mine?force=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let resp = client
        .get(format!(
            "{admin}/subscriptions/{}",
            other["id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        404,
        "forced deletion takes its subscriptions along"
    );
    let listed: Value = client
        .get(format!(
            "{admin}/subscriptions?sink=service://Greeter/greet"
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["subscriptions"].as_array().unwrap().len(), 1);
    // The CLI.
    let id = sub["id"].as_str().unwrap();
    let (ok, out) = sluice_tests::cli(&sluice, "subscriptions", &["list"]);
    assert!(ok && out.contains("SOURCE") && out.contains(id), "{out}");
    let (ok, out) = sluice_tests::cli(
        &sluice,
        "subscriptions",
        &[
            "create",
            "kafka://fixed/u",
            "service://Greeter/greet",
            "--option",
            "auto.offset.reset=latest",
        ],
    );
    assert!(ok && out.contains("auto.offset.reset=latest"), "{out}");
    // A scope is checked like the ingress checks it.
    let (ok, out) = sluice_tests::cli(
        &sluice,
        "subscriptions",
        &[
            "create",
            "kafka://fixed/u",
            "service://Greeter/greet",
            "--option",
            "scope=not a scope!",
        ],
    );
    assert!(
        !ok && out.contains("META0009") && out.contains("invalid scope"),
        "{out}"
    );
    let (ok, out) = sluice_tests::cli(
        &sluice,
        "subscriptions",
        &["create", "kafka://fixed/u", "service://Nope/greet"],
    );
    assert!(!ok && out.contains("META0009"), "{out}");
    let (ok, out) = sluice_tests::cli(&sluice, "subscriptions", &["delete", id]);
    assert!(ok && out.contains("deleted"), "{out}");
    let (ok, out) = sluice_tests::cli(&sluice, "subscriptions", &["describe", id]);
    assert!(!ok && out.contains("does not exist"), "{out}");
}

/// A mock broker with `topic` (of `partitions`), Sluice with flow control under `rules`, the
/// test deployment, a subscription of `Meter/hold` to the topic with `options`, and a producer.
async fn subscribed(
    (topic, partitions): (&str, i32),
    rules: Value,
    options: Value,
) -> (
    MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    Sluice,
    TestDeployment,
    Value,
    FutureProducer,
) {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(topic, partitions, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let (status, body) = sluice.put_rules(rules).await;
    assert_eq!(status, 200, "{body}");
    let sub = subscribe_to(&sluice, &bootstrap, topic, "service://Meter/hold", options).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    (cluster, sluice, dep, sub, producer)
}

#[tokio::test]
async fn a_scoped_subscription_is_limited_and_pauses_while_its_queue_is_full() {
    const RECORDS: u32 = 20;
    let (_cluster, sluice, _dep, sub, producer) = subscribed(
        ("held", 1),
        json!([{"pattern": "*", "limits": {"concurrency": 2}}]),
        // The limit key with a trailing slash is stored as the key it counts under: `gold`.
        json!({"scope": "kq", "limit-key": "gold/", "max-queued": "4"}),
    )
    .await;
    let admin = &sluice.admin_url;
    for _ in 0..RECORDS {
        producer
            .send(
                FutureRecord::<(), _>::to("held").payload("300"),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let (mut paused_seen, mut most_queued) = (false, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, shown) = get_json(&format!(
            "{admin}/subscriptions/{}",
            sub["id"].as_str().unwrap()
        ))
        .await;
        paused_seen |= shown["paused"] == true;
        let queued = sluice
            .count(
                "SELECT CAST(coalesce(sum(num_inbox), 0) AS BIGINT) AS n FROM sys_vqueue_meta WHERE scope = 'kq'",
            )
            .await;
        most_queued = most_queued.max(queued);
        let done = sluice.count(
            "SELECT count(*) AS n FROM sys_invocation WHERE scope = 'kq' AND status = 'completed'",
        )
        .await;
        if done == u64::from(RECORDS) || tokio::time::Instant::now() > deadline {
            assert_eq!(done, u64::from(RECORDS), "all records ran");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(paused_seen, "consumption paused while the queue was over 4");
    // /metrics counts the records and, once librdkafka reports it, the lag: none left.
    let id = sub["id"].as_str().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let samples = sluice.metrics().await;
        let value = |name: &str| {
            samples
                .get(&format!("{name}{{subscription=\"{id}\"}}"))
                .copied()
        };
        if value("sluice_kafka_records_total") >= Some(f64::from(RECORDS))
            && value("sluice_kafka_lag_records") == Some(0.0)
            && value("sluice_kafka_paused_partitions") == Some(0.0)
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{samples:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        (1..=12).contains(&most_queued),
        "the queue held records and stayed near its bound: {most_queued}"
    );
    let keyed = sluice
        .count("SELECT count(*) AS n FROM sys_invocation WHERE scope = 'kq' AND limit_key = 'gold'")
        .await;
    assert_eq!(
        keyed,
        u64::from(RECORDS),
        "every record's limit key is `gold`"
    );
    let peak = sluice_tests::peak(&sluice.ingress_url).await;
    assert_eq!(peak, 2, "never more than 2 at once under *=2");
}

/// Records name their scope in a header: a full scope pauses only the Kafka partition feeding
/// it, while another partition's records (another scope) keep flowing.
#[tokio::test]
async fn a_full_scope_pauses_only_the_partition_that_feeds_it() {
    const BUSY: u32 = 24;
    const FREE: u32 = 20;
    let (_cluster, sluice, _dep, sub, producer) = subscribed(
        ("mixed", 2),
        json!([{"pattern": "busy", "limits": {"concurrency": 1}}]),
        json!({"max-queued": "4"}),
    )
    .await;
    let admin = &sluice.admin_url;
    let scoped = |partition: i32, scope: &'static str, payload: &'static str| {
        FutureRecord::<(), _>::to("mixed")
            .partition(partition)
            .payload(payload)
            .headers(
                rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
                    key: "x-service-scope",
                    value: Some(scope),
                }),
            )
    };
    for _ in 0..BUSY {
        producer
            .send(scoped(0, "busy", "300"), Duration::from_secs(10))
            .await
            .unwrap();
    }
    let sluice = &sluice;
    let done = |scope: &str| {
        let sql = format!(
            "SELECT count(*) AS n FROM sys_invocation WHERE scope = '{scope}' AND status = 'completed'"
        );
        async move { sluice.count(&sql).await }
    };
    // Partition 0 pauses once its scope's queue is over 4.
    let url = format!("{admin}/subscriptions/{}", sub["id"].as_str().unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, shown) = get_json(&url).await;
        if shown["paused_partitions"] == json!([0]) {
            assert_eq!(shown["paused"], true, "{shown}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "partition 0 never paused: {shown}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Partition 1's records, in another scope, run while partition 0 waits.
    for _ in 0..FREE {
        producer
            .send(scoped(1, "free", "0"), Duration::from_secs(10))
            .await
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while done("free").await < u64::from(FREE) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the free scope's records never all ran"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let busy_done = done("busy").await;
    assert!(
        busy_done < u64::from(BUSY) / 2,
        "the free partition did not wait for the busy one: {busy_done} busy done"
    );
    // The busy partition resumes as its queue drains, and every record runs.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while done("busy").await < u64::from(BUSY) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the busy scope's records never all ran"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, shown) = get_json(&url).await;
    assert_eq!(shown["paused"], false, "{shown}");
}

#[tokio::test]
async fn records_that_cannot_become_invocations_are_skipped_as_ing0009_and_the_rest_run() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("mixed", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let data = tempfile::tempdir().unwrap();
    let effects = data.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    let sluice = Sluice::builder()
        .data_dir(data.path().join("data"))
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    subscribe_to(
        &sluice,
        &bootstrap,
        "mixed",
        "service://Meter/work",
        json!({}),
    )
    .await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    // Two records that break the flow-control rules, then three good ones, in one partition.
    for (header, value) in [
        ("x-service-scope", "bad scope"),
        ("x-service-priority", "urgent"),
        ("x-good", "1"),
        ("x-good", "2"),
        ("x-good", "3"),
    ] {
        let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
            key: header,
            value: Some(value),
        });
        producer
            .send(
                FutureRecord::<(), str>::to("mixed")
                    .payload("0")
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    wait_for_done(&effects, 3, Duration::from_secs(60)).await;
    // The skipped records were read before the good ones: both are logged by now, coded.
    let log = sluice.stderr();
    let skipped: Vec<&str> = log.lines().filter(|l| l.contains("ING0009")).collect();
    assert_eq!(skipped.len(), 2, "each skip is logged once, coded:\n{log}");
    assert!(
        skipped[0].contains("RT0024") && skipped[0].contains("scope"),
        "{}",
        skipped[0]
    );
    assert!(
        skipped[1].contains("RT0024") && skipped[1].contains("priority"),
        "{}",
        skipped[1]
    );
    let settled = effects_once_quiet(&effects, Duration::from_millis(500)).await;
    assert_eq!(settled.len(), 3, "only the good records were invoked");
}
