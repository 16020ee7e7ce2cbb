//! The real `restate` CLI (npm `@restatedev/restate`, pinned in `tests/restate-cli/`) pointed
//! at Sluice's admin listener, as a new user would use it: it registers the deployment itself,
//! then every command with a Sluice counterpart runs (rules, deployments, services and their
//! status and config, invocations listed, described, cancelled, killed and purged, state,
//! Kafka clusters and subscriptions, virtual queues and SQL).

use std::path::PathBuf;
use std::process::Command;

use sluice_tests::{ADMIN_TOKEN, Sluice, TestDeployment};

fn restate_cli() -> PathBuf {
    let bin =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("restate-cli/node_modules/.bin/restate");
    assert!(
        bin.exists(),
        "{} not found: run scripts/setup (npm ci in tests/restate-cli)",
        bin.display()
    );
    bin
}

#[tokio::test]
async fn the_restate_cli_works_against_sluice() {
    let dep = TestDeployment::start("v1").await.unwrap();
    // With admin tokens: the CLI sends RESTATE_AUTH_TOKEN as its bearer token.
    let sluice = Sluice::builder().with_tokens().start().await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(restate_cli())
            .args(args)
            .env("RESTATE_ADMIN_URL", &sluice.admin_url)
            .env("RESTATE_AUTH_TOKEN", ADMIN_TOKEN)
            .env("HOME", home.path())
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "restate {args:?} failed:\n{text}");
        text
    };
    // A dry run of a new deployment is 201: the CLI goes on to register it.
    let out = run(&["deployments", "register", &dep.uri, "--yes"]);
    assert!(!out.contains("already exists"), "{out}");
    let deployment = out
        .split_whitespace()
        .find(|word| word.starts_with("dp_"))
        .unwrap_or_else(|| panic!("no deployment id:\n{out}"))
        .to_owned();
    assert!(out.contains("Greeter") && out.contains("Counter"), "{out}");
    let out = run(&["deployments", "describe", &deployment]);
    assert!(out.contains(&dep.uri) && out.contains("greet"), "{out}");
    let out = run(&["whoami"]);
    assert!(out.contains(&sluice.admin_url), "{out}");

    let out = run(&["rules", "set", "*", "--concurrency", "2", "--yes"]);
    assert!(out.contains("Created rule '*'"), "{out}");
    let out = run(&["rules", "set", "acme/*", "--concurrency", "1", "--yes"]);
    assert!(out.contains("acme/*"), "{out}");
    // A rule with Sluice's own limits (rate, burst, on_exceed, max_queued): the CLI reads
    // past fields it does not know.
    let (status, body) = sluice
        .put_rules(serde_json::json!([{"pattern": "paced", "limits": {
            "rate": "10/s", "burst": 2, "on_exceed": "reject", "max_queued": 5}}]))
        .await;
    assert_eq!(status, 200, "{body}");
    let out = run(&["rules", "list"]);
    assert!(
        out.contains("PATTERN") && out.contains("acme/*") && out.contains("paced"),
        "{out}"
    );
    let out = run(&["rules", "disable", "acme/*", "--yes"]);
    assert!(out.contains("disabled"), "{out}");
    let out = run(&["rules", "enable", "acme/*", "--yes"]);
    assert!(out.contains("enabled"), "{out}");
    let out = run(&["rules", "delete", "acme/*", "--yes"]);
    assert!(out.contains("Deleted rule 'acme/*'"), "{out}");
    let out = run(&["rules", "delete", "paced", "--yes"]);
    assert!(out.contains("Deleted rule 'paced'"), "{out}");
    let out = run(&["rules", "list", "--extra"]);
    assert!(
        out.contains("LAST MODIFIED") && !out.contains("acme/*"),
        "{out}"
    );

    let out = run(&["deployments", "list"]);
    assert!(out.contains(&dep.uri), "{out}");
    let out = run(&["services", "list"]);
    assert!(out.contains("Greeter") && out.contains("Counter"), "{out}");
    let out = run(&["services", "describe", "Counter"]);
    assert!(out.contains("add") && out.contains(&deployment), "{out}");
    let out = run(&["services", "config", "view", "Greeter"]);
    assert!(out.contains("retention"), "{out}");

    // A keyed call, described with its journal, then its object's state.
    let resp = reqwest::Client::new()
        .post(format!("{}/Counter/k1/add/send", sluice.ingress_url))
        .header("content-type", "application/json")
        .body("5")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let added: serde_json::Value = resp.json().await.unwrap();
    let added = added["invocationId"].as_str().unwrap().to_owned();
    sluice
        .invocation_until(&added, "completed", |seen| seen["status"] == "completed")
        .await;
    let out = run(&["invocations", "describe", &added]);
    assert!(
        out.contains("Counter/k1/add") && out.contains("completed"),
        "{out}"
    );
    let out = run(&["state", "get", "Counter", "k1"]);
    assert!(out.contains("count") && out.contains('5'), "{out}");
    let out = run(&["services", "status"]);
    assert!(out.contains("Counter") && out.contains("Greeter"), "{out}");
    let out = run(&["invocations", "purge", &added, "--yes"]);
    assert!(out.contains("Purged 1"), "{out}");
    let out = run(&["kafka-clusters", "list"]);
    assert!(!out.contains("Error"), "{out}");
    let out = run(&["subscriptions", "list"]);
    assert!(!out.contains("Error"), "{out}");

    let resp = reqwest::Client::new()
        .post(format!("{}/service/call/Greeter/greet", sluice.ingress_url))
        .header("content-type", "application/json")
        .body("\"Ada\"")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let out = run(&["invocations", "list", "--all"]);
    assert!(
        out.contains("Greeter/greet") && out.contains("completed"),
        "{out}"
    );
    let out = run(&["sql", "SELECT pattern, concurrency FROM sys_rules"]);
    // One row of the table holds the pattern `*` and its limit 2 as cells of their own; the
    // deleted `acme/*` holds none.
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|line| {
            line.split(|c: char| c.is_whitespace() || "|│┃".contains(c))
                .filter(|cell| !cell.is_empty())
                .collect()
        })
        .collect();
    assert!(
        rows.iter()
            .any(|cells| cells.contains(&"*") && cells.contains(&"2")),
        "no row `* | 2`:\n{out}"
    );
    assert!(!rows.iter().any(|cells| cells.contains(&"acme/*")), "{out}");

    // Virtual queues: three scoped holds under `*` = 2 leave one waiting in its queue.
    let mut holds = Vec::new();
    for _ in 0..3 {
        let resp = reqwest::Client::new()
            .post(format!(
                "{}/service/scope/globex/send/Meter/hold",
                sluice.ingress_url
            ))
            .header("content-type", "application/json")
            .body("30000")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        let sent: serde_json::Value = resp.json().await.unwrap();
        holds.push(sent["invocationId"].as_str().unwrap().to_owned());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let listed = loop {
        let out = run(&["vqueues", "list"]);
        // ID SERVICE SCOPE LIMIT-KEY LOCK QUEUE-PAUSED INBOX RUNNING …
        let row: Option<Vec<String>> = out
            .lines()
            .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .find(|cells| cells.get(2).map(String::as_str) == Some("globex"));
        if let Some(cells) = row
            && cells[6] == "1"
            && cells[7] == "2"
        {
            break cells;
        }
        assert!(std::time::Instant::now() < deadline, "{out}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(
        listed[0].starts_with("vq_1") && listed[0].len() == 37,
        "{listed:?}"
    );
    let out = run(&["vqueues", "describe", &listed[0]]);
    assert!(
        out.contains("Meter") && out.contains("globex") && out.contains("inv_1"),
        "{out}"
    );
    // The CLI's JSON output of SQL.
    let out = run(&[
        "sql",
        "--json",
        "SELECT service_name, num_inbox, num_running FROM sys_vqueue_meta WHERE scope = 'globex'",
    ]);
    let json_start = out.find('[').expect("a JSON array");
    // The document, then the CLI's own summary line.
    let rows: serde_json::Value = serde_json::Deserializer::from_str(&out[json_start..])
        .into_iter()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(
        rows,
        serde_json::json!([{"service_name": "Meter", "num_inbox": 1, "num_running": 2}]),
        "{out}"
    );

    // Cancel the waiting hold (its handler hears it when it starts; `hold` does not listen),
    // then kill both through the CLI: they end, not after their 30 s.
    let mut waiting = None;
    let mut running = None;
    for id in &holds {
        let (_, seen) = sluice.describe(id).await;
        match seen["status"].as_str() {
            Some("pending") => waiting = Some(id.clone()),
            Some("running") => running = Some(id.clone()),
            _ => {}
        }
    }
    let (waiting, running) = (waiting.expect("one hold waits"), running.expect("one runs"));
    let out = run(&["invocations", "cancel", &waiting, "--yes"]);
    assert!(out.contains("Cancelled 1"), "{out}");
    for id in [&running, &waiting] {
        let out = run(&["invocations", "kill", id, "--yes"]);
        assert!(out.contains("Killed 1"), "{out}");
    }
    for id in [&waiting, &running] {
        sluice
            .invocation_until(id, "ended", |seen| seen["status"] == "completed")
            .await;
    }
}
