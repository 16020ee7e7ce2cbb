//! Policy plugins end to end: the example plugins (built for wasm32-wasip2 from `plugins/`,
//! and the Python ones from `plugins/python` with componentize-py) loaded into a running Sluice through the admin API and the config file, hostile plugins
//! stopped without taking the proxy down, hot swaps under load.

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use sluice_tests::{
    Sluice, TestDeployment, greet, peak_of, peak_of_calls, plugin_wasm, put_plugin,
    python_plugin_wasm,
};

async fn flow_controlled() -> (Sluice, TestDeployment) {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    (sluice, dep)
}

/// The component of `plugin`: a crate under `plugins/`, or `python/<module>` for a Python
/// plugin under `plugins/python`.
fn wasm_of(plugin: &str) -> std::path::PathBuf {
    match plugin.strip_prefix("python/") {
        Some(module) => python_plugin_wasm(module),
        None => plugin_wasm(plugin),
    }
}

/// `PUT /plugins/{name}?{query}` with the component of `plugin` (see [`wasm_of`]). Unless the query sets
/// one, the deadline is 1 s: the default 10 ms is wall-clock time, which a debug build on a
/// busy two-core test machine can lose to the scheduler (the hostile test checks the default).
async fn load(sluice: &Sluice, name: &str, plugin: &str, query: &str) -> (u16, Value) {
    let bytes = std::fs::read(wasm_of(plugin)).unwrap();
    let query = if query.contains("deadline=") || plugin.ends_with("hostile") {
        query.to_owned()
    } else {
        format!("{query}&deadline=1s")
    };
    put_plugin(sluice, name, bytes, &query).await
}

fn hold(n: usize) -> Vec<String> {
    vec!["/service/call/Meter/hold".to_owned(); n]
}

#[tokio::test]
async fn tenant_header_puts_unscoped_calls_under_their_tenants_rules() {
    tenant_header_classifies("tenant-header").await;
}

#[tokio::test]
async fn the_python_tenant_header_puts_unscoped_calls_under_their_tenants_rules() {
    tenant_header_classifies("python/tenant_header").await;
}

