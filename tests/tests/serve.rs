//! `sluice serve` as a user runs it: listeners, version, health, config layering, shutdown.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use sluice_tests::Sluice;

async fn get_json(url: &str) -> (u16, Value) {
    let resp = reqwest::get(url).await.expect("request");
    let status = resp.status().as_u16();
    let body = resp.json().await.expect("JSON body");
    (status, body)
}

#[tokio::test]
async fn version_reports_build_api_range_features_and_ingress() {
    let sluice = Sluice::builder().start().await.unwrap();
    let (status, v) = get_json(&format!("{}/version", sluice.admin_url)).await;
    assert_eq!(status, 200);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["min_admin_api_version"], 2);
    assert_eq!(v["max_admin_api_version"], 4);
    assert_eq!(v["ingress_endpoint"], format!("{}/", sluice.ingress_url));
    let features = v["features"].as_object().expect("features is an object");
    for flag in [
        "protocol_v7",
        "vqueues",
        "scoped_virtual_objects",
        "flow_control",
    ] {
        // Always on since flow control stopped being a switch.
        assert_eq!(features[flag], Value::Bool(true), "{flag}");
    }
    assert!(features.values().all(Value::is_boolean));
}

#[tokio::test]
async fn versioned_prefixes_and_health() {
    let sluice = Sluice::builder().start().await.unwrap();
    let health = reqwest::get(format!("{}/health", sluice.admin_url))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    for prefix in ["/v2", "/v3", "/v4"] {
        let (status, v) = get_json(&format!("{}{prefix}/version", sluice.admin_url)).await;
        assert_eq!(status, 200, "{prefix}");
        assert_eq!(v["max_admin_api_version"], 4);
    }
    let (status, v) = get_json(&format!("{}/v1/version", sluice.admin_url)).await;
    assert_eq!(status, 400);
    assert_eq!(
        v["message"],
        "[ADM0006] Unsupported Admin API version V1. This server supports versions between V2 and V4."
    );
    assert_eq!(v["restate_code"], "ADM0006");
    let (status, v) = get_json(&format!("{}/no/such/route", sluice.admin_url)).await;
    assert_eq!(status, 404);
    assert_eq!(
        v["message"],
        "[ADM0003] no admin route for GET /no/such/route"
    );
}

/// Every refusal of the admin API is JSON with a code the catalogue explains
/// (`sluice explain CODE`), whatever the route and whatever was wrong.
#[tokio::test]
async fn every_admin_refusal_carries_a_code() {
    use reqwest::Method;
    let sluice = Sluice::builder().start().await.unwrap();
    let refusals: &[(Method, &str, Option<Value>, u16, &str)] = &[
        (Method::GET, "/v1/version", None, 400, "ADM0006"),
        (Method::GET, "/no/such/route", None, 404, "ADM0003"),
        (Method::DELETE, "/version", None, 405, "ADM0005"),
        (Method::GET, "/invocations/not-an-id", None, 400, "ADM0002"),
        (
            Method::GET,
            "/invocations/inv_1aa9wfF3OBR33CrIK4zbRUpUUQjL3DcA9b",
            None,
            404,
            "ADM0003",
        ),
        (Method::GET, "/deployments/dp_nope", None, 400, "ADM0002"),
        (
            Method::DELETE,
            "/deployments/dp_nope?force=maybe",
            None,
            400,
            "ADM0002",
        ),
        (Method::GET, "/services/Nope", None, 404, "ADM0003"),
        (Method::GET, "/subscriptions/sub_nope", None, 400, "ADM0002"),
        (Method::GET, "/kafka-clusters/nope", None, 404, "ADM0003"),
        (Method::DELETE, "/plugins/nope", None, 404, "PLG0006"),
        (
            Method::PUT,
            "/limits/rules",
            Some(serde_json::json!([{"pattern": "x", "limits": {"concurency": 2}}])),
            422,
            "ADM0001",
        ),
        (
            Method::PUT,
            "/limits/rules",
            Some(serde_json::json!([{"pattern": "x", "limits": {"concurrency": 0}}])),
            422,
            "RUL0001",
        ),
        (
            Method::POST,
            "/limits/rules/bulk-delete",
            Some(serde_json::json!([{"pattern": "x", "expected_version": 9}])),
            409,
            "RUL0002",
        ),
        (
            Method::POST,
            "/query",
            Some(serde_json::json!({"query": "SELEC"})),
            400,
            "SQL0001",
        ),
    ];
    for (method, path, body, status, code) in refusals {
        let mut req = sluice.admin(method.clone(), path);
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.unwrap();
        let got = resp.status().as_u16();
        let answer: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(got, *status, "{method} {path}: {answer}");
        let restate_code = answer["restate_code"].as_str().unwrap_or_default();
        assert!(
            !restate_code.is_empty(),
            "{method} {path}: no code in {answer}"
        );
        if !code.is_empty() {
            assert_eq!(restate_code, *code, "{method} {path}: {answer}");
        }
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("[{restate_code}] ")),
            "{method} {path}: {answer}"
        );
    }
}

