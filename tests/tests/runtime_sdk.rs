//! The partition runtime driving invocations on the real Rust SDK deployment: outputs,
//! terminal failures, `ctx.run` resolved through the journal, `ctx.sleep` through a durable
//! timer and replay, and recovery after every partition task is torn down mid-invocation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sluice_config::Config;
use sluice_core::ids::InvocationId;
use sluice_protocol::{Message, proto};
use sluice_runtime::discovery::{DiscoveryClient, DiscoveryRequest};
use sluice_runtime::partition::Runtime;
use sluice_runtime::registry::{Registration, Registry};
use sluice_store::invocation::identity::partition_key;
use sluice_store::invocation::{Failure, InvocationRecord, Outcome, Target};
use sluice_store::storage::Store;
use sluice_tests::TestDeployment;

struct Fixture {
    store: Arc<Store>,
    registry: Arc<Registry>,
    config: Arc<Config>,
    _dir: tempfile::TempDir,
    _deployment: TestDeployment,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let registry = Arc::new(Registry::load(Arc::clone(&store)).unwrap());
    let deployment = TestDeployment::start("v1").await.unwrap();
    let found = DiscoveryClient::default()
        .discover(&DiscoveryRequest {
            uri: deployment.uri.parse().unwrap(),
            additional_headers: BTreeMap::new(),
            use_http_11: false,
        })
        .await
        .unwrap();
    let registration = Registration::new(deployment.uri.clone());
    registry.register(found, registration, 0).unwrap();
    Fixture {
        store,
        registry,
        config: Arc::new(Config::default()),
        _dir: dir,
        _deployment: deployment,
    }
}

fn invocation(handler: &str, json: &str) -> (InvocationRecord, sluice_protocol::Frame) {
    let id = InvocationId::generate(partition_key(&["Greeter", handler]));
    let target = Target {
        service: "Greeter".into(),
        handler: handler.into(),
        key: None,
    };
    let input = Message::Input(proto::InputCommandMessage {
        headers: Vec::new(),
        value: Some(proto::Value {
            content: Bytes::copy_from_slice(json.as_bytes()),
        }),
        name: String::new(),
    })
    .to_frame(false);
    (InvocationRecord::new(id, target, 0), input)
}

async fn run(rt: &Runtime, handler: &str, json: &str) -> Outcome {
    let (record, input) = invocation(handler, json);
    let id = record.id;
    rt.submit(record, input).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), rt.outcome(id))
        .await
        .expect("completes in time")
        .unwrap()
}

#[tokio::test]
async fn invocations_complete_through_partitions() {
    let f = fixture().await;
    let (rt, receivers) = Runtime::new(2);
    let _tasks = rt
        .spawn(receivers, &f.store, &f.registry, &f.config)
        .unwrap();

    assert_eq!(
        run(&rt, "greet", "\"Bob\"").await,
        Outcome::Value(b"\"Hello, Bob!\"".to_vec())
    );
    assert_eq!(
        run(&rt, "fail", "\"boom\"").await,
        Outcome::Failure(Failure {
            code: 500,
            message: "boom".into()
        })
    );
    // ctx.run: proposed, journaled, replayed, completed.
    let Outcome::Value(stamp) = run(&rt, "stamp", "null").await else {
        panic!("a value")
    };
    assert!(String::from_utf8(stamp).unwrap().contains("SystemTime"));
    // ctx.sleep: suspension, durable timer, replay.
    assert_eq!(
        run(&rt, "slow", "200").await,
        Outcome::Value(b"200".to_vec())
    );
}

#[tokio::test]
async fn a_sleeping_invocation_survives_its_partitions() {
    let f = fixture().await;
    let (first, receivers) = Runtime::new(2);
    let tasks = first
        .spawn(receivers, &f.store, &f.registry, &f.config)
        .unwrap();
    let (record, input) = invocation("slow", "1500");
    let id = record.id;
    first.submit(record, input).await.unwrap();
    // Its sleep is a durable timer before the partitions go.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !f
        .store
        .with_db(sluice_store::invocation::store::load_timers)
        .unwrap()
        .unwrap()
        .iter()
        .any(|timer| timer.invocation == id)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the sleep was never stored"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for task in tasks {
        task.abort();
    }
    drop(first);

    let (second, receivers) = Runtime::new(2);
    let _tasks = second
        .spawn(receivers, &f.store, &f.registry, &f.config)
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), second.outcome(id))
        .await
        .expect("completes after recovery")
        .unwrap();
    assert_eq!(outcome, Outcome::Value(b"1500".to_vec()));
}

/// Attempts an invocation needed, read back from the store once it completed.
fn attempts_of(f: &Fixture, id: InvocationId) -> u32 {
    f.store
        .with_db(|db| sluice_store::invocation::store::load_record(db, id))
        .unwrap()
        .unwrap()
        .expect("stored")
        .attempts
}

#[tokio::test]
async fn bidi_attempts_stream_completions_and_suspend_when_idle() {
    let mut f = fixture().await;
    let (rt, receivers) = Runtime::new(1);
    let _tasks = rt
        .spawn(receivers, &f.store, &f.registry, &f.config)
        .unwrap();
    // The run's completion and the timer's completion reach the open stream: one attempt.
    for (handler, json) in [("stamp", "null"), ("slow", "300")] {
        let (record, input) = invocation(handler, json);
        let id = record.id;
        rt.submit(record, input).await.unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(20), rt.outcome(id))
            .await
            .expect("completes in time")
            .unwrap();
        assert!(matches!(outcome, Outcome::Value(_)), "{outcome:?}");
        assert_eq!(attempts_of(&f, id), 1, "{handler} ran in one bidi attempt");
    }

    // Idle longer than the inactivity timeout: the request body is closed, the SDK suspends,
    // and the timer starts a second attempt that replays and completes.
    let mut config = Config::default();
    config.worker.invoker.inactivity_timeout = "100ms".parse().unwrap();
    f.config = Arc::new(config);
    let (rt, receivers) = Runtime::new(1);
    let _tasks = rt
        .spawn(receivers, &f.store, &f.registry, &f.config)
        .unwrap();
    let (record, input) = invocation("slow", "1000");
    let id = record.id;
    rt.submit(record, input).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), rt.outcome(id))
        .await
        .expect("completes in time")
        .unwrap();
    assert_eq!(outcome, Outcome::Value(b"1000".to_vec()));
    assert_eq!(attempts_of(&f, id), 2, "suspended once, resumed once");
}
