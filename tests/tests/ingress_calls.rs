//! Calls and sends through the ingress, run durably on real SDK deployments.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment};

async fn call(
    sluice: &Sluice,
    method: reqwest::Method,
    path: &str,
    body: Option<&str>,
) -> reqwest::Response {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", sluice.ingress_url));
    if let Some(body) = body {
        req = req
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn calls_run_handlers_durably() {
    let sluice = Sluice::builder().start().await.unwrap();
    let dep = TestDeployment::start("v1").await.unwrap();
    sluice.register(&dep.uri, false).await;
    let post = reqwest::Method::POST;

    let resp = call(
        &sluice,
        post.clone(),
        "/service/call/Greeter/greet",
        Some("\"Bob\""),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let id = resp.headers()["x-service-id"].to_str().unwrap().to_owned();
    assert!(id.starts_with("inv_1") && id.len() == 38, "{id}");
    assert_eq!(resp.headers()["x-restate-id"].to_str().unwrap(), id);
    assert_eq!(resp.text().await.unwrap(), "\"Hello, Bob!\"");

    for path in ["/restate/call/Greeter/greet", "/Greeter/greet"] {
        let resp = call(&sluice, post.clone(), path, Some("\"Ann\"")).await;
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(resp.text().await.unwrap(), "\"Hello, Ann!\"");
    }
    // ctx.sleep through a durable timer; ctx.run through the journal.
    let resp = call(
        &sluice,
        post.clone(),
        "/service/call/Greeter/slow",
        Some("150"),
    )
    .await;
    assert_eq!(
        (resp.status(), resp.text().await.unwrap()),
        (StatusCode::OK, "150".to_owned())
    );
    let resp = call(&sluice, post.clone(), "/service/call/Greeter/stamp", None).await;
    assert_eq!(resp.status(), 200);

    // A terminal error comes back with its code, from the invocation.
    let resp = call(
        &sluice,
        post.clone(),
        "/service/call/Greeter/fail",
        Some("\"boom\""),
    )
    .await;
    assert_eq!(resp.status(), 500);
    assert_eq!(resp.headers()["x-service-error-source"], "invocation");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body,
        json!({"code": 500, "message": "boom", "error_code": null, "source": "invocation"})
    );
    // A handler-chosen code is the answer's status.
    let resp = call(
        &sluice,
        post.clone(),
        "/service/call/Greeter/fail",
        Some("\"418:short and stout\""),
    )
    .await;
    assert_eq!(resp.status(), 418);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body,
        json!({"code": 418, "message": "short and stout", "error_code": null, "source": "invocation"})
    );

    // Sends answer once durable.
    let resp = call(
        &sluice,
        post.clone(),
        "/service/send/Greeter/greet",
        Some("\"Eve\""),
    )
    .await;
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "Accepted");
    assert!(body["invocationId"].as_str().unwrap().starts_with("inv_1"));
    let resp = call(
        &sluice,
        post.clone(),
        "/service/send/Greeter/greet?delay=PT1S",
        Some("\"Eve\""),
    )
    .await;
    let body: Value = resp.json().await.unwrap();
    assert!(body["executionTime"].as_str().is_some(), "{body}");

    let resp = call(&sluice, reqwest::Method::GET, "/service/health", None).await;
    assert_eq!(resp.status(), 200);
    let health: Value = resp.json().await.unwrap();
    assert_eq!(health["services"].as_array().unwrap().len(), 4);
}

/// One bad request: how it is sent, and the status, code and message part it must get.
struct BadCase {
    method: reqwest::Method,
    path: &'static str,
    content_type: &'static str,
    body: Option<&'static str>,
    status: u16,
    code: Option<&'static str>,
    says: &'static str,
}

