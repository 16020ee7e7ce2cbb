//! What the SDK suites share (`python_sdk.rs`, `go_sdk.rs`, `java_sdk.rs`): each SDK's
//! deployment has the same services under its own prefix (`PyMeter`, `GoMeter`, `JavaMeter`;
//! `…Counter`; `…Signup`), and the same durable basics run through each.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Sluice, TestDeployment, next_awakeable};

/// A fresh Sluice with `dep` registered and `rules` as its rule book.
pub async fn sluice_for(dep: &TestDeployment, rules: Value) -> Sluice {
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let (status, body) = sluice.put_rules(rules).await;
    assert_eq!(status, 200, "{body}");
    sluice
}

/// A fresh Sluice whose clock is moved by `offset` ms (see [`crate::clock_offset_to`]), with
/// the test deployment registered.
pub async fn sluice_at(offset: i64) -> (Sluice, TestDeployment) {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .clock_offset_ms(offset)
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    (sluice, dep)
}

/// Posts to the ingress's `path` with a JSON body (none for `Null`): the status and the JSON
/// answer.
pub async fn ingress_post(sluice: &Sluice, path: &str, body: Value) -> (u16, Value) {
    let mut req = reqwest::Client::new().post(format!("{}{path}", sluice.ingress_url));
    if !body.is_null() {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

/// [`ingress_post`], asserting a 200: the answer.
pub async fn ingress_ok(sluice: &Sluice, path: &str, body: Value) -> Value {
    let (status, answer) = ingress_post(sluice, path, body).await;
    assert_eq!(status, 200, "{path}: {answer}");
    answer
}

/// `{meter}/spend` reports 1533 as what it spent in two `sluice:cost` runs around a durable
/// sleep (the SDK's own `run` with a name, no new SDK): once it completed, its record says it
/// spent exactly that (`sys_invocation.cost`), and the budget of its scope was charged exactly
/// that; a handler that reports nothing (`{meter}/peak`) has no cost at all.
pub async fn reported_cost_is_stored(sluice: &Sluice, meter: &str) {
    sluice
        .set_rules(serde_json::json!([
            {"pattern": "spenders", "limits": {"budget": "1000000/day"}},
        ]))
        .await;
    let spent = sluice
        .send(
            &format!("/service/scope/spenders/send/{meter}/spend"),
            &1533,
        )
        .await;
    let (status, sent) =
        ingress_post(sluice, &format!("/service/send/{meter}/peak"), Value::Null).await;
    assert_eq!(status, 202, "{sent}");
    let silent = sent["invocationId"].as_str().unwrap().to_owned();
    for id in [&spent, &silent] {
        sluice
            .invocation_until(id, "completed", |seen| seen["status"] == "completed")
            .await;
    }
    let cost = |id: &str, filter: &str| {
        format!("SELECT count(*) AS n FROM sys_invocation WHERE id = '{id}' AND {filter}")
    };
    assert_eq!(
        sluice.count(&cost(&spent, "cost = 1533")).await,
        1,
        "{meter}/spend"
    );
    assert_eq!(
        sluice.count(&cost(&silent, "cost IS NULL")).await,
        1,
        "{meter}/peak"
    );
    // What the scope's budget was charged, whatever the day (a window may turn meanwhile).
    let metrics = sluice.metrics().await;
    assert_eq!(
        metrics.get("sluice_flow_cost_charged_total{rule=\"spenders\",level=\"scope\"}"),
        Some(&1533.0),
        "{meter}/spend charged its budget"
    );
}

/// The deployment registered its three services, `{prefix}Meter` (a service), `{prefix}Counter`
/// (a virtual object) and `{prefix}Signup` (a workflow), as their kinds.
pub async fn registered_three_kinds(sluice: &Sluice, prefix: &str) {
    let (status, services) = sluice.get_admin("/services").await;
    assert_eq!(status, 200, "{services}");
    let mut kinds: Vec<(String, String)> = services["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["ty"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    kinds.sort();
    let want = |name: &str, ty: &str| (format!("{prefix}{name}"), ty.to_owned());
    assert_eq!(
        kinds,
        vec![
            want("Counter", "VirtualObject"),
            want("Meter", "Service"),
            want("Signup", "Workflow"),
        ]
    );
}

/// With a rule of concurrency 2 on `scope`: scope and limit key reach `{prefix}Meter/whoami`
/// from the ingress and from a handler's scoped call (`askWho`); six calls a handler makes at
/// once through its SDK's scoped client under limit key `k` (`fanOut`) run two at a time, and
/// four sends (`sendHolds`) are acknowledged at once and then run two at a time, as the
/// deployment counts (`peak`); the rule book counted them under the key the handler gave.
pub async fn handler_scoped_calls_are_admitted_under_the_rule_book(
    sluice: &Sluice,
    prefix: &str,
    scope: &str,
) {
    let meter = format!("/service/call/{prefix}Meter");
    assert_eq!(
        ingress_ok(
            sluice,
            &format!("/service/scope/t1/call/{prefix}Meter/whoami?limit-key=gold"),
            Value::Null
        )
        .await,
        json!({"scope": "t1", "limitKey": "gold"})
    );
    assert_eq!(
        ingress_ok(
            sluice,
            &format!("{meter}/askWho"),
            json!({"scope": "t2", "limitKey": "eu/gold"})
        )
        .await,
        json!({"scope": "t2", "limitKey": "eu/gold"})
    );
    let started = Instant::now();
    let fanned = ingress_ok(
        sluice,
        &format!("{meter}/fanOut"),
        json!({"scope": scope, "limitKey": "k", "calls": 6, "millis": 300}),
    )
    .await;
    assert_eq!(fanned, json!(6));
    assert_eq!(
        ingress_ok(sluice, &format!("{meter}/peak"), Value::Null).await,
        json!(2)
    );
    assert!(
        started.elapsed() >= Duration::from_millis(850),
        "three rounds of 300 ms"
    );
    ingress_ok(
        sluice,
        &format!("{meter}/sendHolds"),
        json!({"scope": scope, "limitKey": "k", "sends": 4, "millis": 300}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while sluice
        .count(&format!("SELECT count(*) AS n FROM sys_invocation WHERE scope = '{scope}' AND target_handler_name = 'hold' AND status = 'completed'"))
        .await
        < 10
    {
        assert!(Instant::now() < deadline, "the sent holds did not all complete");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        ingress_ok(sluice, &format!("{meter}/peak"), Value::Null).await,
        json!(2)
    );
    assert_eq!(
        sluice
            .count(&format!("SELECT count(*) AS n FROM sys_invocation WHERE scope = '{scope}' AND limit_key = 'k' AND target_handler_name = 'hold'"))
            .await,
        10
    );
}

/// Through the deployment of services `{prefix}Meter`, `{prefix}Counter` and `{prefix}Signup`:
/// a side effect in the SDK's `run` then a durable sleep (the effect ran once, and its
/// journaled result is what the handler saw), object state per key, an awakeable resolved over
/// the ingress, and a workflow waiting on its promise until a shared handler resolves it.
pub async fn durable_basics_run_through(sluice: &Sluice, prefix: &str) {
    let meter = format!("{prefix}Meter");
    let once = ingress_ok(
        sluice,
        &format!("/service/call/{meter}/runOnce"),
        json!(200),
    )
    .await;
    assert_eq!(once, json!({"seen": 1, "effects": 1}));
    let counter =
        |key: &str, handler: &str| format!("/service/call/{prefix}Counter/{key}/{handler}");
    assert_eq!(
        ingress_ok(sluice, &counter("a", "add"), json!(2)).await,
        json!(2)
    );
    assert_eq!(
        ingress_ok(sluice, &counter("a", "add"), json!(3)).await,
        json!(5)
    );
    assert_eq!(
        ingress_ok(sluice, &counter("a", "get"), Value::Null).await,
        json!(5)
    );
    assert_eq!(
        ingress_ok(sluice, &counter("b", "get"), Value::Null).await,
        json!(0)
    );

    let ingress = sluice.ingress_url.clone();
    let awaiting = format!("{ingress}/service/call/{meter}/awaitAwakeable");
    let waiting = tokio::spawn(async move {
        reqwest::Client::new()
            .post(awaiting)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    let id = next_awakeable(&sluice.ingress_url, &meter, "").await;
    let (status, body) = ingress_post(
        sluice,
        &format!("/service/awakeables/{id}/resolve"),
        json!(prefix),
    )
    .await;
    assert_eq!(status, 202, "{id}: {body}");
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the awakeable resolves the handler")
        .unwrap();
    assert_eq!(answer, format!("\"{prefix}\""));

    let signup = format!("{prefix}Signup");
    let (status, body) = ingress_post(
        sluice,
        &format!("/service/send/{signup}/ann/run"),
        json!("ann@example.com"),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        ingress_ok(
            sluice,
            &format!("/service/call/{signup}/ann/confirm"),
            json!("1234")
        )
        .await,
        json!("ok")
    );
    let resp = reqwest::get(format!(
        "{}/service/workflow/{signup}/ann/attach",
        sluice.ingress_url
    ))
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!("ann@example.com confirmed with 1234")
    );
}

/// A send to `{meter}/runOnce` journals its side effect and sleeps durably; Sluice is killed
/// -9 during the sleep and restarted on its data dir: the invocation resumes from its journal
/// and completes, and the effect (counted in the deployment, which lives on) ran exactly once.
pub async fn side_effect_runs_once_across_a_kill_9(mut sluice: Sluice, meter: &str) {
    let (status, sent) = ingress_post(
        &sluice,
        &format!("/service/send/{meter}/runOnce"),
        json!(2000),
    )
    .await;
    assert_eq!(status, 202, "{sent}");
    let id = sent["invocationId"].as_str().unwrap().to_owned();
    // The effect is journaled before the sleep: wait for the journal to hold the sleep.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sluice
        .count(&format!(
            "SELECT count(*) AS n FROM sys_journal WHERE id = '{id}' AND entry_type = 'SleepCommandMessage'"
        ))
        .await
        == 0
    {
        assert!(Instant::now() < deadline, "the handler never reached its sleep");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let effects = format!("/service/call/{meter}/effects");
    assert_eq!(ingress_ok(&sluice, &effects, Value::Null).await, json!(1));
    sluice.kill_9();
    let again = sluice.restart(Sluice::builder()).await;
    let done = again
        .invocation_until(&id, "completed after the restart", |seen| {
            seen["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let output = reqwest::get(format!(
        "{}/restate/invocation/{id}/output",
        again.ingress_url
    ))
    .await
    .unwrap();
    assert_eq!(output.status(), 200);
    assert_eq!(
        output.json::<Value>().await.unwrap(),
        json!({"seen": 1, "effects": 1})
    );
    assert_eq!(ingress_ok(&again, &effects, Value::Null).await, json!(1));
}

/// A V6 deployment's `<meter>` makes scoped calls by headers (`x-service-scope`,
/// `x-service-limit-key`): `fanOut(6)` sends six `hold(300)` into `scope` (the rule on it,
/// concurrency 2, holds them), alternating keys `k0` and `k1`; `whoAmI` reads its own scope and
/// key from its input's headers, `childWhoAmI` inherits them, and a client's header passes as
/// nothing. `input` is what the deployment's `whoAmI` and `peak` take.
pub async fn v6_handlers_make_scoped_calls_by_headers(
    sluice: &Sluice,
    meter: &str,
    scope: &str,
    input: Value,
) {
    assert_eq!(
        ingress_ok(sluice, &format!("/service/call/{meter}/fanOut"), json!(6)).await,
        json!(6)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = format!(
        "SELECT count(*) AS n FROM sys_invocation WHERE scope = '{scope}' AND target_handler_name = 'hold' AND status = 'completed'"
    );
    while sluice.count(&done).await < 6 {
        assert!(Instant::now() < deadline, "the six scoped sends never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        ingress_ok(
            sluice,
            &format!("/service/call/{meter}/peak"),
            input.clone()
        )
        .await,
        json!(2),
        "the rule on scope {scope} held the sends"
    );
    assert_eq!(
        sluice
            .count(&format!(
                "SELECT count(*) AS n FROM sys_invocation WHERE scope = '{scope}' AND limit_key IN ('k0', 'k1')"
            ))
            .await,
        6
    );
    // A handler sees its own scope and key; a child call that names none inherits them.
    for handler in ["whoAmI", "childWhoAmI"] {
        let path = format!("/service/scope/acme/call/{meter}/{handler}?limit-key=gold");
        assert_eq!(
            ingress_ok(sluice, &path, input.clone()).await,
            json!("acme/gold"),
            "{handler}"
        );
    }
    // An unscoped call sees none; a client's own header does not pass as a scope.
    let mut forged = reqwest::Client::new()
        .post(format!(
            "{}/service/call/{meter}/whoAmI",
            sluice.ingress_url
        ))
        .header("x-service-scope", "forged");
    if !input.is_null() {
        forged = forged.json(&input);
    }
    let answer: Value = forged.send().await.unwrap().json().await.unwrap();
    assert_eq!(answer, json!("-/-"));
}