/// The tenant-header plugin (`plugin`, in whichever language) classifies calls by header into
/// rules whose limits hold in the handler, counts its calls and refuses what `require` says.
async fn tenant_header_classifies(plugin: &str) {
    let (sluice, _dep) = flow_controlled().await;
    sluice.set_rules(json!([{"pattern": "t1", "limits": {"concurrency": 1}}, {"pattern": "t2/*", "limits": {"concurrency": 2}}]),
    )
    .await;
    let (status, loaded) = load(
        &sluice,
        "tenants",
        plugin,
        "hook=extract&config.scope-header=x-tenant&config.l1-header=x-tier",
    )
    .await;
    assert_eq!(status, 200, "{loaded}");
    assert_eq!(loaded["hook"], "extract");
    assert_eq!(loaded["sha256"].as_str().unwrap().len(), 64);

    let with = |headers: Vec<(&'static str, &'static str)>, n| {
        (0..n)
            .map(|_| ("/service/call/Meter/hold".to_owned(), headers.clone()))
            .collect::<Vec<_>>()
    };
    // Concurrency measured inside the handler.
    assert_eq!(
        peak_of_calls(&sluice, &with(vec![("x-tenant", "t1")], 4)).await,
        1
    );
    assert_eq!(
        peak_of_calls(
            &sluice,
            &with(vec![("x-tenant", "t2"), ("x-tier", "gold")], 4)
        )
        .await,
        2
    );
    // Without the header the call stays unscoped and unlimited.
    assert_eq!(peak_of(&sluice, &hold(4)).await, 4);

    // The plugin's metrics count its calls.
    let listed: Value = reqwest::get(format!("{}/plugins", sluice.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let metrics = &listed["plugins"][0]["metrics"];
    assert!(metrics["calls"].as_u64().unwrap() >= 12, "{listed}");
    assert_eq!(metrics["errors"], 0);

    // With `require`, a missing tenant header is refused by the plugin.
    load(
        &sluice,
        "tenants",
        plugin,
        "hook=extract&config.scope-header=x-tenant&config.require=true",
    )
    .await;
    let (status, _, body) = greet(&sluice, &[]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("missing tenant header 'x-tenant'"), "{body}");
    assert!(body.contains("plugin 'tenants'"), "{body}");
}

fn jwt(secret: &[u8], claims: Value) -> String {
    let head = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(format!("{head}.{body}").as_bytes());
    let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{head}.{body}.{signature}")
}

#[tokio::test]
async fn jwt_claims_accepts_good_tokens_and_refuses_bad_ones() {
    let (sluice, _dep) = flow_controlled().await;
    // Loaded without `credentials`, the plugin never sees the caller's `authorization`.
    let (status, body) = load(
        &sluice,
        "jwt",
        "jwt-claims",
        "hook=extract&config.secret=s3cret",
    )
    .await;
    assert_eq!(
        (status, &body["credentials"]),
        (200, &json!(false)),
        "{body}"
    );
    let (status, _, body) = greet(&sluice, &[("authorization", "Bearer a.b.c")]).await;
    assert_eq!(
        (status, body.contains("missing bearer token")),
        (401, true),
        "{body}"
    );
    let (status, body) = load(
        &sluice,
        "jwt",
        "jwt-claims",
        "hook=extract&credentials=true&config.secret=s3cret",
    )
    .await;
    assert_eq!(
        (status, &body["credentials"]),
        (200, &json!(true)),
        "{body}"
    );
    // A day from now, by the clock the test and the server share.
    let future = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 86_400;
    let good = jwt(
        b"s3cret",
        json!({"tenant": "acme", "tier": "gold", "exp": future}),
    );
    let bearer = format!("Bearer {good}");
    // A good token: the call is scoped by its claims.
    let resp = reqwest::Client::new()
        .post(format!("{}/service/send/Greeter/greet", sluice.ingress_url))
        .header("content-type", "application/json")
        .header("authorization", &bearer)
        .body("\"Ada\"")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let id = resp.json::<Value>().await.unwrap()["invocationId"]
        .as_str()
        .unwrap()
        .to_owned();
    let invocation: Value = reqwest::get(format!("{}/invocations/{id}", sluice.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(invocation["scope"], "acme", "{invocation}");
    assert_eq!(invocation["limit_key"], "gold", "{invocation}");

    let forged = jwt(b"wrong", json!({"tenant": "acme", "exp": future}));
    let expired = jwt(b"s3cret", json!({"tenant": "acme", "exp": 1_000}));
    for (auth, want) in [
        (format!("Bearer {forged}"), "bad signature"),
        (format!("Bearer {expired}"), "expired"),
        (
            "Bearer not-a-token".to_owned(),
            "not three dot-separated parts",
        ),
    ] {
        let (status, _, body) = greet(&sluice, &[("authorization", &auth)]).await;
        assert_eq!(status, 401, "{body}");
        assert!(body.contains(want), "{want}: {body}");
    }
    let (status, _, body) = greet(&sluice, &[]).await;
    assert_eq!(
        (status, body.contains("missing bearer token")),
        (401, true),
        "{body}"
    );
}

#[tokio::test]
async fn tiered_limits_doubles_a_premium_scopes_budget() {
    let (sluice, _dep) = flow_controlled().await;
    sluice
        .set_rules(json!([{"pattern": "*", "limits": {"concurrency": 2}}]))
        .await;
    let scoped = |scope: &str, n| vec![format!("/service/scope/{scope}/call/Meter/hold"); n];
    assert_eq!(peak_of(&sluice, &scoped("vip", 6)).await, 2);
    let (status, body) = load(
        &sluice,
        "tiers",
        "tiered-limits",
        "hook=match-rule&config.premium=vip,other-vip",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Applied at once to the live counters: no restart, no new rule.
    assert_eq!(peak_of(&sluice, &scoped("vip", 6)).await, 4);
    assert_eq!(peak_of(&sluice, &scoped("plain", 6)).await, 2);
    // A second match-rule plugin is refused; replacing this one by name works.
    let (status, body) = load(&sluice, "tiers-2", "tiered-limits", "hook=match-rule").await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("PLG0007"),
        "{body}"
    );
    // Unloading restores the rule book's own limits.
    let resp = reqwest::Client::new()
        .delete(format!("{}/plugins/tiers", sluice.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    assert_eq!(peak_of(&sluice, &scoped("vip", 4)).await, 2);
}

/// Loads the hostile plugin with `behaviour` and answers a call's status, code, body, time.
async fn hostile(
    sluice: &Sluice,
    plugin: &str,
    behaviour: &str,
    extra: &str,
) -> (u16, Option<String>, String, Duration) {
    let (status, body) = load(
        sluice,
        "hostile",
        plugin,
        &format!("hook=extract&config.behaviour={behaviour}{extra}"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let started = Instant::now();
    let (status, code, body) = greet(sluice, &[]).await;
    (status, code, body, started.elapsed())
}

#[tokio::test]
async fn hostile_plugins_are_stopped_and_the_proxy_keeps_serving() {
    // A Rust plugin's memory is tens of KiB: 4 MiB is room to start and not to hoard.
    hostile_plugins_are_stopped("hostile", "4MiB").await;
}

#[tokio::test]
async fn hostile_python_plugins_are_stopped_and_the_proxy_keeps_serving() {
    // CPython's image is about 12 MiB of memory before the plugin allocates anything.
    hostile_plugins_are_stopped("python/hostile", "24MiB").await;
}

/// Each way the hostile plugin (`plugin`) misbehaves is stopped with its code, within its
/// bound (`memory` is a cap it starts within), and the proxy keeps serving.
async fn hostile_plugins_are_stopped(plugin: &str, memory: &str) {
    let (sluice, _dep) = flow_controlled().await;
    // An infinite loop is stopped at its deadline (default 10 ms).
    let (status, code, body, took) = hostile(&sluice, plugin, "loop", "").await;
    assert_eq!((status, code.as_deref()), (503, Some("PLG0003")), "{body}");
    assert!(
        body.contains("plugin 'hostile' ran past its deadline"),
        "{body}"
    );
    assert!(took < Duration::from_secs(2), "answered after {took:?}");
    // The instance is rebuilt: the next request is answered the same way, not hung.
    let (status, code, _) = greet(&sluice, &[]).await;
    assert_eq!((status, code.as_deref()), (503, Some("PLG0003")));

    // The other failures get a deadline they cannot reach on a busy box: a wall-clock deadline
    // of 10 ms can pass while the instance is descheduled, and these cases test other limits.
    let (status, code, body, _) = hostile(
        &sluice,
        plugin,
        "grow",
        &format!("&memory-limit={memory}&deadline=1s"),
    )
    .await;
    assert_eq!((status, code.as_deref()), (503, Some("PLG0005")), "{body}");
    assert!(body.contains("memory"), "{body}");

    let (status, code, body, _) = hostile(&sluice, plugin, "trap", "&deadline=1s").await;
    assert_eq!((status, code.as_deref()), (503, Some("PLG0002")), "{body}");

    let (status, code, body, _) = hostile(&sluice, plugin, "bad-scope", "&deadline=1s").await;
    assert_eq!((status, code.as_deref()), (503, Some("PLG0004")), "{body}");
    assert!(body.contains("invalid scope 'not a scope!'"), "{body}");

    // Fuel stops it too.
    let (status, code, body, _) =
        hostile(&sluice, plugin, "loop", "&fuel=100000&deadline=1s").await;
    assert_eq!((status, code.as_deref()), (503, Some("PLG0003")), "{body}");
    assert!(body.contains("fuel"), "{body}");

    // on-error = skip passes requests through unchanged, whatever the plugin does.
    for behaviour in ["loop", "grow", "trap", "bad-scope"] {
        let (status, _, body, _) = hostile(&sluice, plugin, behaviour, "&on-error=skip").await;
        assert_eq!(status, 200, "{behaviour}: {body}");
        assert_eq!(body, "\"Hello, Ada!\"");
    }
    let listed: Value = reqwest::get(format!("{}/plugins/hostile", sluice.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["metrics"]["errors"], 1, "{listed}");
}

/// Sluice whose plugin calls wait in a queue of `queue` (two threads run them) and whose
/// breakers open after `breaker_failures` failures in a row, for `cooldown`.
async fn with_plugin_limits(
    queue: &str,
    breaker_failures: &str,
    cooldown: &str,
) -> (Sluice, TestDeployment) {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .env("SERVICE_PLUGIN_LIMITS__CALL_QUEUE", queue)
        .env("SERVICE_PLUGIN_LIMITS__BREAKER_FAILURES", breaker_failures)
        .env("SERVICE_PLUGIN_LIMITS__BREAKER_COOLDOWN", cooldown)
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    (sluice, dep)
}

/// `POST url` with `"Ada"`: a greeting through the ingress, its answer as it came.
async fn post_greet(client: &reqwest::Client, url: &str) -> reqwest::Response {
    client
        .post(url)
        .header("content-type", "application/json")
        .body("\"Ada\"")
        .send()
        .await
        .unwrap()
}

/// Clients that each call `Greeter/greet` back to back until `stop`; each answers the error
/// codes it got, in order.
fn greeting_clients(
    sluice: &Sluice,
    n: usize,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Option<String>>>> {
    (0..n)
        .map(|_| {
            let url = format!("{}/service/call/Greeter/greet", sluice.ingress_url);
            let stop = std::sync::Arc::clone(stop);
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut codes = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let resp = post_greet(&client, &url).await;
                    codes.push(
                        resp.headers()
                            .get("x-service-error-code")
                            .map(|v| v.to_str().unwrap().to_owned()),
                    );
                }
                codes
            })
        })
        .collect()
}

/// A plugin that loops to its 1 s deadline on every call takes the plugin threads, never a
/// shard: while six clients keep both threads and the whole queue busy with it, the ingress's
/// health (no plugin involved) answers within 50 ms at p99; calls past the queue are refused
/// at once, 503 PLG0011 with Retry-After.
#[tokio::test]
async fn beside_a_looping_plugin_health_stays_fast_and_calls_past_its_queue_are_refused() {
    // No breaker: the plugin is to keep looping for the whole test.
    let (sluice, _dep) = with_plugin_limits("4", "0", "10s").await;
    let (status, body) = load(
        &sluice,
        "hostile",
        "hostile",
        "hook=extract&config.behaviour=loop&deadline=1s",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two running, four waiting: both threads and the queue are taken.
    let clients = greeting_clients(&sluice, 6, &stop);
    let plugin = format!("{}/plugins/hostile", sluice.admin_url);
    loop {
        let listed: Value = reqwest::get(&plugin).await.unwrap().json().await.unwrap();
        if listed["metrics"]["errors"].as_u64().unwrap_or(0) >= 2 {
            break;
        }
    }
    let health = reqwest::Client::new();
    let mut took = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        let resp = health
            .get(format!("{}/restate/health", sluice.ingress_url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        took.push(started.elapsed());
    }
    took.sort();
    let p99 = took[took.len() * 99 / 100];
    println!(
        "health beside a looping plugin: p50 {:?}, p99 {p99:?}",
        took[took.len() / 2]
    );
    assert!(
        p99 < Duration::from_millis(50),
        "health p99 {p99:?} beside the looping plugin (p50 {:?})",
        took[took.len() / 2]
    );

    // Calls past the six find the queue full: refused at once, not queued without bound.
    let refused = loop {
        let extra: Vec<_> = (0..4)
            .map(|_| {
                let url = format!("{}/service/call/Greeter/greet", sluice.ingress_url);
                tokio::spawn(async move {
                    let started = Instant::now();
                    let resp = post_greet(&reqwest::Client::new(), &url).await;
                    let code = resp
                        .headers()
                        .get("x-service-error-code")
                        .map(|v| v.to_str().unwrap().to_owned());
                    let retry = resp
                        .headers()
                        .get("retry-after")
                        .map(|v| v.to_str().unwrap().to_owned());
                    (
                        resp.status().as_u16(),
                        code,
                        retry,
                        started.elapsed(),
                        resp.text().await.unwrap(),
                    )
                })
            })
            .collect();
        let mut answers = Vec::new();
        for call in extra {
            answers.push(call.await.unwrap());
        }
        if let Some(refused) = answers
            .into_iter()
            .find(|(_, code, ..)| code.as_deref() == Some("PLG0011"))
        {
            break refused;
        }
    };
    let (status, _, retry, took, body) = refused;
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry.as_deref(), Some("1"), "{body}");
    assert!(body.contains("plugin-limits.call-queue"), "{body}");
    assert!(
        took < Duration::from_millis(900),
        "refused after {took:?}, not at once"
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for client in clients {
        for code in client.await.unwrap() {
            assert!(
                matches!(code.as_deref(), Some("PLG0003" | "PLG0011")),
                "{code:?}"
            );
        }
    }
}

/// Loads the hostile plugin as `hostile`, trapping on every call, with `extra` settings.
async fn load_trapping(sluice: &Sluice, extra: &str) {
    let (status, body) = load(
        sluice,
        "hostile",
        "hostile",
        &format!("hook=extract&config.behaviour=trap&deadline=1s{extra}"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// After `breaker-failures` failed calls in a row a plugin is not called until its cooldown
/// ends: `on-error = "fail"` answers 503 PLG0010 at once with Retry-After, `skip` passes the
/// call through; the first call after the cooldown tries the plugin again, and one more
/// failure opens the breaker again.
#[tokio::test]
async fn a_plugin_that_keeps_failing_is_not_called_while_its_breaker_is_open() {
    let (sluice, _dep) = with_plugin_limits("1024", "3", "3s").await;
    let calls = || async {
        let listed: Value = reqwest::get(format!("{}/plugins/hostile", sluice.admin_url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        listed["metrics"]["calls"].as_u64().unwrap()
    };
    load_trapping(&sluice, "").await;
    for _ in 0..3 {
        let (status, code, body) = greet(&sluice, &[]).await;
        assert_eq!((status, code.as_deref()), (503, Some("PLG0002")), "{body}");
    }
    let resp = post_greet(
        &reqwest::Client::new(),
        &format!("{}/service/call/Greeter/greet", sluice.ingress_url),
    )
    .await;
    assert_eq!(resp.status(), 503);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&retry), "Retry-After {retry}");
    let body = resp.text().await.unwrap();
    assert!(body.contains("PLG0010"), "{body}");
    assert!(body.contains("failed 3 calls in a row"), "{body}");
    for _ in 0..10 {
        let (status, code, _) = greet(&sluice, &[]).await;
        assert_eq!((status, code.as_deref()), (503, Some("PLG0010")));
    }
    assert_eq!(
        calls().await,
        3,
        "the plugin was called while its breaker was open"
    );

    // After the cooldown it is tried once more; still failing, it opens again at once.
    let tried_again = loop {
        let (status, code, body) = greet(&sluice, &[]).await;
        if code.as_deref() != Some("PLG0010") {
            break (status, code, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (tried_again.0, tried_again.1.as_deref()),
        (503, Some("PLG0002")),
        "{}",
        tried_again.2
    );
    let (_, code, _) = greet(&sluice, &[]).await;
    assert_eq!(code.as_deref(), Some("PLG0010"));
    assert_eq!(calls().await, 4);

    // With on-error = skip, an open breaker passes calls through without calling the plugin.
    load_trapping(&sluice, "&on-error=skip").await;
    for _ in 0..10 {
        let (status, _, body) = greet(&sluice, &[]).await;
        assert_eq!((status, body.as_str()), (200, "\"Hello, Ada!\""));
    }
    assert_eq!(calls().await, 3, "called only until its breaker opened");
}

#[tokio::test]
async fn bad_plugins_are_refused_at_load_and_the_old_version_stays() {
    let (sluice, _dep) = flow_controlled().await;
    let (status, first) = load(&sluice, "t", "tenant-header", "hook=extract").await;
    assert_eq!(status, 200);
    let cases: [(Vec<u8>, &str, &str); 5] = [
        (
            b"not wasm".to_vec(),
            "hook=extract",
            "not a valid wasm component",
        ),
        // An empty component: valid, but it exports nothing.
        (
            b"\0asm\x0d\0\x01\0".to_vec(),
            "hook=extract",
            "does not export 'extract'",
        ),
        (
            std::fs::read(plugin_wasm("tenant-header")).unwrap(),
            "hook=sideways",
            "unknown hook 'sideways'",
        ),
        (
            std::fs::read(plugin_wasm("tenant-header")).unwrap(),
            "",
            "say which hook",
        ),
        (Vec::new(), "hook=extract", "the body is empty"),
    ];
    for (bytes, query, want) in cases {
        let (status, body) = put_plugin(&sluice, "t", bytes, query).await;
        assert_eq!(status, 400, "{query}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains("PLG0001") && message.contains(want),
            "{message}"
        );
    }
    let now: Value = reqwest::get(format!("{}/plugins/t", sluice.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(now["sha256"], first["sha256"]);
    let resp = reqwest::Client::new()
        .delete(format!("{}/plugins/nope", sluice.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}

/// A plugin body is read up to `plugin-limits.max-size`, past the listener's 2 MiB default for
/// other bodies (a plugin carrying a language runtime is tens of MiB); beyond it, 413 PLG0009.
#[tokio::test]
async fn plugin_bodies_are_taken_up_to_their_own_size_cap() {
    let sluice = Sluice::builder()
        .env("SERVICE_PLUGIN_LIMITS__MAX_SIZE", "4 MiB")
        .start()
        .await
        .unwrap();
    // 3 MiB is read whole, and refused for what it is.
    let (status, body) = put_plugin(&sluice, "big", vec![7u8; 3 << 20], "hook=extract").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("PLG0001") && m.contains("not a valid wasm component")),
        "{body}"
    );
    let (status, body) = put_plugin(&sluice, "big", vec![7u8; 5 << 20], "hook=extract").await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["restate_code"], "PLG0009", "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("plugin-limits.max-size (4.0 MiB)")),
        "{body}"
    );
}

#[tokio::test]
async fn plugins_survive_restarts_and_load_from_the_config_file() {
    let data = tempfile::tempdir().unwrap();
    let dep = TestDeployment::start("v1").await.unwrap();
    let wasm = plugin_wasm("tenant-header");
    let config = format!(
        "[[plugins]]\nname = \"from-file\"\npath = \"{}\"\nhook = \"extract\"\ndeadline = \"1s\"\nconfig = {{ scope-header = \"x-org\" }}\n",
        wasm.display()
    );
    let start = || {
        Sluice::builder()
            .data_dir(data.path())
            .config(&config)
            .start()
    };
    let sluice = start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let (status, _) = load(
        &sluice,
        "stored",
        "jwt-claims",
        "hook=extract&config.require=false",
    )
    .await;
    assert_eq!(status, 200);
    // A config-file plugin is read-only at runtime.
    let (status, body) = load(&sluice, "from-file", "tenant-header", "hook=extract").await;
    assert_eq!(status, 409, "{body}");
    drop(sluice);

    let sluice = start().await.unwrap();
    let listed: Value = reqwest::get(format!("{}/plugins", sluice.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<(&str, &str)> = listed["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["source"].as_str().unwrap()))
        .collect();
    assert_eq!(names, [("from-file", "config"), ("stored", "admin")]);
    // The config-file plugin scopes calls by `x-org`.
    sluice
        .set_rules(json!([{"pattern": "org1", "limits": {"concurrency": 1}}]))
        .await;
    let calls: Vec<_> = (0..3)
        .map(|_| {
            (
                "/service/call/Meter/hold".to_owned(),
                vec![("x-org", "org1")],
            )
        })
        .collect();
    assert_eq!(peak_of_calls(&sluice, &calls).await, 1);
}

#[tokio::test]
async fn a_missing_config_file_plugin_stops_start_up_with_plg0001() {
    let finished = Sluice::builder()
        .config("[[plugins]]\nname = \"gone\"\npath = \"/nonexistent/plugin.wasm\"\nhook = \"extract\"\n")
        .run_to_exit()
        .unwrap();
    sluice_tests::assert_startup_error(&finished, "PLG0001");
    assert!(
        finished.stderr.contains("/nonexistent/plugin.wasm"),
        "{}",
        finished.stderr
    );
}

#[tokio::test]
async fn hot_swaps_under_load_fail_no_request() {
    let (sluice, _dep) = flow_controlled().await;
    let (status, body) = load(&sluice, "swap", "tenant-header", "hook=extract").await;
    assert!(status < 300, "loading the plugin: {status} {body}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..32)
        .map(|_| {
            let url = format!("{}/service/call/Greeter/greet", sluice.ingress_url);
            let stop = std::sync::Arc::clone(&stop);
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let (mut ok, mut failed) = (0u32, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let resp = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .header("x-tenant", "swapper")
                        .body("\"Ada\"")
                        .send()
                        .await
                        .unwrap();
                    if resp.status() == 200 {
                        ok += 1;
                    } else {
                        failed.push(resp.text().await.unwrap());
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    for i in 0..20 {
        let header = if i % 2 == 0 { "x-tenant" } else { "x-org" };
        let (status, body) = load(
            &sluice,
            "swap",
            "tenant-header",
            &format!("hook=extract&config.scope-header={header}"),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for client in clients {
        let (ok, failed) = client.await.unwrap();
        assert!(failed.is_empty(), "{failed:?}");
        total += ok;
    }
    assert!(total > 100, "only {total} calls ran during the swaps");
}

#[tokio::test]
async fn the_plugins_cli() {
    let (sluice, _dep) = flow_controlled().await;
    let run = |args: &[&str]| sluice_tests::cli(&sluice, "plugins", args);
    let wasm = plugin_wasm("tenant-header");
    let wasm = wasm.to_str().unwrap();
    let (ok, out) = run(&[
        "load",
        "tenants",
        wasm,
        "--hook",
        "extract",
        "--deadline",
        "1s",
        "--config",
        "scope-header=x-t",
    ]);
    assert!(
        ok && out.contains("loaded tenants (extract) sha256 "),
        "{out}"
    );
    let (status, _, _) = greet(&sluice, &[("x-t", "cli")]).await;
    assert_eq!(status, 200);
    let (ok, out) = run(&["list"]);
    assert!(
        ok && out.contains("NAME") && out.contains("tenants"),
        "{out}"
    );
    assert!(
        out.contains("extract") && out.contains(" 1 "),
        "one call: {out}"
    );
    let (ok, out) = run(&["list", "--json"]);
    assert!(ok && out.contains("\"scope-header\": \"x-t\""), "{out}");
    let (ok, out) = run(&[
        "load", "x", wasm, "--hook", "extract", "--config", "novalue",
    ]);
    assert!(!ok && out.contains("write it as key=value"), "{out}");
    let (ok, out) = run(&["unload", "tenants"]);
    assert!(ok && out.contains("unloaded tenants"), "{out}");
    let (ok, out) = run(&["unload", "tenants"]);
    assert!(!ok && out.contains("PLG0006"), "{out}");
}
