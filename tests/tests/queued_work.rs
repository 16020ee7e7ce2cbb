//! What happens to work while it waits in its queue, measured in the handler (`Meter/timed`
//! records when each call started and ended): why-waiting's position and ETA; deadlines,
//! shedding, burstable keys; canceling what waits by filter.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment, burst_of, call_json, cli, peak_among, timings};

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
    sluice
        .send(
            &format!("{prefix}/send/Meter/timed"),
            &format!("{label} {millis}"),
        )
        .await
}

/// How long the calls a test sends may take to run, all of them.
const RUN_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

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
    let position = waiting["position"]
        .as_u64()
        .unwrap_or_else(|| panic!("{seen}"));
    let eta_ms = waiting["eta_ms"].as_u64().unwrap();
    assert!(waiting["eta"].is_string(), "{seen}");
    let rate = waiting["drain_per_second"].as_f64().unwrap();
    // One call per 300 ms at most: a little over 3 per second at best.
    assert!(rate > 1.0 && rate <= 1000.0 / HOLD as f64 + 0.5, "{seen}");
    assert!((1..=4).contains(&position), "{seen}");
    assert_eq!(
        waiting["queued"].as_u64(),
        Some(position),
        "the last is last: {seen}"
    );
    // The queue's drain rate is in SQL too.
    let (status, rows) = sluice
        .query("SELECT drain_per_second FROM sys_vqueue_meta WHERE scope = 'eta'")
        .await;
    assert_eq!(status, 200, "{rows}");
    let sql_rate = rows["rows"][0]["drain_per_second"].as_f64();
    assert!(sql_rate.is_some_and(|r| r > 1.0), "{rows}");

    let ran = timings(&sluice, 6, RUN_WITHIN).await;
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
    timings(&sluice, 2, RUN_WITHIN).await;
}

/// Calls `Meter/timed("<label> <millis>")` under `prefix` with extra headers; answers status
/// and body.
async fn call_timed(
    sluice: &Sluice,
    prefix: &str,
    label: &str,
    millis: u64,
    headers: &[(&str, String)],
) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(format!("{}{prefix}/call/Meter/timed", sluice.ingress_url))
        .json(&format!("{label} {millis}"));
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    let header = resp
        .headers()
        .get("x-service-error-code")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp.text().await.unwrap();
    if status == 504 {
        // A call dropped at its deadline carries its code where every refusal does.
        let code = serde_json::from_str::<Value>(&body).unwrap()["error_code"].clone();
        assert_eq!(
            (header.as_deref(), code.as_str()),
            (Some("FLO0003"), Some("FLO0003")),
            "{body}"
        );
    }
    (status, body)
}

