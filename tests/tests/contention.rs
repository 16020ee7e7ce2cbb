//! Who goes first when a limit is full, end to end against the real Rust SDK deployment:
//! weights share a scope between its keys, a high priority overtakes a low-priority backlog,
//! a shadow rule counts and holds nothing, and a paused queue keeps its entries across a
//! kill -9 until it is resumed. Admission order is measured inside the handler (`Meter/mark`
//! records its label as it starts).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment, cli};

async fn flow_controlled() -> (Sluice, TestDeployment) {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    (sluice, dep)
}

/// Sends `path` with a JSON body and extra headers; asserts the 202.
async fn send(sluice: &Sluice, path: &str, body: &str, headers: &[(&str, &str)]) {
    let mut req = reqwest::Client::new()
        .post(format!("{}{path}", sluice.ingress_url))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    assert_eq!(status, 202, "{}", resp.text().await.unwrap_or_default());
}

/// The labels `Meter/mark` recorded since the last look.
async fn marks(sluice: &Sluice) -> Vec<String> {
    sluice_tests::call_json(sluice, "Meter/marks").await
}

/// Collects marks until `n` were recorded (at most 20 s).
async fn marks_until(sluice: &Sluice, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while seen.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n}: {seen:?}",
            seen.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen.extend(marks(sluice).await);
    }
    assert_eq!(seen.len(), n, "more ran than were sent: {seen:?}");
    seen
}

