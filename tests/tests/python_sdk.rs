//! The Python SDK through Sluice (`tests/py-deployment`, PyPI `restate-sdk` served by hypercorn
//! over HTTP/2 with prior knowledge): a Python handler's scoped calls and sends are admitted
//! under the rule book (concurrency measured in the deployment), scope and limit key reach the
//! callee, and the durable basics run: `ctx.run` once across a durable sleep, object state,
//! an awakeable, a workflow's promise.

use serde_json::{Value, json};
use sluice_tests::{
    Sluice, TestDeployment, durable_basics_run_through,
    handler_scoped_calls_are_admitted_under_the_rule_book, reported_cost_is_stored, sluice_for,
};

async fn started(rules: Value) -> (Sluice, TestDeployment) {
    let dep = TestDeployment::python().await.unwrap();
    (sluice_for(&dep, rules).await, dep)
}

#[tokio::test]
async fn a_python_handlers_scoped_calls_and_sends_are_admitted_under_the_rule_book() {
    let (sluice, _dep) = started(json!([{"pattern": "py", "limits": {"concurrency": 2}}])).await;
    handler_scoped_calls_are_admitted_under_the_rule_book(&sluice, "Py", "py").await;
}

#[tokio::test]
async fn the_durable_basics_run_through_sluice() {
    let (sluice, _dep) = started(json!([])).await;
    durable_basics_run_through(&sluice, "Py").await;
}

#[tokio::test]
async fn a_python_handlers_reported_cost_is_stored_with_its_completion() {
    let (sluice, _dep) = started(json!([])).await;
    reported_cost_is_stored(&sluice, "PyMeter").await;
}
