//! The reference's 1.8 admin shapes: a deployment's `type` and `?include=status`, the SQL
//! statements that run and the wording of the ones that do not, and `sys_locks`' columns.

use serde_json::Value;
use sluice_tests::{Sluice, TestDeployment, get_json};

#[tokio::test]
async fn deployments_carry_their_type_and_on_request_their_status() {
    // `fewer` serves a subset of `v1`'s services: once v1 is registered, it serves none.
    let v1 = TestDeployment::start("fewer").await.unwrap();
    let v2 = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&v1.uri, false).await;
    // An object call pinned to the first sleeps, then the second takes every service it served.
    let resp = reqwest::Client::new()
        .post(format!("{}/Counter/k/addSlowly/send", sluice.ingress_url))
        .header("content-type", "application/json")
        .body("60000")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let id: Value = resp.json().await.unwrap();
    sluice
        .invocation_until(id["invocationId"].as_str().unwrap(), "pinned", |v| {
            v["deployment_id"].is_string()
        })
        .await;
    sluice.register(&v2.uri, false).await;

    let (status, listed) = get_json(&format!("{}/deployments", sluice.admin_url)).await;
    assert_eq!(status, 200);
    for d in listed["deployments"].as_array().unwrap() {
        assert_eq!(d["type"], "http", "{d}");
        assert!(d.get("status").is_none(), "only on request: {d}");
    }
    let resp = reqwest::get(format!("{}/deployments?include=status", sluice.admin_url))
        .await
        .unwrap();
    assert_eq!(resp.headers()["cache-control"], "no-store");
    assert_eq!(resp.headers()["age"], "0");
    let listed: Value = resp.json().await.unwrap();
    let deployment_at = |uri: &str| {
        listed["deployments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| {
                d["uri"]
                    .as_str()
                    .unwrap()
                    .starts_with(uri.trim_end_matches('/'))
            })
            .unwrap()
            .clone()
    };
    let status_of = |uri: &str| deployment_at(uri)["status"].clone();
    // v1 serves nothing now, but the sleeping call is pinned to it; v2 serves.
    assert_eq!(status_of(&v1.uri), "active", "{listed}");
    assert_eq!(status_of(&v2.uri), "active", "{listed}");
    let v1_id = deployment_at(&v1.uri)["id"].as_str().unwrap().to_owned();
    // Killed, nothing pins v1 any more: drained.
    let resp = sluice
        .admin(
            reqwest::Method::PATCH,
            &format!("/invocations/{}/kill", id["invocationId"].as_str().unwrap()),
        )
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let (_, one) = get_json(&format!(
            "{}/deployments/{v1_id}?include=status&refresh=true",
            sluice.admin_url
        ))
        .await;
        assert_eq!(one["type"], "http");
        if one["status"] == "drained" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{one}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (status, body) = get_json(&format!(
        "{}/deployments?include=everything",
        sluice.admin_url
    ))
    .await;
    assert_eq!(status, 400, "{body}");
}

#[tokio::test]
async fn sql_runs_select_explain_and_show_and_refuses_the_rest_as_the_reference_words_it() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    for ok in [
        "SELECT 1",
        "EXPLAIN SELECT * FROM sys_service",
        "SHOW TABLES",
        "SHOW COLUMNS FROM sys_locks",
    ] {
        let (status, body) = sluice.query(ok).await;
        assert_eq!(status, 200, "{ok}: {body}");
    }
    let (_, tables) = sluice.query("SHOW TABLES").await;
    assert!(tables.to_string().contains("sys_locks"), "{tables}");
    for refused in [
        "SET datafusion.execution.batch_size = 1",
        "RESET datafusion.execution.batch_size",
        "BEGIN",
        "PREPARE q AS SELECT 1",
        "CREATE TABLE t (x INT)",
        "INSERT INTO sys_service VALUES (1)",
    ] {
        let (status, body) = sluice.query(refused).await;
        assert_eq!(status, 400, "{refused}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("Statement not supported") || message.contains("SQL0001"),
            "{refused}: {body}"
        );
    }
    let (_, body) = sluice
        .query("SET datafusion.execution.batch_size = 1")
        .await;
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("Statement not supported"),
        "{body}"
    );

    // sys_locks: the reference's columns, and a held lock in them.
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/Counter/locked/addSlowly/send",
            sluice.ingress_url
        ))
        .header("content-type", "application/json")
        .body("60000")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let (status, body) = sluice
            .query("SELECT scope, lock_name, acquired_by, acquired_at FROM sys_locks")
            .await;
        assert_eq!(status, 200, "{body}");
        if body["rows"].as_array().is_some_and(|rows| !rows.is_empty()) {
            assert_eq!(body["rows"][0]["lock_name"], "Counter/locked", "{body}");
            assert!(
                body["rows"][0]["acquired_by"]
                    .as_str()
                    .unwrap()
                    .starts_with("inv_"),
                "{body}"
            );
            let acquired = body["rows"][0]["acquired_at"].as_str().unwrap_or_default();
            assert!(acquired.starts_with("20"), "{body}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
