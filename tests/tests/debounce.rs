//! A rule's `debounce`: calls of one target at one key within the wait make one delayed run.
//! Trailing (`last`) runs the newest and answers each earlier call 409 `FLO0009` naming the
//! next; leading (`first`) runs the first and answers each later one at once; `max` bounds how
//! far a busy key's run is pushed. A kill -9 between two calls of a burst changes nothing.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment, call_json, cli};

/// Sends `Meter/timed("<label> 10")` to `scope`, limit key `key`: its id.
async fn send(sluice: &Sluice, scope: &str, key: &str, label: &str) -> String {
    sluice
        .send(
            &format!("/service/scope/{scope}/send/Meter/timed?limit-key={key}"),
            &format!("{label} 10"),
        )
        .await
}

/// Sends `Meter/timed("<label> 10")` to `scope`, limit key `key` with `idempotency-key: once`:
/// its id.
async fn send_once(sluice: &Sluice, scope: &str, key: &str, label: &str) -> String {
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/service/scope/{scope}/send/Meter/timed?limit-key={key}",
            sluice.ingress_url
        ))
        .header("idempotency-key", "once")
        .json(&format!("{label} 10"))
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    body["invocationId"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"))
        .to_owned()
}

/// Waits until invocation `id` completed: its `completion_result`.
async fn outcome(sluice: &Sluice, id: &str) -> String {
    sluice
        .invocation_until(id, "completed", |seen| seen["status"] == "completed")
        .await;
    let (_, rows) = sluice
        .query(&format!(
            "SELECT completion_result FROM sys_invocation WHERE id = '{id}'"
        ))
        .await;
    rows["rows"][0]["completion_result"]
        .as_str()
        .unwrap_or_else(|| panic!("{id}: {rows}"))
        .to_owned()
}

/// Every label `Meter/timed` recorded, gathered until `done` holds of them (at most 30 s).
async fn ran_until(sluice: &Sluice, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(&seen) {
        assert!(Instant::now() < deadline, "only {seen:?} ran");
        let more: Vec<(String, u64, u64)> = call_json(sluice, "Meter/timings").await;
        if more.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen.extend(more.into_iter().map(|(label, _, _)| label));
    }
    seen
}

