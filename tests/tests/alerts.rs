//! The Prometheus rules an operator installs (`deploy/prometheus/sluice.rules.yml`): promtool
//! checks them and runs their unit tests, and a real Prometheus (Debian's, which
//! `scripts/setup` installs) scraping a running Sluice records its refusals by code and raises
//! the refusal alert.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::{Sluice, free_port, run_ok, workspace_root};

fn rules_dir() -> PathBuf {
    workspace_root().join("deploy/prometheus")
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    let file = |name: &str| rules_dir().join(name).display().to_string();
    let checked = run_ok("promtool", &["check", "rules", &file("sluice.rules.yml")]);
    assert!(checked.contains("SUCCESS: 10 rules found"), "{checked}");
    let tested = run_ok(
        "promtool",
        &["test", "rules", &file("sluice.rules.test.yml")],
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// A Prometheus server on loopback, stopped (and its data dir removed) when dropped.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `target` (host:port) every second and evaluates the rules every second.
    fn start(target: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 rule_files: [{rules:?}]\n\
                 scrape_configs:\n  - job_name: sluice\n    static_configs: [{{targets: [{target:?}]}}]\n",
                rules = rules_dir().join("sluice.rules.yml").display().to_string(),
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts (scripts/setup installs Debian's prometheus)");
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    /// `GET /api/v1/{path}`'s `data`, once Prometheus answers.
    async fn api(&self, path: &str) -> Option<Value> {
        let resp = reqwest::get(format!("{}/api/v1/{path}", self.url))
            .await
            .ok()?;
        let body: Value = resp.json().await.ok()?;
        (body["status"] == "success").then(|| body["data"].clone())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_real_prometheus_records_refusals_by_code_and_raises_the_refusal_alert() {
    let sluice = Sluice::builder().start().await.unwrap();
    let target = sluice
        .admin_url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let prometheus = Prometheus::start(&target);
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut recorded = None;
    loop {
        // A steady stream of calls with a bad scope: each is refused with 400 RT0024.
        for _ in 0..10 {
            let resp = client
                .post(format!(
                    "{}/service/scope/bad!/call/Greeter/greet",
                    sluice.ingress_url
                ))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 400);
        }
        if recorded.is_none()
            && let Some(data) = prometheus
                .api("query?query=sluice%3Aingress_refusals%3Arate5m%7Bcode%3D%22RT0024%22%7D")
                .await
            && let Some(rate) = data["result"][0]["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
            && rate > 1.0
        {
            recorded = Some(rate);
        }
        // Over one refusal a second: the alert is pending (it fires after 5 minutes of it).
        let pending = prometheus.api("alerts").await.is_some_and(|data| {
            data["alerts"].as_array().is_some_and(|alerts| {
                alerts.iter().any(|a| {
                    a["labels"]["alertname"] == "SluiceRefusing"
                        && a["labels"]["code"] == "RT0024"
                        && a["state"] == "pending"
                })
            })
        });
        if recorded.is_some() && pending {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never recorded the refusals ({recorded:?}) with the alert pending: {:?}",
            prometheus.api("alerts").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The scrape itself is healthy.
    let targets = prometheus.api("targets").await.unwrap();
    assert_eq!(targets["activeTargets"][0]["health"], "up", "{targets}");
}
