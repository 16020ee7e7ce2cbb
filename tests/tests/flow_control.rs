//! Flow control end to end against the real Rust SDK deployment: scoped calls admitted under
//! the rule book, concurrency measured inside the handler (`Meter/hold` records how many run at
//! once), rule changes applied to running partitions, and the rule book API.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{
    Sluice, TestDeployment, assert_once_but_in_flight, effects_once_quiet, effects_per_invocation,
    get_json, peak_of, post_json,
};

async fn flow_controlled() -> (Sluice, TestDeployment) {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    (sluice, dep)
}

fn scoped(scope: &str, n: usize) -> Vec<String> {
    vec![format!("/service/scope/{scope}/call/Meter/hold"); n]
}

#[tokio::test]
async fn rules_bound_scoped_concurrency_and_apply_at_once() {
    let (sluice, _dep) = flow_controlled().await;
    let (status, created) = sluice
        .put_rules(json!([{"pattern": "*", "limits": {"concurrency": 2}}]))
        .await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created[0]["limits"]["concurrency"], 2);

    // Six calls in one scope never exceed 2.
    assert_eq!(peak_of(&sluice, &scoped("s1", 6)).await, 2);
    // Two scopes get 2 each.
    let both = [scoped("s1", 3), scoped("s2", 3)].concat();
    assert_eq!(peak_of(&sluice, &both).await, 4);
    // An exact scope rule beats `*`.
    sluice
        .set_rules(json!([{"pattern": "s3", "limits": {"concurrency": 1}}]))
        .await;
    assert_eq!(peak_of(&sluice, &scoped("s3", 4)).await, 1);
    // Unscoped calls are never limited.
    let unscoped = vec!["/service/call/Meter/hold".to_owned(); 5];
    assert_eq!(peak_of(&sluice, &unscoped).await, 5);
    // Raising the rule applies to the next burst at once.
    sluice
        .set_rules(json!([{"pattern": "*", "limits": {}}]))
        .await;
    assert_eq!(peak_of(&sluice, &scoped("s1", 5)).await, 5);
    // A disabled rule is ignored.
    sluice
        .set_rules(json!([{"pattern": "s3", "limits": {"concurrency": 1}, "disabled": true}]))
        .await;
    assert_eq!(peak_of(&sluice, &scoped("s3", 3)).await, 3);
    // Limit keys: `s4/*` = 1 gives one per L1 key.
    sluice
        .set_rules(json!([{"pattern": "s4/*", "limits": {"concurrency": 1}}]))
        .await;
    let keyed: Vec<String> = ["gold", "gold", "silver", "silver"]
        .iter()
        .map(|k| format!("/service/scope/s4/call/Meter/hold?limit-key={k}"))
        .collect();
    assert_eq!(peak_of(&sluice, &keyed).await, 2);
}