#[tokio::test]
async fn work_past_its_deadline_is_dropped_never_started_and_the_earliest_deadline_goes_first() {
    let (sluice, _dep) = started().await;
    sluice
        .set_rules(json!([{"pattern": "dl", "limits": {"concurrency": 1, "max_wait": "600ms"}}]))
        .await;
    let listed: Value = reqwest::get(format!("{}/limits/rules", sluice.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["rules"][0]["limits"]["max_wait"], "600ms",
        "{listed}"
    );

    // One call holds the scope's slot for 2.5 s.
    let holder = send_timed(&sluice, "/service/scope/dl", "holder", 2_500).await;
    sluice
        .invocation_until(&holder, "running", |seen| seen["status"] == "running")
        .await;
    // The rule's max_wait: a call that cannot start within 600 ms answers 504 FLO0003.
    let asked = std::time::Instant::now();
    let (status, body) = call_timed(&sluice, "/service/scope/dl", "late-call", 10, &[]).await;
    let waited = asked.elapsed();
    assert_eq!(status, 504, "{body}");
    assert!(
        body.contains("FLO0003") && body.contains("max_wait of rule 'dl'"),
        "{body}"
    );
    assert!(
        waited >= std::time::Duration::from_millis(600),
        "answered after {waited:?}, before its max_wait"
    );
    // A send's invocation completes with it; its status says so.
    let sent = send_timed(&sluice, "/service/scope/dl", "late-send", 10).await;
    let seen = sluice
        .invocation_until(&sent, "dropped", |seen| seen["status"] == "completed")
        .await;
    assert!(
        seen["completion"]
            .as_str()
            .unwrap_or_default()
            .contains("FLO0003"),
        "{seen}"
    );
    let (_, status) = sluice_tests::get_json(&format!(
        "{}/restate/invocation/{sent}/status",
        sluice.ingress_url
    ))
    .await;
    assert!(
        status["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("FLO0003"),
        "{status}"
    );
    // The request's own deadline, as gRPC's relative timeout or an absolute time, when it
    // is earlier than the rule's.
    let (status, body) = call_timed(
        &sluice,
        "/service/scope/dl",
        "grpc",
        10,
        &[("grpc-timeout", "200m".to_owned())],
    )
    .await;
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("its request's deadline"), "{body}");
    let (status, body) = call_timed(
        &sluice,
        "/service/scope/dl",
        "absolute",
        10,
        &[("x-request-deadline", (epoch_ms() + 200).to_string())],
    )
    .await;
    assert_eq!(status, 504, "{body}");
    let (status, body) = call_timed(
        &sluice,
        "/service/scope/dl",
        "bad",
        10,
        &[("grpc-timeout", "soon".to_owned())],
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("RT0024") && body.contains("grpc-timeout"),
        "{body}"
    );

    // In the handler: only the holder ran; nothing past its deadline ever started.
    let ran = timings(&sluice, 1, RUN_WITHIN).await;
    assert_eq!(
        ran.iter().map(|(l, _, _)| l.as_str()).collect::<Vec<_>>(),
        vec!["holder"]
    );
    let metrics = sluice.metrics().await;
    let expired = |rule: &str, level: &str| {
        metrics
            .get(&format!(
                "sluice_flow_expired_total{{rule=\"{rule}\",level=\"{level}\"}}"
            ))
            .copied()
            .unwrap_or_default()
    };
    assert_eq!(expired("dl", "scope"), 2.0, "{metrics:?}");
    assert_eq!(expired("request", "request"), 2.0, "{metrics:?}");

    // Earliest deadline first among one queue's waiting calls: with the slot held, three
    // sends with deadlines 20 s, none and 10 s start 10 s, 20 s, none.
    sluice
        .set_rules(json!([{"pattern": "edf", "limits": {"concurrency": 1}}]))
        .await;
    let holder = send_timed(&sluice, "/service/scope/edf", "edf-holder", 2_000).await;
    sluice
        .invocation_until(&holder, "running", |seen| seen["status"] == "running")
        .await;
    for (label, timeout) in [
        ("in-20s", Some("20S")),
        ("none", None),
        ("in-10s", Some("10S")),
    ] {
        let mut request = reqwest::Client::new()
            .post(format!(
                "{}/service/scope/edf/send/Meter/timed",
                sluice.ingress_url
            ))
            .json(&format!("{label} 10"));
        if let Some(t) = timeout {
            request = request.header("grpc-timeout", t);
        }
        assert_eq!(request.send().await.unwrap().status(), 202);
    }
    let mut ran = timings(&sluice, 4, RUN_WITHIN).await;
    ran.sort_by_key(|(_, start, _)| *start);
    let order: Vec<&str> = ran.iter().map(|(l, _, _)| l.as_str()).collect();
    assert_eq!(order, vec!["edf-holder", "in-10s", "in-20s", "none"]);
}

/// Shedding by priority: near `worker.max-held-invocations`, new work is refused lowest
/// priority first (429 FLO0001 with Retry-After) while higher priorities still get in, and
/// everything accepted runs (measured in the handler's marks).
#[tokio::test]
async fn near_the_held_bound_low_priority_is_shed_first_and_nothing_accepted_is_lost() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .config("[worker]\nmax-held-invocations = 20\n[flow]\nshed-from = 0.5\n")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let client = reqwest::Client::new();
    // Delayed 2 s, so each is held until then.
    let send = |label: String, priority: &'static str| {
        client
            .post(format!(
                "{}/service/scope/shed/send/Meter/mark?delay=2s&priority={priority}",
                sluice.ingress_url
            ))
            .json(&label)
            .send()
    };
    let mut low = 0;
    loop {
        let resp = send(format!("low-{low}"), "low").await.unwrap();
        if resp.status() == 429 {
            assert_eq!(resp.headers()["retry-after"], "1");
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["error_code"], "FLO0001", "{body}");
            assert!(
                body["message"].as_str().unwrap().contains("flow.shed-from"),
                "{body}"
            );
            break;
        }
        assert_eq!(resp.status(), 202);
        low += 1;
        assert!(low <= 20, "low priority was never shed");
    }
    // 20 × (0.5 + 0.5 × 1/10) = 11 for priority 0.
    assert_eq!(low, 11);
    let mut high = 0;
    loop {
        let resp = send(format!("high-{high}"), "high").await.unwrap();
        if resp.status() == 429 {
            let body: Value = resp.json().await.unwrap();
            assert!(
                body["message"]
                    .as_str()
                    .unwrap()
                    .contains("max-held-invocations allows"),
                "high priority is refused only at the bound: {body}"
            );
            break;
        }
        assert_eq!(resp.status(), 202);
        high += 1;
        assert!(high <= 20, "the bound never held");
    }
    assert_eq!(high, 9, "high priority got in up to the bound");
    // Everything accepted ran once. (Until the delays end, the node is at its bound, so even
    // asking for the marks is refused.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut marks: Vec<String> = Vec::new();
    while marks.len() < 20 {
        assert!(std::time::Instant::now() < deadline, "only {marks:?} ran");
        let resp = client
            .post(format!("{}/service/call/Meter/marks", sluice.ingress_url))
            .send()
            .await
            .unwrap();
        if resp.status() == 200 {
            marks.extend(resp.json::<Vec<String>>().await.unwrap());
        } else {
            assert_eq!(resp.status(), 429);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    marks.sort();
    marks.dedup();
    assert_eq!(marks.len(), 20, "{marks:?}");
    assert_eq!(marks.iter().filter(|m| m.starts_with("low-")).count(), 11);
}

/// Sends `Meter/timed("<label> <millis>")` in scope `bu` under limit key `key`.
async fn send_keyed(sluice: &Sluice, key: &str, label: &str, millis: u64) {
    send_keyed_at(sluice, key, label, millis, "normal").await;
}

/// [`send_keyed`] at `priority` (each priority of a key is a queue of its own).
async fn send_keyed_at(sluice: &Sluice, key: &str, label: &str, millis: u64, priority: &str) {
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/service/scope/bu/send/Meter/timed?limit-key={key}",
            sluice.ingress_url
        ))
        .header("x-service-priority", priority)
        .json(&format!("{label} {millis}"))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
}

