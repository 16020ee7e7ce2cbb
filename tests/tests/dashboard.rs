//! The dashboard at `/ui` in a real browser (Debian's Chromium, headless, through ChromeDriver):
//! it asks for the admin token, shows held invocations as they arrive, pauses a queue with its
//! button, and says why an invocation waits. Screenshots go to the test's temp dir (and to
//! `$SLUICE_UI_SCREENSHOT_DIR` when set, which is how `docs/dashboard.png` is made).

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use sluice_tests::{ADMIN_TOKEN, Sluice, TestDeployment, free_port};

/// A ChromeDriver process in its own process group, killed with the browsers it started
/// when dropped (a failed test leaves no Chromium behind).
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.wait();
    }
}

fn start_driver() -> Driver {
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver is installed by scripts/setup (Debian package chromium-driver)");
    let driver = Driver { child, port };
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    driver
}

async fn browser(driver: &Driver, profile: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    let mut options = json!({
        "args": [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--window-size=1440,900", format!("--user-data-dir={}", profile.display()),
        ]
    });
    if Path::new("/usr/bin/chromium").exists() {
        options["binary"] = json!("/usr/bin/chromium");
    }
    caps.insert("goog:chromeOptions".into(), options);
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a headless chromium session")
}

/// Waits until the text of the first element matching `css` satisfies `ok`; returns it.
async fn text_until(client: &Client, css: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last = String::new();
    loop {
        if let Ok(found) = client.find(Locator::Css(css)).await
            && let Ok(text) = found.text().await
        {
            if ok(&text) {
                return text;
            }
            last = text;
        }
        assert!(
            Instant::now() < deadline,
            "{css} never matched; last text {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Clicks `css` once it is there. The page re-renders its tables every second, so an element
/// found just before a refresh can be replaced before the click lands: it is found again.
async fn click(client: &Client, css: &str) {
    text_until(client, css, |_| true).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let clicked = match client.find(Locator::Css(css)).await {
            Ok(element) => element.click().await.map(drop),
            Err(e) => Err(e),
        };
        match clicked {
            Ok(()) => return,
            Err(e) => assert!(Instant::now() < deadline, "cannot click {css}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn screenshot(client: &Client, dir: &Path, name: &str) {
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    std::fs::write(dir.join(name), &png).unwrap();
    if let Some(out) = std::env::var_os("SLUICE_UI_SCREENSHOT_DIR") {
        std::fs::write(Path::new(&out).join(name), &png).unwrap();
    }
}

async fn send(sluice: &Sluice, scope: &str, body: &str) {
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/service/scope/{scope}/send/Greeter/slow",
            sluice.ingress_url
        ))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
}

#[tokio::test]
async fn the_dashboard_shows_held_work_and_pauses_a_queue() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().with_tokens().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    sluice
        .set_rules(json!([
            {"pattern": "*", "limits": {"concurrency": 2}},
            {"pattern": "ui", "limits": {"concurrency": 1}},
            {"pattern": "ui/*", "limits": {"concurrency": 1, "on_full": "keep_newest"}}
        ]))
        .await;
    let set = sluice
        .admin(reqwest::Method::PUT, "/limits/weights")
        .json(&json!([{"counter": "ui/vip", "weight": 4}]))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    // One runs for a minute, five wait behind it; two other scopes have work too.
    for _ in 0..6 {
        send(&sluice, "ui", "60000").await;
    }
    for scope in ["acme", "globex"] {
        for _ in 0..3 {
            send(&sluice, scope, "60000").await;
        }
    }

    let driver = start_driver();
    let tmp = tempfile::tempdir().unwrap();
    let client = browser(&driver, &tmp.path().join("profile")).await;
    client
        .goto(&format!("{}/ui", sluice.admin_url))
        .await
        .unwrap();

    // It asks for the token, refuses a wrong one, opens with the right one.
    let token = client
        .wait()
        .for_element(Locator::Css("#token"))
        .await
        .unwrap();
    token.send_keys("not-the-token").await.unwrap();
    click(&client, "#login-form button").await;
    text_until(&client, "#login-error", |t| t.contains("not one of")).await;
    let token = client.find(Locator::Css("#token")).await.unwrap();
    token.clear().await.unwrap();
    token.send_keys(ADMIN_TOKEN).await.unwrap();
    click(&client, "#login-form button").await;

    // The rule book with what waits under each rule, and the weight overrides.
    text_until(&client, "tr[data-rule=\"ui\"] td.held", |t| t == "5").await;
    text_until(&client, "tr[data-rule=\"ui/*\"] td.on-full", |t| {
        t == "keep_newest"
    })
    .await;
    text_until(&client, "tr[data-rule=\"ui\"] td.on-full", |t| t == "queue").await;
    text_until(
        &client,
        "#weights tr[data-counter=\"ui/vip\"] td.weight",
        |t| t == "4",
    )
    .await;
    text_until(&client, "#sum-held .value", |t| t == "7").await;
    screenshot(&client, tmp.path(), "dashboard-flow.png").await;

    // The queue of `ui` holds five; two more arrive and the page shows seven on its own.
    click(&client, "button[data-tab=\"queues\"]").await;
    text_until(&client, "#queues tr[data-scope=\"ui\"] td.held", |t| {
        t == "5"
    })
    .await;
    send(&sluice, "ui", "60000").await;
    send(&sluice, "ui", "60000").await;
    let started = Instant::now();
    text_until(&client, "#queues tr[data-scope=\"ui\"] td.held", |t| {
        t == "7"
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );

    // Its pause button pauses it, for the API too.
    click(
        &client,
        "#queues tr[data-scope=\"ui\"] button[data-action=\"pause\"]",
    )
    .await;
    text_until(&client, "#queues tr[data-scope=\"ui\"] td.status", |t| {
        t == "paused"
    })
    .await;
    text_until(&client, "#queues tr[data-scope=\"ui\"] button", |t| {
        t == "Resume"
    })
    .await;
    let queues: serde_json::Value = sluice
        .admin(reqwest::Method::GET, "/vqueues")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ui = queues["vqueues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["scope"] == "ui")
        .unwrap();
    assert_eq!(ui["status"], "paused", "{queues}");
    screenshot(&client, tmp.path(), "dashboard-queues.png").await;

    // An invocation of the paused queue says why it waits.
    click(&client, "button[data-tab=\"invocations\"]").await;
    let scope = client.find(Locator::Css("#inv-scope")).await.unwrap();
    scope.send_keys("ui").await.unwrap();
    click(&client, "#invocations tr[data-invocation] .badge.pending").await;
    let why = text_until(&client, "#why", |t| t.contains("paused")).await;
    assert!(why.contains("queue is paused"), "{why}");
    text_until(&client, "#detail .journal", |t| t.contains("Input")).await;
    screenshot(&client, tmp.path(), "dashboard-invocation.png").await;

    // Resumed from the page: the queue runs again.
    click(&client, "button[data-tab=\"queues\"]").await;
    click(
        &client,
        "#queues tr[data-scope=\"ui\"] button[data-action=\"resume\"]",
    )
    .await;
    text_until(&client, "#queues tr[data-scope=\"ui\"] td.status", |t| {
        t != "paused"
    })
    .await;

    client.close().await.unwrap();
}

/// The `points` of the first line of the chart `css` draws (empty when it has none yet).
async fn points(client: &Client, css: &str) -> String {
    match client.find(Locator::Css(&format!("{css} polyline"))).await {
        Ok(line) => line.attr("points").await.ok().flatten().unwrap_or_default(),
        Err(_) => String::new(),
    }
}

#[tokio::test]
async fn the_dashboard_draws_per_rule_charts_that_move() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .with_tokens()
        .config("[flow]\nhistory = \"1m\"\nhistory-interval = \"1s\"\n")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    sluice
        .set_rules(json!([
            {"pattern": "ch", "limits": {"concurrency": 2, "max_queued": 4}},
            {"pattern": "ad", "limits": {"adaptive": {"min": 1, "max": 8}}},
            {"pattern": "ch/*", "mode": "shadow", "limits": {"concurrency": 1}},
            {"pattern": "bg", "limits": {"budget": "1000000000/day"}},
        ]))
        .await;
    // Steady load: sends of 200 ms under `ch` (some refused once 4 wait), calls under `ad`, and
    // calls under `bg` that each report spending 200.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for (scope, path, key, handler) in [
        ("ch", "send", "k", "loaded"),
        ("ch", "send", "k", "loaded"),
        ("ad", "call", "", "loaded"),
        ("bg", "call", "", "spend"),
    ] {
        let url = format!(
            "{}/service/scope/{scope}/{path}/Meter/{handler}?limit-key={key}",
            sluice.ingress_url
        )
        .replace(
            "?limit-key=",
            if key.is_empty() { "" } else { "?limit-key=" },
        );
        let stop = std::sync::Arc::clone(&stop);
        load.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut refused = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let resp = client.post(&url).json(&200).send().await.unwrap();
                match resp.status().as_u16() {
                    200 | 202 => {}
                    429 => refused += 1,
                    other => panic!("{url}: {other}"),
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            refused
        }));
    }

    let driver = start_driver();
    let tmp = tempfile::tempdir().unwrap();
    let client = browser(&driver, &tmp.path().join("profile")).await;
    client
        .goto(&format!("{}/ui", sluice.admin_url))
        .await
        .unwrap();
    let token = client
        .wait()
        .for_element(Locator::Css("#token"))
        .await
        .unwrap();
    token.send_keys(ADMIN_TOKEN).await.unwrap();
    click(&client, "#login-form button").await;

    // Each rule has its card; the enforced one draws admitted/s, running, waiting, refused/s
    // and p99 wait; the adaptive one its limit; the shadow one its tallies.
    let card = "#charts .chart-card[data-rule=\"ch\"][data-level=\"scope\"]";
    for series in ["admitted", "running", "waiting", "refused", "p99-wait"] {
        text_until(
            &client,
            &format!("{card} svg[data-series=\"{series}\"]"),
            |_| true,
        )
        .await;
    }
    text_until(
        &client,
        "#charts .chart-card[data-rule=\"ad\"] svg[data-series=\"adaptive\"]",
        |_| true,
    )
    .await;
    text_until(
        &client,
        "#charts .chart-card[data-rule=\"ch/*\"] .last[data-series=\"would-wait\"]",
        |t| t.parse::<f64>().is_ok_and(|n| n > 0.0),
    )
    .await;
    // The budget's card draws what its calls spent; the counters table shows it against the
    // budget.
    text_until(
        &client,
        "#charts .chart-card[data-rule=\"bg\"] .last[data-series=\"budget-spent\"]",
        |t| t.parse::<f64>().is_ok_and(|n| n >= 200.0),
    )
    .await;
    text_until(&client, "#counters tr[data-scope=\"bg\"]", |t| {
        t.contains("/ 1000000000/day")
    })
    .await;
    // The numbers beside the lines are the load's: admissions going on, the bound full, some
    // refused.
    text_until(
        &client,
        &format!("{card} .last[data-series=\"admitted\"]"),
        |t| t.parse::<f64>().is_ok_and(|n| n > 0.0),
    )
    .await;
    text_until(
        &client,
        &format!("{card} .last[data-series=\"running\"]"),
        |t| t == "2",
    )
    .await;

    // The charts move: the admitted/s line is redrawn with new points as samples arrive.
    let chart = format!("{card} svg[data-series=\"admitted\"]");
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut first = String::new();
    while first.split(' ').count() < 3 {
        assert!(
            Instant::now() < deadline,
            "the chart never drew 3 points: {first:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        first = points(&client, &chart).await;
    }
    let mut moved = first.clone();
    while moved == first {
        assert!(Instant::now() < deadline, "the chart did not move: {first}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        moved = points(&client, &chart).await;
    }
    assert!(
        moved.split(' ').count() > first.split(' ').count() || moved != first,
        "{first} -> {moved}"
    );
    screenshot(&client, tmp.path(), "dashboard-charts.png").await;

    // A sparkline per queue on the queues tab.
    click(&client, "button[data-tab=\"queues\"]").await;
    text_until(
        &client,
        "#queues tr[data-scope=\"ch\"] td.trend svg polyline",
        |_| true,
    )
    .await;

    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut refused = 0;
    for l in load {
        refused += l.await.unwrap();
    }
    assert!(refused > 0, "the load never filled `ch`'s queue bound");
    // The refusals the chart counts are the load's 429s.
    let history: serde_json::Value = sluice
        .admin(reqwest::Method::GET, "/limits/history")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ch = history["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "ch" && r["level"] == "scope")
        .unwrap_or_else(|| panic!("{history}"));
    let seen: f64 = ch["refused_per_second"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(serde_json::Value::as_f64)
        .sum();
    assert!(seen > 0.0, "refusals charted: {ch}");
    client.close().await.unwrap();
}
