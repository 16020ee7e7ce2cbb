//! The Go SDK through Sluice (`tests/go-deployment`, `github.com/restatedev/sdk-go` served by
//! its own HTTP/2 server): discovery and registration, a Go handler's calls and sends through
//! a client scoped with `restate.WithScope` under `restate.WithLimitKey` admitted under the rule
//! book (concurrency measured in the deployment), scope and limit key reaching the callee, and
//! the durable basics: object state, an awakeable, a workflow's promise, and a side effect in
//! `restate.Run` that runs once across a durable sleep and across a kill -9 of Sluice.

use serde_json::{Value, json};
use sluice_tests::{
    Sluice, TestDeployment, durable_basics_run_through,
    handler_scoped_calls_are_admitted_under_the_rule_book, registered_three_kinds,
    reported_cost_is_stored, side_effect_runs_once_across_a_kill_9, sluice_for,
};

async fn started(rules: Value) -> (Sluice, TestDeployment) {
    let dep = TestDeployment::go().await.unwrap();
    (sluice_for(&dep, rules).await, dep)
}

#[tokio::test]
async fn the_go_deployment_registers_with_its_three_kinds_of_service() {
    let (sluice, _dep) = started(json!([])).await;
    registered_three_kinds(&sluice, "Go").await;
}

#[tokio::test]
async fn a_go_handlers_scoped_calls_and_sends_are_admitted_under_the_rule_book() {
    let (sluice, _dep) = started(json!([{"pattern": "go", "limits": {"concurrency": 2}}])).await;
    handler_scoped_calls_are_admitted_under_the_rule_book(&sluice, "Go", "go").await;
}

#[tokio::test]
async fn the_durable_basics_run_through_sluice() {
    let (sluice, _dep) = started(json!([])).await;
    durable_basics_run_through(&sluice, "Go").await;
}

#[tokio::test]
async fn a_go_handlers_reported_cost_is_stored_with_its_completion() {
    let (sluice, _dep) = started(json!([])).await;
    reported_cost_is_stored(&sluice, "GoMeter").await;
}

/// A side effect in `restate.Run` survives a kill -9 of Sluice between it and the handler's
/// end, and runs once (counted in the deployment).
#[tokio::test]
async fn a_go_side_effect_runs_once_across_a_kill_9_of_sluice() {
    let (sluice, _dep) = started(json!([])).await;
    side_effect_runs_once_across_a_kill_9(sluice, "GoMeter").await;
}
