//! Scoped calls and sends made from handlers (protocol V7) against the real TypeScript SDK
//! deployment: the SDK puts scope and limit key on its Call and OneWayCall commands, Sluice
//! admits the callee under the rule book like an ingress call, and the callee's StartMessage
//! carries both. Concurrency is measured inside the deployment (`TsMeter/hold`).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment, reported_cost_is_stored};

async fn started(rules: Value) -> (Sluice, TestDeployment) {
    let dep = TestDeployment::typescript("h2").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let (status, body) = sluice.put_rules(rules).await;
    assert_eq!(status, 200, "{body}");
    (sluice, dep)
}

async fn call(sluice: &Sluice, path: &str, body: Value) -> (u16, String) {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", sluice.ingress_url))
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn completed_in(sluice: &Sluice, scope: &str) -> u64 {
    sluice
        .count(&format!(
            "SELECT count(*) AS n FROM sys_invocation WHERE scope = '{scope}' AND status = 'completed'"
        ))
        .await
}

/// What `TsMeter/whoami` (directly, or through `askWho`) saw: its scope and limit key.
async fn who(sluice: &Sluice, path: &str, body: Value) -> Value {
    let (status, body) = call(sluice, path, body).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn scope_and_limit_key_reach_the_deployment_from_ingress_and_from_handlers() {
    let (sluice, _dep) = started(json!([])).await;
    assert_eq!(
        who(
            &sluice,
            "/service/scope/t1/call/TsMeter/whoami?limit-key=gold",
            Value::Null
        )
        .await,
        json!({"scope": "t1", "limitKey": "gold"})
    );
    assert_eq!(
        who(&sluice, "/service/call/TsMeter/whoami", Value::Null).await,
        json!({"scope": null, "limitKey": null})
    );
    // An unscoped handler calls into a scope with a two-level limit key.
    assert_eq!(
        who(
            &sluice,
            "/service/call/TsMeter/askWho",
            json!({"scope": "t2", "limitKey": "eu/gold"})
        )
        .await,
        json!({"scope": "t2", "limitKey": "eu/gold"})
    );
    // A trailing slash is not part of the key: the handler sees, and the store keeps, the
    // key the counters count (`a/` is `a`), from the ingress and from a handler's call.
    assert_eq!(
        who(
            &sluice,
            "/service/scope/t5/call/TsMeter/whoami?limit-key=a/",
            Value::Null
        )
        .await,
        json!({"scope": "t5", "limitKey": "a"})
    );
    assert_eq!(
        who(
            &sluice,
            "/service/call/TsMeter/askWho",
            json!({"scope": "t6", "limitKey": "eu/gold/"})
        )
        .await,
        json!({"scope": "t6", "limitKey": "eu/gold"})
    );
    let (status, stored) = sluice
        .query(
            "SELECT scope, limit_key FROM sys_invocation WHERE scope IN ('t5', 't6') AND target_handler_name = 'whoami' ORDER BY scope",
        )
        .await;
    assert_eq!(status, 200, "{stored}");
    assert_eq!(
        stored["rows"],
        json!([
            {"scope": "t5", "limit_key": "a"},
            {"scope": "t6", "limit_key": "eu/gold"}
        ])
    );
}

#[tokio::test]
async fn calls_and_sends_from_handlers_are_admitted_under_the_rule_book() {
    let (sluice, _dep) = started(json!([
        {"pattern": "*", "limits": {"concurrency": 2}},
        {"pattern": "t4/*", "limits": {"concurrency": 1}},
    ]))
    .await;
    // Five sends from a handler, in scope t4 under limit key `k`: one at a time.
    let (status, body) = call(
        &sluice,
        "/service/call/TsMeter/sendHolds",
        json!({"scope": "t4", "limitKey": "k", "sends": 5, "millis": 200}),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "5"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while completed_in(&sluice, "t4").await < 5 {
        assert!(Instant::now() < deadline, "the scoped sends never all ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, peak) = call(&sluice, "/service/call/TsMeter/peak", Value::Null).await;
    assert_eq!(peak, "1", "t4/* = 1 holds the sends to one at a time");

    // Six parallel calls from a handler, in scope t1 under `*` = 2: never more than two.
    let (status, body) = call(
        &sluice,
        "/service/call/TsMeter/fanOut",
        json!({"scope": "t1", "calls": 6, "millis": 300}),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "6"));
    let (_, peak) = call(&sluice, "/service/call/TsMeter/peak", Value::Null).await;
    assert_eq!(
        peak, "2",
        "* = 2 bounds the scope's calls made from a handler"
    );
    assert_eq!(completed_in(&sluice, "t1").await, 6);
}

/// A bad scope or limit key on a handler's call fails the calling attempt with RT0024 (it
/// retries, as the reference server does), saying what is wrong.
#[tokio::test]
async fn bad_scopes_on_calls_from_handlers_are_rt0024() {
    let (sluice, _dep) = started(json!([])).await;
    for (asked, says) in [
        (
            json!({"scope": "bad scope!"}),
            "invalid scope 'bad scope!': only [a-zA-Z0-9_.-] allowed",
        ),
        (json!({"limitKey": "x"}), "limit key 'x' requires a scope"),
        (
            json!({"scope": "s", "limitKey": "a/b/c"}),
            "limit key 'a/b/c'",
        ),
    ] {
        let sent: Value = reqwest::Client::new()
            .post(format!(
                "{}/service/send/TsMeter/askWho",
                sluice.ingress_url
            ))
            .json(&asked)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = sent["invocationId"].as_str().unwrap();
        let seen = sluice
            .invocation_until(id, &format!("RT0024 for {asked}"), |seen| {
                seen["last_failure_error_code"] == "RT0024"
            })
            .await;
        let failure = seen["last_failure"].as_str().unwrap();
        assert!(failure.contains(says), "{asked}: {failure}");
        assert_ne!(seen["status"], "completed", "{seen}");
    }
}

/// A handler's call that a rule refuses (here a rate with `on_exceed = reject` and no token
/// left) fails with 429 FLO0002, which the SDK surfaces as a terminal error of the caller.
#[tokio::test]
async fn a_refused_call_from_a_handler_fails_with_rt0030() {
    let (sluice, _dep) = started(json!([
        {"pattern": "r5", "limits": {"rate": "1/min", "on_exceed": "reject"}},
    ]))
    .await;
    let who = json!({"scope": "r5", "limitKey": null});
    let (status, body) = call(&sluice, "/service/call/TsMeter/askWho", who.clone()).await;
    assert_eq!(
        status, 200,
        "the first call takes the minute's token: {body}"
    );
    let (status, body) = call(&sluice, "/service/call/TsMeter/askWho", who).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("FLO0002") && body.contains("1/min"), "{body}");
    assert_eq!(
        completed_in(&sluice, "r5").await,
        1,
        "the refused call was not stored"
    );
}

/// A handler's call or send that names no scope runs under its caller's scope and limit key
/// (`flow.inherit-scope`, on by default), so one rule governs a whole call chain; a scope or
/// limit key the handler names wins. Measured in the deployment: the callee's StartMessage and
/// the peak of `hold`s running at once.
#[tokio::test]
async fn calls_from_a_scoped_handler_inherit_its_scope_and_limit_key() {
    let (sluice, _dep) = started(json!([{"pattern": "t9", "limits": {"concurrency": 3}}])).await;
    let inherited = [
        (json!({}), json!({"scope": "t7", "limitKey": "gold"})),
        (
            json!({"limitKey": "silver"}),
            json!({"scope": "t7", "limitKey": "silver"}),
        ),
        (
            json!({"scope": "t8"}),
            json!({"scope": "t8", "limitKey": null}),
        ),
    ];
    for (asked, seen) in inherited {
        assert_eq!(
            who(
                &sluice,
                "/service/scope/t7/call/TsMeter/askWho?limit-key=gold",
                asked.clone()
            )
            .await,
            seen,
            "{asked}"
        );
    }
    // Six parallel calls from a handler in t9 = 3 that name no scope: the caller holds one
    // slot while it runs, its children share the other two.
    let (status, body) = call(
        &sluice,
        "/service/scope/t9/call/TsMeter/fanOut",
        json!({"calls": 6, "millis": 300}),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "6"));
    let (_, peak) = call(&sluice, "/service/call/TsMeter/peak", Value::Null).await;
    assert_eq!(peak, "2", "the chain shares t9's three slots");
    assert_eq!(
        completed_in(&sluice, "t9").await,
        7,
        "caller and children in t9"
    );

    // Turned off, a handler's calls that name no scope are unscoped, as before.
    let dep = TestDeployment::typescript("h2").await.unwrap();
    let off = Sluice::builder()
        .config("[flow]\ninherit-scope = false\n")
        .start()
        .await
        .unwrap();
    off.register(&dep.uri, false).await;
    off.set_rules(json!([{"pattern": "t9", "limits": {"concurrency": 3}}]))
        .await;
    assert_eq!(
        who(&off, "/service/scope/t7/call/TsMeter/askWho", json!({})).await,
        json!({"scope": null, "limitKey": null})
    );
    let (status, _) = call(
        &off,
        "/service/scope/t9/call/TsMeter/fanOut",
        json!({"calls": 6, "millis": 300}),
    )
    .await;
    assert_eq!(status, 200);
    let (_, peak) = call(&off, "/service/call/TsMeter/peak", Value::Null).await;
    assert_eq!(peak, "6", "unscoped children are not limited");
}

#[tokio::test]
async fn a_typescript_handlers_reported_cost_is_stored_with_its_completion() {
    let (sluice, _dep) = started(json!([])).await;
    reported_cost_is_stored(&sluice, "TsMeter").await;
}