#[tokio::test]
async fn the_rule_book_api() {
    let (sluice, _dep) = flow_controlled().await;
    let (status, _) = sluice
        .put_rules(json!([
            {"pattern": "b", "limits": {"concurrency": 3}, "description": "bee"},
            {"pattern": "a/*", "limits": {}}
        ]))
        .await;
    assert_eq!(status, 200);
    let (status, listed) = get_json(&format!("{}/limits/rules", sluice.admin_url)).await;
    assert_eq!(status, 200, "{listed}");
    let patterns: Vec<&str> = listed["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pattern"].as_str().unwrap())
        .collect();
    assert_eq!(patterns, ["a/*", "b"]);
    let b = &listed["rules"][1];
    assert_eq!(b["description"], "bee");
    let version = b["version"].as_u64().unwrap();

    // Preconditions: nothing of a refused batch applies.
    let (status, refused) = sluice.put_rules(json!([
        {"pattern": "c", "limits": {"concurrency": 1}},
        {"pattern": "b", "limits": {"concurrency": 9}, "precondition": {"type": "does_not_exist"}}
    ]))
    .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["restate_code"], "RUL0002", "{refused}");
    let (_, listed) = get_json(&format!("{}/limits/rules", sluice.admin_url)).await;
    assert_eq!(
        listed["rules"].as_array().unwrap().len(),
        2,
        "c was not created"
    );
    let (status, updated) = sluice.put_rules(json!([
        {"pattern": "b", "limits": {"concurrency": 4}, "precondition": {"type": "matches", "version": version}}
    ]))
    .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated[0]["version"].as_u64(), Some(version + 1));

    // Invalid input is 422, with a code.
    for bad in [
        json!([{"pattern": "not a pattern!", "limits": {}}]),
        json!([{"pattern": "x", "limits": {"concurrency": 0}}]),
    ] {
        let (status, body) = sluice.put_rules(bad).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["restate_code"], "RUL0001", "{body}");
    }
    // A typo at any level is refused naming the field, as the rules file is (before, each was
    // stored as a rule with no limit, burst 1, or ignored).
    for (typo, field) in [
        (
            json!([{"pattern": "x", "limits": {"concurency": 2}}]),
            "concurency",
        ),
        (
            json!([{"pattern": "x", "limits": {"rate": "5/s", "burts": 5}}]),
            "burts",
        ),
        (
            json!([{"pattern": "x", "limit": {"concurrency": 2}}]),
            "limit",
        ),
        (
            json!([{"pattern": "x", "precondition": {"type": "matches", "versoin": 1}}]),
            "versoin",
        ),
    ] {
        let (status, body) = sluice.put_rules(typo.clone()).await;
        assert_eq!(status, 422, "{typo}: {body}");
        assert_eq!(body["restate_code"], "ADM0001", "{typo}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains(field),
            "{typo}: {body}"
        );
    }
    let applied = reqwest::Client::new()
        .post(format!("{}/limits/rules/apply", sluice.admin_url))
        .json(&json!({"upserts": [], "delets": [{"pattern": "b"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(applied.status(), 422);
    let (_, listed) = get_json(&format!("{}/limits/rules", sluice.admin_url)).await;
    assert!(
        listed["rules"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["pattern"] != "x"),
        "a typo stored a rule: {listed}"
    );

    // Bulk delete answers what it removed.
    let removed: Value = reqwest::Client::new()
        .post(format!("{}/limits/rules/bulk-delete", sluice.admin_url))
        .json(&json!([{"pattern": "a/*"}, {"pattern": "zzz"}]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(removed, json!(["a/*"]));
}

#[tokio::test]
async fn scoped_calls_need_no_opt_in_and_the_retired_switches_are_ignored() {
    let dep = TestDeployment::start("v1").await.unwrap();
    // Switched off the old way: both are accepted, ignored and said so once.
    let sluice = Sluice::builder()
        .config("experimental-enable-protocol-v7 = false\n")
        .env("SERVICE_EXPERIMENTAL_ENABLE_VQUEUES", "false")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/service/scope/s1/call/Greeter/greet",
            sluice.ingress_url
        ))
        .header("content-type", "application/json")
        .body("\"Ada\"")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "\"Hello, Ada!\"");
    let (_, seen) = sluice
        .query("SELECT scope FROM sys_invocation WHERE target_service_name = 'Greeter'")
        .await;
    assert_eq!(seen["rows"][0]["scope"], "s1", "{seen}");
    let stderr = sluice.stderr();
    let warned: Vec<_> = stderr
        .lines()
        .filter(|l| l.contains("ignoring retired settings"))
        .collect();
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(
        warned[0].contains("experimental-enable-protocol-v7, experimental-enable-vqueues"),
        "{stderr}"
    );
}

#[tokio::test]
async fn held_scoped_sends_survive_kill_9_and_run_exactly_once() {
    const SENDS: usize = 100;
    let log = tempfile::tempdir().unwrap();
    let effects = log.path().join("effects.log");
    let dep = TestDeployment::start_logging("v1", &effects).await.unwrap();
    let mut sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    sluice
        .set_rules(json!([{"pattern": "*", "limits": {"concurrency": 1}}]))
        .await;
    let client = reqwest::Client::new();
    let mut acknowledged = Vec::new();
    for _ in 0..SENDS {
        let resp = client
            .post(format!(
                "{}/service/scope/held/send/Meter/work",
                sluice.ingress_url
            ))
            .header("content-type", "application/json")
            .body("20")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        let sent: Value = resp.json().await.unwrap();
        acknowledged.push(sent["invocationId"].as_str().unwrap().to_owned());
    }
    // Kill once a few ran, while most are still held in the queue.
    let deadline = Instant::now() + Duration::from_secs(30);
    while effects_per_invocation(&effects)
        .values()
        .filter(|(_, done)| *done > 0)
        .count()
        < 3
    {
        assert!(Instant::now() < deadline, "the queue never moved");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sluice.kill_9();
    let before = effects_once_quiet(&effects, Duration::from_millis(500)).await;
    let done_before = before.values().filter(|(_, done)| *done > 0).count();
    assert!(
        done_before > 0 && before.len() < SENDS,
        "the kill must land while the queue holds work: {done_before} done, {} started",
        before.len()
    );
    let again = sluice.restart(Sluice::builder()).await;
    // Every acknowledged send completes.
    for id in &acknowledged {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, seen) = again.describe(id).await;
            if seen["status"] == "completed" {
                break;
            }
            assert!(Instant::now() < deadline, "{id} never completed: {seen}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Settled: each side effect ran once per invocation. Under `*` = 1 one invocation runs at
    // a time, so at most one side effect was under way at the kill and may have run again.
    // The log stopped growing for a second: no handler is still running a side effect.
    let after = effects_once_quiet(&effects, Duration::from_secs(1)).await;
    assert_eq!(after.len(), SENDS);
    let reruns = assert_once_but_in_flight(&acknowledged, &before, &after);
    assert!(
        reruns <= 1,
        "{reruns} side effects ran again; one at most was under way"
    );
}

#[tokio::test]
async fn the_rules_cli() {
    let (sluice, _dep) = flow_controlled().await;
    let run = |args: &[&str]| sluice_tests::cli(&sluice, "rules", args);
    assert!(run(&["set", "*", "--concurrency", "2"]).0);
    // Setting only the description keeps the limit.
    let (ok, out) = run(&["set", "*", "--description", "everyone"]);
    assert!(ok, "{out}");
    let (ok, out) = run(&["list", "--extra"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("PATTERN") && out.contains("LAST MODIFIED"),
        "{out}"
    );
    assert!(out.contains("everyone") && out.contains(" 2 "), "{out}");
    let (ok, out) = run(&["set", "new"]);
    assert!(
        !ok && out.contains("--concurrency N, --rate R, --quota Q, --budget B or --unlimited"),
        "{out}"
    );
    assert!(run(&["set", "acme/gold", "--unlimited"]).0);
    assert!(run(&["disable", "*"]).0);
    let (ok, out) = run(&["disable", "*"]);
    assert!(!ok && out.contains("already disabled"), "{out}");
    assert!(run(&["enable", "*"]).0);
    let (ok, out) = run(&["list", "--json"]);
    assert!(ok, "{out}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["rules"][0]["pattern"], "*");
    assert_eq!(listed["rules"][0]["disabled"], false);
    assert_eq!(listed["rules"][1]["pattern"], "acme/gold");
    assert!(run(&["delete", "acme/gold"]).0);
    let (ok, out) = run(&["delete", "acme/gold"]);
    assert!(
        !ok && out.contains("no rule with pattern 'acme/gold'"),
        "{out}"
    );
    let (ok, out) = run(&["disable", "nope"]);
    assert!(!ok && out.contains("no rule with pattern 'nope'"), "{out}");
}

#[tokio::test]
async fn a_held_invocation_says_what_it_waits_for() {
    let (sluice, _dep) = flow_controlled().await;
    sluice
        .set_rules(json!([{"pattern": "*", "limits": {"concurrency": 1}}]))
        .await;
    let send = || async {
        let sent: Value = reqwest::Client::new()
            .post(format!(
                "{}/service/scope/w/send/Meter/hold?limit-key=gold",
                sluice.ingress_url
            ))
            .header("content-type", "application/json")
            .body("1500")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        sent["invocationId"].as_str().unwrap().to_owned()
    };
    let _running = send().await;
    let held = send().await;
    let seen = sluice
        .invocation_until(&held, "shown as held", |seen| {
            seen["waiting"]["blocked_on"] == "limit-key-concurrency"
        })
        .await;
    assert_eq!(seen["scope"], "w");
    assert_eq!(seen["limit_key"], "gold");
    let waiting = &seen["waiting"];
    assert_eq!(waiting["status"], "blocked", "{seen}");
    assert_eq!(waiting["level"], "scope", "{seen}");
    assert_eq!(waiting["limit"], 1, "{seen}");
    assert_eq!(waiting["rule"], "*", "{seen}");

    // The scope's counter is full with one waiter.
    let counters: Value = reqwest::get(format!("{}/limits/counters", sluice.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let scope = counters["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["scope"] == "w" && c["level"] == "scope")
        .unwrap_or_else(|| panic!("no counter for scope w: {counters}"));
    assert_eq!(scope["usage"], 1, "{scope}");
    assert_eq!(scope["limit"], 1, "{scope}");
    assert_eq!(scope["available"], 0, "{scope}");
    assert_eq!(scope["waiters"], 1, "{scope}");
    assert_eq!(scope["rule"], "*", "{scope}");
}

fn keyed(scope: &str, key: &str, n: usize) -> Vec<String> {
    vec![format!("/service/scope/{scope}/call/Meter/hold?limit-key={key}"); n]
}

#[tokio::test]
async fn rules_match_by_precedence_and_levels() {
    let (sluice, _dep) = flow_controlled().await;
    let (status, body) = sluice
        .put_rules(json!([
            {"pattern": "s5/gold", "limits": {"concurrency": 3}},
            {"pattern": "s5/*", "limits": {"concurrency": 1}},
            {"pattern": "*/gold", "limits": {"concurrency": 2}},
            {"pattern": "s7/a/x", "limits": {"concurrency": 1}},
            {"pattern": "s8", "limits": {"concurrency": 2}},
            {"pattern": "s8/*", "limits": {}}
        ]))
        .await;
    assert_eq!(status, 200, "{body}");
    // The exact L1 rule beats the scope's wildcard, which beats the any-scope rule.
    assert_eq!(peak_of(&sluice, &keyed("s5", "gold", 5)).await, 3);
    assert_eq!(peak_of(&sluice, &keyed("s5", "silver", 3)).await, 1);
    assert_eq!(peak_of(&sluice, &keyed("s6", "gold", 4)).await, 2);
    // An L2 rule bounds its L2 key only.
    assert_eq!(peak_of(&sluice, &keyed("s7", "a/x", 3)).await, 1);
    assert_eq!(peak_of(&sluice, &keyed("s7", "a/y", 3)).await, 3);
    // Unlimited at L1 does not lift the scope's own cap.
    let both = [keyed("s8", "p", 3), keyed("s8", "q", 3)].concat();
    assert_eq!(peak_of(&sluice, &both).await, 2);
}

#[tokio::test]
async fn idempotency_is_per_scope_and_ignores_the_limit_key() {
    let (sluice, _dep) = flow_controlled().await;
    let send = |scope: &'static str, limit_key: &'static str| {
        reqwest::Client::new()
            .post(format!(
                "{}/service/scope/{scope}/send/Greeter/greet?limit-key={limit_key}",
                sluice.ingress_url
            ))
            .header("content-type", "application/json")
            .header("idempotency-key", "same")
            .body("\"x\"")
            .send()
    };
    let id = |resp: reqwest::Response| async move {
        let sent: Value = resp.json().await.unwrap();
        (
            sent["invocationId"].as_str().unwrap().to_owned(),
            sent["status"].clone(),
        )
    };
    let (first, status) = id(send("i1", "gold").await.unwrap()).await;
    assert_eq!(status, "Accepted");
    let (again, status) = id(send("i1", "silver").await.unwrap()).await;
    assert_eq!(
        (again.as_str(), status.as_str()),
        (first.as_str(), Some("PreviouslyAccepted"))
    );
    let (other, status) = id(send("i2", "gold").await.unwrap()).await;
    assert_ne!(other, first, "another scope is another invocation");
    assert_eq!(status, "Accepted");
}

#[tokio::test]
async fn virtual_objects_keep_state_per_scope() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let add = |sluice: &Sluice, scope: &str| {
        reqwest::Client::new()
            .post(format!(
                "{}/service/scope/{scope}/call/Counter/shared/add",
                sluice.ingress_url
            ))
            .header("content-type", "application/json")
            .body("1")
            .send()
    };
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    for (scope, want) in [("a", "1"), ("a", "2"), ("b", "1")] {
        let resp = add(&sluice, scope).await.unwrap();
        assert_eq!(resp.text().await.unwrap(), want, "scope {scope}");
    }
}

#[tokio::test]
async fn a_rule_created_right_before_a_burst_applies_to_it_and_re_enabling_restores_it() {
    let (sluice, _dep) = flow_controlled().await;
    sluice
        .set_rules(json!([{"pattern": "r1", "limits": {"concurrency": 1}}]))
        .await;
    // No pause between the rule and the burst: the rule book reaches partitions before the
    // PUT answers.
    assert_eq!(peak_of(&sluice, &scoped("r1", 4)).await, 1);
    let toggle = |disabled: bool| json!([{"pattern": "r1", "limits": {"concurrency": 1}, "disabled": disabled}]);
    sluice.set_rules(toggle(true)).await;
    assert_eq!(peak_of(&sluice, &scoped("r1", 3)).await, 3);
    sluice.set_rules(toggle(false)).await;
    assert_eq!(peak_of(&sluice, &scoped("r1", 3)).await, 1);
}

/// Every way the rule book changes binds the burst sent right after its answer: apply
/// (upsert, disable, enable, delete in one change) and bulk-delete, each lowering and raising.
#[tokio::test]
async fn every_kind_of_rule_change_binds_the_burst_right_behind_its_answer() {
    let (sluice, _dep) = flow_controlled().await;
    let apply = |body: serde_json::Value| {
        let url = format!("{}/limits/rules/apply", sluice.admin_url);
        async move {
            let (status, answer) = post_json(&url, body).await;
            assert_eq!(status, 200, "{answer}");
        }
    };
    apply(json!({"upserts": [{"pattern": "k1", "limits": {"concurrency": 1}}]})).await;
    assert_eq!(peak_of(&sluice, &scoped("k1", 4)).await, 1);
    apply(json!({"upserts": [{"pattern": "k1", "limits": {"concurrency": 1}, "disabled": true}]}))
        .await;
    assert_eq!(peak_of(&sluice, &scoped("k1", 3)).await, 3);
    apply(json!({"upserts": [{"pattern": "k1", "limits": {"concurrency": 1}}]})).await;
    assert_eq!(peak_of(&sluice, &scoped("k1", 3)).await, 1);
    // One change deletes k1's rule and limits k2: both bind the next bursts.
    apply(json!({
        "upserts": [{"pattern": "k2", "limits": {"concurrency": 2}}],
        "deletes": [{"pattern": "k1"}]
    }))
    .await;
    assert_eq!(peak_of(&sluice, &scoped("k1", 3)).await, 3);
    assert_eq!(peak_of(&sluice, &scoped("k2", 5)).await, 2);
    let (status, removed) = post_json(
        &format!("{}/limits/rules/bulk-delete", sluice.admin_url),
        json!([{"pattern": "k2"}]),
    )
    .await;
    assert_eq!((status, removed), (200, json!(["k2"])));
    assert_eq!(peak_of(&sluice, &scoped("k2", 4)).await, 4);
}

#[tokio::test]
async fn the_invokers_limit_is_global_across_partitions() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .env("SERVICE_WORKER__INVOKER__CONCURRENT_INVOCATIONS_LIMIT", "3")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    // Unscoped calls land on every partition; together they never run more than 3 at once,
    // and a slot freed on one partition lets another's waiting call run.
    let unscoped = vec!["/service/call/Meter/hold".to_owned(); 12];
    assert_eq!(peak_of(&sluice, &unscoped).await, 3);
    // One scope lives on one partition: that partition alone may use all 3 slots.
    assert_eq!(peak_of(&sluice, &scoped("g1", 6)).await, 3);
}

#[tokio::test]
async fn every_scope_and_limit_key_rejection_is_rt0024_and_says_what_to_fix() {
    let (sluice, _dep) = flow_controlled().await;
    let client = reqwest::Client::new();
    let send = |path: &str, header: Option<(&str, &str)>| {
        let mut request = client
            .post(format!("{}{path}", sluice.ingress_url))
            .header("content-type", "application/json")
            .body("1");
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        request.send()
    };
    let long = "x".repeat(37);
    type Case<'a> = (String, Option<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "/service/scope/a:b/send/Meter/hold".into(),
            None,
            "invalid scope 'a:b': only [a-zA-Z0-9_.-] allowed",
        ),
        (
            format!("/restate/scope/{long}/send/Meter/hold"),
            None,
            "at most 36 bytes, got 37",
        ),
        (
            "/service/scope/s/send/Meter/hold?limit-key=a/b/c".into(),
            None,
            "limit key",
        ),
        (
            "/service/scope/s/send/Meter/hold".into(),
            Some(("x-service-limit-key", "go!d")),
            "only [a-zA-Z0-9_.-] allowed",
        ),
        // The header wins over the query, whatever the case of its name.
        (
            "/service/scope/s/send/Meter/hold?limit-key=gold".into(),
            Some(("X-Restate-Limit-Key", "bad key")),
            "bad key",
        ),
        (
            "/service/send/Meter/hold?Limit-Key=gold".into(),
            None,
            "limit key 'gold' requires a scope",
        ),
        (
            "/service/send/Meter/hold".into(),
            Some(("x-service-limit-key", "gold")),
            "requires a scope",
        ),
        // The scope is checked before the limit key.
        (
            "/service/scope/bad!/send/Meter/hold?limit-key=bad!".into(),
            None,
            "invalid scope 'bad!'",
        ),
    ];
    for (path, header, want) in cases {
        let resp = send(&path, header).await.unwrap();
        assert_eq!(resp.status(), 400, "{path}");
        assert_eq!(resp.headers()["x-service-error-code"], "RT0024", "{path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error_code"], "RT0024", "{path}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(want), "{path}: {message}");
    }
    // A valid header wins over a bad query value.
    let resp = send(
        "/service/scope/s/send/Meter/hold?limit-key=bad!",
        Some(("x-service-limit-key", "gold")),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 202, "{}", resp.text().await.unwrap());
}

/// Held sends rest in a compact form while they wait: everything about them must come back
/// intact when anything touches them or when their turn comes.
#[tokio::test]
async fn held_sends_keep_their_input_and_answer_requests_while_they_wait() {
    let (sluice, _dep) = flow_controlled().await;
    sluice
        .set_rules(json!([{"pattern": "*", "limits": {"concurrency": 1}}]))
        .await;
    let client = reqwest::Client::new();
    let send = |path: String, body: String, key: Option<String>| {
        let client = client.clone();
        let url = format!("{}{path}", sluice.ingress_url);
        async move {
            let mut request = client
                .post(url)
                .header("content-type", "application/json")
                .body(body);
            if let Some(key) = key {
                request = request.header("idempotency-key", key);
            }
            let resp = request.send().await.unwrap();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap();
            (status, body["invocationId"].as_str().unwrap().to_owned())
        }
    };
    // The one slot is taken for a while; the greetings queue behind it.
    let (status, _) = send(
        "/service/scope/r/send/Meter/hold".into(),
        "1500".into(),
        None,
    )
    .await;
    assert_eq!(status, 202);
    let mut held = Vec::new();
    for i in 0..20 {
        let (status, id) = send(
            "/service/scope/r/send/Greeter/greet".into(),
            format!("\"guest-{i}\""),
            Some(format!("k-{i}")),
        )
        .await;
        assert_eq!(status, 202);
        held.push(id);
    }
    // Touch them while they wait: a repeat of an idempotency key finds its invocation, the
    // admin API says what one waits for, and one is killed.
    let (_, again) = send(
        "/service/scope/r/send/Greeter/greet".into(),
        "\"guest-3\"".into(),
        Some("k-3".into()),
    )
    .await;
    assert_eq!(again, held[3], "the repeat finds the held invocation");
    let (_, seen) = sluice.describe(&held[5]).await;
    assert_eq!(
        seen["waiting"]["blocked_on"], "limit-key-concurrency",
        "{seen}"
    );
    assert_eq!(seen["scope"], "r", "{seen}");
    let killed = client
        .patch(format!("{}/invocations/{}/kill", sluice.admin_url, held[7]))
        .send()
        .await
        .unwrap();
    assert!(killed.status().is_success(), "{}", killed.status());
    let queued = sluice.count("SELECT count(*) AS n FROM sys_vqueues").await;
    assert!(queued > 0, "the greetings still wait");

    // Each runs with its own input once its turn comes; the killed one never runs.
    for (i, id) in held.iter().enumerate() {
        let resp = reqwest::get(format!("{}/service/attach/{id}", sluice.ingress_url))
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        if i == 7 {
            assert_eq!(status, 409, "killed: {body}");
        } else {
            assert_eq!(status, 200, "{id}: {body}");
            assert_eq!(body, format!("\"Hello, guest-{i}!\""));
        }
    }
}

#[tokio::test]
async fn rules_apply_plans_applies_prunes_and_exports() {
    let (sluice, _dep) = flow_controlled().await;
    let run = |args: &[&str]| sluice_tests::cli(&sluice, "rules", args);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    let path = file.to_str().unwrap();
    sluice
        .set_rules(json!([{"pattern": "old", "limits": {"concurrency": 1}}]))
        .await;
    std::fs::write(
        &file,
        "[[rules]]\npattern = \"*\"\nconcurrency = 2\n\n[[rules]]\npattern = \"openai\"\nconcurrency = 5\nrate = \"100/minute\"\nburst = 10\n",
    )
    .unwrap();
    let patterns = || async {
        let (_, listed) =
            sluice_tests::get_json(&format!("{}/limits/rules", sluice.admin_url)).await;
        listed["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["pattern"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };

    // A dry run prints the plan and changes nothing.
    let (ok, out) = run(&["apply", "-f", path, "--dry-run"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("+ create     *") && out.contains("+ create     openai"),
        "{out}"
    );
    assert!(out.contains("! not in file old"), "{out}");
    assert!(
        out.contains("2 to create, 0 to update, 0 to delete, 0 unchanged"),
        "{out}"
    );
    assert_eq!(patterns().await, ["old"]);

    // Applied: both created, `old` kept without --prune.
    let (ok, out) = run(&["apply", "-f", path]);
    assert!(ok, "{out}");
    assert_eq!(patterns().await, ["*", "old", "openai"]);
    let (_, rows) = sluice
        .query("SELECT rate, burst, concurrency FROM sys_rules WHERE pattern = 'openai'")
        .await;
    assert_eq!(
        rows["rows"],
        json!([{"rate": "100/min", "burst": 10, "concurrency": 5}])
    );

    // Applying the same file again: nothing to do (the rate compares as the server stores it).
    let (ok, out) = run(&["apply", "-f", path]);
    assert!(ok && out.contains("nothing to do"), "{out}");

    // A changed file with --prune: one update, one delete, one unchanged.
    std::fs::write(
        &file,
        "[[rules]]\npattern = \"*\"\nconcurrency = 3\n\n[[rules]]\npattern = \"openai\"\nconcurrency = 5\nrate = \"100/min\"\nburst = 10\n",
    )
    .unwrap();
    let (ok, out) = run(&["apply", "-f", path, "--prune"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("0 to create, 1 to update, 1 to delete, 1 unchanged"),
        "{out}"
    );
    assert_eq!(patterns().await, ["*", "openai"]);

    // A file with a typo changes nothing and names the field.
    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "[[rules]]\npattern = \"x\"\nconcurency = 1\n").unwrap();
    let (ok, out) = run(&["apply", "-f", typo.to_str().unwrap()]);
    assert!(!ok && out.contains("concurency"), "{out}");

    // Export writes what apply reads: applying it changes nothing; JSON too.
    let exported = dir.path().join("exported.toml");
    let (ok, out) = run(&["export", "-o", exported.to_str().unwrap()]);
    assert!(ok, "{out}");
    let (ok, out) = run(&["apply", "-f", exported.to_str().unwrap(), "--prune"]);
    assert!(ok && out.contains("nothing to do"), "{out}");
    let (ok, out) = run(&["export", "--format", "json"]);
    assert!(ok, "{out}");
    let as_json: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        as_json["rules"][0],
        json!({"pattern": "*", "concurrency": 3})
    );
}
