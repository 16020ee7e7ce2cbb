//! Operator control of invocations through the admin API and the CLI, against the real Rust
//! SDK deployment: cancel, kill, purge, pause and resume.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sluice_tests::{Sluice, TestDeployment, binary};

async fn send(sluice: &Sluice, path: &str, body: &str) -> String {
    let sent: Value = reqwest::Client::new()
        .post(format!("{}{path}", sluice.ingress_url))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    sent["invocationId"].as_str().unwrap().to_owned()
}

async fn patch(sluice: &Sluice, id: &str, op: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .patch(format!("{}/invocations/{id}/{op}", sluice.admin_url))
        .send()
        .await
        .unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn cancel_kill_and_purge() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;

    // Cancel a sleeping call: the handler sees a terminal 409 and the caller gets it.
    let url = format!("{}/service/call/Greeter/slow", sluice.ingress_url);
    let call = tokio::spawn(async move {
        let resp = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .body("30000")
            .send()
            .await
            .unwrap();
        let id = resp.headers()["x-service-id"].to_str().unwrap().to_owned();
        (
            resp.status().as_u16(),
            id,
            resp.json::<Value>().await.unwrap(),
        )
    });
    let listed = first_running(&sluice, "status=running").await;
    assert_eq!(patch(&sluice, &listed, "cancel").await.0, 202);
    let (status, id, body) = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the canceled call answers")
        .unwrap();
    assert_eq!(id, listed);
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("cancel"),
        "{body}"
    );
    assert_eq!(
        patch(&sluice, &id, "cancel").await.0,
        409,
        "already completed"
    );

    // Kill a sleeping send with the CLI: completed at once with 409 "killed".
    let killed = send(&sluice, "/service/send/Greeter/slow", "30000").await;
    sluice
        .invocation_until(&killed, "running", |v| v["status"] == "running")
        .await;
    let out = Command::new(binary())
        .args([
            "invocations",
            "kill",
            &killed,
            "--admin-url",
            &sluice.admin_url,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = sluice
        .invocation_until(&killed, "completed", |v| v["status"] == "completed")
        .await;
    assert!(seen["completion"].to_string().contains("killed"), "{seen}");

    // Killing a caller kills the child it waits on.
    let parent = send(&sluice, "/service/send/Meter/callSlow", "30000").await;
    let child = first_running(&sluice, "service=Greeter&status=running").await;
    assert_eq!(patch(&sluice, &parent, "kill").await.0, 200);
    let seen = sluice
        .invocation_until(&child, "killed with its caller", |v| {
            v["status"] == "completed"
        })
        .await;
    assert!(seen["completion"].to_string().contains("killed"), "{seen}");

    // Purge: refused while running, then the record is gone.
    let running = send(&sluice, "/service/send/Greeter/slow", "30000").await;
    let (status, refused) = patch(&sluice, &running, "purge").await;
    assert_eq!(status, 409);
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("not yet completed"),
        "{refused}"
    );
    assert_eq!(patch(&sluice, &killed, "purge").await.0, 200);
    assert_eq!(sluice.describe(&killed).await.0, 404);
    let (status, _) = patch(&sluice, "inv_1nope", "kill").await;
    assert_eq!(status, 400);
    let resp = reqwest::Client::new()
        .delete(format!(
            "{}/invocations/{running}?mode=kill",
            sluice.admin_url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    sluice
        .invocation_until(&running, "completed", |v| v["status"] == "completed")
        .await;
}

#[tokio::test]
async fn pause_stops_retries_and_resume_restarts_them() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().quick_retries().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    // Fails on its first 1000 calls in the deployment: retried until paused.
    let id = send(&sluice, "/service/send/Meter/flaky", "1000").await;
    sluice
        .invocation_until(&id, "retried", |v| v["attempts"].as_u64() >= Some(2))
        .await;
    let (status, _) = patch(&sluice, &id, "pause").await;
    assert!(status == 200 || status == 202, "{status}");
    let paused = sluice
        .invocation_until(&id, "paused", |v| v["status"] == "paused")
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, later) = sluice.describe(&id).await;
    assert_eq!(later["status"], "paused");
    assert!(
        later["attempts"].as_u64() <= paused["attempts"].as_u64().map(|a| a + 1),
        "no attempts while paused: {paused} then {later}"
    );
    assert_eq!(patch(&sluice, &id, "resume").await.0, 200);
    let before = later["attempts"].as_u64().unwrap();
    sluice
        .invocation_until(&id, "attempted again", |v| {
            v["attempts"].as_u64() > Some(before + 1)
        })
        .await;
}

