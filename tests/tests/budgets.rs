//! Budgets end to end, measured in the handler (`Meter/spend` reports what it spent with
//! `sluice:cost` steps and counts it, `Meter/spent` answers the count): a tenant that spends
//! its day's budget is held while another runs on, until a reset; a rejecting budget answers
//! 429 `FLO0005`; a reservation keeps what runs at once within the budget; a kill -9 between a
//! call's end and its answer charges it exactly once.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{
    MIDDAY_MS, Sluice, TestDeployment, call_json, cli, clock_offset_to, refused_with_retry_after,
    sluice_at,
};

/// The server with its day starting twelve hours before its clock (no window ends during a
/// test, whatever the hour it runs), the test deployment registered, and `rules`.
async fn started(rules: Value) -> (Sluice, TestDeployment, i64) {
    let offset = clock_offset_to(MIDDAY_MS);
    let (sluice, dep) = sluice_at(offset).await;
    sluice.set_rules(rules).await;
    // Start the handler's count from here.
    let _: (u64, u64) = call_json(&sluice, "Meter/spent").await;
    (sluice, dep, offset)
}

/// Sends `Meter/spend(amount)` in `scope` (under `key`, if any); answers its invocation id.
async fn spend(sluice: &Sluice, scope: &str, key: Option<&str>, amount: u64) -> String {
    let key = key.map_or_else(String::new, |k| format!("?limit-key={k}"));
    sluice
        .send(
            &format!("/service/scope/{scope}/send/Meter/spend{key}"),
            &amount,
        )
        .await
}