/// Occupies the one slot of `scope` (limit key `blocker`) for `millis`, and waits until it
/// holds it: everything sent to the scope meanwhile waits at its counter.
async fn block(sluice: &Sluice, scope: &str, millis: u64) {
    send(
        sluice,
        &format!("/service/scope/{scope}/send/Meter/hold"),
        &millis.to_string(),
        &[("x-service-limit-key", "blocker")],
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(sluice, scope, "scope").await["usage"] != 1 {
        assert!(Instant::now() < deadline, "the blocker never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The counter of `scope` at `level` (`Null` when there is none).
async fn counter(sluice: &Sluice, scope: &str, level: &str) -> Value {
    sluice_tests::counter(sluice, scope, level)
        .await
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn weights_share_a_full_scope_three_to_one() {
    let (sluice, _dep) = flow_controlled().await;
    let (ok, out) = cli(&sluice, "rules", &["set", "wt", "--concurrency", "1"]);
    assert!(ok, "{out}");
    let (ok, out) = cli(
        &sluice,
        "rules",
        &["set", "wt/gold", "--unlimited", "--weight", "3"],
    );
    assert!(ok, "{out}");
    let (ok, out) = cli(&sluice, "rules", &["list"]);
    assert!(ok && out.contains("WEIGHT"), "{out}");
    gold_and_free_waiting(&sluice, "wt").await;
    // While both keys wait, gold gets three admissions for each of free's.
    let (golds, seen) = golds_of_the_first_40(&sluice).await;
    assert!(
        (27..=33).contains(&golds),
        "{golds} of the first 40 admissions were gold, not 30 ± 10 %: {seen:?}"
    );
    let (status, rows) = sluice
        .query("SELECT pattern, weight, mode FROM sys_rules ORDER BY pattern")
        .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(
        rows["rows"],
        json!([
            {"pattern": "wt", "weight": 1, "mode": "enforce"},
            {"pattern": "wt/gold", "weight": 3, "mode": "enforce"},
        ])
    );
}

/// Sends 40 calls for each of `gold` and `free` under `scope`, whose one slot a blocker holds
/// meanwhile: all 80 wait at the scope's counter.
async fn gold_and_free_waiting(sluice: &Sluice, scope: &str) {
    block(sluice, scope, 2_000).await;
    for _ in 0..40 {
        for key in ["gold", "free"] {
            send(
                sluice,
                &format!("/service/scope/{scope}/send/Meter/mark"),
                &format!("\"{key}\""),
                &[("x-service-limit-key", key)],
            )
            .await;
        }
    }
}

/// How many of the first 40 admissions went to gold, once all 80 ran; and the order they
/// ran in.
async fn golds_of_the_first_40(sluice: &Sluice) -> (usize, Vec<String>) {
    let seen = marks_until(sluice, 80).await;
    (seen[..40].iter().filter(|m| *m == "gold").count(), seen)
}

#[tokio::test]
async fn a_weight_override_beats_the_rules_weight_through_a_kill_9_until_unset() {
    let (sluice, _dep) = flow_controlled().await;
    // Every key of `wo` has weight 1 by its rule; the override gives gold 3.
    sluice
        .set_rules(json!([
            {"pattern": "wo", "limits": {"concurrency": 1}},
            {"pattern": "wo/*", "limits": {"weight": 1}},
        ]))
        .await;
    let (ok, out) = cli(&sluice, "weights", &["set", "wo/gold", "3"]);
    assert!(ok && out.contains("wo/gold") && out.contains('3'), "{out}");
    let (ok, out) = cli(&sluice, "weights", &["set", "wo/*", "3"]);
    assert!(
        !ok && out.contains("RUL0001") && out.contains("not a counter"),
        "{out}"
    );

    // Stored: a kill -9 and a restart keep it, and dispatch follows it.
    let mut sluice = sluice;
    sluice.kill_9();
    let sluice = sluice.restart(Sluice::builder()).await;
    let (ok, out) = cli(&sluice, "weights", &["list"]);
    assert!(ok && out.contains("wo/gold"), "{out}");
    let (status, rows) = sluice
        .query("SELECT counter, weight FROM sys_weight_overrides")
        .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows["rows"], json!([{"counter": "wo/gold", "weight": 3}]));
    gold_and_free_waiting(&sluice, "wo").await;
    // While they wait, introspection shows each key's weight in force.
    let (status, rows) = sluice
        .query("SELECT l1, weight FROM sys_user_limits WHERE scope = 'wo' AND l1 IN ('gold', 'free') ORDER BY l1")
        .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(
        rows["rows"],
        json!([{"l1": "free", "weight": 1}, {"l1": "gold", "weight": 3}])
    );
    let (golds, seen) = golds_of_the_first_40(&sluice).await;
    assert!(
        (27..=33).contains(&golds),
        "{golds} of the first 40 admissions were gold, not 30 ± 10 %: {seen:?}"
    );

    // Unset, gold takes its rule's weight again: the two share evenly.
    let (ok, out) = cli(&sluice, "weights", &["unset", "wo/gold"]);
    assert!(ok && !out.contains("wo/gold"), "{out}");
    gold_and_free_waiting(&sluice, "wo").await;
    let (golds, seen) = golds_of_the_first_40(&sluice).await;
    assert!(
        (16..=24).contains(&golds),
        "{golds} of the first 40 admissions were gold, not 20 ± 4 after the unset: {seen:?}"
    );
}

#[tokio::test]
async fn high_priority_overtakes_a_low_priority_backlog() {
    let (sluice, _dep) = flow_controlled().await;
    sluice
        .set_rules(json!([{"pattern": "pr", "limits": {"concurrency": 1}}]))
        .await;
    block(&sluice, "pr", 1_500).await;
    for _ in 0..20 {
        send(
            &sluice,
            "/service/scope/pr/send/Meter/mark",
            "\"low\"",
            &[("x-service-priority", "low")],
        )
        .await;
    }
    for _ in 0..3 {
        send(
            &sluice,
            "/service/scope/pr/send/Meter/mark?priority=high",
            "\"high\"",
            &[],
        )
        .await;
    }
    // What waits says its priority.
    let (ok, out) = cli(&sluice, "queues", &["list", "--scope", "pr"]);
    assert!(ok && out.contains("PRIORITY"), "{out}");
    let seen = marks_until(&sluice, 23).await;
    assert_eq!(&seen[..3], ["high", "high", "high"], "{seen:?}");
    // A priority that is not one says what to write.
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/service/scope/pr/send/Meter/mark",
            sluice.ingress_url
        ))
        .header("x-service-priority", "urgent")
        .header("content-type", "application/json")
        .body("\"x\"")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error_code"], "RT0024", "{body}");
    assert!(body["message"].as_str().unwrap().contains("0..9"), "{body}");
}

#[tokio::test]
async fn a_shadow_rule_counts_what_it_would_hold_and_holds_nothing() {
    let (sluice, _dep) = flow_controlled().await;
    let (ok, out) = cli(
        &sluice,
        "rules",
        &["set", "sh", "--concurrency", "1", "--shadow"],
    );
    assert!(ok, "{out}");
    for _ in 0..4 {
        send(&sluice, "/service/scope/sh/send/Meter/hold", "1500", &[]).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let scope = loop {
        let c = counter(&sluice, "sh", "scope").await;
        if c["usage"] == 4 {
            break c;
        }
        assert!(Instant::now() < deadline, "not all four ran at once: {c}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(scope["shadow"]["rule"], "sh", "{scope}");
    assert_eq!(scope["shadow"]["would_wait"], 3, "{scope}");
    let (status, rows) = sluice
        .query("SELECT shadow_rule, shadow_would_wait FROM sys_user_limits WHERE scope = 'sh' AND level = 'Scope'")
        .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(
        rows["rows"],
        json!([{"shadow_rule": "sh", "shadow_would_wait": 3}])
    );
    // And in /metrics, by rule pattern and level (no scope label).
    let metrics = sluice.metrics().await;
    let shadow: Vec<(&String, &f64)> = metrics
        .iter()
        .filter(|(name, _)| name.starts_with("sluice_flow_shadow_would_wait{"))
        .collect();
    assert!(
        shadow
            .iter()
            .any(|(name, value)| name.contains("rule=\"sh\"")
                && name.contains("level=\"scope\"")
                && **value == 3.0),
        "{shadow:?}"
    );
    assert!(
        shadow.iter().all(|(name, _)| !name.contains("scope=")),
        "{shadow:?}"
    );
    let (ok, out) = cli(&sluice, "rules", &["list"]);
    assert!(ok && out.contains("shadow"), "{out}");
}

/// The queue of `scope` as `GET /vqueues` lists it.
async fn vqueue(sluice: &Sluice, scope: &str) -> Value {
    let (_, list) = sluice_tests::get_json(&format!("{}/vqueues", sluice.admin_url)).await;
    list["vqueues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["scope"] == scope)
        .cloned()
        .unwrap_or_else(|| panic!("no queue of {scope}: {list}"))
}

#[tokio::test]
async fn a_paused_queue_keeps_its_entries_across_kill_9_until_resumed() {
    let (mut sluice, _dep) = flow_controlled().await;
    sluice
        .set_rules(json!([{"pattern": "pz", "limits": {"concurrency": 1}}]))
        .await;
    // One running, three waiting behind it in the same queue.
    send(&sluice, "/service/scope/pz/send/Meter/hold", "800", &[]).await;
    for _ in 0..3 {
        send(&sluice, "/service/scope/pz/send/Meter/mark", "\"p\"", &[]).await;
    }
    let id = vqueue(&sluice, "pz").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (ok, out) = cli(&sluice, "queues", &["pause", &id]);
    assert!(ok, "{out}");
    let queue = vqueue(&sluice, "pz").await;
    assert_eq!(queue["status"], "paused", "{queue}");
    assert_eq!(queue["blocked_on"], "queue-paused", "{queue}");
    // SQL says so too (before, `queue_is_paused` was always false).
    let (status, rows) = sluice
        .query("SELECT queue_is_paused FROM sys_vqueue_meta WHERE scope = 'pz'")
        .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows["rows"], json!([{"queue_is_paused": true}]), "{rows}");
    // The running one ends; nothing of the paused queue starts.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&sluice, "pz", "scope").await["usage"] != 0 {
        assert!(Instant::now() < deadline, "the hold never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(marks(&sluice).await.is_empty(), "a paused queue ran");
    // Unknown ids are refused with what an id looks like.
    let resp = sluice
        .admin(reqwest::Method::POST, "/vqueues/nope/pause")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);

    // Still paused after a kill -9: the pause and the entries were stored.
    sluice.kill_9();
    let again = sluice.restart(Sluice::builder()).await;
    let queue = vqueue(&again, "pz").await;
    assert_eq!(
        (queue["status"].clone(), queue["queued"].clone()),
        (json!("paused"), json!(3)),
        "{queue}"
    );
    let (status, rows) = again
        .query("SELECT status, blocked_on FROM sys_scheduler WHERE scope = 'pz'")
        .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(
        rows["rows"],
        json!([{"status": "paused", "blocked_on": "queue-paused"}])
    );
    let resp = again
        .admin(
            reqwest::Method::POST,
            &format!("/vqueues/{}/resume", queue["id"].as_str().unwrap()),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    assert_eq!(marks_until(&again, 3).await, ["p", "p", "p"]);
}