/// The id of the first invocation `GET /invocations?{query}` lists, once there is one.
async fn first_running(sluice: &Sluice, query: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let list: Value = reqwest::get(format!("{}/invocations?{query}", sluice.admin_url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(first) = list["invocations"].as_array().and_then(|a| a.first()) {
            return first["id"].as_str().unwrap().to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing listed by /invocations?{query}: {list}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn output(sluice: &Sluice, id: &str) -> (u16, String) {
    let resp = reqwest::Client::new()
        .get(format!("{}/service/attach/{id}", sluice.ingress_url))
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test]
async fn restart_as_new_and_purge_journal() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;

    // A running invocation can be neither restarted nor have its journal purged.
    let slow = send(&sluice, "/service/send/Greeter/slow", "30000").await;
    sluice
        .invocation_until(&slow, "running", |v| v["status"] == "running")
        .await;
    assert_eq!(patch(&sluice, &slow, "restart-as-new").await.0, 409);
    assert_eq!(patch(&sluice, &slow, "purge-journal").await.0, 409);

    // Restarted as new through the CLI: a new id, the same input, the same result.
    let first = send(&sluice, "/service/send/Greeter/greet", "\"Ann\"").await;
    assert_eq!(
        output(&sluice, &first).await,
        (200, "\"Hello, Ann!\"".into())
    );
    let out = Command::new(binary())
        .args([
            "invocations",
            "restart-as-new",
            &first,
            "--admin-url",
            &sluice.admin_url,
        ])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = printed.trim().rsplit(' ').next().unwrap().to_owned();
    assert!(again.starts_with("inv_") && again != first, "{printed}");
    assert_eq!(
        output(&sluice, &again).await,
        (200, "\"Hello, Ann!\"".into())
    );

    // From a journal index: the entries up to it are kept and replayed (here the output, so
    // the new invocation ends as the old one did); past the end is refused, saying why.
    let entries = sluice
        .query(&format!(
            "SELECT COUNT(*) AS n FROM sys_journal WHERE id = '{first}'"
        ))
        .await
        .1["rows"][0]["n"]
        .as_i64()
        .unwrap();
    let (status, body) = patch(
        &sluice,
        &first,
        &format!("restart-as-new?from={}", entries - 1),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let replayed = body["new_invocation_id"].as_str().unwrap().to_owned();
    assert_eq!(
        output(&sluice, &replayed).await,
        (200, "\"Hello, Ann!\"".into())
    );
    let (status, body) = patch(&sluice, &first, &format!("restart-as-new?from={entries}")).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("entries"),
        "{body}"
    );
    let (status, _) = patch(&sluice, &first, "restart-as-new?deployment=keep").await;
    assert_eq!(status, 400, "deployment without from");

    // The journal is purged, the record and result stay: the input is gone, so it cannot be
    // restarted any more.
    let journal = |id: String| {
        let sluice = &sluice;
        async move {
            sluice
                .query(&format!(
                    "SELECT COUNT(*) AS n FROM sys_journal WHERE id = '{id}'"
                ))
                .await
                .1["rows"][0]["n"]
                .as_i64()
                .unwrap()
        }
    };
    assert!(journal(first.clone()).await > 0);
    assert_eq!(patch(&sluice, &first, "purge-journal").await.0, 200);
    assert_eq!(journal(first.clone()).await, 0);
    assert_eq!(
        output(&sluice, &first).await,
        (200, "\"Hello, Ann!\"".into())
    );
    let (status, body) = patch(&sluice, &first, "restart-as-new").await;
    assert_eq!(status, 410, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("purged"),
        "{body}"
    );
    assert_eq!(patch(&sluice, "inv_1nope", "purge-journal").await.0, 400);
}
