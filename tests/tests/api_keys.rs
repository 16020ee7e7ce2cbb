//! API keys hold every ingress route that reaches an invocation, not only calls and sends:
//! with `require-api-key = true`, a client with no key, a wrong key or another tenant's key
//! reads nothing of tenant alpha's invocations (output, attach, status, lookup, by id, by
//! idempotency target, by workflow) and completes none of its awakeables; alpha's own key
//! reaches all of them, naming its scope or leaving it out. The key itself never reaches the
//! handler nor the store.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;
use sluice_tests::{Sluice, TestDeployment};

const ALPHA: &str = "alpha-secret";
const BETA: &str = "beta-secret";

fn digest(key: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What one request answered: status, `error_code` of the body, the header's code, the body.
#[derive(Debug)]
struct Answer {
    status: u16,
    code: Option<String>,
    header_code: Option<String>,
    body: String,
}

async fn request(
    sluice: &Sluice,
    method: Method,
    path: &str,
    key: Option<&str>,
    body: Option<&str>,
    extra: &[(&str, &str)],
) -> Answer {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", sluice.ingress_url));
    if let Some(key) = key {
        req = req.header("x-sluice-api-key", key);
    }
    if let Some(body) = body {
        req = req
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    for (name, value) in extra {
        req = req.header(*name, *value);
    }
    let resp = req
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let header_code = resp
        .headers()
        .get("x-service-error-code")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp.text().await.unwrap_or_default();
    let code = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["error_code"].as_str().map(str::to_owned));
    Answer {
        status,
        code,
        header_code,
        body,
    }
}

#[tokio::test]
async fn api_keys_hold_every_route_that_reaches_an_invocation_to_its_scope() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .config(&format!(
            "[ingress]\nrequire-api-key = true\n\n[[ingress.api-keys]]\nsha256 = \"{}\"\nscope = \"alpha\"\n\n[[ingress.api-keys]]\nsha256 = \"{}\"\nscope = \"beta\"\n",
            digest(ALPHA),
            digest(BETA)
        ))
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let alpha = Some(ALPHA);

    // Alpha's work: a retained result and a retained failure (by idempotency key, targets a
    // stranger can compute from business keys), a workflow run, a handler on an awakeable.
    let greeted = request(
        &sluice,
        Method::POST,
        "/Greeter/greet",
        alpha,
        Some("\"Ada\""),
        &[("idempotency-key", "order-2")],
    )
    .await;
    assert_eq!(greeted.status, 200, "{greeted:?}");
    let failed = request(
        &sluice,
        Method::POST,
        "/Greeter/fail",
        alpha,
        Some("\"alpha's secret failure\""),
        &[("idempotency-key", "order-1")],
    )
    .await;
    assert_eq!(failed.status, 500, "{failed:?}");
    let ids = sluice
        .query("SELECT id, target_handler_name AS h FROM sys_invocation WHERE scope = 'alpha'")
        .await
        .1;
    let id_of = |handler: &str| -> String {
        ids["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["h"] == handler)
            .unwrap_or_else(|| panic!("{handler} in {ids}"))["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (greet_id, fail_id) = (id_of("greet"), id_of("fail"));
    let run = request(
        &sluice,
        Method::POST,
        "/Signup/user-1/run/send",
        alpha,
        Some("\"ada@example.com\""),
        &[],
    )
    .await;
    assert_eq!(run.status, 202, "{run:?}");
    let waiting = request(
        &sluice,
        Method::POST,
        "/Meter/awaitAwakeable/send",
        alpha,
        None,
        &[],
    )
    .await;
    assert_eq!(waiting.status, 202, "{waiting:?}");
    let waiting_id = serde_json::from_str::<Value>(&waiting.body).unwrap()["invocationId"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let awakeable = loop {
        let last = request(
            &sluice,
            Method::POST,
            "/Meter/lastAwakeable",
            alpha,
            None,
            &[],
        )
        .await;
        let id: String = serde_json::from_str(&last.body).unwrap_or_default();
        if !id.is_empty() {
            break id;
        }
        assert!(Instant::now() < deadline, "no awakeable: {last:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let idempotent = |scope: &str| {
        format!(
            r#"{{"target":"idempotentInvocation","service":"Greeter","handler":"greet","idempotencyKey":"order-2"{scope}}}"#
        )
    };
    let named = idempotent(r#","scope":"alpha""#);
    let list = format!(r#"["{greet_id}","{fail_id}"]"#);
    // Every route that reaches one of alpha's invocations, and what alpha's own key gets.
    let routes: Vec<(Method, String, Option<String>, u16)> = vec![
        (
            Method::GET,
            format!("/restate/invocation/{greet_id}/output"),
            None,
            200,
        ),
        (
            Method::GET,
            format!("/restate/invocation/{greet_id}/attach"),
            None,
            200,
        ),
        (
            Method::GET,
            format!("/restate/invocation/{fail_id}/status"),
            None,
            200,
        ),
        (Method::GET, format!("/restate/status/{fail_id}"), None, 200),
        (
            Method::GET,
            "/service/scope/alpha/invocation/Greeter/greet/order-2/status".into(),
            None,
            200,
        ),
        (
            Method::GET,
            "/service/scope/alpha/workflow/Signup/user-1/status".into(),
            None,
            200,
        ),
        (
            Method::POST,
            "/restate/output".into(),
            Some(named.clone()),
            200,
        ),
        (
            Method::POST,
            "/restate/attach".into(),
            Some(named.clone()),
            200,
        ),
        (
            Method::POST,
            "/restate/lookup".into(),
            Some(named.clone()),
            200,
        ),
        (
            Method::POST,
            "/restate/status".into(),
            Some(named.clone()),
            200,
        ),
        (
            Method::POST,
            "/restate/status".into(),
            Some(list.clone()),
            200,
        ),
    ];
    for (method, path, body, own) in &routes {
        for (key, status, code) in [
            (None, 401, "SEC0009"),
            (Some("guess"), 401, "SEC0009"),
            (Some(BETA), 403, "SEC0010"),
        ] {
            let got = request(&sluice, method.clone(), path, key, body.as_deref(), &[]).await;
            assert_eq!(
                (got.status, got.code.as_deref(), got.header_code.as_deref()),
                (status, Some(code), Some(code)),
                "{method} {path} with key {key:?}: {got:?}"
            );
            assert!(
                !got.body.contains("Ada") && !got.body.contains("secret failure"),
                "{method} {path} with key {key:?} leaked alpha's data: {got:?}"
            );
        }
        let got = request(&sluice, method.clone(), path, alpha, body.as_deref(), &[]).await;
        assert_eq!(
            got.status, *own,
            "{method} {path} with alpha's key: {got:?}"
        );
    }
    // Alpha reads its own results, naming its scope or not.
    let implied = request(
        &sluice,
        Method::POST,
        "/restate/output",
        alpha,
        Some(&idempotent("")),
        &[],
    )
    .await;
    assert_eq!(
        (implied.status, implied.body.as_str()),
        (200, "\"Hello, Ada!\"")
    );
    let failure = request(
        &sluice,
        Method::GET,
        &format!("/restate/invocation/{fail_id}/status"),
        alpha,
        None,
        &[],
    )
    .await;
    assert!(
        failure.body.contains("alpha's secret failure"),
        "{failure:?}"
    );
    // A workflow named without a scope is the key's own: alpha's run is there, still waiting
    // for its approval; beta's key names beta's (none), not alpha's.
    let path = "/restate/workflow/Signup/user-1/output";
    let own = request(&sluice, Method::GET, path, alpha, None, &[]).await;
    assert_eq!(
        (own.status, own.code.as_deref()),
        (470, Some("ING0003")),
        "{own:?}"
    );
    let other = request(&sluice, Method::GET, path, Some(BETA), None, &[]).await;
    assert_eq!(
        (other.status, other.code.as_deref()),
        (404, Some("ING0002")),
        "{other:?}"
    );
    let none = request(&sluice, Method::GET, path, None, None, &[]).await;
    assert_eq!(none.status, 401, "{none:?}");

    // The awakeable: no stranger completes it; alpha does, and its handler gets alpha's value.
    let resolve = format!("/restate/awakeables/{awakeable}/resolve");
    for (key, status) in [(None, 401), (Some("guess"), 401), (Some(BETA), 403)] {
        let got = request(
            &sluice,
            Method::POST,
            &resolve,
            key,
            Some("\"from a stranger\""),
            &[],
        )
        .await;
        assert_eq!(got.status, status, "resolve with {key:?}: {got:?}");
    }
    let resolved = request(
        &sluice,
        Method::POST,
        &resolve,
        alpha,
        Some("\"alpha's own\""),
        &[],
    )
    .await;
    assert_eq!(resolved.status, 202, "{resolved:?}");
    let attached = request(
        &sluice,
        Method::GET,
        &format!("/restate/invocation/{waiting_id}/attach"),
        alpha,
        None,
        &[],
    )
    .await;
    assert_eq!(
        (attached.status, attached.body.as_str()),
        (200, "\"alpha's own\"")
    );

    // The key reaches neither the handler nor the journal on disk.
    let seen = request(&sluice, Method::POST, "/Meter/headers", alpha, None, &[]).await;
    assert_eq!(seen.status, 200, "{seen:?}");
    let headers: Vec<String> = serde_json::from_str(&seen.body).unwrap();
    assert!(
        !headers.iter().any(|h| h.contains("x-sluice-api-key")),
        "{headers:?}"
    );
    let mut sluice = sluice;
    sluice
        .signal(nix::sys::signal::Signal::SIGTERM)
        .expect("SIGTERM");
    sluice.wait_exit(Duration::from_secs(10)).unwrap();
    let mut stored = Vec::new();
    collect_files(&sluice.data_dir, &mut stored);
    assert!(!stored.is_empty());
    for file in stored {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !bytes.windows(ALPHA.len()).any(|w| w == ALPHA.as_bytes()),
            "{} holds the API key",
            file.display()
        );
    }
}

fn collect_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// A key with `limit-key` holds every call under that first level: a quota on it counts the
/// calls whatever fresh limit keys the client makes up (before, each new
/// `x-service-limit-key` started a fresh quota: 20 of 20 admitted past a 2/day quota), and a
/// key under another first level is refused.
#[tokio::test]
async fn a_key_that_binds_a_limit_key_holds_fresh_keys_to_its_quota() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        // Noon of a fixed day: no daily window ends while the test runs.
        .clock_offset_ms(sluice_tests::clock_offset_to(sluice_tests::MIDDAY_MS))
        .config(&format!(
            "[ingress]\nrequire-api-key = true\n\n[[ingress.api-keys]]\nsha256 = \"{}\"\nscope = \"alpha\"\nlimit-key = \"acme\"\n",
            digest(ALPHA)
        ))
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    sluice
        .set_rules(serde_json::json!([
            {"pattern": "alpha/acme", "limits": {"quota": "2/day", "on_exceed": "reject"}}
        ]))
        .await;
    let mut statuses = Vec::new();
    for i in 0..6 {
        let fresh = format!("fresh-{i}");
        let answer = request(
            &sluice,
            Method::POST,
            "/Greeter/greet",
            Some(ALPHA),
            Some("\"a\""),
            &[("x-service-limit-key", fresh.as_str())],
        )
        .await;
        statuses.push(answer.status);
    }
    assert_eq!(statuses, vec![200, 200, 429, 429, 429, 429]);
    // The quota is the first level's.
    let counter = sluice_tests::counter(&sluice, "alpha", "level1")
        .await
        .expect("/limits/counters shows alpha/acme");
    assert_eq!(counter["quota_used"], 2, "{counter}");
    // A two-level key under another first level is refused.
    let answer = request(
        &sluice,
        Method::POST,
        "/Greeter/greet",
        Some(ALPHA),
        Some("\"a\""),
        &[("x-service-limit-key", "other/x")],
    )
    .await;
    assert_eq!(
        (answer.status, answer.code.as_deref()),
        (403, Some("SEC0010")),
        "{answer:?}"
    );
}

/// A plugin cannot widen a key: with key A bound to scope `alpha` and the shipped
/// `tenant_header` plugin, A plus `x-tenant: beta` was run in scope `beta`. Now the key's scope
/// holds whatever the plugin answers: another scope is refused with a code, the key's own runs.
#[tokio::test]
async fn a_plugin_cannot_move_a_keys_calls_into_another_scope() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .config(&format!(
            "[ingress]\nrequire-api-key = true\n\n[[ingress.api-keys]]\nsha256 = \"{}\"\nscope = \"alpha\"\n",
            digest(ALPHA)
        ))
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let bytes = std::fs::read(sluice_tests::plugin_wasm("tenant-header")).unwrap();
    let (status, loaded) = sluice_tests::put_plugin(
        &sluice,
        "tenants",
        bytes,
        "hook=extract&deadline=1s&config.scope-header=x-tenant",
    )
    .await;
    assert_eq!(status, 200, "{loaded}");
    let widened = request(
        &sluice,
        Method::POST,
        "/Greeter/greet",
        Some(ALPHA),
        Some("\"a\""),
        &[("x-tenant", "beta")],
    )
    .await;
    assert_eq!(
        (widened.status, widened.code.as_deref()),
        (403, Some("SEC0010")),
        "{widened:?}"
    );
    assert!(
        widened.body.contains("a plugin classified the call"),
        "{widened:?}"
    );
    let own = request(
        &sluice,
        Method::POST,
        "/Greeter/greet",
        Some(ALPHA),
        Some("\"a\""),
        &[("x-tenant", "alpha")],
    )
    .await;
    assert_eq!(own.status, 200, "{own:?}");
    let (_, rows) = sluice
        .query("SELECT scope FROM sys_invocation WHERE target_service_name = 'Greeter'")
        .await;
    assert_eq!(
        rows["rows"],
        serde_json::json!([{"scope": "alpha"}]),
        "{rows}"
    );
}