#[tokio::test]
async fn openapi_is_generated_from_the_routes() {
    let sluice = Sluice::builder().start().await.unwrap();
    let (status, doc) = get_json(&format!("{}/openapi", sluice.admin_url)).await;
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    for path in ["/health", "/version", "/openapi"] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
}

#[tokio::test]
async fn ingress_health_and_json_errors() {
    let sluice = Sluice::builder().start().await.unwrap();
    let (status, body) = get_json(&format!("{}/service/health", sluice.ingress_url)).await;
    assert_eq!(status, 200);
    assert_eq!(body, serde_json::json!({"services": []}));
    let (status, body) = get_json(&format!("{}/restate/health", sluice.ingress_url)).await;
    assert_eq!((status, body), (200, serde_json::json!({"services": []})));

    let client = reqwest::Client::new();
    for (method, path, status, code) in [
        (reqwest::Method::GET, "/", 400, Value::from("ING0001")),
        (
            reqwest::Method::POST,
            "/service/call/Greeter/greet",
            404,
            Value::from("RT0018"),
        ),
        (
            reqwest::Method::PUT,
            "/anything/at/all",
            405,
            Value::from("ING0004"),
        ),
    ] {
        let resp = client
            .request(method.clone(), format!("{}{path}", sluice.ingress_url))
            .body("some body")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{method} {path}");
        assert_eq!(resp.headers()["content-type"], "application/json");
        assert_eq!(resp.headers()["x-service-error-source"], "ingress");
        // Every refusal carries its code in the header as in the body.
        assert_eq!(
            resp.headers()["x-service-error-code"],
            code.as_str().unwrap()
        );
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["code"], status);
        assert_eq!(body["source"], "ingress");
        assert_eq!(body["error_code"], code);
    }
}

#[tokio::test]
async fn version_answers_the_retired_features_as_on_and_the_advertised_endpoint() {
    // The retired switches, even set off, change nothing: the features are always on.
    let sluice = Sluice::builder()
        .config("experimental-enable-protocol-v7 = false\n[ingress]\nadvertised-endpoint = \"unix:/run/sluice/ingress.sock\"\n")
        .env("SERVICE_EXPERIMENTAL_ENABLE_VQUEUES", "false")
        .env("RESTATE_EXPERIMENTAL_ENABLE_SCOPED_VIRTUAL_OBJECTS", "false")
        .start()
        .await
        .unwrap();
    let (_, v) = get_json(&format!("{}/version", sluice.admin_url)).await;
    assert_eq!(v["ingress_endpoint"], "unix:/run/sluice/ingress.sock");
    for flag in [
        "protocol_v7",
        "vqueues",
        "scoped_virtual_objects",
        "flow_control",
    ] {
        assert_eq!(v["features"][flag], Value::Bool(true), "{flag}");
    }
}

