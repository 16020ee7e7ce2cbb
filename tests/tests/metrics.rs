//! `GET /metrics` of the real binary under load: the series move, flow control shows per rule
//! (never per scope, except the opt-in top-N gauge), and 10,000 scopes do not make 10,000
//! series.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_tests::{Sluice, TestDeployment, cli};

/// The sum of the samples of `name` whose labels contain every one of `labels`.
fn sum(samples: &HashMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            (series.as_str() == name || series.starts_with(&format!("{name}{{")))
                && labels.iter().all(|l| series.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}

async fn until(sluice: &Sluice, what: &str, done: impl Fn(&HashMap<String, f64>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let samples = sluice.metrics().await;
        if done(&samples) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never happened: {samples:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn metrics_move_under_load_and_stay_per_rule() {
    const SCOPES: usize = 10_000;
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .config("[metrics]\ntop-scopes = 3\n")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    sluice
        .set_rules(json!([
            {"pattern": "*", "limits": {"concurrency": 100}},
            {"pattern": "held", "limits": {"concurrency": 1}}
        ]))
        .await;

    // One scope with a backlog: one runs, two wait.
    for _ in 0..3 {
        let resp = reqwest::Client::new()
            .post(format!(
                "{}/service/scope/held/send/Greeter/slow",
                sluice.ingress_url
            ))
            .header("content-type", "application/json")
            .body("30000")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 202);
    }

    // 10,000 sends, each in its own scope, 32 at a time, scraped while they arrive.
    let client = reqwest::Client::new();
    let url = sluice.ingress_url.clone();
    let senders: Vec<_> = (0..32)
        .map(|worker| {
            let client = client.clone();
            let url = url.clone();
            tokio::spawn(async move {
                for i in (worker..SCOPES).step_by(32) {
                    let resp = client
                        .post(format!("{url}/service/scope/tenant-{i}/send/Greeter/greet"))
                        .header("content-type", "application/json")
                        .body(format!("\"{i}\""))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(resp.status().as_u16(), 202);
                }
            })
        })
        .collect();
    let during = sluice.metrics().await;
    assert!(!during.is_empty());
    for sender in senders {
        sender.await.unwrap();
    }

    until(&sluice, "every greet completing", |s| {
        sum(
            s,
            "sluice_invocations_completed_total",
            &["service=\"Greeter\"", "outcome=\"success\""],
        ) >= SCOPES as f64
    })
    .await;
    let samples = sluice.metrics().await;
    let sends = sum(
        &samples,
        "sluice_ingress_requests_total",
        &["kind=\"send\"", "status=\"202\""],
    );
    assert!(sends >= (SCOPES + 3) as f64, "{sends}");
    assert!(
        sum(
            &samples,
            "sluice_invocations_created_total",
            &["service=\"Greeter\""]
        ) >= (SCOPES + 3) as f64
    );
    assert!(sum(&samples, "sluice_attempts_total", &["service=\"Greeter\""]) >= SCOPES as f64);
    assert!(sum(&samples, "sluice_attempt_duration_seconds_count", &[]) >= SCOPES as f64);
    assert!(sum(&samples, "sluice_invocation_duration_seconds_count", &[]) >= SCOPES as f64);
    assert!(sum(&samples, "sluice_store_commit_duration_seconds_count", &[]) > 0.0);
    assert!(sum(&samples, "sluice_store_commit_group_size_count", &[]) > 0.0);
    assert!(sum(&samples, "process_resident_memory_bytes", &[]) > 0.0);
    assert!(sum(&samples, "process_open_fds", &[]) > 0.0);
    // Flow control, per rule and level.
    let admitted = sum(
        &samples,
        "sluice_flow_admissions_total",
        &["rule=\"*\"", "level=\"scope\""],
    );
    assert!(admitted >= SCOPES as f64, "{admitted}");
    assert_eq!(
        sum(
            &samples,
            "sluice_flow_running",
            &["rule=\"held\"", "level=\"scope\""]
        ),
        1.0
    );
    assert_eq!(
        sum(
            &samples,
            "sluice_flow_held",
            &["rule=\"held\"", "level=\"scope\""]
        ),
        2.0
    );
    assert_eq!(
        sum(&samples, "sluice_flow_scope_held", &["scope=\"held\""]),
        2.0
    );

    // Bounded: a few hundred series, and no scope but the opt-in top ones in any label.
    assert!(samples.len() < 600, "{} series", samples.len());
    let scoped: Vec<_> = samples.keys().filter(|s| s.contains("tenant-")).collect();
    assert!(scoped.is_empty(), "per-scope series: {scoped:?}");

    // Errors are counted by code; a rule removed is gone from the gauges.
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/service/scope/bad%20scope/send/Greeter/greet",
            sluice.ingress_url
        ))
        .body("\"x\"")
        .send()
        .await
        .unwrap();
    let code = resp.headers()["x-service-error-code"]
        .to_str()
        .unwrap()
        .to_owned();
    let samples = sluice.metrics().await;
    assert_eq!(
        sum(
            &samples,
            "sluice_ingress_requests_total",
            &[&format!("code=\"{code}\"")]
        ),
        1.0
    );
    let (ok, out) = cli(&sluice, "rules", &["delete", "held"]);
    assert!(ok, "{out}");
    until(&sluice, "the deleted rule leaving the gauges", |s| {
        sum(s, "sluice_flow_counters", &["rule=\"held\""]) == 0.0
    })
    .await;
}

#[tokio::test]
async fn metrics_can_be_turned_off() {
    let sluice = Sluice::builder()
        .config("[metrics]\nenabled = false\n")
        .start()
        .await
        .unwrap();
    let resp = sluice
        .admin(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("metrics.enabled"),
        "{body}"
    );
}
