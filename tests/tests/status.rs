//! The ingress status endpoints of the reference's 1.8: where an invocation is, answered at
//! once, by id, idempotency key or workflow key, scoped or not, one at a time or as a list.

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment, post_json};

/// GETs a status path: its status, the `x-restate-id` header and the JSON body.
async fn status(sluice: &Sluice, path: &str) -> (u16, Option<String>, Value) {
    let resp = reqwest::get(format!("{}{path}", sluice.ingress_url))
        .await
        .unwrap();
    let id = resp
        .headers()
        .get("x-restate-id")
        .map(|v| v.to_str().unwrap().to_owned());
    (
        resp.status().as_u16(),
        id,
        resp.json().await.unwrap_or(Value::Null),
    )
}

/// POSTs to the ingress with a JSON body and optional idempotency key: status and body.
async fn post(
    sluice: &Sluice,
    path: &str,
    body: &str,
    idempotency_key: Option<&str>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().post(format!("{}{path}", sluice.ingress_url));
    if !body.is_empty() {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    if let Some(key) = idempotency_key {
        request = request.header("idempotency-key", key);
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Polls a status path until its stage is `stage` (at most 15 s).
async fn until_stage(sluice: &Sluice, path: &str, stage: &str) -> (Option<String>, Value) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let (code, id, body) = status(sluice, path).await;
        if code == 200 && body["stage"] == stage {
            return (id, body);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path} never reached {stage}: {code} {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn status_says_created_started_or_completed_at_once() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .config("[ingress]\nmax-status-targets = 3\n")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;

    // Created: a delayed send has not started.
    let (code, sent) = post(&sluice, "/Greeter/greet/send?delay=1h", "\"later\"", None).await;
    assert_eq!(code, 202, "{sent}");
    let delayed = sent["invocationId"].as_str().unwrap().to_owned();
    for path in [
        format!("/restate/invocation/{delayed}/status"),
        format!("/service/invocation/{delayed}/status"),
        format!("/restate/status/{delayed}"),
        format!("/service/status/{delayed}"),
    ] {
        let (code, id, body) = status(&sluice, &path).await;
        assert_eq!((code, &body), (200, &json!({"stage": "created"})), "{path}");
        assert_eq!(id.as_deref(), Some(delayed.as_str()), "{path}");
    }

    // Started: suspended on an awakeable.
    let (code, sent) = post(&sluice, "/Meter/awaitAwakeable/send", "", None).await;
    assert_eq!(code, 202, "{sent}");
    let waiting = sent["invocationId"].as_str().unwrap().to_owned();
    until_stage(&sluice, &format!("/restate/status/{waiting}"), "started").await;

    // Completed, found by idempotency key; a failure carries its error.
    let (code, _) = post(&sluice, "/Greeter/greet", "\"Ada\"", Some("k-ok")).await;
    assert_eq!(code, 200);
    let (code, _) = post(&sluice, "/Greeter/fail", "\"418:teapot\"", Some("k-fail")).await;
    assert_ne!(code, 200);
    let (code, _, body) = status(&sluice, "/restate/invocation/Greeter/greet/k-ok/status").await;
    assert_eq!((code, body), (200, json!({"stage": "completed"})));
    let (code, _, body) = status(&sluice, "/service/invocation/Greeter/fail/k-fail/status").await;
    assert_eq!(code, 200);
    assert_eq!(body["stage"], "completed");
    assert_eq!(body["error"]["code"], 418, "{body}");
    assert_eq!(body["error"]["message"], "teapot", "{body}");
    // A keyed service's idempotent call: by service, key, handler and idempotency key.
    let (code, _) = post(&sluice, "/Counter/c1/add", "2", Some("k-add")).await;
    assert_eq!(code, 200);
    let (code, _, body) = status(&sluice, "/restate/invocation/Counter/c1/add/k-add/status").await;
    assert_eq!((code, body), (200, json!({"stage": "completed"})));

    // Workflows by key; a scoped run is another run, found by its scoped path.
    let (code, _) = post(&sluice, "/Signup/u1/run/send", "\"ada@example.com\"", None).await;
    assert_eq!(code, 202);
    until_stage(&sluice, "/restate/workflow/Signup/u1/status", "started").await;
    let (code, _, _) = status(&sluice, "/restate/scope/acme/workflow/Signup/u1/status").await;
    assert_eq!(code, 404, "the scoped run does not exist yet");
    let (code, _) = post(
        &sluice,
        "/service/scope/acme/send/Signup/u1/run",
        "\"\"",
        None,
    )
    .await;
    assert_eq!(code, 202);
    let (scoped_run, _) = until_stage(
        &sluice,
        "/restate/scope/acme/workflow/Signup/u1/status",
        "completed",
    )
    .await;
    let (code, _, _) = status(
        &sluice,
        "/service/scope/bad%20scope/workflow/Signup/u1/status",
    )
    .await;
    assert_eq!(code, 400);

    // Unknown and malformed ids.
    let unknown = "inv_1aA6MMRWDzRL5BYD303UK7dAgFVoIHpF1T";
    let (code, _, body) = status(&sluice, &format!("/restate/status/{unknown}")).await;
    assert_eq!(code, 404, "{body}");
    let (code, _, _) = status(&sluice, "/restate/status/not-an-id").await;
    assert_eq!(code, 400);

    // POST: the reference's single target body, answered like the GET.
    let (code, body) = post_json(
        &format!("{}/restate/status", sluice.ingress_url),
        json!({"target": "idempotentInvocation", "service": "Greeter", "handler": "greet", "idempotencyKey": "k-ok"}),
    )
    .await;
    assert_eq!((code, body), (200, json!({"stage": "completed"})));
    let (code, _) = post_json(
        &format!("{}/restate/status", sluice.ingress_url),
        json!({"target": "invocation", "invocationId": unknown}),
    )
    .await;
    assert_eq!(code, 404);
    // A list: ids and targets, in order, the unknown one not found.
    let (code, body) = post_json(
        &format!("{}/service/status", sluice.ingress_url),
        json!([
            delayed,
            {"target": "workflow", "workflowName": "Signup", "workflowKey": "u1", "scope": "acme"},
            unknown,
        ]),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body,
        json!([
            {"invocationId": delayed, "found": true, "stage": "created"},
            {"invocationId": scoped_run.unwrap(), "found": true, "stage": "completed"},
            {"invocationId": unknown, "found": false},
        ])
    );
    // Bounded, and every entry checked.
    let (code, body) = post_json(
        &format!("{}/service/status", sluice.ingress_url),
        json!([delayed, delayed, delayed, delayed]),
    )
    .await;
    assert_eq!(code, 400);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("ingress.max-status-targets"),
        "{body}"
    );
    let (code, body) = post_json(
        &format!("{}/service/status", sluice.ingress_url),
        json!([delayed, 7]),
    )
    .await;
    assert_eq!(code, 400);
    assert!(
        body["message"].as_str().unwrap().contains("entry 1"),
        "{body}"
    );
    // Status is read-only: GET only for one, POST only for a body.
    let resp = reqwest::Client::new()
        .post(format!("{}/restate/status/{delayed}", sluice.ingress_url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
}
