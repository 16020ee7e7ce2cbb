//! Rate limits end to end against the real Rust SDK deployment: admissions counted inside the
//! handler (`Meter/tick` records when each one started), what a throttled invocation says it
//! waits for, the counters, SQL and the CLI, and a rate kept across a kill -9.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment, cli};

async fn flow_controlled() -> (Sluice, TestDeployment) {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    (sluice, dep)
}

/// Sends `n` `Meter/tick`s in `scope`; answers their invocation ids (each acknowledged 202).
async fn send_ticks(sluice: &Sluice, scope: &str, n: usize) -> Vec<String> {
    let path = format!("/service/scope/{scope}/send/Meter/tick");
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let (status, _, sent) = send(sluice, &path, "").await;
        assert_eq!(status, 202, "{sent}");
        ids.push(sent["invocationId"].as_str().unwrap().to_owned());
    }
    ids
}

/// Asserts the rule book holds the one rule `rb` = 2/s, burst 5 (as `sys_rules` shows it).
async fn assert_rb_stored(sluice: &Sluice) {
    let (status, rows) = sluice
        .query("SELECT pattern, rate, burst FROM sys_rules")
        .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(
        rows["rows"],
        json!([{"pattern": "rb", "rate": "2/s", "burst": 5}])
    );
}

/// The start times `Meter/tick` recorded since the last look (ms since the epoch).
async fn ticks(sluice: &Sluice) -> Vec<u64> {
    sluice_tests::call_json(sluice, "Meter/ticks").await
}

