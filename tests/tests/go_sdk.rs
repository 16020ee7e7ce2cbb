//! The Go SDK through Sluice (`tests/go-deployment`, `github.com/restatedev/sdk-go` served by
//! its own HTTP/2 server): discovery and registration, a Go handler's calls and sends through
//! a client scoped with `restate.WithScope` under `restate.WithLimitKey` admitted under the rule
//! book (concurrency measured in the deployment), scope and limit key reaching the callee, and
//! the durable basics: object state, an awakeable, a workflow's promise, and a side effect in
//! `restate.Run` that runs once across a durable sleep and across a kill -9 of Sluice.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment};

async fn started(rules: Value) -> (Sluice, TestDeployment) {
    let dep = TestDeployment::go().await.unwrap();
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
async fn the_go_deployment_registers_with_its_three_kinds_of_service() {
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
            ("GoCounter".to_owned(), "VirtualObject".to_owned()),
            ("GoMeter".to_owned(), "Service".to_owned()),
            ("GoSignup".to_owned(), "Workflow".to_owned()),
        ]
    );
}

#[tokio::test]
async fn a_go_handlers_scoped_calls_and_sends_are_admitted_under_the_rule_book() {
    let (sluice, _dep) = started(json!([{"pattern": "go", "limits": {"concurrency": 2}}])).await;
    // Scope and limit key reach the callee, from the ingress and from a handler's call.
    assert_eq!(
        ok(
            &sluice,
            "/service/scope/t1/call/GoMeter/whoami?limit-key=gold",
            Value::Null
        )
        .await,
        json!({"scope": "t1", "limitKey": "gold"})
    );
    assert_eq!(
        ok(
            &sluice,
            "/service/call/GoMeter/askWho",
            json!({"scope": "t2", "limitKey": "eu/gold"})
        )
        .await,
        json!({"scope": "t2", "limitKey": "eu/gold"})
    );
    // Six calls at once from one handler into `go`: two run at a time.
    let started = Instant::now();
    let fanned = ok(
        &sluice,
        "/service/call/GoMeter/fanOut",
        json!({"scope": "go", "limitKey": "k", "calls": 6, "millis": 300}),
    )
    .await;
    assert_eq!(fanned, json!(6));
    assert_eq!(
        ok(&sluice, "/service/call/GoMeter/peak", Value::Null).await,
        json!(2)
    );
    assert!(
        started.elapsed() >= Duration::from_millis(850),
        "three rounds of 300 ms"
    );
    // Four sends from a handler: acknowledged at once, then run two at a time.
    ok(
        &sluice,
        "/service/call/GoMeter/sendHolds",
        json!({"scope": "go", "limitKey": "k", "sends": 4, "millis": 300}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while sluice
        .count("SELECT count(*) AS n FROM sys_invocation WHERE scope = 'go' AND target_handler_name = 'hold' AND status = 'completed'")
        .await
        < 10
    {
        assert!(Instant::now() < deadline, "the sent holds did not all complete");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        ok(&sluice, "/service/call/GoMeter/peak", Value::Null).await,
        json!(2)
    );
    // The two-level key the handler gave is the one the rule book counted.
    assert_eq!(
        sluice
            .count("SELECT count(*) AS n FROM sys_invocation WHERE scope = 'go' AND limit_key = 'k' AND target_handler_name = 'hold'")
            .await,
        10
    );
}

#[tokio::test]
async fn the_durable_basics_run_through_sluice() {
    let (sluice, _dep) = started(json!([])).await;
    // restate.Run then a durable sleep: the effect ran once, and its journaled result is what
    // the handler saw.
    let once = ok(&sluice, "/service/call/GoMeter/runOnce", json!(200)).await;
    assert_eq!(once, json!({"seen": 1, "effects": 1}));
    // Object state, kept per key.
    assert_eq!(
        ok(&sluice, "/service/call/GoCounter/a/add", json!(2)).await,
        json!(2)
    );
    assert_eq!(
        ok(&sluice, "/service/call/GoCounter/a/add", json!(3)).await,
        json!(5)
    );
    assert_eq!(
        ok(&sluice, "/service/call/GoCounter/a/get", Value::Null).await,
        json!(5)
    );
    assert_eq!(
        ok(&sluice, "/service/call/GoCounter/b/get", Value::Null).await,
        json!(0)
    );
    // An awakeable resolved over the ingress.
    let ingress = sluice.ingress_url.clone();
    let waiting = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{ingress}/service/call/GoMeter/awaitAwakeable"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    let id = sluice_tests::next_awakeable(&sluice.ingress_url, "GoMeter", "").await;
    let (status, _) = call(
        &sluice,
        &format!("/service/awakeables/{id}/resolve"),
        json!("go"),
    )
    .await;
    assert_eq!(status, 202);
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the awakeable resolves the handler")
        .unwrap();
    assert_eq!(answer, "\"go\"");
    // A workflow waits on its promise until a shared handler resolves it.
    let (status, _) = call(
        &sluice,
        "/service/send/GoSignup/ann/run",
        json!("ann@example.com"),
    )
    .await;
    assert_eq!(status, 202);
    assert_eq!(
        ok(&sluice, "/service/call/GoSignup/ann/confirm", json!("1234")).await,
        json!("ok")
    );
    let resp = reqwest::get(format!(
        "{}/service/workflow/GoSignup/ann/attach",
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
async fn a_go_side_effect_runs_once_across_a_kill_9_of_sluice() {
    let (mut sluice, _dep) = started(json!([])).await;
    let (status, sent) = call(&sluice, "/service/send/GoMeter/runOnce", json!(2000)).await;
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
        ok(&sluice, "/service/call/GoMeter/effects", Value::Null).await,
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
        ok(&again, "/service/call/GoMeter/effects", Value::Null).await,
        json!(1)
    );
}
