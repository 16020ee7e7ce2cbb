//! Adaptive concurrency end to end: a rule with `adaptive = { min, max }` against a handler
//! whose latency grows with its concurrency past 8 (`Meter/loaded`). The limit settles near 8
//! and the handler never sees many more at once; when the handler stops slowing down under
//! load, the limit rises again. A static `concurrency` on the rule wins.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_tests::{Sluice, TestDeployment, call_json, counter};

/// Held by each test of this file for its whole run: each measures how latency moves its
/// limit, so one's forty clients must not be the other's latency (they share the box's cores).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The `ad` scope counter's limit now, and whether it adapts.
async fn limit(sluice: &Sluice) -> Option<(u64, bool)> {
    let c = counter(sluice, "ad", "scope").await?;
    Some((c["limit"].as_u64()?, c["adaptive"].is_object()))
}

/// Makes `Meter/loaded` slow down past `knee` calls at once (0: never).
async fn set_knee(sluice: &Sluice, knee: u64) {
    let resp = reqwest::Client::new()
        .post(format!("{}/service/call/Meter/knee", sluice.ingress_url))
        .json(&knee)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// The server with the test deployment, scope `ad` adaptive between 1 and 64, and
/// `Meter/loaded`'s knee at `knee`.
async fn adaptive_at_knee(knee: u64) -> (Sluice, TestDeployment) {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    sluice
        .set_rules(json!([{"pattern": "ad", "limits": {"adaptive": {"min": 1, "max": 64}}}]))
        .await;
    set_knee(&sluice, knee).await;
    (sluice, dep)
}

/// Keeps `clients` calls of `Meter/loaded(100)` in flight in scope `ad` until `stop`.
fn load(
    sluice: &Sluice,
    clients: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<u64>> {
    looping(sluice, "Meter/loaded", json!(100), clients, stop)
}

/// Keeps `clients` calls of `handler` (with `body`) looping in scope `ad` until `stop`;
/// each answers how many calls it made.
fn looping(
    sluice: &Sluice,
    handler: &str,
    body: serde_json::Value,
    clients: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<u64>> {
    (0..clients)
        .map(|_| {
            let url = format!("{}/service/scope/ad/call/{handler}", sluice.ingress_url);
            let (stop, body) = (Arc::clone(stop), body.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut done = 0;
                while !stop.load(Ordering::SeqCst) {
                    let resp = client.post(&url).json(&body).send().await.unwrap();
                    assert_eq!(resp.status(), 200);
                    done += 1;
                }
                done
            })
        })
        .collect()
}

/// Samples the limit every 200 ms for `how_long`.
async fn sample(sluice: &Sluice, how_long: Duration) -> Vec<u64> {
    let mut seen = Vec::new();
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        if let Some((l, adaptive)) = limit(sluice).await {
            assert!(adaptive, "the counter adapts");
            seen.push(l);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    seen
}

#[tokio::test]
async fn an_adaptive_limit_settles_where_latency_grows_and_rises_when_it_stops() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (sluice, _dep) = adaptive_at_knee(8).await;

    let stop = Arc::new(AtomicBool::new(false));
    let clients = load(&sluice, 40, &stop);
    // It climbs from 1, overshoots the knee, and comes back.
    sample(&sluice, Duration::from_secs(5)).await;
    let _: u64 = call_json(&sluice, "Meter/peak").await;
    let settled = sample(&sluice, Duration::from_secs(4)).await;
    let peak: u64 = call_json(&sluice, "Meter/peak").await;
    let mean = settled.iter().sum::<u64>() as f64 / settled.len() as f64;
    println!("settled: {settled:?} (mean {mean:.1}), handler peak {peak}");
    assert!(
        (5.0..=13.0).contains(&mean),
        "the limit settles near 8, not at 64: {settled:?}"
    );
    assert!(
        peak <= 16,
        "the handler saw {peak} at once while the limit settled ({settled:?})"
    );
    // Its metric and SQL say the same: read the gauge on both sides of the query, so the
    // limit (which moves each window under load) stood still while SQL read it.
    let gauge = |metrics: &std::collections::HashMap<String, f64>| {
        metrics
            .get("sluice_flow_adaptive_limit{rule=\"ad\",level=\"scope\"}")
            .copied()
            .unwrap_or_else(|| panic!("no adaptive gauge: {metrics:?}"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let before = gauge(&sluice.metrics().await);
        let (status, rows) = sluice
            .query("SELECT concurrency_limit, adaptive FROM sys_user_limits WHERE scope = 'ad' AND level = 'Scope'")
            .await;
        assert_eq!(status, 200, "{rows}");
        assert_eq!(rows["rows"][0]["adaptive"], true, "{rows}");
        let after = gauge(&sluice.metrics().await);
        if before == after {
            assert!((1.0..=64.0).contains(&before), "{before}");
            assert_eq!(
                rows["rows"][0]["concurrency_limit"].as_f64(),
                Some(before),
                "SQL and the gauge disagree: {rows}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the limit never stood still across one query"
        );
    }

    // The handler no longer slows down under load: the limit rises again.
    set_knee(&sluice, 0).await;
    let risen = sample(&sluice, Duration::from_secs(5)).await;
    assert!(
        risen.iter().any(|l| *l >= 24),
        "the limit rises when latency stops growing: {risen:?}"
    );
    let peak: u64 = call_json(&sluice, "Meter/peak").await;
    println!("risen: {risen:?}, handler peak {peak}");
    assert!(peak >= 20, "more run at once in the handler: {peak}");

    // A static concurrency on the same rule wins (the rollback), at once.
    sluice
        .set_rules(json!([{"pattern": "ad", "limits": {"concurrency": 3, "adaptive": {"min": 1, "max": 64}}}]))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some((3, false)) = limit(&sluice).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the static limit never took over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        assert!(client.await.unwrap() > 0);
    }
    // Bad bounds are refused with what to fix.
    let (status, body) = sluice
        .put_rules(json!([{"pattern": "ad", "limits": {"adaptive": {"min": 8, "max": 2}}}]))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("1 <= min <= max"), "{body}");
}

/// A scope's handlers are each judged against their own latency: clients looping a fast
/// handler beside a slow one that does not slow down under load leave the limit where the
/// slow one's callers need it. Before, the baseline was the fastest latency seen on the
/// counter, and the same mix drove the limit from 51 to 1, where it stayed.
#[tokio::test]
async fn a_fast_handler_beside_a_slow_one_keeps_an_adaptive_limit_up() {
    let _alone = ONE_AT_A_TIME.lock().await;
    // `Meter/loaded(100)` takes 100 ms however many run.
    let (sluice, _dep) = adaptive_at_knee(0).await;

    let stop = Arc::new(AtomicBool::new(false));
    let slow = load(&sluice, 24, &stop);
    // Alone, the slow handler's callers lift the limit to what they use.
    let deadline = Instant::now() + Duration::from_secs(60);
    while limit(&sluice).await.is_none_or(|(l, _)| l < 24) {
        assert!(Instant::now() < deadline, "the limit never rose to 24");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fast = looping(&sluice, "Greeter/greet", json!("fast"), 8, &stop);
    let mixed = sample(&sluice, Duration::from_secs(6)).await;
    stop.store(true, Ordering::SeqCst);
    let (mut slow_calls, mut fast_calls) = (0, 0);
    for client in slow {
        slow_calls += client.await.unwrap();
    }
    for client in fast {
        fast_calls += client.await.unwrap();
    }
    let mut sorted = mixed.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    println!(
        "limit beside the fast loops: {mixed:?} (median {median}); {slow_calls} slow and {fast_calls} fast calls"
    );
    assert!(
        fast_calls > 100,
        "the fast handler was looped: {fast_calls}"
    );
    assert!(
        median >= 16,
        "the fast handler drove the limit down: {mixed:?}"
    );
}
