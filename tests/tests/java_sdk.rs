//! The Java SDK through Sluice (`tests/java-deployment`, Maven Central's `dev.restate:sdk-java-http`
//! 2.4.0 behind Vert.x on loopback): discovery and registration, object state, an awakeable, a
//! workflow's promise, a side effect in `ctx.run` that runs once across a durable sleep and
//! across a kill -9 of Sluice, and flow control at the edge (calls made in a scope from the
//! ingress, their concurrency measured in the handler).
//!
//! That SDK release speaks the service protocol up to V6: it has no scoped client and no limit
//! key (both came with V7), so its handlers cannot make scoped calls or see their scope; the
//! ingress still places and limits their calls (`docs/flow-control.md`, "SDKs").

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment};

async fn started(rules: Value) -> (Sluice, TestDeployment) {
    let dep = TestDeployment::java().await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let (status, body) = sluice.put_rules(rules).await;
    assert_eq!(status, 200, "{body}");
    (sluice, dep)
}

/// Calls `path` with a JSON body (none for `Null`); answers the status and the JSON answer.
async fn call(sluice: &Sluice, path: &str, body: Value) -> (u16, Value) {
    let mut req = reqwest::Client::new().post(format!("{}{path}", sluice.ingress_url));
    if !body.is_null() {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

async fn ok(sluice: &Sluice, path: &str, body: Value) -> Value {
    let (status, answer) = call(sluice, path, body).await;
    assert_eq!(status, 200, "{path}: {answer}");
    answer
}

#[tokio::test]
async fn the_java_deployment_registers_with_its_three_kinds_of_service_on_protocol_v6() {
    let (sluice, _dep) = started(json!([])).await;
    let (status, services) = sluice.get_admin("/services").await;
    assert_eq!(status, 200, "{services}");
    let mut kinds: Vec<(String, String)> = services["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["ty"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        vec![
            ("JavaCounter".to_owned(), "VirtualObject".to_owned()),
            ("JavaMeter".to_owned(), "Service".to_owned()),
            ("JavaSignup".to_owned(), "Workflow".to_owned()),
        ]
    );
    let (status, deployments) = sluice.get_admin("/deployments").await;
    assert_eq!(status, 200, "{deployments}");
    let deployment = &deployments["deployments"][0];
    assert_eq!(deployment["max_protocol_version"], 6, "{deployments}");
}

#[tokio::test]
async fn java_calls_made_in_a_scope_at_the_ingress_are_admitted_under_the_rule_book() {
    let (sluice, _dep) = started(json!([{"pattern": "java", "limits": {"concurrency": 2}}])).await;
    // Six calls at once into scope `java`: two run at a time, as the handler counts.
    let started = Instant::now();
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let ingress = sluice.ingress_url.clone();
            tokio::spawn(async move {
                let resp = reqwest::Client::new()
                    .post(format!(
                        "{ingress}/service/scope/java/call/JavaMeter/hold?limit-key=k{}",
                        i % 2
                    ))
                    .json(&json!(300))
                    .send()
                    .await
                    .unwrap();
                resp.status().as_u16()
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
    assert!(
        started.elapsed() >= Duration::from_millis(850),
        "three rounds of 300 ms"
    );
    assert_eq!(
        ok(&sluice, "/service/call/JavaMeter/peak", Value::Null).await,
        json!(2)
    );
    assert_eq!(
        sluice
            .count("SELECT count(*) AS n FROM sys_invocation WHERE scope = 'java' AND target_handler_name = 'hold' AND status = 'completed'")
            .await,
        6
    );
}

#[tokio::test]
async fn the_durable_basics_run_through_sluice() {
    let (sluice, _dep) = started(json!([])).await;
    // ctx.run then a durable sleep: the effect ran once, and its journaled result is what the
    // handler saw.
    let once = ok(&sluice, "/service/call/JavaMeter/runOnce", json!(200)).await;
    assert_eq!(once, json!({"seen": 1, "effects": 1}));
    // Object state, kept per key.
    assert_eq!(
        ok(&sluice, "/service/call/JavaCounter/a/add", json!(2)).await,
        json!(2)
    );
    assert_eq!(
        ok(&sluice, "/service/call/JavaCounter/a/add", json!(3)).await,
        json!(5)
    );
    assert_eq!(
        ok(&sluice, "/service/call/JavaCounter/a/get", Value::Null).await,
        json!(5)
    );
    assert_eq!(
        ok(&sluice, "/service/call/JavaCounter/b/get", Value::Null).await,
        json!(0)
    );
    // An awakeable resolved over the ingress.
    let ingress = sluice.ingress_url.clone();
    let waiting = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{ingress}/service/call/JavaMeter/awaitAwakeable"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    let id = sluice_tests::next_awakeable(&sluice.ingress_url, "JavaMeter", "").await;
    let (status, body) = call(
        &sluice,
        &format!("/service/awakeables/{id}/resolve"),
        json!("java"),
    )
    .await;
    assert_eq!(status, 202, "{id}: {body}");
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the awakeable resolves the handler")
        .unwrap();
    assert_eq!(answer, "\"java\"");
    // A workflow waits on its promise until a shared handler resolves it.
    let (status, _) = call(
        &sluice,
        "/service/send/JavaSignup/ann/run",
        json!("ann@example.com"),
    )
    .await;
    assert_eq!(status, 202);
    assert_eq!(
        ok(
            &sluice,
            "/service/call/JavaSignup/ann/confirm",
            json!("1234")
        )
        .await,
        json!("ok")
    );
    let resp = reqwest::get(format!(
        "{}/service/workflow/JavaSignup/ann/attach",
        sluice.ingress_url
    ))
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!("ann@example.com confirmed with 1234")
    );
}

/// A send whose handler journaled its side effect and sleeps durably survives a kill -9 of
/// Sluice: after the restart the invocation resumes from its journal and completes, and the
/// effect (counted in the deployment, which lives on) ran exactly once.
#[tokio::test]
async fn a_java_side_effect_runs_once_across_a_kill_9_of_sluice() {
    let (mut sluice, _dep) = started(json!([])).await;
    let (status, sent) = call(&sluice, "/service/send/JavaMeter/runOnce", json!(2000)).await;
    assert_eq!(status, 202, "{sent}");
    let id = sent["invocationId"].as_str().unwrap().to_owned();
    // The effect is journaled before the sleep: wait for the journal to hold the sleep.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sluice
        .count(&format!(
            "SELECT count(*) AS n FROM sys_journal WHERE id = '{id}' AND entry_type = 'SleepCommandMessage'"
        ))
        .await
        == 0
    {
        assert!(Instant::now() < deadline, "the handler never reached its sleep");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        ok(&sluice, "/service/call/JavaMeter/effects", Value::Null).await,
        json!(1)
    );
    sluice.kill_9();
    let again = sluice.restart(Sluice::builder()).await;
    let done = again
        .invocation_until(&id, "completed after the restart", |seen| {
            seen["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let output = reqwest::get(format!(
        "{}/restate/invocation/{id}/output",
        again.ingress_url
    ))
    .await
    .unwrap();
    assert_eq!(output.status(), 200);
    assert_eq!(
        output.json::<Value>().await.unwrap(),
        json!({"seen": 1, "effects": 1})
    );
    assert_eq!(
        ok(&again, "/service/call/JavaMeter/effects", Value::Null).await,
        json!(1)
    );
}