#[tokio::test]
async fn debounced_calls_make_one_run_per_burst_with_coded_outcomes_through_a_kill_9() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    // The wait outlasts a restart: the burst is still open when the process is back.
    let (status, body) = sluice
        .put_rules(json!([
            {"pattern": "dl/*", "limits": {"debounce": "5s"}},
            {"pattern": "df/*", "limits": {"debounce": "300ms first"}},
            {"pattern": "dm/*", "limits": {"debounce": "1s last max 2s"}},
        ]))
        .await;
    assert_eq!(status, 200, "{body}");
    for (debounce, mode, says) in [
        ("2s", "shadow", "mode = enforce"),
        ("2s max 1s", "enforce", "max is at least the wait"),
        ("soon", "enforce", "not a duration"),
    ] {
        let (status, body) = sluice
            .put_rules(json!([{"pattern": "dz", "limits": {"debounce": debounce}, "mode": mode}]))
            .await;
        assert_eq!(
            (status, body["restate_code"].as_str()),
            (422, Some("RUL0001")),
            "{body}"
        );
        assert!(body["message"].as_str().unwrap().contains(says), "{body}");
    }
    let (ok, out) = cli(
        &sluice,
        "rules",
        &["set", "dc/*", "--unlimited", "--debounce", "2s last"],
    );
    assert!(ok, "{out}");
    let (_, rules) = sluice
        .query("SELECT pattern, debounce FROM sys_rules ORDER BY pattern")
        .await;
    let shown: Vec<(&str, &str)> = rules["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["pattern"].as_str().unwrap(),
                r["debounce"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            ("dc/*", "2s"),
            ("df/*", "300ms first"),
            ("dl/*", "5s"),
            ("dm/*", "1s max 2s")
        ]
    );

    // Trailing: the newest runs; each earlier call is answered naming the next, even across
    // a kill -9 between two calls of the burst.
    let l1 = send(&sluice, "dl", "k", "l1").await;
    let described = sluice.describe(&l1).await.1;
    assert_eq!(described["status"], "scheduled", "{described}");
    sluice.kill_9();
    sluice = sluice.restart(Sluice::builder()).await;
    let l2 = send(&sluice, "dl", "k", "l2").await;
    let other = send(&sluice, "dl", "other", "l-other").await;
    // A caller of the burst's run waits on the connection; a newer call answers it.
    let waiting = {
        let url = format!(
            "{}/service/scope/dl/call/Meter/timed?limit-key=k",
            sluice.ingress_url
        );
        tokio::spawn(async move {
            let resp = reqwest::Client::new()
                .post(url)
                .json(&json!("l3 10"))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or_default())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let l3 = loop {
        let (_, rows) = sluice
            .query("SELECT id FROM sys_invocation WHERE scope = 'dl' AND limit_key = 'k' AND status = 'scheduled'")
            .await;
        let id = rows["rows"][0]["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if !id.is_empty() && id != l2 {
            break id;
        }
        assert!(
            Instant::now() < deadline,
            "the call never joined the burst: {rows}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let l4 = send(&sluice, "dl", "k", "l4").await;
    for (id, next) in [(&l1, &l2), (&l2, &l3), (&l3, &l4)] {
        let failure = outcome(&sluice, id).await;
        assert!(
            failure.starts_with("failure 409: [FLO0009]") && failure.contains(next.as_str()),
            "{id} names {next}: {failure}"
        );
    }
    let (status, body) = waiting.await.unwrap();
    assert_eq!(
        (status, body["error_code"].as_str()),
        (409, Some("FLO0009")),
        "the waiting caller is answered: {body}"
    );
    assert_eq!(outcome(&sluice, &l4).await, "value");
    assert_eq!(
        outcome(&sluice, &other).await,
        "value",
        "each key its own burst"
    );
    let seen = ran_until(&sluice, |seen| seen.iter().any(|l| l == "l4")).await;
    assert!(
        !seen
            .iter()
            .any(|l| ["l1", "l2", "l3"].contains(&l.as_str())),
        "only the newest ran: {seen:?}"
    );

    // Leading: the first runs; the later ones are answered at once, naming it; an idempotent
    // repeat reads the same.
    let f1 = send(&sluice, "df", "k", "f1").await;
    let mut later = Vec::new();
    later.push(send(&sluice, "df", "k", "f2").await);
    later.push(send_once(&sluice, "df", "k", "f3").await);
    for id in &later {
        let failure = outcome(&sluice, id).await;
        assert!(
            failure.starts_with("failure 409: [FLO0009]") && failure.contains(&f1),
            "{failure}"
        );
    }
    assert_eq!(
        send_once(&sluice, "df", "k", "f3").await,
        later[1],
        "an idempotent repeat is the same invocation"
    );
    assert!(outcome(&sluice, &later[1]).await.contains("FLO0009"));
    assert_eq!(outcome(&sluice, &f1).await, "value");
    let seen = ran_until(&sluice, |seen| seen.iter().any(|l| l == "f1")).await;
    assert!(!seen.iter().any(|l| l == "f2" || l == "f3"), "{seen:?}");

    // max: a key called every 100 ms for 3 s runs at least every 2 s, not once at the end.
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < Duration::from_secs(3) {
        send(&sluice, "dm", "k", &format!("m{sent}")).await;
        sent += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let runs = |seen: &[String]| seen.iter().filter(|l| l.starts_with('m')).count();
    let seen = ran_until(&sluice, |seen| runs(seen) >= 2).await;
    assert!(
        runs(&seen) < sent,
        "{} runs of {sent} calls: {seen:?}",
        runs(&seen)
    );
}