/// Adds the ticks recorded from now on to `seen` until it holds `n` (at most 15 s).
async fn ticks_until(sluice: &Sluice, seen: &mut Vec<u64>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while seen.len() < n {
        assert!(Instant::now() < deadline, "only {} of {n} ran", seen.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen.extend(ticks(sluice).await);
    }
    assert_eq!(seen.len(), n, "more ran than were sent");
}

/// The scope-level counter of `scope` from `GET /limits/counters`.
async fn scope_counter(sluice: &Sluice, scope: &str) -> Value {
    sluice_tests::counter(sluice, scope, "scope")
        .await
        .unwrap_or_else(|| panic!("no counter for {scope}"))
}

/// The most ticks inside any window of `window_ms`.
fn densest(ticks: &[u64], window_ms: u64) -> usize {
    (0..ticks.len())
        .map(|i| {
            ticks[i..]
                .iter()
                .take_while(|t| **t < ticks[i] + window_ms)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn a_rate_spaces_admissions_measured_in_the_handler() {
    let (sluice, _dep) = flow_controlled().await;
    let created = sluice
        .set_rules(json!([{"pattern": "rl", "limits": {"rate": "10/s"}}]))
        .await;
    assert_eq!(created[0]["limits"], json!({"rate": "10/s", "burst": 1}));

    // A burst of 100 sends: the rate lets one through every 100 ms.
    let ids = send_ticks(&sluice, "rl", 100).await;
    let start = Instant::now();

    // The last one waits for a token and says so.
    let seen = sluice
        .invocation_until(&ids[99], "shown as rate limited", |seen| {
            seen["waiting"]["blocked_on"] == "rate-limit"
        })
        .await;
    let waiting = &seen["waiting"];
    assert_eq!(waiting["rate"], "10/s", "{seen}");
    assert_eq!(waiting["level"], "scope", "{seen}");
    assert_eq!(waiting["rule"], "rl", "{seen}");
    assert!(waiting["next_token_at"].is_string(), "{seen}");
    let counter = scope_counter(&sluice, "rl").await;
    assert_eq!(counter["rate"], "10/s", "{counter}");
    assert_eq!(counter["tokens"], 0, "{counter}");
    assert!(counter["waiters"].as_u64().unwrap() > 0, "{counter}");
    let (status, rows) = sluice
        .query("SELECT rate, burst, tokens, num_waiters FROM sys_user_limits WHERE scope = 'rl'")
        .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows["rows"][0]["rate"], "10/s", "{rows}");

    // Over five seconds: 1 at once, then one per 100 ms (50 ± 5 in all, with timing slack).
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(start.elapsed())).await;
    let mut seen_ticks = ticks(&sluice).await;
    let first = seen_ticks[0];
    let in_five = seen_ticks.iter().filter(|t| **t < first + 5_000).count();
    eprintln!(
        "10/s: {in_five} admissions in the first 5 s, at most {} in one second",
        densest(&seen_ticks, 1_000)
    );
    assert!(
        (45..=56).contains(&in_five),
        "{in_five} admissions in the first 5 s of a 10/s rule"
    );
    assert!(
        densest(&seen_ticks, 1_000) <= 12,
        "{} admissions inside one second under 10/s: {seen_ticks:?}",
        densest(&seen_ticks, 1_000)
    );

    // Removing the rate lets the rest through at once.
    let (status, removed) = sluice_tests::post_json(
        &format!("{}/limits/rules/bulk-delete", sluice.admin_url),
        json!([{"pattern": "rl"}]),
    )
    .await;
    assert_eq!(status, 200, "{removed}");
    ticks_until(&sluice, &mut seen_ticks, 100).await;
}

#[tokio::test]
async fn a_burst_goes_at_once_and_a_rate_survives_kill_9() {
    let (mut sluice, _dep) = flow_controlled().await;
    // Set through the CLI, shown by it and by SQL.
    let (ok, out) = cli(
        &sluice,
        "rules",
        &["set", "rb", "--rate", "2/s", "--burst", "5"],
    );
    assert!(ok, "{out}");
    let (ok, out) = cli(&sluice, "rules", &["list"]);
    assert!(ok && out.contains("2/s (burst 5)"), "{out}");
    let (ok, out) = cli(&sluice, "rules", &["set", "rb", "--rate", "2/week"]);
    assert!(!ok && out.contains("<count>/<unit>"), "{out}");
    assert_rb_stored(&sluice).await;

    // Ten sends: the five of the burst run at once, the rest one per 500 ms.
    send_ticks(&sluice, "rb", 10).await;
    let mut seen = Vec::new();
    ticks_until(&sluice, &mut seen, 10).await;
    let first = seen[0];
    let early = seen.iter().filter(|t| **t < first + 400).count();
    assert_eq!(early, 5, "the burst of 5 at once, then 2/s: {seen:?}");
    let spread = seen[9] - first;
    assert!(
        (2_000..4_000).contains(&spread),
        "five more at 2/s take about 2.5 s, took {spread} ms: {seen:?}"
    );

    // The rule is stored: after a kill -9 it limits again.
    sluice.kill_9();
    let again = sluice.restart(Sluice::builder()).await;
    assert_rb_stored(&again).await;
    // One call through to the deployment first (no tick is left to read: all ten were): the
    // ticks are the handler's clock, and on a busy box the first calls after a restart wait
    // for a new connection, so a burst admitted at once would reach the handler bunched with
    // the next admission.
    assert!(ticks(&again).await.is_empty(), "every tick was read");
    send_ticks(&again, "rb", 8).await;
    let mut after = Vec::new();
    ticks_until(&again, &mut after, 8).await;
    // After a restart the bucket starts full: at most the burst at once, never more.
    let early = after.iter().filter(|t| **t < after[0] + 400).count();
    assert!(
        early <= 5,
        "{early} ran at once after the restart: {after:?}"
    );
    assert!(
        after[7] - after[0] >= 1_000,
        "the rate held after the restart: {after:?}"
    );
}

/// POSTs a scoped send; answers the status, the `Retry-After` header and the body.
async fn send(sluice: &Sluice, path: &str, body: &str) -> (u16, Option<u64>, Value) {
    let mut req = reqwest::Client::new().post(format!("{}{path}", sluice.ingress_url));
    if !body.is_empty() {
        req = req
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (status, retry, resp.json().await.unwrap_or_default())
}

#[tokio::test]
async fn a_full_queue_and_a_rejecting_rate_answer_429_with_retry_after() {
    let (sluice, _dep) = flow_controlled().await;
    sluice
        .set_rules(json!([
            {"pattern": "mq", "limits": {"concurrency": 1, "max_queued": 5}},
            {"pattern": "rj", "limits": {"rate": "1/min", "on_exceed": "reject"}},
        ]))
        .await;

    // One runs for a while, five wait: the next is refused, and nothing of it is stored.
    let hold = "/service/scope/mq/send/Meter/hold";
    for _ in 0..6 {
        let (status, _, body) = send(&sluice, hold, "3000").await;
        assert_eq!(status, 202, "{body}");
    }
    let counter = scope_counter(&sluice, "mq").await;
    assert_eq!(
        (counter["queued"].as_u64(), counter["max_queued"].as_u64()),
        (Some(5), Some(5)),
        "{counter}"
    );
    let (status, retry, body) = send(&sluice, hold, "3000").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error_code"], "FLO0002", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("max_queued"),
        "{body}"
    );
    assert!(retry.is_some_and(|s| s >= 1), "Retry-After: {retry:?}");
    assert_eq!(
        sluice
            .count("SELECT count(*) AS n FROM sys_invocation WHERE scope = 'mq'")
            .await,
        6,
        "the refused one was not stored"
    );
    // Another scope is not affected.
    let (status, _, body) = send(&sluice, "/service/scope/other/send/Meter/hold", "1").await;
    assert_eq!(status, 202, "{body}");

    // A rejecting rate: the first goes in, the next is refused until the next token.
    let tick = "/service/scope/rj/send/Meter/tick";
    let (status, _, body) = send(&sluice, tick, "").await;
    assert_eq!(status, 202, "{body}");
    let (status, retry, body) = send(&sluice, tick, "").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error_code"], "FLO0002", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("1/min"),
        "{body}"
    );
    assert!(
        retry.is_some_and(|s| (50..=60).contains(&s)),
        "the next token is a minute away: Retry-After {retry:?}"
    );
    let (status, rules) = sluice
        .query("SELECT pattern, max_queued, on_exceed FROM sys_rules ORDER BY pattern")
        .await;
    assert_eq!(status, 200, "{rules}");
    assert_eq!(
        rules["rows"],
        json!([{"pattern": "mq", "max_queued": 5}, {"pattern": "rj", "on_exceed": "reject"}]),
        "{rules}"
    );
    let (_, listed) = sluice_tests::get_json(&format!("{}/limits/rules", sluice.admin_url)).await;
    assert_eq!(
        listed["rules"][1]["limits"],
        json!({"rate": "1/min", "burst": 1, "on_exceed": "reject"}),
        "{listed}"
    );
}
