//! Durability: invocations accepted before a `kill -9` complete after restart, and a journaled
//! `ctx.run` never runs again; retryable failures are retried with back-off.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use sluice_tests::{Sluice, TestDeployment, meter_counts};

const SENDS: usize = 200;

async fn wait_for(sluice: &Sluice, want: (u64, u64), within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let seen = meter_counts(sluice).await;
        assert!(
            seen.0 <= want.0 && seen.1 <= want.1,
            "executed more than once: {seen:?}"
        );
        if seen == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "stuck at {seen:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn accepted_invocations_survive_kill_9_and_run_exactly_once() {
    let dep = TestDeployment::start("v1").await.unwrap();
    // Sleeping bidi attempts give their stream back quickly (they suspend), so all 200 run
    // their first side effect before the kill rather than queueing for HTTP/2 streams.
    let inactivity = ("SERVICE_WORKER__INVOKER__INACTIVITY_TIMEOUT", "300ms");
    let mut sluice = Sluice::builder()
        .env(inactivity.0, inactivity.1)
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;

    let client = reqwest::Client::new();
    for _ in 0..SENDS {
        let resp = client
            .post(format!("{}/service/send/Meter/work", sluice.ingress_url))
            .header("content-type", "application/json")
            .body("3000")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
    }
    // Every first side effect has run; the invocations now sleep (on a slow machine the first
    // ones may have woken and finished already).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = meter_counts(&sluice).await;
        assert!(
            seen.0 <= SENDS as u64 && seen.1 <= seen.0,
            "executed more than once: {seen:?}"
        );
        if seen.0 == SENDS as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stuck at {seen:?} before the kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    sluice.signal(Signal::SIGKILL).unwrap();
    let killed = sluice.wait_exit(Duration::from_secs(5)).unwrap();
    assert!(!killed.status.success());

    let again = Sluice::builder()
        .env(inactivity.0, inactivity.1)
        .data_dir(&sluice.data_dir)
        .start()
        .await
        .unwrap();
    // Timers re-armed, attempts replayed: all complete, and no first side effect ran twice.
    wait_for(
        &again,
        (SENDS as u64, SENDS as u64),
        Duration::from_secs(60),
    )
    .await;
}

#[tokio::test]
async fn retryable_failures_are_retried_then_succeed() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/service/call/Meter/flaky", sluice.ingress_url))
        .header("content-type", "application/json")
        .body("2")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let id = resp.headers()["x-service-id"].to_str().unwrap().to_owned();
    assert_eq!(resp.text().await.unwrap(), "3");
    let described: Value = reqwest::get(format!("{}/invocations/{id}", sluice.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(described["status"], "completed");
    assert_eq!(described["attempts"], 3);
    assert_eq!(described["retry_count"], 2);
    assert_eq!(described["last_failure_error_code"], "RT0007");
    assert!(
        described["last_failure"]
            .as_str()
            .unwrap()
            .contains("flaky failure 2"),
        "{described}"
    );
    let listed: Value = reqwest::get(format!(
        "{}/invocations?service=Meter&status=completed",
        sluice.admin_url
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert!(
        listed["invocations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == id.as_str())
    );
    let missing = reqwest::get(format!(
        "{}/invocations/inv_1{}",
        sluice.admin_url,
        "0".repeat(33)
    ))
    .await
    .unwrap();
    assert_eq!(missing.status(), 404);
}

#[tokio::test]
async fn sigterm_drains_an_in_flight_call() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = Sluice::builder()
        .env("SERVICE_SHUTDOWN_GRACE_PERIOD", "20s")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let url = format!("{}/service/call/Greeter/slow", sluice.ingress_url);
    let call = tokio::spawn(async move {
        let resp = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .body("1500")
            .send()
            .await
            .unwrap();
        (resp.status(), resp.text().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signalled = Instant::now();
    sluice.signal(Signal::SIGTERM).unwrap();
    let (status, body) = call.await.unwrap();
    assert_eq!(
        (status.as_u16(), body.as_str()),
        (200, "1500"),
        "the in-flight call finished"
    );
    let done = tokio::task::spawn_blocking(move || {
        sluice.wait_exit(Duration::from_secs(20)).map(|f| f.status)
    })
    .await
    .unwrap()
    .unwrap();
    assert!(done.success());
    assert!(
        signalled.elapsed() < Duration::from_secs(20),
        "exited once drained, within the grace period"
    );
}

#[tokio::test]
async fn object_state_survives_kill_9_and_operators_can_replace_it() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let call = |ingress: String, path: &'static str, body: Option<&'static str>| async move {
        let mut req = reqwest::Client::new().post(format!("{ingress}{path}"));
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body);
        }
        req.send().await.unwrap().text().await.unwrap()
    };
    assert_eq!(
        call(
            sluice.ingress_url.clone(),
            "/service/call/Counter/kept/add",
            Some("5")
        )
        .await,
        "5"
    );
    sluice.signal(Signal::SIGKILL).unwrap();
    sluice.wait_exit(Duration::from_secs(5)).unwrap();

    let again = Sluice::builder()
        .data_dir(&sluice.data_dir)
        .start()
        .await
        .unwrap();
    assert_eq!(
        call(
            again.ingress_url.clone(),
            "/service/call/Counter/kept/get",
            None
        )
        .await,
        "5"
    );

    // The admin API replaces an object's whole state.
    let edit = |service: &str, body: serde_json::Value| {
        reqwest::Client::new()
            .post(format!("{}/services/{service}/state", again.admin_url))
            .json(&body)
            .send()
    };
    let replaced = edit(
        "Counter",
        serde_json::json!({"object_key": "kept", "new_state": {"count": b"42".to_vec()}}),
    )
    .await
    .unwrap();
    assert_eq!(replaced.status(), 202);
    assert_eq!(
        call(
            again.ingress_url.clone(),
            "/service/call/Counter/kept/get",
            None
        )
        .await,
        "42"
    );
    assert_eq!(
        call(
            again.ingress_url.clone(),
            "/service/call/Counter/kept/add",
            Some("1")
        )
        .await,
        "43"
    );
    let stateless = edit(
        "Greeter",
        serde_json::json!({"object_key": "x", "new_state": {}}),
    )
    .await
    .unwrap();
    assert_eq!(stateless.status(), 400);
    let missing = edit(
        "Nope",
        serde_json::json!({"object_key": "x", "new_state": {}}),
    )
    .await
    .unwrap();
    assert_eq!(missing.status(), 404);
}
