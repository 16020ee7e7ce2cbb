//! The Java SDK through Sluice (`tests/java-deployment`, Maven Central's `dev.restate:sdk-java-http`
//! 2.4.0 behind Vert.x on loopback): discovery and registration, object state, an awakeable, a
//! workflow's promise, a side effect in `ctx.run` that runs once across a durable sleep and
//! across a kill -9 of Sluice, and flow control at the edge (calls made in a scope from the
//! ingress, their concurrency measured in the handler).
//!
//! That SDK release speaks the service protocol up to V6: it has no scoped client and no limit
//! key fields (both came with V7). Its handlers name a call's scope and limit key in the call's
//! headers (`x-service-scope`, `x-service-limit-key`), and read their own in their input's
//! headers (`docs/flow-control.md`, "SDKs").

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{
    Sluice, TestDeployment, durable_basics_run_through, ingress_ok, registered_three_kinds,
    reported_cost_is_stored, side_effect_runs_once_across_a_kill_9, sluice_for,
    v6_handlers_make_scoped_calls_by_headers,
};

async fn started(rules: Value) -> (Sluice, TestDeployment) {
    let dep = TestDeployment::java().await.unwrap();
    (sluice_for(&dep, rules).await, dep)
}

#[tokio::test]
async fn the_java_deployment_registers_with_its_three_kinds_of_service_on_protocol_v6() {
    let (sluice, _dep) = started(json!([])).await;
    registered_three_kinds(&sluice, "Java").await;
    let (status, deployments) = sluice.get_admin("/deployments").await;
    assert_eq!(status, 200, "{deployments}");
    let deployment = &deployments["deployments"][0];
    assert_eq!(deployment["max_protocol_version"], 6, "{deployments}");
}

#[tokio::test]
async fn java_calls_made_in_a_scope_at_the_ingress_are_admitted_under_the_rule_book() {
    let (sluice, _dep) = started(json!([{"pattern": "java", "limits": {"concurrency": 2}}])).await;
    // Six calls at once into scope `java`: two run at a time, as the handler counts.
    let started = Instant::now();
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let ingress = sluice.ingress_url.clone();
            tokio::spawn(async move {
                let resp = reqwest::Client::new()
                    .post(format!(
                        "{ingress}/service/scope/java/call/JavaMeter/hold?limit-key=k{}",
                        i % 2
                    ))
                    .json(&json!(300))
                    .send()
                    .await
                    .unwrap();
                resp.status().as_u16()
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
    assert!(
        started.elapsed() >= Duration::from_millis(850),
        "three rounds of 300 ms"
    );
    assert_eq!(
        ingress_ok(&sluice, "/service/call/JavaMeter/peak", Value::Null).await,
        json!(2)
    );
    assert_eq!(
        sluice
            .count("SELECT count(*) AS n FROM sys_invocation WHERE scope = 'java' AND target_handler_name = 'hold' AND status = 'completed'")
            .await,
        6
    );
}

/// V6 has no scope fields: a Java handler names the scope and limit key of a call in its
/// headers (`x-service-scope`, `x-service-limit-key`), Sluice limits it as it would a V7
/// field, and a handler reads its own in its input's headers (inherited by an unnamed call).
#[tokio::test]
async fn java_handlers_make_scoped_calls_by_headers_and_read_their_own_scope() {
    let (sluice, _dep) = started(json!([{"pattern": "jv", "limits": {"concurrency": 2}}])).await;
    v6_handlers_make_scoped_calls_by_headers(&sluice, "JavaMeter", "jv", Value::Null).await;
}

#[tokio::test]
async fn the_durable_basics_run_through_sluice() {
    let (sluice, _dep) = started(json!([])).await;
    durable_basics_run_through(&sluice, "Java").await;
}

#[tokio::test]
async fn a_java_handlers_reported_cost_is_stored_with_its_completion() {
    let (sluice, _dep) = started(json!([])).await;
    reported_cost_is_stored(&sluice, "JavaMeter").await;
}

/// A side effect in `ctx.run` survives a kill -9 of Sluice between it and the handler's end,
/// and runs once (counted in the deployment).
#[tokio::test]
async fn a_java_side_effect_runs_once_across_a_kill_9_of_sluice() {
    let (sluice, _dep) = started(json!([])).await;
    side_effect_runs_once_across_a_kill_9(sluice, "JavaMeter").await;
}