#[test]
fn dump_config_reflects_file_env_and_flags() {
    let done = Sluice::builder()
        .config("[worker.invoker]\nabort-timeout = \"5m\"\ninactivity-timeout = \"2m\"\n")
        .env("SERVICE_WORKER__INVOKER__ABORT_TIMEOUT", "42s")
        .env("RESTATE_EXPERIMENTAL_ENABLE_VQUEUES", "true")
        .env("SERVICE_LOG_FORMAT", "human")
        .arg("--log-format")
        .arg("json")
        .arg("--dump-config")
        .run_to_exit()
        .unwrap();
    assert!(done.status.success(), "{}", done.stderr);
    let out = &done.stdout;
    assert!(
        out.contains("abort-timeout = \"42s\""),
        "env beats file:\n{out}"
    );
    assert!(
        out.contains("inactivity-timeout = \"2m\""),
        "file beats default:\n{out}"
    );
    assert!(
        out.contains("experimental-enable-vqueues = true"),
        "RESTATE_ alias:\n{out}"
    );
    assert!(
        out.contains("log-format = \"json\""),
        "flag beats env:\n{out}"
    );
    assert!(out.contains("bind = \"127.0.0.1:"), "{out}");
}

#[tokio::test]
async fn sigterm_drains_and_exits_zero_within_the_grace_period() {
    let grace = Duration::from_secs(5);
    let mut sluice = Sluice::builder()
        .env("SERVICE_SHUTDOWN_GRACE_PERIOD", "5s")
        .start()
        .await
        .unwrap();
    let started = Instant::now();
    sluice.signal(Signal::SIGTERM).unwrap();
    let done = sluice.wait_exit(grace * 2).unwrap();
    let took = started.elapsed();
    assert!(
        done.status.success(),
        "exit {}:\n{}",
        done.status,
        done.stderr
    );
    assert!(took < grace, "took {took:?}, grace is {grace:?}");
    assert!(
        done.stderr.contains("signal=\"SIGTERM\""),
        "{}",
        done.stderr
    );
    assert!(done.stderr.contains("store closed"), "{}", done.stderr);

    // The store was released cleanly: the same data dir starts again.
    let again = Sluice::builder()
        .data_dir(&sluice.data_dir)
        .start()
        .await
        .unwrap();
    drop(again);
}

#[tokio::test]
async fn sigint_is_graceful_too() {
    let mut sluice = Sluice::builder().start().await.unwrap();
    sluice.signal(Signal::SIGINT).unwrap();
    let done = sluice.wait_exit(Duration::from_secs(10)).unwrap();
    assert!(
        done.status.success(),
        "exit {}:\n{}",
        done.status,
        done.stderr
    );
    assert!(done.stderr.contains("shutdown complete"), "{}", done.stderr);
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let mut sluice = Sluice::builder()
        .arg("--log-format")
        .arg("json")
        .start()
        .await
        .unwrap();
    sluice.signal(Signal::SIGTERM).unwrap();
    let done = sluice.wait_exit(Duration::from_secs(10)).unwrap();
    assert!(done.status.success());
    let lines: Vec<&str> = done
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(!lines.is_empty());
    for line in lines {
        let parsed: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(parsed["level"].is_string(), "{line}");
    }
}

/// Sluice's own codes left the reference's RT numbers; the old numbers still explain.
#[test]
fn explain_answers_old_numbers_with_their_new_codes() {
    let run = |code: &str| {
        let out = std::process::Command::new(sluice_tests::binary())
            .args(["explain", code])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    for (old, new) in [
        ("RT0026", "AWK0001"),
        ("rt0027", "STO0001"),
        ("RT0028", "STO0002"),
        ("RT0029", "FLO0001"),
        ("RT0030", "FLO0002"),
        ("RT0031", "CLU0005"),
    ] {
        let (ok, out) = run(old);
        assert!(ok, "{out}");
        assert!(
            out.contains(&format!("Sluice's old number for {new}")),
            "{out}"
        );
        assert!(out.contains(&format!("\n{new}: ")), "{out}");
        let (ok, direct) = run(new);
        assert!(ok && direct.starts_with(&format!("{new}: ")), "{direct}");
    }
    // The reference's own codes are unchanged.
    let (ok, out) = run("RT0024");
    assert!(ok && out.starts_with("RT0024: "), "{out}");
    let (ok, out) = run("RT0099");
    assert!(!ok && out.contains("unknown error code"), "{out}");
}
