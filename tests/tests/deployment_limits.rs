//! Deployment gates end to end, measured in the deployment: a concurrency limit its discovery
//! manifest declares (for the deployment, or for one service) bounds every attempt on it and
//! says so in why-waiting and SQL; and after an outage its backlog drains paced (AIMD) instead
//! of all at once, against the same outage with pacing off, with attempts that hold their slot
//! for long (awaiting an awakeable) counted as answered when the deployment answers them.

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::{Sluice, TestDeployment, free_port, peak_in_handler};

/// Sends `Meter/timed("<label> <millis>")`; answers its invocation id.
async fn send(sluice: &Sluice, label: &str, millis: u64) -> String {
    sluice
        .send("/Meter/timed/send", &format!("{label} {millis}"))
        .await
}

/// Waits until invocation `id` says a deployment gate holds it; answers what it said.
async fn waits_at_gate(sluice: &Sluice, id: &str) -> Value {
    sluice
        .invocation_until(id, "a deployment-concurrency wait", |seen| {
            seen["waiting"]["blocked_on"] == "deployment-concurrency"
        })
        .await
}

/// Waits until `n` `Meter` invocations completed.
async fn completed(sluice: &Sluice, n: u64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let done = sluice
            .count("SELECT count(*) AS n FROM sys_invocation WHERE target_service_name = 'Meter' AND status = 'completed'")
            .await;
        if done >= n {
            return;
        }
        assert!(Instant::now() < deadline, "only {done} of {n} completed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_limit_the_manifest_declares_bounds_its_deployment_and_says_so() {
    let port = free_port();
    let dep = TestDeployment::start_with(port, "v1", &[("SLUICE_TEST_LIMITS", "deployment=3")])
        .await
        .unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let (_, rows) = sluice
        .query("SELECT concurrency_limit, running FROM sys_deployment")
        .await;
    assert_eq!(rows["rows"][0]["concurrency_limit"], 3, "{rows}");

    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(send(&sluice, &format!("d{i}"), 600).await);
    }
    let why = waits_at_gate(&sluice, &ids[7]).await;
    let waiting = &why["waiting"];
    assert_eq!(waiting["limit"], 3, "{why}");
    assert!(
        waiting["deployment"]
            .as_str()
            .is_some_and(|d| d.starts_with("dp_")),
        "{why}"
    );
    let (_, rows) = sluice.query("SELECT running FROM sys_deployment").await;
    assert_eq!(rows["rows"][0]["running"], 3, "{rows}");
    let blocked = sluice
        .count("SELECT count(*) AS n FROM sys_scheduler WHERE service_name = 'Meter' AND blocked_on = 'deployment-concurrency'")
        .await;
    assert!(
        blocked >= 1,
        "sys_scheduler shows the queue held by the deployment"
    );
    let gate = waiting["deployment"].as_str().unwrap();
    let metrics = sluice.metrics().await;
    let series = |name: &str| format!("{name}{{deployment=\"{gate}\"}}");
    assert_eq!(
        metrics.get(&series("sluice_deployment_limit")),
        Some(&3.0),
        "{metrics:?}"
    );
    assert_eq!(
        metrics.get(&series("sluice_deployment_running")),
        Some(&3.0)
    );
    let gates: Value = sluice
        .admin(reqwest::Method::GET, "/limits/deployments")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(gates["gates"][0]["deployment"], gate, "{gates}");
    assert_eq!(gates["gates"][0]["declared"], 3, "{gates}");
    assert_eq!(gates["gates"][0]["running"], 3, "{gates}");
    completed(&sluice, 8, Duration::from_secs(30)).await;
    assert_eq!(
        peak_in_handler(&sluice, 8).await,
        3,
        "the deployment ran 3 at once"
    );
}

