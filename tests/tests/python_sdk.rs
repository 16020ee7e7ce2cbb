//! The Python SDK through Sluice (`tests/py-deployment`, PyPI `restate-sdk` served by hypercorn
//! over HTTP/2 with prior knowledge): a Python handler's scoped calls and sends are admitted
//! under the rule book (concurrency measured in the deployment), scope and limit key reach the
//! callee, and the durable basics run: `ctx.run` once across a durable sleep, object state,
//! an awakeable, a workflow's promise.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment};

async fn started(rules: Value) -> (Sluice, TestDeployment) {
    let dep = TestDeployment::python().await.unwrap();
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
async fn a_python_handlers_scoped_calls_and_sends_are_admitted_under_the_rule_book() {
    let (sluice, _dep) = started(json!([{"pattern": "py", "limits": {"concurrency": 2}}])).await;
    // Scope and limit key reach the callee, from the ingress and from a handler's call.
    assert_eq!(
        ok(
            &sluice,
            "/service/scope/t1/call/PyMeter/whoami?limit-key=gold",
            Value::Null
        )
        .await,
        json!({"scope": "t1", "limitKey": "gold"})
    );
    assert_eq!(
        ok(
            &sluice,
            "/service/call/PyMeter/askWho",
            json!({"scope": "t2", "limitKey": "eu/gold"})
        )
        .await,
        json!({"scope": "t2", "limitKey": "eu/gold"})
    );
    // Six calls at once from one handler into `py`: two run at a time.
    let started = Instant::now();
    let fanned = ok(
        &sluice,
        "/service/call/PyMeter/fanOut",
        json!({"scope": "py", "limitKey": "k", "calls": 6, "millis": 300}),
    )
    .await;
    assert_eq!(fanned, json!(6));
    assert_eq!(
        ok(&sluice, "/service/call/PyMeter/peak", Value::Null).await,
        json!(2)
    );
    assert!(
        started.elapsed() >= Duration::from_millis(850),
        "three rounds of 300 ms"
    );
    // Four sends from a handler: acknowledged at once, then run two at a time.
    ok(
        &sluice,
        "/service/call/PyMeter/sendHolds",
        json!({"scope": "py", "sends": 4, "millis": 300}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while sluice
        .count("SELECT count(*) AS n FROM sys_invocation WHERE scope = 'py' AND target_handler_name = 'hold' AND status = 'completed'")
        .await
        < 10
    {
        assert!(Instant::now() < deadline, "the sent holds did not all complete");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        ok(&sluice, "/service/call/PyMeter/peak", Value::Null).await,
        json!(2)
    );
}

#[tokio::test]
async fn the_durable_basics_run_through_sluice() {
    let (sluice, _dep) = started(json!([])).await;
    // ctx.run then a durable sleep: the effect ran once, and its journaled result is what the
    // handler saw.
    let once = ok(&sluice, "/service/call/PyMeter/runOnce", json!(200)).await;
    assert_eq!(once["seen"], once["effects"], "{once}");
    // Object state, kept per key.
    assert_eq!(
        ok(&sluice, "/service/call/PyCounter/a/add", json!(2)).await,
        json!(2)
    );
    assert_eq!(
        ok(&sluice, "/service/call/PyCounter/a/add", json!(3)).await,
        json!(5)
    );
    assert_eq!(
        ok(&sluice, "/service/call/PyCounter/a/get", Value::Null).await,
        json!(5)
    );
    assert_eq!(
        ok(&sluice, "/service/call/PyCounter/b/get", Value::Null).await,
        json!(0)
    );
    // An awakeable resolved over the ingress.
    let ingress = sluice.ingress_url.clone();
    let waiting = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{ingress}/service/call/PyMeter/awaitAwakeable"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    let id = sluice_tests::next_awakeable(&sluice.ingress_url, "PyMeter", "").await;
    let (status, _) = call(
        &sluice,
        &format!("/service/awakeables/{id}/resolve"),
        json!("py"),
    )
    .await;
    assert_eq!(status, 202);
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the awakeable resolves the handler")
        .unwrap();
    assert_eq!(answer, "\"py\"");
    // A workflow waits on its promise until a shared handler resolves it.
    let (status, _) = call(
        &sluice,
        "/service/send/PySignup/ann/run",
        json!("ann@example.com"),
    )
    .await;
    assert_eq!(status, 202);
    assert_eq!(
        ok(&sluice, "/service/call/PySignup/ann/confirm", json!("1234")).await,
        json!("ok")
    );
    let resp = reqwest::get(format!(
        "{}/service/workflow/PySignup/ann/attach",
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
