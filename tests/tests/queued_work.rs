//! What happens to work while it waits in its queue, measured in the handler (`Meter/timed`
//! records when each call started and ended): why-waiting's position and ETA.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment, call_json};

async fn started() -> (Sluice, TestDeployment) {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    (sluice, dep)
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Sends `Meter/timed("<label> <millis>")` under `path_prefix` (e.g. `/service/scope/s`) and
/// answers its invocation id.
async fn send_timed(sluice: &Sluice, prefix: &str, label: &str, millis: u64) -> String {
    let sent: Value = reqwest::Client::new()
        .post(format!("{}{prefix}/send/Meter/timed", sluice.ingress_url))
        .json(&format!("{label} {millis}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    sent["invocationId"]
        .as_str()
        .unwrap_or_else(|| panic!("no id: {sent}"))
        .to_owned()
}

/// Waits until `Meter/timed` has recorded `n` calls; answers them (label, start, end).
async fn timings(sluice: &Sluice, n: usize) -> Vec<(String, u64, u64)> {
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while seen.len() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {n} calls ran: {seen:?}",
            seen.len()
        );
        let more: Vec<(String, u64, u64)> = call_json(sluice, "Meter/timings").await;
        if more.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        seen.extend(more);
    }
    seen
}

#[tokio::test]
async fn why_waiting_says_the_place_in_line_and_an_eta_the_handler_bears_out() {
    let (sluice, _dep) = started().await;
    sluice
        .set_rules(json!([{"pattern": "eta", "limits": {"concurrency": 1}}]))
        .await;
    const HOLD: u64 = 300;
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(send_timed(&sluice, "/service/scope/eta", &format!("c{i}"), HOLD).await);
    }
    // Once two have started, the queue has a drain rate: the last one gives its place and ETA.
    let last = ids.last().unwrap().clone();
    let seen = sluice
        .invocation_until(&last, "shown with an ETA", |seen| {
            seen["waiting"]["eta_ms"].is_u64()
        })
        .await;
    let asked_at = epoch_ms();
    let waiting = &seen["waiting"];
    let position = waiting["position"].as_u64().unwrap_or_else(|| panic!("{seen}"));
    let eta_ms = waiting["eta_ms"].as_u64().unwrap();
    assert!(waiting["eta"].is_string(), "{seen}");
    let rate = waiting["drain_per_second"].as_f64().unwrap();
    // One call per 300 ms at most: a little over 3 per second at best.
    assert!(rate > 1.0 && rate <= 1000.0 / HOLD as f64 + 0.5, "{seen}");
    assert!((1..=4).contains(&position), "{seen}");
    assert_eq!(waiting["queued"].as_u64(), Some(position), "the last is last: {seen}");
    // The queue's drain rate is in SQL too.
    let (status, rows) = sluice
        .query("SELECT drain_per_second FROM sys_vqueue_meta WHERE scope = 'eta'")
        .await;
    assert_eq!(status, 200, "{rows}");
    let sql_rate = rows["rows"][0]["drain_per_second"].as_f64();
    assert!(sql_rate.is_some_and(|r| r > 1.0), "{rows}");

    let ran = timings(&sluice, 6).await;
    let mut by_start = ran.clone();
    by_start.sort_by_key(|(_, start, _)| *start);
    let started_before: Vec<&(String, u64, u64)> =
        by_start.iter().filter(|(_, s, _)| *s < asked_at).collect();
    let (label, start, _) = by_start.last().unwrap();
    assert_eq!(label, "c5", "FIFO in one queue: {by_start:?}");
    // Its place: exactly `position` calls started from the moment it was asked, itself last.
    assert_eq!(
        6 - started_before.len(),
        position as usize,
        "position {position} at {asked_at}: {by_start:?}"
    );
    // The ETA against when the handler actually started it: within one hold either way.
    let predicted = asked_at + eta_ms;
    let error = start.abs_diff(predicted);
    assert!(
        error <= HOLD,
        "predicted {predicted} (ETA {eta_ms} ms), started {start}: off by {error} ms: {by_start:?}"
    );

    // The CLI says it on one line.
    let id = send_timed(&sluice, "/service/scope/eta", "d0", 2_000).await;
    let held = send_timed(&sluice, "/service/scope/eta", "d1", 10).await;
    sluice
        .invocation_until(&held, "waiting", |seen| seen["waiting"]["position"] == 1)
        .await;
    let (ok, out) = sluice_tests::cli(&sluice, "invocations", &["describe", &held]);
    assert!(ok, "{out}");
    assert!(
        out.contains("waiting:     blocked on limit-key-concurrency (rule 'eta'), position 1 of 1"),
        "{out}"
    );
    drop(id);
    timings(&sluice, 2).await;
}