#[tokio::test]
async fn bad_requests_are_rejected_with_their_codes() {
    let sluice = Sluice::builder().start().await.unwrap();
    let dep = TestDeployment::start("v1").await.unwrap();
    sluice.register(&dep.uri, false).await;
    let post = |path, body, status, code, says| BadCase {
        method: reqwest::Method::POST,
        path,
        content_type: "application/json",
        body,
        status,
        code,
        says,
    };
    let get = |path, status, code, says| BadCase {
        method: reqwest::Method::GET,
        path,
        content_type: "application/json",
        body: None,
        status,
        code: Some(code),
        says,
    };
    let id = "\"inv_1aA6MMRWDzRL5BYD303UK7dAgFVoIHpF1T\"";
    let too_many: &'static str =
        Box::leak(format!("[{}]", vec![id; 101].join(",")).into_boxed_str());
    let cases = [
        post(
            "/service/call/Nope/x",
            Some("1"),
            404,
            Some("RT0018"),
            "service 'Nope' not found",
        ),
        post(
            "/service/call/Greeter/nope",
            Some("1"),
            404,
            Some("RT0018"),
            "handler 'nope' was not found",
        ),
        post(
            "/service/call/Greeter/greet?delay=1s",
            Some("\"x\""),
            400,
            Some("ING0001"),
            "delay query parameter with calls",
        ),
        post(
            "/service/call/Greeter/greet",
            None,
            400,
            Some("ING0001"),
            "empty body not allowed",
        ),
        post(
            "/service/call/Counter/add",
            Some("1"),
            400,
            Some("ING0001"),
            "with a key",
        ),
        post(
            "/service/scope/a:b/call/Greeter/greet",
            Some("\"x\""),
            400,
            Some("RT0024"),
            "invalid scope 'a:b'",
        ),
        post(
            "/service/call/Greeter/greet?limit-key=gold",
            Some("\"x\""),
            400,
            Some("RT0024"),
            "requires a scope",
        ),
        post(
            "/service/call/Greeter",
            Some("1"),
            400,
            Some("ING0001"),
            "bad path",
        ),
        BadCase {
            method: reqwest::Method::PUT,
            ..post(
                "/service/call/Greeter/greet",
                Some("1"),
                405,
                Some("ING0004"),
                "not allowed",
            )
        },
        BadCase {
            content_type: "text/plain",
            ..post(
                "/service/call/Greeter/greet",
                Some("hi"),
                400,
                Some("ING0001"),
                "content-type 'text/plain' does not match",
            )
        },
        // The routes that name an invocation: an unknown one, a malformed one, a list too long
        // or with a bad entry, a target nothing matches.
        get(
            "/restate/invocation/inv_1aA6MMRWDzRL5BYD303UK7dAgFVoIHpF1T/status",
            404,
            "ING0002",
            "not found",
        ),
        get(
            "/restate/invocation/inv_1aA6MMRWDzRL5BYD303UK7dAgFVoIHpF1T/output",
            404,
            "ING0002",
            "not found",
        ),
        get(
            "/restate/invocation/nope/status",
            400,
            "ING0001",
            "bad invocation id",
        ),
        get("/service/attach/nope", 400, "ING0001", "bad invocation id"),
        get(
            "/restate/workflow/Signup/nobody/output",
            404,
            "ING0002",
            "not found",
        ),
        post(
            "/restate/status",
            Some(too_many),
            400,
            Some("ING0001"),
            "more than 100 targets",
        ),
        post(
            "/restate/status",
            Some("[0]"),
            400,
            Some("ING0001"),
            "entry 0",
        ),
        post(
            "/restate/status",
            Some("{\"target\":\"nope\"}"),
            400,
            Some("ING0001"),
            "bad status body",
        ),
        post(
            "/restate/lookup",
            Some(
                r#"{"target":"idempotentInvocation","service":"Greeter","handler":"greet","idempotencyKey":"none"}"#,
            ),
            404,
            Some("ING0002"),
            "no invocation matches",
        ),
        post(
            "/restate/attach",
            Some(
                r#"{"target":"workflow","workflowName":"Signup","workflowKey":"k","scope":"a:b"}"#,
            ),
            400,
            Some("RT0024"),
            "invalid scope 'a:b'",
        ),
        post(
            "/restate/lookup",
            Some(
                r#"{"target":"idempotentInvocation","service":"Greeter","handler":"greet","idempotencyKey":"k","scope":"a:b"}"#,
            ),
            400,
            Some("RT0024"),
            "invalid scope 'a:b'",
        ),
        post(
            "/restate/awakeables/nope/resolve",
            Some("1"),
            400,
            Some("ING0001"),
            "awakeable",
        ),
    ];
    for case in cases {
        let mut request = reqwest::Client::new().request(
            case.method.clone(),
            format!("{}{}", sluice.ingress_url, case.path),
        );
        if let Some(body) = case.body {
            request = request.header("content-type", case.content_type).body(body);
        }
        let resp = request.send().await.unwrap();
        let what = format!("{} {}", case.method, case.path);
        let status = resp.status().as_u16();
        let code = resp
            .headers()
            .get("x-service-error-code")
            .map(|v| v.to_str().unwrap().to_owned());
        let body: Value = resp.json().await.unwrap();
        assert_eq!(status, case.status, "{what}: {body}");
        assert_eq!(code.as_deref(), case.code, "{what}: header, {body}");
        assert_eq!(body["error_code"].as_str(), case.code, "{what}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains(case.says), "{what}: {body}");
    }
}

#[tokio::test]
async fn typescript_request_response_over_http11() {
    let sluice = Sluice::builder().start().await.unwrap();
    let dep = TestDeployment::typescript("h1").await.unwrap();
    sluice.register(&dep.uri, true).await;
    let resp = call(
        &sluice,
        reqwest::Method::POST,
        "/service/call/TsGreeter/greet",
        Some("\"Ada\""),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "\"Hello, Ada!\"");
}

#[tokio::test]
async fn get_calls_and_delayed_sends() {
    let sluice = Sluice::builder().start().await.unwrap();
    let dep = TestDeployment::start("v1").await.unwrap();
    sluice.register(&dep.uri, false).await;
    let counts = || async {
        let resp = call(
            &sluice,
            reqwest::Method::GET,
            "/service/call/Meter/counts",
            None,
        )
        .await;
        assert_eq!(resp.status(), 200, "GET is accepted like POST");
        resp.text().await.unwrap()
    };
    assert_eq!(counts().await, "\"0/0\"");
    let sent = std::time::Instant::now();
    let resp = call(
        &sluice,
        reqwest::Method::POST,
        "/service/send/Meter/work?delay=1s",
        Some("0"),
    )
    .await;
    assert_eq!(resp.status(), 202);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(counts().await, "\"0/0\"", "not before its delay");
    loop {
        if counts().await == "\"1/1\"" {
            break;
        }
        assert!(
            sent.elapsed() < std::time::Duration::from_secs(15),
            "the delayed send never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(sent.elapsed() >= std::time::Duration::from_secs(1));
}

#[tokio::test]
async fn virtual_object_state_persists_per_key_eagerly_and_lazily() {
    // Default: state travels in the Start message. Limit 0: every read is a lazy round trip.
    for eager_limit in [None, Some("0")] {
        let dep = TestDeployment::start("v1").await.unwrap();
        let mut builder = Sluice::builder();
        if let Some(limit) = eager_limit {
            builder = builder.env("SERVICE_WORKER__INVOKER__EAGER_STATE_SIZE_LIMIT", limit);
        }
        let sluice = builder.start().await.unwrap();
        sluice.register(&dep.uri, false).await;
        let post = reqwest::Method::POST;
        for (path, body, want) in [
            ("/service/call/Counter/k1/add", Some("5"), "5"),
            ("/service/call/Counter/k1/add", Some("3"), "8"),
            ("/service/call/Counter/k2/add", Some("1"), "1"),
            ("/service/call/Counter/k1/get", None, "8"),
            ("/service/call/Counter/k3/get", None, "0"),
        ] {
            let resp = call(&sluice, post.clone(), path, body).await;
            assert_eq!(
                (resp.status(), resp.text().await.unwrap()),
                (StatusCode::OK, want.to_owned()),
                "{path} with eager limit {eager_limit:?}"
            );
        }
    }
}

#[tokio::test]
async fn exclusive_handlers_of_one_object_run_one_at_a_time_and_shared_ones_alongside() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let client = reqwest::Client::new();
    let add = |path: &'static str, body: &'static str| {
        client
            .post(format!("{}{path}", sluice.ingress_url))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let read = |path: &'static str| client.post(format!("{}{path}", sluice.ingress_url)).send();
    // 100 concurrent read-modify-write calls on one key: none is lost.
    let calls: Vec<_> = (0..100)
        .map(|_| tokio::spawn(add("/service/call/Counter/hot/add", "1")))
        .collect();
    let mut values = Vec::new();
    for call in calls {
        let resp = call.await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
        values.push(resp.text().await.unwrap().parse::<u64>().unwrap());
    }
    values.sort_unstable();
    assert_eq!(
        values,
        (1..=100).collect::<Vec<u64>>(),
        "each add saw the one before"
    );
    let total = read("/service/call/Counter/hot/get").await.unwrap();
    assert_eq!(total.text().await.unwrap(), "100");

    // A sleeping exclusive handler keeps the lock: the next add waits for it, a shared get
    // does not.
    let slow = tokio::spawn(add("/service/call/Counter/hot/addSlowly", "1500"));
    // It holds the object's lock (every add before it completed and let go).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sluice
        .count("SELECT count(*) AS n FROM sys_locks WHERE service_name = 'Counter' AND service_key = 'hot'")
        .await
        == 0
    {
        assert!(std::time::Instant::now() < deadline, "addSlowly never took the lock");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let queued = tokio::spawn(add("/service/call/Counter/hot/add", "1"));
    let started = std::time::Instant::now();
    let during = read("/service/call/Counter/hot/get").await.unwrap();
    assert_eq!(
        during.text().await.unwrap(),
        "100",
        "shared read while add sleeps"
    );
    assert!(started.elapsed() < std::time::Duration::from_millis(1000));
    let slow = slow.await.unwrap().unwrap();
    assert_eq!(slow.text().await.unwrap(), "110");
    let queued = queued.await.unwrap().unwrap();
    assert_eq!(
        queued.text().await.unwrap(),
        "111",
        "ran after the sleeping add"
    );
    let overlaps = read("/service/call/Counter/hot/overlaps").await.unwrap();
    assert_eq!(overlaps.text().await.unwrap(), "0");
}

#[tokio::test]
async fn handlers_call_and_send_to_each_other() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().quick_retries().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let post = reqwest::Method::POST;
    // A call: the callee's result comes back to the caller.
    for want in ["1", "2"] {
        let resp = call(
            &sluice,
            post.clone(),
            "/service/call/Greeter/addVia",
            Some("\"via\""),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), want);
    }
    // Two calls with one idempotency key run the callee once; both get its result.
    let resp = call(
        &sluice,
        post.clone(),
        "/service/call/Meter/addOnce",
        Some("\"once\""),
    )
    .await;
    assert_eq!(resp.text().await.unwrap(), "\"1/1\"");
    let resp = call(
        &sluice,
        post.clone(),
        "/service/call/Counter/once/get",
        None,
    )
    .await;
    assert_eq!(resp.text().await.unwrap(), "1");

    // A callee's terminal failure propagates to the caller as its own.
    let resp = call(
        &sluice,
        post.clone(),
        "/service/call/Meter/failVia",
        Some("\"409:taken\""),
    )
    .await;
    assert_eq!(resp.status(), 409);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["message"], "taken");

    // A delayed send: the caller answers at once, the callee runs a second later.
    let started = std::time::Instant::now();
    let resp = call(
        &sluice,
        post.clone(),
        "/service/call/Meter/addLater",
        Some("\"later\""),
    )
    .await;
    assert_eq!(resp.text().await.unwrap(), "\"sent\"");
    let read = |path: &'static str| {
        reqwest::Client::new()
            .post(format!("{}{path}", sluice.ingress_url))
            .send()
    };
    let now = read("/service/call/Counter/later/get").await.unwrap();
    assert_eq!(now.text().await.unwrap(), "0", "not yet");
    loop {
        let seen = read("/service/call/Counter/later/get").await.unwrap();
        if seen.text().await.unwrap() == "1" {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the delayed send never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));

    // A call to an unknown service is refused with RT0018 and the caller retried.
    let sent: Value = call(
        &sluice,
        post.clone(),
        "/service/send/Meter/callMissing",
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    let id = sent["invocationId"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let seen: Value = reqwest::get(format!("{}/invocations/{id}", sluice.admin_url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if seen["last_failure_error_code"] == "RT0018" && seen["retry_count"].as_u64() >= Some(2) {
            assert!(
                seen["last_failure"].as_str().unwrap().contains("Missing"),
                "{seen}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never refused: {seen}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn awakeables_are_completed_over_the_ingress_and_by_handlers() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let ingress = sluice.ingress_url.clone();
    let post = |path: String, body: Option<String>| {
        let mut req = reqwest::Client::new().post(format!("{ingress}{path}"));
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body);
        }
        req.send()
    };
    let mut previous = String::new();
    for (how, want_status, want_body) in [
        ("resolve", 200, "\"hello\""),
        ("reject", 500, "nope"),
        ("handler", 200, "\"from a handler\""),
    ] {
        let waiting = tokio::spawn(post("/service/call/Meter/awaitAwakeable".into(), None));
        let id = sluice_tests::next_awakeable(&ingress, "Meter", &previous).await;
        assert!(id.starts_with("sign_1"), "{id}");
        previous = id.clone();
        let done = match how {
            "resolve" => {
                post(
                    format!("/service/awakeables/{id}/resolve"),
                    Some("\"hello\"".into()),
                )
                .await
            }
            "reject" => post(format!("/restate/a/{id}/reject"), Some("nope".into())).await,
            _ => {
                let body = format!("\"{id}\"");
                post("/service/call/Meter/resolveAwakeable".into(), Some(body)).await
            }
        }
        .unwrap();
        assert!(done.status().is_success(), "{how}: {}", done.status());
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("the waiting handler answers")
            .unwrap()
            .unwrap();
        assert_eq!(answer.status().as_u16(), want_status, "{how}");
        let text = answer.text().await.unwrap();
        assert!(text.contains(want_body), "{how}: {text}");
    }
    // Bad and unknown awakeable ids.
    let bad = post(
        "/service/awakeables/sign_1nope/resolve".into(),
        Some("1".into()),
    )
    .await
    .unwrap();
    assert_eq!(bad.status(), 400);
    // Index 17, the first a handler can create, of an invocation that does not exist.
    let unknown = "sign_1AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEQ";
    let missing = post(
        format!("/service/awakeables/{unknown}/resolve"),
        Some("1".into()),
    )
    .await
    .unwrap();
    assert_eq!(missing.status(), 404);
}

#[tokio::test]
async fn attach_and_output_by_invocation_id() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let sent: Value = call(
        &sluice,
        reqwest::Method::POST,
        "/service/send/Greeter/slow",
        Some("700"),
    )
    .await
    .json()
    .await
    .unwrap();
    let id = sent["invocationId"].as_str().unwrap().to_owned();
    let get = |path: String| reqwest::get(format!("{}{path}", sluice.ingress_url));
    let early = get(format!("/service/output/{id}")).await.unwrap();
    assert_eq!(early.status().as_u16(), 470);
    let attached = get(format!("/service/attach/{id}")).await.unwrap();
    assert_eq!(attached.status(), 200);
    assert_eq!(attached.headers()["x-service-id"], id.as_str());
    assert_eq!(attached.text().await.unwrap(), "700");
    for path in [
        format!("/service/output/{id}"),
        format!("/restate/attach/{id}"),
        format!("/restate/invocation/{id}/output"),
    ] {
        let resp = get(path.clone()).await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(resp.text().await.unwrap(), "700", "{path}");
    }
    assert_eq!(
        get("/service/attach/inv_1bad".into())
            .await
            .unwrap()
            .status(),
        400
    );
    let unknown = "inv_1gdJBtdVEcM942bjcDmb1c1khoaJe11Hbz";
    assert_eq!(
        get(format!("/service/output/{unknown}"))
            .await
            .unwrap()
            .status(),
        404
    );
}

#[tokio::test]
async fn idempotency_keys_dedupe_calls_and_sends_until_their_retention_ends() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let idempotent = |path: &str, key: &str, body: &str| {
        reqwest::Client::new()
            .post(format!("{}{path}", sluice.ingress_url))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
    };
    // A repeated call attaches to the first one, whatever its body.
    let first = idempotent("/service/call/Greeter/greet", "k1", "\"a\"")
        .await
        .unwrap();
    let id = first.headers()["x-service-id"].to_str().unwrap().to_owned();
    assert!(first.headers().contains_key("idempotency-expires"));
    assert_eq!(first.text().await.unwrap(), "\"Hello, a!\"");
    let again = idempotent("/service/call/Greeter/greet", "k1", "\"b\"")
        .await
        .unwrap();
    assert_eq!(again.headers()["x-service-id"], id.as_str());
    assert_eq!(again.text().await.unwrap(), "\"Hello, a!\"");

    // The same invocation by target body: lookup, attach, output.
    let by_target = |action: &str, body: Value| {
        reqwest::Client::new()
            .post(format!("{}/service/{action}", sluice.ingress_url))
            .json(&body)
            .send()
    };
    let target = json!({"target": "idempotentInvocation", "service": "Greeter", "handler": "greet", "idempotencyKey": "k1"});
    let found: Value = by_target("lookup", target.clone())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(found["invocationId"], id.as_str());
    let attached = by_target("attach", target).await.unwrap();
    assert_eq!(attached.text().await.unwrap(), "\"Hello, a!\"");
    let output = by_target(
        "output",
        json!({"target": "invocation", "invocationId": id}),
    )
    .await
    .unwrap();
    assert_eq!(output.text().await.unwrap(), "\"Hello, a!\"");
    let nothing = json!({"target": "idempotentInvocation", "service": "Greeter", "handler": "greet", "idempotencyKey": "never"});
    assert_eq!(by_target("lookup", nothing).await.unwrap().status(), 404);
    let garbage = by_target("attach", json!({"target": "nonsense"}))
        .await
        .unwrap();
    assert_eq!(garbage.status(), 400);

    // A repeated send is previously accepted, with the same id.
    let mut seen = Vec::new();
    for _ in 0..2 {
        let sent: Value = idempotent("/service/send/Greeter/greet", "s1", "\"c\"")
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        seen.push((sent["invocationId"].clone(), sent["status"].clone()));
    }
    assert_eq!(seen[0].0, seen[1].0);
    assert_eq!(
        (seen[0].1.as_str(), seen[1].1.as_str()),
        (Some("Accepted"), Some("PreviouslyAccepted"))
    );

    // With a short retention the key is free again once the result expires.
    let patched = reqwest::Client::new()
        .patch(format!("{}/services/Greeter", sluice.admin_url))
        .json(&json!({"idempotency_retention": "1s"}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);
    let short = idempotent("/service/call/Greeter/greet", "k2", "\"x\"")
        .await
        .unwrap();
    assert_eq!(short.text().await.unwrap(), "\"Hello, x!\"");
    let stored = std::time::Instant::now();
    // The retained result answers until it expires (a repeat never runs the call); then the
    // key runs afresh.
    loop {
        let again = idempotent("/service/call/Greeter/greet", "k2", "\"y\"")
            .await
            .unwrap();
        match again.text().await.unwrap().as_str() {
            "\"Hello, y!\"" => break,
            "\"Hello, x!\"" => assert!(
                stored.elapsed() < std::time::Duration::from_secs(15),
                "the 1 s retention never expired"
            ),
            other => panic!("neither the retained result nor a fresh run: {other}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        stored.elapsed() >= std::time::Duration::from_millis(900),
        "ran again {:?} after the result was stored, before its 1 s retention",
        stored.elapsed()
    );

    let empty = idempotent("/service/call/Greeter/greet", "", "\"z\"")
        .await
        .unwrap();
    assert_eq!(empty.status(), 400);
}

#[tokio::test]
async fn workflows_run_once_and_wait_on_promises_completed_by_shared_handlers() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let post = reqwest::Method::POST;
    let get = |path: String| reqwest::get(format!("{}{path}", sluice.ingress_url));

    let sent: Value = call(
        &sluice,
        post.clone(),
        "/service/send/Signup/ann/run",
        Some("\"ann@example.com\""),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(sent["status"], "Accepted");
    // The run waits on its promise: no output yet, and the promise is open.
    let early = get("/service/workflow/Signup/ann/output".into())
        .await
        .unwrap();
    assert_eq!(early.status().as_u16(), 470);
    let peek = call(&sluice, post.clone(), "/service/call/Signup/ann/peek", None).await;
    assert_eq!(peek.text().await.unwrap(), "\"open\"");
    // A second run of the same key is refused.
    let twice = call(
        &sluice,
        post.clone(),
        "/service/call/Signup/ann/run",
        Some("\"ann@example.com\""),
    )
    .await;
    assert_eq!(twice.status(), 409);
    assert!(twice.text().await.unwrap().contains("already invoked"));

    // A shared handler completes the promise; the run finishes with it.
    let attached = tokio::spawn(get("/service/workflow/Signup/ann/attach".into()));
    let approved = call(
        &sluice,
        post.clone(),
        "/service/call/Signup/ann/approve",
        Some("\"yes\""),
    )
    .await;
    assert_eq!(approved.status(), 200);
    let attached = tokio::time::timeout(std::time::Duration::from_secs(10), attached)
        .await
        .expect("the run completes")
        .unwrap()
        .unwrap();
    assert_eq!(attached.status(), 200);
    assert_eq!(
        attached.text().await.unwrap(),
        "\"signed up ann@example.com: yes\""
    );
    let peek = call(&sluice, post.clone(), "/service/call/Signup/ann/peek", None).await;
    assert_eq!(peek.text().await.unwrap(), "\"yes\"");
    let status = call(
        &sluice,
        post.clone(),
        "/service/call/Signup/ann/status",
        None,
    )
    .await;
    assert_eq!(status.text().await.unwrap(), "\"yes\"");
    let output = get("/restate/workflow/Signup/ann/output".into())
        .await
        .unwrap();
    assert_eq!(output.status(), 200);
    let by_body = reqwest::Client::new()
        .post(format!("{}/restate/output", sluice.ingress_url))
        .json(&json!({"target": "workflow", "workflowName": "Signup", "workflowKey": "ann"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        by_body.text().await.unwrap(),
        "\"signed up ann@example.com: yes\""
    );
}

#[tokio::test]
async fn typescript_objects_calls_and_awakeables_in_both_protocol_modes() {
    for (mode, http11) in [("h2", false), ("h1", true)] {
        let sluice = Sluice::builder().start().await.unwrap();
        let dep = TestDeployment::typescript(mode).await.unwrap();
        sluice.register(&dep.uri, http11).await;
        let client = reqwest::Client::new();
        let post = |path: String, body: Option<String>| {
            let mut req = client.post(format!("{}{path}", sluice.ingress_url));
            if let Some(body) = body {
                req = req.header("content-type", "application/json").body(body);
            }
            req.send()
        };
        // Concurrent exclusive adds on one key: none lost.
        let adds: Vec<_> = (0..30)
            .map(|_| {
                tokio::spawn(post(
                    "/service/call/TsCounter/hot/add".into(),
                    Some("1".into()),
                ))
            })
            .collect();
        for add in adds {
            assert_eq!(add.await.unwrap().unwrap().status(), 200, "{mode}");
        }
        let total = post("/service/call/TsCounter/hot/get".into(), None)
            .await
            .unwrap();
        assert_eq!(total.text().await.unwrap(), "30", "{mode}");
        // A call between handlers.
        let via = post(
            "/service/call/TsGreeter/addVia".into(),
            Some("\"hot\"".into()),
        )
        .await
        .unwrap();
        assert_eq!(via.text().await.unwrap(), "31", "{mode}");
        // An awakeable resolved over the ingress.
        let waiting = tokio::spawn(post("/service/call/TsGreeter/awaitAwakeable".into(), None));
        let id = sluice_tests::next_awakeable(&sluice.ingress_url, "TsGreeter", "").await;
        let resolved = post(
            format!("/service/awakeables/{id}/resolve"),
            Some("\"ts\"".into()),
        )
        .await
        .unwrap();
        assert_eq!(resolved.status(), 202, "{mode}");
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("the awakeable resolves the handler")
            .unwrap()
            .unwrap();
        assert_eq!(answer.text().await.unwrap(), "\"ts\"", "{mode}");
    }
}

#[tokio::test]
async fn client_sent_internal_headers_never_reach_the_handler() {
    let sluice = Sluice::builder().start().await.unwrap();
    let dep = TestDeployment::start("v1").await.unwrap();
    sluice.register(&dep.uri, false).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/service/call/Meter/headers", sluice.ingress_url))
        .header("x-restate-ingress-path", "/forged")
        .header("X-Restate-Anything", "y")
        .header("x-service-whatever", "z")
        .header("x-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let headers: Vec<String> = resp.json().await.unwrap();
    assert!(
        headers.contains(&"x-tenant: acme".to_owned()),
        "other headers reach the handler: {headers:?}"
    );
    assert_eq!(
        headers
            .iter()
            .filter(|h| h.starts_with("x-restate-") || h.starts_with("x-service-"))
            .collect::<Vec<_>>(),
        ["x-restate-ingress-path: /service/call/Meter/headers"],
        "only the edge's own ingress path, none the client sent"
    );
}