#[tokio::test]
async fn a_service_limit_holds_that_service_only() {
    let port = free_port();
    let dep = TestDeployment::start_with(port, "v1", &[("SLUICE_TEST_LIMITS", "Meter=2")])
        .await
        .unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(send(&sluice, &format!("s{i}"), 2_000).await);
    }
    let why = waits_at_gate(&sluice, &ids[3]).await;
    assert!(
        why["waiting"]["deployment"]
            .as_str()
            .is_some_and(|d| d.ends_with("/Meter")),
        "the service's own gate: {why}"
    );
    assert_eq!(why["waiting"]["limit"], 2, "{why}");
    // Another service of the deployment is not held by Meter's limit: it answers while
    // Meter's last call still waits.
    let greeting: String = reqwest::Client::new()
        .post(format!("{}/Greeter/greet", sluice.ingress_url))
        .json(&"you")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(greeting, "Hello, you!");
    let (_, still) = sluice.describe(&ids[3]).await;
    assert_eq!(
        still["waiting"]["blocked_on"], "deployment-concurrency",
        "Greeter answered only after Meter's backlog: {still}"
    );
    completed(&sluice, 4, Duration::from_secs(30)).await;
    assert_eq!(peak_in_handler(&sluice, 4).await, 2);
}

/// What the deployment saw while a backlog drained after an outage.
#[derive(Debug)]
struct Drain {
    /// Attempts it answered 503 (over its capacity).
    refused: u64,
    /// Attempts in flight at once, refused ones included.
    #[expect(dead_code, reason = "reported in the test's output")]
    peak: u64,
    /// From its return to the last completion.
    #[expect(dead_code, reason = "reported in the test's output")]
    took: Duration,
}

/// What the test deployment saw (`GET /stats`: refused, peak, failed); it speaks HTTP/2 only.
async fn deployment_stats(dep: &TestDeployment) -> Value {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap()
        .get(format!("{}stats", dep.uri))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

const HELD: usize = 2_000;
const CAPACITY: &str = "16";

/// Registers a deployment with a capacity of 16, takes it down, sends 2,000 calls, brings it
/// back after 10 s on the same port, and waits for all of them.
async fn outage(paced: bool) -> Drain {
    let port = free_port();
    let env = [("SLUICE_TEST_CAPACITY", CAPACITY)];
    let dep = TestDeployment::start_with(port, "v1", &env).await.unwrap();
    let sluice = Sluice::builder()
        .env(
            "SERVICE_WORKER__INVOKER__RETRY_POLICY__INITIAL_INTERVAL",
            "100ms",
        )
        .env("SERVICE_WORKER__INVOKER__RETRY_POLICY__MAX_INTERVAL", "1s")
        .env(
            "SERVICE_WORKER__INVOKER__DRAIN__ENABLED",
            &paced.to_string(),
        )
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    drop(dep);
    let down = Instant::now();
    for i in 0..HELD {
        send(&sluice, &format!("o{i}"), 20).await;
    }
    // The outage lasts 10 s whatever the sends took.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(down.elapsed())).await;
    let dep = TestDeployment::start_with(port, "v1", &env).await.unwrap();
    let back = Instant::now();
    completed(&sluice, HELD as u64, Duration::from_secs(120)).await;
    let took = back.elapsed();
    let stats = deployment_stats(&dep).await;
    Drain {
        refused: stats["refused"].as_u64().unwrap(),
        peak: stats["peak"].as_u64().unwrap(),
        took,
    }
}

#[tokio::test]
async fn after_an_outage_the_backlog_drains_paced_not_all_at_once() {
    let today = outage(false).await;
    let paced = outage(true).await;
    println!(
        "2,000 held through a 10 s outage, capacity {CAPACITY}: unpaced {today:?}, paced {paced:?}"
    );
    assert!(
        today.refused > 200,
        "without pacing the backlog hits the returning deployment at once: {today:?}"
    );
    assert!(
        paced.refused * 5 <= today.refused,
        "pacing cuts the 503s to a fifth or less: {paced:?} against {today:?}"
    );
    // The peak in flight is reported, not compared: a refused attempt leaves at once, so the
    // deployment's own capacity bounds it either way; the 503s are what a flood costs.
}

/// `calls` calls of `Greeter/greet` from 16 callers at once: calls per second.
async fn greet_rate(sluice: &Sluice, calls: usize) -> f64 {
    let client = reqwest::Client::new();
    let url = format!("{}/Greeter/greet", sluice.ingress_url);
    let started = Instant::now();
    let callers = (0..16).map(|_| {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            for _ in 0..calls / 16 {
                let resp = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body("\"healthy\"")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200);
            }
        })
    });
    for caller in callers.collect::<Vec<_>>() {
        caller.await.unwrap();
    }
    (calls / 16 * 16) as f64 / started.elapsed().as_secs_f64()
}

