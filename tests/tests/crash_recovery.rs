//! Durability: invocations accepted before a `kill -9` complete after restart, and a journaled
//! `ctx.run` never runs again; retryable failures are retried with back-off.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use sluice_tests::{Sluice, TestDeployment, assert_once_but_in_flight, effects_once_quiet};

const SENDS: usize = 200;

/// Sluice with four invoker slots and bidi attempts that suspend on their sleep after 300 ms:
/// the sends start a few at a time, so a kill finds some done, some sleeping and some never
/// started.
async fn start_slow(data_dir: Option<&Path>) -> Sluice {
    let mut builder = Sluice::builder()
        .env("SERVICE_WORKER__INVOKER__INACTIVITY_TIMEOUT", "300ms")
        .env("SERVICE_WORKER__INVOKER__CONCURRENT_INVOCATIONS_LIMIT", "4");
    if let Some(dir) = data_dir {
        builder = builder.data_dir(dir);
    }
    builder.start().await.unwrap()
}

#[tokio::test]
async fn accepted_invocations_survive_kill_9_and_run_exactly_once() {
    let log = tempfile::tempdir().unwrap();
    let effects = log.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    let mut sluice = start_slow(None).await;
    sluice.register(&dep.uri, false).await;

    let client = reqwest::Client::new();
    let mut acknowledged = Vec::new();
    for i in 0..SENDS {
        let millis = 200 + (i % 10) * 150;
        let resp = client
            .post(format!("{}/service/send/Meter/work", sluice.ingress_url))
            .header("content-type", "application/json")
            .body(millis.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        let sent: Value = resp.json().await.unwrap();
        acknowledged.push(sent["invocationId"].as_str().unwrap().to_owned());
    }
    // Kill once a tenth is done.
    sluice_tests::until_done(&effects, SENDS / 10, "the sends never got going").await;
    sluice.signal(Signal::SIGKILL).unwrap();
    let killed = sluice.wait_exit(Duration::from_secs(5)).unwrap();
    assert!(!killed.status.success());
    // What ran until the kill (an attempt cut off by it may still finish its side effect).
    let before = effects_once_quiet(&effects, Duration::from_millis(500)).await;
    let started = before.len();
    let done = before.values().filter(|(_, done)| *done > 0).count();
    assert!(
        done > 0 && started < SENDS,
        "the kill must land mid-stream: {done} done, {started} of {SENDS} started"
    );

    let again = start_slow(Some(&sluice.data_dir)).await;
    // Every acknowledged invocation completes: timers re-armed, attempts replayed, the ones
    // that never started started now.
    if let Err(finished) =
        sluice_tests::all_done(&effects, &acknowledged, Duration::from_secs(90)).await
    {
        panic!("{finished} of {SENDS} acknowledged invocations finished after the restart");
    }
    for id in &acknowledged {
        let completed = again
            .invocation_until(id, "completed after the restart", |seen| {
                seen["status"] == "completed"
            })
            .await;
        assert_eq!(completed["id"], id.as_str(), "{completed}");
    }
    // Settled (the effects log stopped growing: an attempt cut off by the kill may still have
    // been finishing its side effect in the deployment), and each side effect ran once per
    // invocation — except one that was under way at the kill (its result not yet journaled),
    // which may run once more.
    let after = effects_once_quiet(&effects, Duration::from_millis(500)).await;
    assert_eq!(after.len(), SENDS, "side effects of invocations never sent");
    let reruns = assert_once_but_in_flight(&acknowledged, &before, &after);
    println!(
        "kill -9 with {done} done and {started} of {SENDS} started; {reruns} side effects under way at the kill ran again"
    );
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
    // The call is in flight (its attempt runs on the deployment) before the signal.
    let deadline = Instant::now() + Duration::from_secs(20);
    while sluice
        .count("SELECT count(*) AS n FROM sys_invocation WHERE target_handler_name = 'slow' AND status = 'running'")
        .await
        == 0
    {
        assert!(Instant::now() < deadline, "the call never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    sluice.kill_9();

    let again = sluice.restart(Sluice::builder()).await;
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

/// The segment files of `data_dir`'s local log, oldest first.
fn segments(data_dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(data_dir.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    files
}

/// Sends far-off `Greeter/greet` calls until the local log's segments are `done`, then kills
/// the server: every send was acknowledged, so stored in the log.
async fn log_until(
    builder: sluice_tests::Builder,
    done: impl Fn(&[std::path::PathBuf]) -> bool,
) -> Sluice {
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = builder
        .env("SERVICE_WORKER__LOG_SEGMENT_SIZE", "64KiB")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let body = "x".repeat(2000);
    let mut sent = 0;
    while !done(&segments(&sluice.data_dir)) {
        sluice.send("/Greeter/greet/send?delay=8760h", &body).await;
        sent += 1;
        assert!(sent < 10_000, "the log never got there");
    }
    sluice.kill_9();
    sluice
}

/// A crash tears at most the last record of the log. Damage before a good record (a flipped
/// bit, a deleted segment) or a log that no longer reaches back to what the store needs (a
/// deleted `sluice.redb` after segments were recycled) refuses to start with STO0003, naming
/// the file and offset, instead of starting healthy without acknowledged sends; the operator
/// can choose to start without them.
#[tokio::test]
async fn a_damaged_local_log_refuses_to_start_unless_told_to_truncate() {
    // No checkpoint while the test writes: every record is needed from the log.
    let quiet = || Sluice::builder().env("SERVICE_WORKER__LOG_CHECKPOINT_INTERVAL", "1h");
    let sluice = log_until(quiet(), |s| s.len() >= 3).await;
    let first = segments(&sluice.data_dir)[0].clone();
    let bytes = std::fs::read(&first).unwrap();
    let mut flipped = bytes.clone();
    flipped[40] ^= 0x04;
    std::fs::write(&first, &flipped).unwrap();
    let done = quiet().data_dir(&sluice.data_dir).run_to_exit().unwrap();
    sluice_tests::assert_startup_error(&done, "STO0003");
    let name = first.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        done.stderr.contains(&name) && done.stderr.contains("at byte 0"),
        "{}",
        done.stderr
    );
    // Told to, it starts without the records from the damage on.
    let mut truncated = quiet()
        .data_dir(&sluice.data_dir)
        .env("SERVICE_WORKER__TRUNCATE_DAMAGED_LOG", "true")
        .start()
        .await
        .unwrap();
    truncated.kill_9();

    // A segment in the middle lost.
    let sluice = log_until(quiet(), |s| s.len() >= 4).await;
    std::fs::remove_file(&segments(&sluice.data_dir)[1]).unwrap();
    let done = quiet().data_dir(&sluice.data_dir).run_to_exit().unwrap();
    sluice_tests::assert_startup_error(&done, "STO0003");

    // The store deleted after checkpoints recycled the log's first segments.
    let recycled = |s: &[std::path::PathBuf]| {
        s.first().is_some_and(|oldest| {
            oldest
                .file_name()
                .is_some_and(|n| n != "00000000000000000001.log")
        })
    };
    let sluice = log_until(Sluice::builder(), recycled).await;
    std::fs::remove_file(sluice.data_dir.join("sluice.redb")).unwrap();
    let done = Sluice::builder()
        .data_dir(&sluice.data_dir)
        .run_to_exit()
        .unwrap();
    sluice_tests::assert_startup_error(&done, "STO0003");
    assert!(done.stderr.contains("sluice.redb"), "{}", done.stderr);
}

/// Under `*` = 2 a slot passes to the next waiter when the deployment ends an attempt, before
/// that end is stored. A kill -9 amid that (sends of 25 ms each, ends every ~12 ms) must not let
/// more than two run at once in the deployment, before or after the restart: recovery admits
/// every unfinished invocation through the rule book again.
#[tokio::test]
async fn a_scope_limit_holds_in_the_deployment_across_a_kill_9_while_slots_pass_on() {
    const CALLS: usize = 80;
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    sluice
        .set_rules(serde_json::json!([{"pattern": "*", "limits": {"concurrency": 2}}]))
        .await;
    let mut acknowledged = Vec::new();
    for _ in 0..CALLS {
        acknowledged.push(sluice.send("/service/scope/s1/send/Meter/hold", &25).await);
    }
    // Killed once a quarter has run: slots are passing on.
    sluice
        .invocation_until(&acknowledged[CALLS / 4], "run before the kill", |seen| {
            seen["status"] == "completed"
        })
        .await;
    sluice.kill_9();
    let again = sluice.restart(Sluice::builder()).await;
    // The last send waits behind the ~60 the kill left (≥ 0.7 s of work at two at a time).
    let (_, last) = again.describe(&acknowledged[CALLS - 1]).await;
    assert_ne!(last["status"], "completed", "the kill must land mid-stream");
    for id in &acknowledged {
        again
            .invocation_until(id, "completed after the restart", |seen| {
                seen["status"] == "completed"
            })
            .await;
    }
    // The most that ran at once in the deployment, over both lives of Sluice.
    let peak = sluice_tests::peak(&again.ingress_url).await;
    assert!(peak <= 2, "{peak} ran at once under a limit of 2");
    assert_eq!(peak, 2, "the limit's two slots were used");
}