#[tokio::test]
async fn a_burstable_key_borrows_idle_slots_and_gives_them_back_first() {
    let (sluice, _dep) = started().await;
    sluice
        .set_rules(json!([
            {"pattern": "bu", "limits": {"concurrency": 4}},
            {"pattern": "bu/*", "limits": {"concurrency": {"min": 2, "max": 4}}},
        ]))
        .await;
    let _ = call_json::<Value>(&sluice, "Meter/timings").await;
    // Alone, key `a` borrows the idle half of the scope: 4 at once, never more.
    for i in 0..6 {
        send_keyed(&sluice, "a", &format!("solo{i}"), 400).await;
    }
    let solo = timings(&sluice, 6, RUN_WITHIN).await;
    assert_eq!(
        peak_among(&solo, "solo"),
        4,
        "borrowed up to its max: {solo:?}"
    );

    // `a` holds all 4 slots with more waiting; then `b` (within its guarantee) arrives with two
    // calls, each in a queue of its own (two priorities). The first four of `a` hold their
    // slots for 3 s, so both are there before any slot comes back however slow the box is.
    // (The promise is per waiting queue: two calls in one queue wait as one waiter, so when
    // two slots come back in the same moment the second may go to `a`; docs/flow-control.md.)
    for i in 0..10 {
        let hold = if i < 4 { 3_000 } else { 300 };
        send_keyed(&sluice, "a", &format!("a{i}"), hold).await;
    }
    // Until `a` runs 4: 2 guaranteed, 2 borrowed (the counter says so).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while sluice
        .count("SELECT count(*) AS n FROM sys_user_limits WHERE scope = 'bu' AND l1 = 'a' AND usage = 4 AND guaranteed = 2 AND borrowed = 2")
        .await
        == 0
    {
        assert!(std::time::Instant::now() < until, "a never ran 4 at once");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let b_sent = epoch_ms();
    tokio::join!(
        send_keyed_at(&sluice, "b", "b0", 500, "normal"),
        send_keyed_at(&sluice, "b", "b1", 500, "high")
    );
    let b_arrived = epoch_ms();
    let all = timings(&sluice, 12, RUN_WITHIN).await;
    let start_of = |label: &str| all.iter().find(|(l, ..)| l == label).unwrap().1;
    let b_started = start_of("b0").max(start_of("b1"));
    let first_back = all
        .iter()
        .filter(|(l, ..)| ["a0", "a1", "a2", "a3"].contains(&l.as_str()))
        .map(|(.., end)| *end)
        .min()
        .unwrap();
    assert!(
        b_arrived < first_back,
        "the test needs b there before a slot comes back ({b_arrived} vs {first_back})"
    );
    // Measured in the handler: no `a` call started on a borrowed slot between b's arrival and
    // both of b's starts; the slots `a` had borrowed went to `b` as they came back. An `a` call
    // borrowed when two other `a` calls were still running at its start (its guarantee is 2):
    // those calls ended in the handler after it started, so Sluice still counted them when it
    // admitted it. When three of a0..a3 end in one moment, `a` is back within its guarantee and
    // its next call starts beside b's two, in any order the box happens to run them.
    let others_running = |label: &str, at: u64| {
        all.iter()
            .filter(|(l, s, e)| l.starts_with('a') && l != label && *s <= at && at < *e)
            .count()
    };
    let overtaking: Vec<_> = all
        .iter()
        .filter(|(l, s, _)| l.starts_with('a') && *s >= b_sent && *s < b_started)
        .filter(|(l, s, _)| others_running(l, *s) >= 2)
        .collect();
    assert!(
        overtaking.is_empty(),
        "a borrower overtook b: {overtaking:?} (b at {b_started}; all {all:?})"
    );
    assert!(
        peak_among(&all, "") <= 4,
        "the scope's bound holds: {all:?}"
    );
}

/// Sends `count` calls of `Meter/timed` under scope `bc` and limit key `key` (`extra`: more of
/// the query string, such as a delay).
async fn send_bc(sluice: &Sluice, key: &str, count: usize, extra: &str) {
    let client = reqwest::Client::new();
    for n in 0..count {
        let resp = client
            .post(format!(
                "{}/service/scope/bc/send/Meter/timed?limit-key={key}{extra}",
                sluice.ingress_url
            ))
            .json(&format!("{key}-{n} 10"))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
    }
}

/// `POST /invocations/bulk-cancel` with `body`: status and answer.
async fn bulk_cancel(sluice: &Sluice, body: Value) -> (u16, Value) {
    let resp = sluice
        .admin(reqwest::Method::POST, "/invocations/bulk-cancel")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

/// How many invocations under key `key` of scope `bc` are in `status` (`canceled`: completed
/// by a bulk cancel).
async fn bc_count(sluice: &Sluice, key: &str, status: &str) -> u64 {
    let status = match status {
        "canceled" => "status = 'completed' AND completion_result LIKE '%FLO0006%'".to_owned(),
        other => format!("status = '{other}'"),
    };
    sluice
        .count(&format!(
            "SELECT count(*) AS n FROM sys_invocation WHERE scope = 'bc' AND limit_key = '{key}' AND {status}"
        ))
        .await
}

#[tokio::test]
async fn a_bulk_cancel_counts_then_cancels_what_waits_by_filter_through_a_kill_9_and_is_recorded() {
    let dep = TestDeployment::start("v1").await.unwrap();
    // Two invocations a partition command: the cancel takes many commands, and the kill -9
    // below lands among them. A durable sleep suspends after 300 ms.
    let builder = || {
        Sluice::builder()
            .env("SERVICE_WORKER__BULK_CANCEL_BATCH", "2")
            .env("SERVICE_WORKER__INVOKER__INACTIVITY_TIMEOUT", "300ms")
    };
    let mut sluice = builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    sluice
        .set_rules(json!([{"pattern": "bc", "limits": {"concurrency": 1}}]))
        .await;
    // One call holds the scope's slot; 300 `gold` and 10 `free` wait behind it, 5 `later`
    // are delayed by ten minutes, and one call of another scope sleeps durably.
    let holder = send_timed(&sluice, "/service/scope/bc", "holder", 600_000).await;
    sluice
        .invocation_until(&holder, "running", |seen| seen["status"] == "running")
        .await;
    const GOLD: u64 = 300;
    send_bc(&sluice, "gold", GOLD as usize, "").await;
    send_bc(&sluice, "free", 10, "").await;
    send_bc(&sluice, "later", 5, "&delay=10m").await;
    let sleeper = sluice
        .send("/service/scope/bcs/send/Greeter/slow", &600_000u64)
        .await;
    sluice
        .invocation_until(&sleeper, "suspended", |seen| seen["status"] == "suspended")
        .await;

    // A filter without scope or service is refused; a dry run counts and keeps no record.
    let (status, body) = bulk_cancel(&sluice, json!({"handler": "timed"})).await;
    assert_eq!(
        (status, body["restate_code"].as_str()),
        (422, Some("ADM0001")),
        "{body}"
    );
    let (status, body) = bulk_cancel(
        &sluice,
        json!({"scope": "bc", "limit_key": "gold", "dry_run": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["named"].as_u64(), body["cancelled"].as_u64()),
        (Some(GOLD), Some(0)),
        "{body}"
    );
    assert!(body.get("id").is_none(), "{body}");
    let (status, body) = bulk_cancel(
        &sluice,
        json!({"scope": "bc", "statuses": ["scheduled"], "dry_run": true}),
    )
    .await;
    assert_eq!((status, body["named"].as_u64()), (200, Some(5)), "{body}");
    assert_eq!(
        sluice
            .count("SELECT count(*) AS n FROM sys_bulk_cancels")
            .await,
        0
    );
    assert_eq!(bc_count(&sluice, "gold", "pending").await, GOLD);

    // The real one, killed -9 once it has canceled some.
    let asked = {
        let request = sluice
            .admin(reqwest::Method::POST, "/invocations/bulk-cancel")
            .json(&json!({"scope": "bc", "limit_key": "gold"}));
        tokio::spawn(async move { request.send().await.map(|r| r.status().as_u16()) })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while bc_count(&sluice, "gold", "canceled").await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the bulk cancel canceled nothing"
        );
    }
    sluice.kill_9();
    let answered = asked.await.unwrap();
    let sluice = sluice.restart(builder()).await;

    // What it canceled stays canceled, the rest still waits, and its record says how it ended.
    let canceled = bc_count(&sluice, "gold", "canceled").await;
    let waiting = bc_count(&sluice, "gold", "pending").await;
    assert!(canceled >= 1, "{canceled}");
    assert_eq!(
        canceled + waiting,
        GOLD,
        "{canceled} canceled, {waiting} waiting"
    );
    let (_, record) = sluice
        .query("SELECT state, named, cancelled, filter FROM sys_bulk_cancels")
        .await;
    let first = &record["rows"][0];
    let expected = if matches!(answered, Ok(200)) {
        "done"
    } else {
        "interrupted"
    };
    assert_eq!(first["state"], expected, "answered {answered:?}: {record}");
    assert!(
        first["filter"]
            .as_str()
            .unwrap_or_default()
            .contains("\"limit_key\":\"gold\""),
        "{record}"
    );
    println!("killed with {canceled} of {GOLD} canceled ({expected})");

    // The same filter again (through the CLI) cancels the rest.
    let (ok, out) = cli(
        &sluice,
        "invocations",
        &["bulk-cancel", "--scope", "bc", "--limit-key", "gold"],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("canceled {waiting} of {waiting} named")),
        "{out}"
    );
    assert_eq!(bc_count(&sluice, "gold", "canceled").await, GOLD);
    assert_eq!(bc_count(&sluice, "free", "pending").await, 10);

    // A canceled call's outcome is readable: 409 FLO0006, never run.
    let (_, rows) = sluice
        .query("SELECT id, attempts FROM sys_invocation WHERE limit_key = 'gold' LIMIT 1")
        .await;
    let gold = rows["rows"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(rows["rows"][0]["attempts"], 0, "{rows}");
    let (_, status) = sluice_tests::get_json(&format!(
        "{}/restate/invocation/{gold}/status",
        sluice.ingress_url
    ))
    .await;
    let message = status["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("FLO0006"), "{status}");

    // Delayed sends by status, and a suspended call, which gets the cancel signal and ends 409.
    let (status, body) =
        bulk_cancel(&sluice, json!({"scope": "bc", "statuses": ["scheduled"]})).await;
    assert_eq!(
        (status, body["cancelled"].as_u64()),
        (200, Some(5)),
        "{body}"
    );
    assert_eq!(bc_count(&sluice, "later", "canceled").await, 5);
    let seen = sluice
        .invocation_until(&sleeper, "suspended after the restart", |seen| {
            seen["status"] == "suspended"
        })
        .await;
    println!("the sleeper after the restart: {seen}");
    let (status, body) = bulk_cancel(
        &sluice,
        json!({"scope": "bcs", "service": "Greeter", "handler": "slow", "statuses": ["suspended"]}),
    )
    .await;
    assert_eq!(
        (status, body["cancelled"].as_u64()),
        (200, Some(1)),
        "{body}"
    );
    let seen = sluice
        .invocation_until(&sleeper, "canceled", |seen| seen["status"] == "completed")
        .await;
    assert!(
        seen["completion"]
            .as_str()
            .unwrap_or_default()
            .contains("409"),
        "{seen}"
    );

    // Every real one is recorded; the untouched key still runs once there is room.
    let (_, records) = sluice
        .query("SELECT state, cancelled FROM sys_bulk_cancels ORDER BY id")
        .await;
    let states: Vec<(String, u64)> = records["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["state"].as_str().unwrap().to_owned(),
                r["cancelled"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(states.len(), 4, "{records}");
    assert_eq!(
        states[1..].to_vec(),
        vec![
            ("done".to_owned(), waiting),
            ("done".to_owned(), 5),
            ("done".to_owned(), 1)
        ],
        "{records}"
    );
    sluice
        .set_rules(json!([{"pattern": "bc", "limits": {"concurrency": 20}}]))
        .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while sluice
        .count("SELECT count(*) AS n FROM sys_invocation WHERE limit_key = 'free' AND completion_result = 'value'")
        .await
        < 10
    {
        assert!(std::time::Instant::now() < deadline, "the free calls never ran");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Sends `Meter/timed("<label> <millis>")` under scope `bb` and limit key `key`.
async fn send_bb(sluice: &Sluice, key: &str, label: &str, millis: u64) {
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/service/scope/bb/send/Meter/timed?limit-key={key}",
            sluice.ingress_url
        ))
        .json(&format!("{label} {millis}"))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
}

/// Sends `n` calls of 600 ms each, half under key `a` and half under `c`, labelled
/// `<phase><key><i>`, and answers their timings once all ran.
async fn burst_phase(sluice: &Sluice, phase: &str, n: usize) -> Vec<(String, u64, u64)> {
    for i in 0..n {
        let key = if i % 2 == 0 { "a" } else { "c" };
        send_bb(sluice, key, &format!("{phase}{key}{i}"), 600).await;
    }
    timings(sluice, n, RUN_WITHIN).await
}

#[tokio::test]
async fn a_burst_budget_runs_above_the_limit_until_its_time_is_spent_through_a_kill_9() {
    // The server's day starts twelve hours before its clock: no window ends during the test.
    let offset = sluice_tests::clock_offset_to(sluice_tests::MIDDAY_MS);
    let builder = || Sluice::builder().clock_offset_ms(offset);
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    // The scope runs 2, or 4 while 2 s above 2 are left today; each key at most 3 throughout.
    let (status, body) = sluice
        .put_rules(json!([
            {"pattern": "bb", "limits": {"concurrency": 2, "burst_budget": "2x 2s/day"}},
            {"pattern": "bb/*", "limits": {"concurrency": 3}},
        ]))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = sluice
        .put_rules(json!([{"pattern": "bz", "limits": {"burst_budget": "2x 2s/day"}}]))
        .await;
    assert_eq!(
        (status, body["restate_code"].as_str()),
        (422, Some("RUL0001")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("fixed concurrency"),
        "{body}"
    );
    let _ = call_json::<Value>(&sluice, "Meter/timings").await;

    // Bursting: 4 at once, each key at most 3; the time above 2 is counted.
    let first = burst_phase(&sluice, "p1", 8).await;
    assert_eq!(peak_among(&first, "p1"), 4, "twice the limit: {first:?}");
    assert!(
        peak_among(&first, "p1a") <= 3 && peak_among(&first, "p1c") <= 3,
        "{first:?}"
    );
    let (spent, left) = burst_of(&sluice, "bb").await;
    assert_eq!(spent + left, 2_000);
    assert!(spent >= 300, "{spent} ms above 2");

    // Kept through a kill -9: the scope's row shows the same spend while it is idle.
    sluice.kill_9();
    let sluice = sluice.restart(builder()).await;
    assert_eq!(
        burst_of(&sluice, "bb").await,
        (spent, left),
        "after the restart"
    );
    let (status, rules) = sluice
        .query("SELECT burst_budget FROM sys_rules WHERE pattern = 'bb'")
        .await;
    assert_eq!(
        (status, rules["rows"][0]["burst_budget"].as_str()),
        (200, Some("2x 2s/day")),
        "{rules}"
    );

    // Spend the rest, then the limit is 2 again for the day.
    let mut phase = 2;
    while burst_of(&sluice, "bb").await.1 > 0 {
        assert!(
            phase < 10,
            "the budget never ran out: {:?}",
            burst_of(&sluice, "bb").await
        );
        burst_phase(&sluice, &format!("p{phase}"), 8).await;
        phase += 1;
    }
    assert_eq!(burst_of(&sluice, "bb").await, (2_000, 0));
    let spent_out = burst_phase(&sluice, "q", 6).await;
    assert_eq!(
        peak_among(&spent_out, "q"),
        2,
        "back to the limit: {spent_out:?}"
    );

    // An operator starts the day's budget again.
    let (ok, out) = cli(&sluice, "rules", &["reset-burst", "bb"]);
    assert!(
        ok && out.contains("burst of 'bb' reset at 1 counter(s)"),
        "{out}"
    );
    let again = burst_phase(&sluice, "r", 8).await;
    assert_eq!(peak_among(&again, "r"), 4, "bursting again: {again:?}");
    let (spent, left) = burst_of(&sluice, "bb").await;
    assert!(
        spent + left == 2_000 && left > 0,
        "{spent} spent, {left} left"
    );
}
