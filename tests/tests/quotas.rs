//! Long-window quotas end to end, measured in the handler (`Meter/timed` records what ran): a
//! key runs its quota's worth of new work in its window and holds the rest; another key has
//! its own; a rejecting quota answers 429 until its next window; what was used survives a
//! kill -9; `sluice rules reset-quota` lets the held work run.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{
    MIDDAY_MS, Sluice, TestDeployment, call_json, cli, clock_offset_to, refused_with_retry_after,
    sluice_at,
};

/// Sends `Meter/timed("<label> 10")` in scope `qt` under `key`; answers its invocation id.
async fn send(sluice: &Sluice, key: &str, label: &str) -> String {
    sluice
        .send(
            &format!("/service/scope/qt/send/Meter/timed?limit-key={key}"),
            &format!("{label} 10"),
        )
        .await
}

/// The labels `Meter/timed` ran since the last look, sorted.
async fn ran(sluice: &Sluice) -> Vec<String> {
    let runs: Vec<(String, u64, u64)> = call_json(sluice, "Meter/timings").await;
    let mut labels: Vec<String> = runs.into_iter().map(|(l, ..)| l).collect();
    labels.sort();
    labels
}

/// Waits until the handler ran `n` more calls; answers their labels, sorted.
async fn ran_until(sluice: &Sluice, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while seen.len() < n {
        assert!(Instant::now() < deadline, "only {seen:?} of {n} ran");
        seen.extend(ran(sluice).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen.sort();
    seen
}

/// Waits until invocation `id` says it waits for its quota.
async fn waits_for_quota(sluice: &Sluice, id: &str) -> Value {
    sluice
        .invocation_until(id, "a quota wait", |seen| {
            seen["waiting"]["blocked_on"] == "quota"
        })
        .await
}

#[tokio::test]
async fn a_quota_holds_new_work_until_its_window_or_a_reset_and_survives_kill_9() {
    // The server's day starts twelve hours before its clock: no window ends during the test,
    // whatever the hour it runs.
    let offset = clock_offset_to(MIDDAY_MS);
    let (mut sluice, _dep) = sluice_at(offset).await;
    sluice
        .set_rules(json!([
            {"pattern": "qt/*", "limits": {"quota": "3/day"}},
            {"pattern": "qr", "limits": {"quota": "2/day", "on_exceed": "reject"}},
        ]))
        .await;
    let _ = ran(&sluice).await;

    // Key `a` runs 3 of 5 today; the other 2 wait for the next window.
    let mut held = Vec::new();
    for i in 0..5 {
        let id = send(&sluice, "a", &format!("a{i}")).await;
        if i >= 3 {
            held.push(id);
        }
    }
    assert_eq!(ran_until(&sluice, 3).await, ["a0", "a1", "a2"]);
    let why = waits_for_quota(&sluice, &held[1]).await;
    assert_eq!(why["waiting"]["quota"], "3/day", "{why}");
    assert!(why["waiting"]["quota_resets_at"].is_string(), "{why}");
    // Key `b` has its own quota.
    send(&sluice, "b", "b0").await;
    assert_eq!(ran_until(&sluice, 1).await, ["b0"]);
    let used = sluice
        .count("SELECT count(*) AS n FROM sys_user_limits WHERE scope = 'qt' AND l1 = 'a' AND quota = '3/day' AND quota_used = 3")
        .await;
    assert_eq!(used, 1, "sys_user_limits shows a's use");

    // A rejecting quota: 429 with Retry-After until its next window.
    let client = reqwest::Client::new();
    let url = format!("{}/service/scope/qr/call/Meter/timed", sluice.ingress_url);
    for i in 0..2 {
        let resp = client
            .post(&url)
            .json(&format!("r{i} 10"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let refused = client.post(&url).json(&"r2 10").send().await.unwrap();
    let (retry, body) = refused_with_retry_after(refused).await;
    assert!((1..=86_400).contains(&retry), "retry after {retry} s");
    assert!(body.contains("FLO0002") && body.contains("quota"), "{body}");
    assert_eq!(ran_until(&sluice, 2).await, ["r0", "r1"]);

    // kill -9: what `a` used is stored with the admissions that used it.
    sluice.kill_9();
    let sluice = sluice
        .restart(Sluice::builder().clock_offset_ms(offset))
        .await;
    let after = send(&sluice, "a", "a5").await;
    waits_for_quota(&sluice, &after).await;
    waits_for_quota(&sluice, &held[0]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        ran(&sluice).await.is_empty(),
        "nothing of `a` ran after the restart"
    );
    let refused = client
        .post(format!(
            "{}/service/scope/qr/call/Meter/timed",
            sluice.ingress_url
        ))
        .json(&"r3 10")
        .send()
        .await
        .unwrap();
    assert_eq!(
        refused.status(),
        429,
        "the rejecting quota is still used up"
    );

    // An operator resets `qt/*`: a's held work runs, 3 of today's quota again.
    let (ok, out) = cli(&sluice, "rules", &["reset-quota", "qt/*"]);
    assert!(ok, "{out}");
    assert!(out.contains("reset at 2 counter(s)"), "{out}");
    assert_eq!(ran_until(&sluice, 3).await, ["a3", "a4", "a5"]);
    // They count: the next one waits again.
    let next = send(&sluice, "a", "a6").await;
    waits_for_quota(&sluice, &next).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        ran(&sluice).await.is_empty(),
        "a6 waits for the next window"
    );
}

#[tokio::test]
async fn work_held_by_a_daily_quota_runs_when_the_utc_day_turns() {
    // The server's clock starts 30 s before midnight UTC (a fixed day): long enough for the
    // set-up below on a busy box, short enough to wait for.
    let midnight = MIDDAY_MS + 12 * 3_600_000;
    let offset = clock_offset_to(midnight - 30_000);
    let (sluice, _dep) = sluice_at(offset).await;
    sluice
        .set_rules(json!([{"pattern": "qt/*", "limits": {"quota": "1/day"}}]))
        .await;
    let _ = ran(&sluice).await;

    send(&sluice, "d", "d0").await;
    assert_eq!(ran_until(&sluice, 1).await, ["d0"]);
    let held = send(&sluice, "d", "d1").await;
    let why = waits_for_quota(&sluice, &held).await;
    assert_eq!(
        why["waiting"]["quota_resets_at"], "2030-01-16T00:00:00Z",
        "{why}"
    );

    // No reset: the new day's window lets it run, and not before midnight by the server's clock.
    let deadline = Instant::now() + Duration::from_secs(60);
    let runs = loop {
        let runs: Vec<(String, u64, u64)> = call_json(&sluice, "Meter/timings").await;
        if !runs.is_empty() {
            break runs;
        }
        assert!(Instant::now() < deadline, "d1 did not run after midnight");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(runs.len(), 1, "{runs:?}");
    let (label, started, _) = &runs[0];
    assert_eq!(label, "d1");
    let started_on_server = i64::try_from(*started).unwrap() + offset;
    assert!(
        started_on_server >= midnight,
        "d1 started {} ms before midnight",
        midnight - started_on_server
    );
}

#[tokio::test]
async fn a_quota_use_shows_while_its_scope_is_idle() {
    let (sluice, _dep) = sluice_at(clock_offset_to(MIDDAY_MS)).await;
    sluice
        .set_rules(json!([{"pattern": "t", "limits": {"quota": "3/day", "on_exceed": "reject"}}]))
        .await;
    let client = reqwest::Client::new();
    let url = format!("{}/service/scope/t/call/Greeter/greet", sluice.ingress_url);
    for _ in 0..2 {
        let resp = client.post(&url).json(&"idle").send().await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    // Nothing runs or waits in `t` now; its counter may be gone, its count is not.
    let counter = sluice_tests::counter(&sluice, "t", "scope")
        .await
        .expect("/limits/counters shows scope t");
    assert_eq!(counter["usage"], 0, "{counter}");
    assert_eq!(counter["quota"], "3/day", "{counter}");
    assert_eq!(counter["quota_used"], 2, "{counter}");
    assert_eq!(
        counter["quota_resets_at"], "2030-01-16T00:00:00Z",
        "{counter}"
    );
    assert_eq!(
        sluice
            .count("SELECT count(*) AS n FROM sys_user_limits WHERE scope = 't' AND quota_used = 2")
            .await,
        1
    );
    // The count is the one admission reads: one more call, then a refusal.
    let third = client.post(&url).json(&"idle").send().await.unwrap();
    assert_eq!(third.status(), 200);
    let fourth = client.post(&url).json(&"idle").send().await.unwrap();
    assert_eq!(fourth.status(), 429);
}

#[tokio::test]
async fn a_scope_minting_quota_keys_fills_its_own_bound_and_another_scope_still_starts_keys() {
    // One partition, so both scopes share its idle counts; two per scope at most.
    let config = "[worker]\npartitions = 1\n[flow]\nmax-idle-quota-counters-per-scope = 2\n";
    let dep = TestDeployment::start("v1").await.unwrap();
    // Midday on the server's clock, so no window ends while the test runs.
    let sluice = Sluice::builder()
        .clock_offset_ms(clock_offset_to(MIDDAY_MS))
        .config(config)
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    sluice
        .set_rules(json!([
            {"pattern": "greedy/*", "limits": {"quota": "5/day"}},
            {"pattern": "quiet/*", "limits": {"quota": "5/day"}}
        ]))
        .await;
    let client = reqwest::Client::new();
    let call = |scope: &str, key: &str| {
        client
            .post(format!(
                "{}/service/scope/{scope}/call/Greeter/greet?limit-key={key}",
                sluice.ingress_url
            ))
            .json(&key)
            .send()
    };
    for key in ["k0", "k1"] {
        assert_eq!(call("greedy", key).await.unwrap().status(), 200, "{key}");
    }
    let idle = "SELECT count(*) AS n FROM sys_user_limits WHERE scope = 'greedy' AND l1 IS NOT NULL AND usage = 0 AND quota_used = 1";
    let deadline = Instant::now() + Duration::from_secs(20);
    while sluice.count(idle).await != 2 {
        assert!(Instant::now() < deadline, "the two keys never went idle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A third greedy key is refused by the scope's own bound, named in the answer.
    let (_, body) = refused_with_retry_after(call("greedy", "k2").await.unwrap()).await;
    assert!(
        body.contains("FLO0004") && body.contains("flow.max-idle-quota-counters-per-scope"),
        "{body}"
    );
    // The other scope on the same partition still starts fresh keys.
    for key in ["k0", "k1"] {
        assert_eq!(
            call("quiet", key).await.unwrap().status(),
            200,
            "quiet {key}"
        );
    }
}

#[tokio::test]
async fn fresh_quota_keys_are_refused_with_flo0004_while_idle_counts_are_at_their_bound() {
    // Three idle counts kept at most; the server's day has twelve hours left.
    let offset = clock_offset_to(MIDDAY_MS);
    let config = "[flow]\nmax-idle-quota-counters = 3\n";
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = Sluice::builder()
        .clock_offset_ms(offset)
        .config(config)
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    sluice
        .set_rules(json!([{"pattern": "qk/*", "limits": {"quota": "5/day"}}]))
        .await;
    let client = reqwest::Client::new();
    let call = |sluice: &Sluice, key: &str| {
        client
            .post(format!(
                "{}/service/scope/qk/call/Greeter/greet?limit-key={key}",
                sluice.ingress_url
            ))
            .json(&key)
            .send()
    };
    for key in ["k0", "k1", "k2"] {
        assert_eq!(call(&sluice, key).await.unwrap().status(), 200, "{key}");
    }
    // An answer may come before its counter lets go of the call: wait for three idle counts.
    let idle = "SELECT count(*) AS n FROM sys_user_limits WHERE scope = 'qk' AND l1 IS NOT NULL AND usage = 0 AND quota_used = 1";
    let deadline = Instant::now() + Duration::from_secs(20);
    while sluice.count(idle).await != 3 {
        assert!(Instant::now() < deadline, "the three keys never went idle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let assert_refused = |resp: reqwest::Response| async move {
        let (retry, body) = refused_with_retry_after(resp).await;
        assert!(
            (1..=12 * 3_600).contains(&retry),
            "until the first kept window ends, at the server's midnight: {retry} s"
        );
        assert!(
            body.contains("FLO0004") && body.contains("flow.max-idle-quota-counters"),
            "{body}"
        );
    };
    // A fourth key would be a fourth count to keep.
    assert_refused(call(&sluice, "k3").await.unwrap()).await;
    // A key already counting goes on; its count was not reset to make room.
    assert_eq!(call(&sluice, "k1").await.unwrap().status(), 200);
    assert_eq!(
        sluice
            .count("SELECT count(*) AS n FROM sys_user_limits WHERE scope = 'qk' AND l1 = 'k1' AND quota_used = 2")
            .await,
        1
    );
    // The counts are stored: after a kill -9 the bound still holds.
    sluice.kill_9();
    let sluice = sluice
        .restart(Sluice::builder().clock_offset_ms(offset).config(config))
        .await;
    assert_refused(call(&sluice, "k3").await.unwrap()).await;
    assert_eq!(call(&sluice, "k0").await.unwrap().status(), 200);
}
