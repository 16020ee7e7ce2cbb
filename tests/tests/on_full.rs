//! A rule's `on_full`: what a new call meets at a full key. One active run per key that drops
//! what comes meanwhile; a bounded queue that keeps the newest; a newcomer that cancels what
//! runs. Every call that goes is answered with a coded outcome its caller, an attach and a
//! status read, and the decisions hold through a kill -9.

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment, call_json, cli};

/// Sends `Meter/timed("<label> <millis>")` to scope `scope`, limit key `key`: its id.
async fn send_timed(sluice: &Sluice, scope: &str, key: &str, label: &str, millis: u64) -> String {
    sluice
        .send(
            &format!("/service/scope/{scope}/send/Meter/timed?limit-key={key}"),
            &format!("{label} {millis}"),
        )
        .await
}

/// Sends `Greeter/slow(millis)` (a durable sleep) to scope `scope`, limit key `key`: its id.
async fn send_slow(sluice: &Sluice, scope: &str, key: &str, millis: u64) -> String {
    sluice
        .send(
            &format!("/service/scope/{scope}/send/Greeter/slow?limit-key={key}"),
            &millis,
        )
        .await
}

/// Calls `path` on the ingress with `body` and `headers`: status and answer.
async fn call(sluice: &Sluice, path: &str, body: Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{}{path}", sluice.ingress_url))
        .json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

/// Waits until invocation `id` completed: its `completion_result` (`value`, or `failure <code>:
/// <message>`).
async fn outcome(sluice: &Sluice, id: &str) -> String {
    sluice
        .invocation_until(id, "completed", |seen| seen["status"] == "completed")
        .await;
    let (_, rows) = sluice
        .query(&format!(
            "SELECT completion_result FROM sys_invocation WHERE id = '{id}'"
        ))
        .await;
    rows["rows"][0]["completion_result"]
        .as_str()
        .unwrap_or_else(|| panic!("{id}: {rows}"))
        .to_owned()
}

/// `GET /restate/invocation/{id}/attach` on the ingress: status and answer.
async fn attach(sluice: &Sluice, id: &str) -> (u16, Value) {
    let resp = reqwest::get(format!(
        "{}/restate/invocation/{id}/attach",
        sluice.ingress_url
    ))
    .await
    .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

/// Waits until `Meter/timed` recorded the labels `want` (in any order), and answers every label
/// it recorded by then.
async fn ran(sluice: &Sluice, want: &[&str]) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !want.iter().all(|w| seen.iter().any(|s| s == w)) {
        assert!(
            std::time::Instant::now() < deadline,
            "only {seen:?} of {want:?} ran"
        );
        let more: Vec<(String, u64, u64)> = call_json(sluice, "Meter/timings").await;
        if more.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        seen.extend(more.into_iter().map(|(label, _, _)| label));
    }
    seen
}

#[tokio::test]
async fn on_full_drops_replaces_and_cancels_per_key_with_coded_outcomes_through_a_kill_9() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let (status, body) = sluice
        .put_rules(json!([
            {"pattern": "od/*", "limits": {"concurrency": 1, "on_full": "drop_new"}},
            {"pattern": "on/*", "limits": {"concurrency": 1, "on_full": "keep_newest"}},
        ]))
        .await;
    assert_eq!(status, 200, "{body}");
    // Refused: full needs a concurrency; a shadow rule never acts; a value it does not know.
    for (limits, mode, says) in [
        (
            json!({"on_full": "drop_new"}),
            "enforce",
            "give the rule a concurrency",
        ),
        (
            json!({"concurrency": 1, "on_full": "drop_new"}),
            "shadow",
            "mode = enforce",
        ),
        (
            json!({"concurrency": 1, "on_full": "drop"}),
            "enforce",
            "'drop' is not an on_full",
        ),
    ] {
        let (status, body) = sluice
            .put_rules(json!([{"pattern": "oz", "limits": limits, "mode": mode}]))
            .await;
        assert_eq!(
            (status, body["restate_code"].as_str()),
            (422, Some("RUL0001")),
            "{body}"
        );
        assert!(body["message"].as_str().unwrap().contains(says), "{body}");
    }
    // The CLI sets one too, and SQL shows it.
    let (ok, out) = cli(
        &sluice,
        "rules",
        &[
            "set",
            "oc/*",
            "--concurrency",
            "1",
            "--on-full",
            "cancel_running",
        ],
    );
    assert!(ok, "{out}");
    let (_, rules) = sluice
        .query("SELECT pattern, on_full FROM sys_rules ORDER BY pattern")
        .await;
    let shown: Vec<(&str, &str)> = rules["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["pattern"].as_str().unwrap(),
                r["on_full"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            ("oc/*", "cancel_running"),
            ("od/*", "drop_new"),
            ("on/*", "keep_newest")
        ]
    );

    // drop_new: one active run per key; what comes meanwhile completes 409 FLO0007, never run.
    let holder = send_timed(&sluice, "od", "k", "od-holder", 60_000).await;
    sluice
        .invocation_until(&holder, "running", |seen| seen["status"] == "running")
        .await;
    let idempotent = [("idempotency-key", "od-once")];
    let (status, body) = call(
        &sluice,
        "/service/scope/od/call/Meter/timed?limit-key=k",
        json!("od-call 10"),
        &idempotent,
    )
    .await;
    assert_eq!(
        (status, body["error_code"].as_str()),
        (409, Some("FLO0007")),
        "{body}"
    );
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("rule 'od/*', on_full = drop_new") && message.contains("limit key 'k'"),
        "{message}"
    );
    let (status, again) = call(
        &sluice,
        "/service/scope/od/call/Meter/timed?limit-key=k",
        json!("od-call 10"),
        &idempotent,
    )
    .await;
    assert_eq!(
        (status, again["error_code"].as_str()),
        (409, Some("FLO0007")),
        "an idempotent repeat reads the same outcome: {again}"
    );
    let dropped = send_timed(&sluice, "od", "k", "od-dropped", 10).await;
    let failure = outcome(&sluice, &dropped).await;
    assert!(failure.starts_with("failure 409: [FLO0007]"), "{failure}");
    let (status, body) = attach(&sluice, &dropped).await;
    assert_eq!(
        (status, body["error_code"].as_str()),
        (409, Some("FLO0007")),
        "{body}"
    );
    let other = send_timed(&sluice, "od", "other", "od-other", 10).await;
    assert_eq!(outcome(&sluice, &other).await, "value", "another key runs");

    // keep_newest: one runs, at most one waits, each newcomer replaces the one waiting; a
    // kill -9 among them changes nothing.
    let slow = send_slow(&sluice, "on", "k", 600_000).await;
    sluice
        .invocation_until(&slow, "running", |seen| seen["status"] == "running")
        .await;
    let mut waiting = Vec::new();
    for n in 1..=3 {
        waiting.push(send_timed(&sluice, "on", "k", &format!("on-{n}"), 10).await);
    }
    for id in &waiting[..2] {
        let failure = outcome(&sluice, id).await;
        assert!(failure.contains("FLO0008"), "{failure}");
    }
    sluice.kill_9();
    sluice = sluice.restart(Sluice::builder()).await;
    for n in 4..=5 {
        waiting.push(send_timed(&sluice, "on", "k", &format!("on-{n}"), 10).await);
    }
    for (at, id) in waiting[..4].iter().enumerate() {
        let failure = outcome(&sluice, id).await;
        assert!(
            failure.contains("FLO0008") && failure.contains(&waiting[at + 1]),
            "on-{} names the call that took its place, on-{}: {failure}",
            at + 1,
            at + 2
        );
    }
    let (status, body) = attach(&sluice, &waiting[0]).await;
    assert_eq!(
        (status, body["error_code"].as_str()),
        (409, Some("FLO0008")),
        "{body}"
    );
    assert_eq!(
        sluice.describe(&waiting[4]).await.1["status"].as_str(),
        Some("pending"),
        "the newest waits"
    );
    let resp = sluice
        .admin(
            reqwest::Method::PATCH,
            &format!("/invocations/{slow}/cancel"),
        )
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let seen = ran(&sluice, &["on-5"]).await;
    assert!(
        !seen
            .iter()
            .any(|l| ["on-1", "on-2", "on-3", "on-4"].contains(&l.as_str())),
        "only the newest ran: {seen:?}"
    );

    // cancel_running: a newcomer cancels the call running at its key, then runs.
    let old = send_slow(&sluice, "oc", "k", 600_000).await;
    sluice
        .invocation_until(&old, "running", |seen| seen["status"] == "running")
        .await;
    let (status, body) = call(
        &sluice,
        "/service/scope/oc/call/Greeter/slow?limit-key=k",
        json!(10),
        &[],
    )
    .await;
    assert_eq!((status, body.as_u64()), (200, Some(10)), "{body}");
    let failure = outcome(&sluice, &old).await;
    assert!(
        failure.starts_with("failure 409") && failure.to_lowercase().contains("cancel"),
        "the running call was canceled: {failure}"
    );
}
