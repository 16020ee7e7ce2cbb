//! SQL introspection end to end: `POST /query` over the system tables while a burst is held.

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment};

async fn rows(sluice: &Sluice, sql: &str) -> Vec<Value> {
    let (status, body) = sluice.query(sql).await;
    assert_eq!(status, 200, "{sql}: {body}");
    body["rows"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_held_burst_is_visible_in_the_system_tables() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let (status, _) = sluice
        .put_rules(
            json!([{"pattern": "*", "limits": {"concurrency": 1}, "description": "one each"}]),
        )
        .await;
    assert_eq!(status, 200);
    for _ in 0..3 {
        let resp = reqwest::Client::new()
            .post(format!(
                "{}/service/scope/q1/send/Meter/hold",
                sluice.ingress_url
            ))
            .header("content-type", "application/json")
            .body("3000")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
    }
    // Wait until the first one runs and the others wait.
    let mut limits = Vec::new();
    for _ in 0..100 {
        limits = rows(&sluice, "SELECT * FROM sys_user_limits WHERE scope = 'q1'").await;
        if limits
            .first()
            .is_some_and(|r| r["usage"] == 1 && r["num_waiters"].as_u64() > Some(0))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let limit = limits.first().expect("scope q1 has a counter");
    assert!(
        limit["num_waiters"].as_u64() > Some(0),
        "the others never waited: {limit}"
    );
    assert_eq!(limit["level"], "Scope", "{limit}");
    assert_eq!(
        (limit["usage"].clone(), limit["concurrency_limit"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(limit["rule_pattern"], "*");
    assert_eq!(limit["available"], 0);
    assert!(
        limit.get("l1").is_none(),
        "null columns are left out: {limit}"
    );

    let blocked = rows(
        &sluice,
        "SELECT status, blocked_on, blocked_on_json, num_inbox FROM sys_scheduler WHERE scope = 'q1'",
    )
    .await;
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(blocked[0]["status"], "blocked");
    assert_eq!(blocked[0]["blocked_on"], "limit-key-concurrency");
    let why: Value = serde_json::from_str(blocked[0]["blocked_on_json"].as_str().unwrap()).unwrap();
    assert_eq!(
        (why["scope"].clone(), why["rule"].clone()),
        (json!("q1"), json!("*"))
    );
    assert_eq!(blocked[0]["num_inbox"], 2);

    let meta = rows(
        &sluice,
        "SELECT m.id, m.num_inbox, s.status FROM sys_vqueue_meta m JOIN sys_scheduler s ON m.id = s.id \
         WHERE m.scope = 'q1'",
    )
    .await;
    assert_eq!(meta.len(), 1, "{meta:?}");
    assert_eq!(
        (meta[0]["num_inbox"].clone(), meta[0]["status"].clone()),
        (json!(2), json!("blocked"))
    );

    // The two waiting invocations, joined with their invocation rows.
    let waiting = rows(
        &sluice,
        "SELECT v.id, v.status, i.status AS invocation_status FROM sys_vqueues v \
         JOIN sys_invocation i ON v.entry_id = i.id WHERE i.scope = 'q1'",
    )
    .await;
    assert_eq!(waiting.len(), 2, "{waiting:?}");
    assert!(
        waiting
            .iter()
            .all(|r| r["status"] == "blocked" && r["id"] == meta[0]["id"]),
        "{waiting:?}"
    );

    // A join: the invocations of the scope with their counter.
    let joined = rows(
        &sluice,
        "SELECT i.status, count(*) AS n, max(u.concurrency_limit) AS lim FROM sys_invocation i \
         JOIN sys_user_limits u ON i.scope = u.scope WHERE i.scope = 'q1' GROUP BY i.status ORDER BY i.status",
    )
    .await;
    let total: u64 = joined.iter().map(|r| r["n"].as_u64().unwrap()).sum();
    assert_eq!(total, 3, "{joined:?}");
    assert!(joined.iter().all(|r| r["lim"] == 1), "{joined:?}");

    // Each held invocation has its Input entry journaled.
    let inputs = rows(
        &sluice,
        "SELECT j.entry_type FROM sys_journal j JOIN sys_invocation i ON j.id = i.id \
         WHERE i.scope = 'q1' AND j.index = 0",
    )
    .await;
    assert_eq!(inputs.len(), 3, "{inputs:?}");
    assert!(
        inputs
            .iter()
            .all(|r| r["entry_type"].as_str().unwrap().contains("Input")),
        "{inputs:?}"
    );

    let rules = rows(&sluice, "SELECT * FROM sys_rules").await;
    assert_eq!(rules[0]["pattern"], "*");
    assert_eq!(rules[0]["description"], "one each");
    let modified = rules[0]["last_modified"].as_str().unwrap();
    assert!(
        modified.ends_with('Z') && modified.len() == 24,
        "{modified}"
    );

    let services = rows(&sluice, "SELECT name, ty FROM sys_service ORDER BY name").await;
    assert!(
        services.iter().any(|s| s["name"] == "Meter"),
        "{services:?}"
    );
    let deployments = rows(&sluice, "SELECT endpoint, services FROM sys_deployment").await;
    assert_eq!(deployments[0]["endpoint"], dep.uri.as_str());
}

#[tokio::test]
async fn bad_queries_are_400_with_a_message() {
    let sluice = Sluice::builder()
        .env("SERVICE_ADMIN__QUERY_ROW_LIMIT", "2")
        .start()
        .await
        .unwrap();
    let (status, body) = sluice.query("SELEC 1").await;
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("SQL error"),
        "{body}"
    );
    let (status, body) = sluice.query("SELECT nope FROM sys_service").await;
    assert_eq!(status, 400);
    assert!(body["message"].as_str().unwrap().contains("nope"), "{body}");
    let (status, body) = sluice
        .query("SELECT * FROM (VALUES (1), (2), (3)) AS t(x)")
        .await;
    assert_eq!(status, 400);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("more than 2 rows"),
        "{body}"
    );

    // Without `accept: application/json`, an Arrow IPC stream.
    let resp = reqwest::Client::new()
        .post(format!("{}/query", sluice.admin_url))
        .json(&json!({"query": "SELECT 1 AS one"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "application/vnd.apache.arrow.stream"
    );
    let bytes = resp.bytes().await.unwrap();
    assert_eq!(
        &bytes[..4],
        &[0xff, 0xff, 0xff, 0xff],
        "an IPC continuation marker"
    );
}

#[tokio::test]
async fn the_sql_cli() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let run = |args: &[&str]| sluice_tests::cli(&sluice, "sql", args);
    let (ok, out) = run(&["SELECT name, ty, revision FROM sys_service ORDER BY name"]);
    assert!(ok, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["name", "ty", "revision"]
    );
    assert!(
        out.contains("Greeter") && out.contains("virtual_object"),
        "{out}"
    );
    assert!(out.trim_end().ends_with("rows"), "{out}");
    let (ok, out) = run(&[
        "SELECT name FROM sys_service WHERE name = 'Greeter'",
        "--json",
    ]);
    assert!(ok, "{out}");
    let rows: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows, json!([{"name": "Greeter"}]));
    // Object state, through the `state` table.
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/service/call/Counter/c1/add",
            sluice.ingress_url
        ))
        .header("content-type", "application/json")
        .body("5")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (ok, out) = run(&[
        "SELECT service_name, service_key, value_length FROM state WHERE service_key = 'c1'",
        "--json",
    ]);
    assert!(ok, "{out}");
    let state: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(state[0]["service_name"], "Counter", "{state}");
    assert!(state[0]["value_length"].as_u64().unwrap() > 0, "{state}");
    // An exclusive handler holds its object's lock while it sleeps.
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/service/send/Counter/c2/addSlowly",
            sluice.ingress_url
        ))
        .header("content-type", "application/json")
        .body("3000")
        .send()
        .await
        .unwrap();
    let id = resp.json::<Value>().await.unwrap()["invocationId"]
        .as_str()
        .unwrap()
        .to_owned();
    let sql = "SELECT lock_name, acquired_by FROM sys_locks WHERE service_key = 'c2'";
    let mut locks = Value::Null;
    for _ in 0..100 {
        let (ok, out) = run(&[sql, "--json"]);
        assert!(ok, "{out}");
        locks = serde_json::from_str(&out).unwrap();
        if locks.as_array().is_some_and(|l| !l.is_empty()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        locks,
        json!([{"lock_name": "Counter/c2", "acquired_by": id}])
    );
    let (ok, out) = run(&["SELEC 1"]);
    assert!(!ok && out.contains("SQL error"), "{out}");
}