/// A deployment that answers is up: one handler answered HTTP 500 by a gateway in front of
/// it, its 100 invocations retrying every second at most, neither paces the deployment nor
/// takes its healthy handler's places under the declared limit (8). Before, the 500s made
/// the deployment "down": its window fell to 2 and its gate closed between probes, and a
/// healthy handler's 676 calls/s fell to 5.
#[tokio::test]
async fn a_failing_handler_does_not_hold_back_its_deployments_healthy_one() {
    let env = [
        ("SLUICE_TEST_HTTP_500", "/invoke/Greeter/fail"),
        ("SLUICE_TEST_LIMITS", "deployment=8"),
    ];
    let dep = TestDeployment::start_with(free_port(), "v1", &env)
        .await
        .unwrap();
    let sluice = Sluice::builder()
        .env(
            "SERVICE_WORKER__INVOKER__RETRY_POLICY__INITIAL_INTERVAL",
            "100ms",
        )
        .env("SERVICE_WORKER__INVOKER__RETRY_POLICY__MAX_INTERVAL", "1s")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let before = greet_rate(&sluice, 320).await;

    for i in 0..100 {
        sluice.send("/Greeter/fail/send", &format!("f{i}")).await;
    }
    let failed = || async { deployment_stats(&dep).await["failed"].as_u64().unwrap() };
    // Every failing invocation has failed twice or more: its retries are coming.
    let deadline = Instant::now() + Duration::from_secs(60);
    while failed().await < 200 {
        assert!(
            Instant::now() < deadline,
            "the failing handler's retries never came"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let during = greet_rate(&sluice, 320).await;
    let (status, gate) = sluice
        .query("SELECT drain_window, closed_until FROM sys_deployment")
        .await;
    assert_eq!(status, 200, "{gate}");
    // A null column is left out of its row.
    assert!(
        gate["rows"][0]["drain_window"].is_null() && gate["rows"][0]["closed_until"].is_null(),
        "the deployment is paced for one handler's 500s: {gate}"
    );
    let retried = failed().await;
    println!(
        "healthy calls/s: {before:.0} alone, {during:.0} beside a handler failing 100 invocations ({retried} 500s)"
    );
    assert!(
        during * 4.0 >= before,
        "the healthy handler fell from {before:.0} to {during:.0} calls/s"
    );
}

/// Awaits `want` of the (only) deployment's gate in `/limits/deployments`; answers what it
/// showed.
async fn gate_until(sluice: &Sluice, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    let listed = sluice
        .admin_until("/limits/deployments", what, |listed| {
            want(&listed["gates"][0])
        })
        .await;
    listed["gates"][0].clone()
}

#[tokio::test]
async fn a_paced_window_held_by_attempts_that_run_on_still_lets_new_work_start() {
    let port = free_port();
    let dep = TestDeployment::start_with(port, "v1", &[]).await.unwrap();
    // Attempts that wait on an awakeable hold their slot until it is completed: the
    // inactivity timeout that would suspend them is far beyond the test.
    let sluice = Sluice::builder()
        .quick_retries()
        .env("SERVICE_WORKER__INVOKER__INACTIVITY_TIMEOUT", "10min")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    drop(dep);
    // Two calls that will wait on an awakeable find the deployment down: it is paced, two
    // attempts at once.
    let client = reqwest::Client::new();
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let sent: Value = client
            .post(format!("{}/Meter/awaitAwakeable/send", sluice.ingress_url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        waiters.push(sent["invocationId"].as_str().unwrap().to_owned());
    }
    gate_until(&sluice, "paced at 2", |g| g["drain_window"] == 2).await;
    // Back on the same port: both waiters start and run on, filling the window they found.
    let _dep = TestDeployment::start_with(port, "v1", &[]).await.unwrap();
    for id in &waiters {
        sluice
            .invocation_until(id, "the waiter runs", |seen| seen["status"] == "running")
            .await;
    }
    // The deployment answered both: that counts now, not when they end, so the window grew
    // past what they hold and a new call starts at once.
    let paced = gate_until(&sluice, "both waiters answered", |g| {
        g["running"] == 2 && g["drain_window"].as_u64().is_some_and(|w| w > 2)
    })
    .await;
    assert_eq!(paced["drain_window"], 4, "{paced}");
    let answered = client
        .post(format!("{}/Greeter/greet", sluice.ingress_url))
        .json(&"Ada")
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    assert_eq!(answered.text().await.unwrap(), "\"Hello, Ada!\"");
}