/// Waits until `n` spends in `scope` completed.
async fn completed(sluice: &Sluice, scope: &str, n: u64) {
    let sql = format!(
        "SELECT count(*) AS n FROM sys_invocation WHERE target_handler_name = 'spend' AND scope = '{scope}' AND status = 'completed'"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while sluice.count(&sql).await < n {
        assert!(
            Instant::now() < deadline,
            "{n} spends in {scope} never completed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until invocation `id` says it waits for its spent budget.
async fn waits_for_budget(sluice: &Sluice, id: &str) -> Value {
    sluice
        .invocation_until(id, "a budget wait", |seen| {
            seen["waiting"]["blocked_on"] == "budget-exhausted"
        })
        .await
}

/// What the handler paid for since the last look, and the most spends it ran at once.
async fn handler_spent(sluice: &Sluice) -> (u64, u64) {
    call_json(sluice, "Meter/spent").await
}

#[tokio::test]
async fn a_tenant_that_spends_its_budget_is_held_while_another_runs_on_until_a_reset() {
    let (sluice, _dep, _) = started(json!([])).await;
    // Set through the CLI, as an operator would.
    for args in [
        &[
            "set",
            "bt/*",
            "--budget",
            "3000/day",
            "--budget-unit",
            "tokens",
        ][..],
        &["set", "br", "--budget", "1000/day", "--on-exceed", "reject"][..],
    ] {
        let (ok, out) = cli(&sluice, "rules", args);
        assert!(ok, "{out}");
    }

    // acme spends its day's 3000 in three calls; its fourth waits for the next window.
    for _ in 0..3 {
        spend(&sluice, "bt", Some("acme"), 1000).await;
    }
    completed(&sluice, "bt", 3).await;
    let held = spend(&sluice, "bt", Some("acme"), 1000).await;
    let why = waits_for_budget(&sluice, &held).await;
    assert_eq!(why["waiting"]["budget"], "3000/day", "{why}");
    assert!(why["waiting"]["budget_resets_at"].is_string(), "{why}");
    // globex has its own budget and runs on.
    spend(&sluice, "bt", Some("globex"), 500).await;
    completed(&sluice, "bt", 4).await;
    assert_eq!(
        handler_spent(&sluice).await.0,
        3500,
        "what the handler paid for"
    );
    let shown = sluice
        .count("SELECT count(*) AS n FROM sys_user_limits WHERE scope = 'bt' AND l1 = 'acme' AND budget = '3000/day' AND budget_spent = 3000 AND budget_reserved = 0")
        .await;
    assert_eq!(shown, 1, "sys_user_limits shows acme's spend");
    let (_, counters) = sluice.get_admin("/limits/counters").await;
    let acme = counters["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["l1"] == "acme")
        .cloned()
        .unwrap_or_default();
    assert_eq!(acme["budget_spent"], 3000, "{counters}");
    let (ok, listed) = cli(&sluice, "rules", &["list", "--extra"]);
    assert!(
        ok && listed.contains("BUDGET") && listed.contains("3000/day tokens"),
        "{listed}"
    );
    let (_, rules) = sluice.get_admin("/limits/rules").await;
    assert!(
        rules.to_string().contains("\"budget_unit\":\"tokens\""),
        "{rules}"
    );

    // An operator starts acme's spend again: the held call runs.
    let (ok, out) = cli(&sluice, "rules", &["reset-budget", "bt/*"]);
    assert!(
        ok && out.contains("budget of 'bt/*' reset at 2 counter(s)"),
        "{out}"
    );
    completed(&sluice, "bt", 5).await;
    assert_eq!(handler_spent(&sluice).await.0, 1000);
    let metrics = sluice.metrics().await;
    let charged = metrics.get("sluice_flow_cost_charged_total{rule=\"bt/*\",level=\"level1\"}");
    assert_eq!(
        charged,
        Some(&4500.0),
        "charged by rule and level: {metrics:?}"
    );

    // A rejecting budget: 429 FLO0005 with Retry-After once it is spent.
    let client = reqwest::Client::new();
    let url = format!("{}/service/scope/br/call/Meter/spend", sluice.ingress_url);
    let first = client.post(&url).json(&1000).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let refused = client.post(&url).json(&1).send().await.unwrap();
    let (retry, body) = refused_with_retry_after(refused).await;
    assert!((1..=86_400).contains(&retry), "retry after {retry} s");
    assert!(
        body.contains("FLO0005") && body.contains("budget"),
        "{body}"
    );
    assert_eq!(
        handler_spent(&sluice).await.0,
        1000,
        "the refused call never ran"
    );
}

#[tokio::test]
async fn a_reservation_keeps_what_runs_at_once_within_the_budget() {
    // 10000 a day, 1000 reserved per call: with calls spending 1000 each, at most ten run at
    // once and the budget is never overshot, however many arrive together.
    let (sluice, _dep, _) = started(json!([
        {"pattern": "rv", "limits": {"budget": "10000/day", "reserve": 1000}},
    ]))
    .await;
    let mut ids = Vec::new();
    for _ in 0..25 {
        ids.push(spend(&sluice, "rv", None, 1000).await);
    }
    completed(&sluice, "rv", 10).await;
    // The other fifteen wait for the budget (none runs past it).
    let waiting = "SELECT count(*) AS n FROM sys_invocation WHERE target_handler_name = 'spend' AND scope = 'rv' AND status <> 'completed'";
    assert_eq!(sluice.count(waiting).await, 15);
    for id in &ids {
        let (_, seen) = sluice.describe(id).await;
        if seen["status"] != "completed" {
            waits_for_budget(&sluice, id).await;
        }
    }
    let (spent, peak) = handler_spent(&sluice).await;
    assert_eq!(
        spent, 10_000,
        "what the handler paid for is the budget, not more"
    );
    assert!(peak <= 10, "at most ten spends at once, saw {peak}");
    let charged = sluice
        .count("SELECT sum(cost) AS n FROM sys_invocation WHERE target_handler_name = 'spend' AND scope = 'rv'")
        .await;
    assert_eq!(charged, 10_000);
    assert_eq!(
        sluice
            .count("SELECT count(*) AS n FROM sys_user_limits WHERE scope = 'rv' AND budget_spent = 10000 AND budget_reserved = 0")
            .await,
        1
    );
}

#[tokio::test]
async fn a_kill_9_between_a_calls_end_and_its_answer_charges_it_exactly_once() {
    const SENDS: u64 = 40;
    let (mut sluice, _dep, offset) = started(json!([
        {"pattern": "kb", "limits": {"budget": "1000000000/day"}},
    ]))
    .await;
    // Each send reports half, sleeps durably, reports the rest: the kill finds some before
    // their first report, some between, some ended and not yet answered, some done.
    for amount in 1..=SENDS {
        spend(&sluice, "kb", None, amount * 100).await;
    }
    sluice.kill_9();
    let sluice = sluice
        .restart(Sluice::builder().clock_offset_ms(offset))
        .await;
    completed(&sluice, "kb", SENDS).await;
    let expected = (1..=SENDS).map(|a| a * 100).sum::<u64>();
    let charged = sluice
        .count("SELECT sum(cost) AS n FROM sys_invocation WHERE target_handler_name = 'spend' AND scope = 'kb'")
        .await;
    assert_eq!(charged, expected);
    let budget = format!(
        "SELECT count(*) AS n FROM sys_user_limits WHERE scope = 'kb' AND budget_spent = {expected} AND budget_reserved = 0"
    );
    assert_eq!(
        sluice.count(&budget).await,
        1,
        "the budget holds each charge once"
    );
}

/// One report of 2^64−1 from any caller in the scope spent a `1000/day` budget until midnight
/// (the next call: 429 `FLO0005`, retry after hours). One call's charge is cut at its rule's
/// `reserve` now, and what was cut is counted as an overrun: the tenant's next call runs.
#[tokio::test]
async fn one_huge_report_spends_at_most_what_one_call_may_and_the_rest_is_an_overrun() {
    let (sluice, _dep, _) = started(json!([
        {"pattern": "cap", "limits": {"budget": "1000/day", "reserve": 100, "on_exceed": "reject"}},
    ]))
    .await;
    spend(&sluice, "cap", None, u64::MAX).await;
    completed(&sluice, "cap", 1).await;
    let (status, rows) = sluice
        .query("SELECT budget_spent, budget_overrun FROM sys_user_limits WHERE scope = 'cap'")
        .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(
        rows["rows"],
        json!([{"budget_spent": 100, "budget_overrun": u64::MAX - 100}]),
        "{rows}"
    );
    let overrun = sluice.metrics().await;
    assert!(
        overrun.iter().any(
            |(name, value)| name.starts_with("sluice_flow_cost_overrun_total") && *value > 1e18
        ),
        "{overrun:?}"
    );
    // The victim's next call is admitted and charged as usual.
    spend(&sluice, "cap", None, 10).await;
    completed(&sluice, "cap", 2).await;
    assert_eq!(
        sluice
            .count("SELECT budget_spent AS n FROM sys_user_limits WHERE scope = 'cap'")
            .await,
        110
    );
}
