//! Registering real SDK deployments through the admin API, and every way it can fail.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment, get_json, post_json};

async fn patch(url: &str, body: Value) -> (StatusCode, Value) {
    send(reqwest::Method::PATCH, url, body).await
}

async fn send(method: reqwest::Method, url: &str, body: Value) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .request(method, url)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn assert_code(body: &Value, code: &str) {
    assert_eq!(body["restate_code"], code, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("[{code}]")),
        "{body}"
    );
}

#[tokio::test]
async fn register_list_describe_a_real_sdk_deployment() {
    let sluice = Sluice::builder().start().await.unwrap();
    let dep = TestDeployment::start("v1").await.unwrap();
    let admin = &sluice.admin_url;
    let resp = reqwest::Client::new()
        .post(format!("{admin}/deployments"))
        .json(&json!({"uri": dep.uri, "additional_headers": {"x-secret": "s3cret"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let location = resp.headers()["location"].to_str().unwrap().to_owned();
    let body: Value = resp.json().await.unwrap();
    let id = body["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("dp_1") && id.len() == 26, "{id}");
    assert_eq!(location, format!("deployments/{id}"));
    assert_eq!(
        (
            body["min_protocol_version"].as_i64(),
            body["max_protocol_version"].as_i64()
        ),
        (Some(5), Some(7))
    );
    assert_eq!(body["sdk_version"], "restate-sdk-rust/0.13.0");
    assert_eq!(body["services"].as_array().unwrap().len(), 4);

    let (status, list) = get_json(&format!("{admin}/deployments")).await;
    assert_eq!(status, 200);
    let listed = &list["deployments"][0];
    assert_eq!(listed["id"], id.as_str());
    assert_eq!(listed["protocol_type"], "BidiStream");
    assert_eq!(listed["http_version"], "HTTP/2.0");
    assert_eq!(listed["additional_headers"]["x-secret"], "<redacted>");
    assert!(
        listed["services"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["revision"] == 1)
    );

    let (_, detail) = get_json(&format!("{admin}/v4/deployments/{id}")).await;
    assert_eq!(detail["services"].as_array().unwrap().len(), 4);

    let (_, counter) = get_json(&format!("{admin}/services/Counter")).await;
    assert_eq!(counter["ty"], "VirtualObject");
    assert_eq!(counter["deployment_id"], id.as_str());
    let types: Vec<(&str, &str)> = counter["handlers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["name"].as_str().unwrap(), h["ty"].as_str().unwrap()))
        .collect();
    assert!(
        types.contains(&("add", "Exclusive")) && types.contains(&("get", "Shared")),
        "{types:?}"
    );
    let (_, signup) = get_json(&format!("{admin}/services/Signup")).await;
    assert_eq!(signup["ty"], "Workflow");
    assert_eq!(signup["workflow_completion_retention"], "24h");
    let (_, greet) = get_json(&format!("{admin}/services/Greeter/handlers/greet")).await;
    assert_eq!(greet["input_description"], "application/json");
    assert!(
        greet.get("ty").is_none(),
        "plain service handlers have no type: {greet}"
    );
    let (_, handlers) = get_json(&format!("{admin}/services/Greeter/handlers")).await;
    assert_eq!(handlers["handlers"].as_array().unwrap().len(), 5);

    let (status, missing) = get_json(&format!("{admin}/services/Nope")).await;
    assert_eq!(status, 404);
    assert_eq!(
        missing["message"],
        "[ADM0003] The requested service 'Nope' does not exist"
    );
    assert_eq!(missing["restate_code"], "ADM0003");
    let (status, missing) = get_json(&format!("{admin}/services/Greeter/handlers/nope")).await;
    assert_eq!(status, 404);
    assert_eq!(
        missing["message"],
        "[ADM0003] The requested handler 'nope' on service 'Greeter' does not exist"
    );
    let (status, bad) = get_json(&format!("{admin}/deployments/dp_nope")).await;
    assert_eq!(status, 400);
    assert!(
        bad["message"]
            .as_str()
            .unwrap()
            .starts_with("[ADM0002] The request field 'deployment' is invalid")
    );

    let (status, openapi) = get_json(&format!("{admin}/services/Counter/openapi")).await;
    assert_eq!(status, 200);
    assert!(
        openapi["paths"]["/service/call/Counter/{key}/add"].is_object(),
        "{openapi}"
    );
    let (_, admin_doc) = get_json(&format!("{admin}/openapi")).await;
    assert!(admin_doc["paths"]["/deployments/{deployment}"]["patch"].is_object());

    let (status, patched) = patch(
        &format!("{admin}/services/Greeter"),
        json!({"idempotency_retention": "2h"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(patched["idempotency_retention"], "2h");
}

#[tokio::test]
async fn reregistering_conflicts_and_force() {
    let sluice = Sluice::builder().start().await.unwrap();
    let admin = &sluice.admin_url;
    let port = sluice_tests::free_port();
    let v1 = TestDeployment::start_on(port, "v1").await.unwrap();
    let (status, first) = post_json(&format!("{admin}/deployments"), json!({"uri": v1.uri})).await;
    assert_eq!(status, 201);

    // Unchanged: 200, same id.
    let (status, again) = post_json(&format!("{admin}/deployments"), json!({"uri": v1.uri})).await;
    assert_eq!(status, 200);
    assert_eq!(again["id"], first["id"]);

    // The endpoint now serves a different manifest.
    drop(v1);
    let v2 = TestDeployment::start_on(port, "v2").await.unwrap();
    let (status, conflict) =
        post_json(&format!("{admin}/deployments"), json!({"uri": v2.uri})).await;
    assert_eq!(status, 409);
    assert_code(&conflict, "META0004");
    let (status, forced) = post_json(
        &format!("{admin}/deployments"),
        json!({"uri": v2.uri, "force": true}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(forced["id"], first["id"]);
    let greeter = forced["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "Greeter")
        .unwrap();
    assert_eq!(greeter["revision"], 2);
    assert_eq!(greeter["handlers"].as_array().unwrap().len(), 6);

    // Another endpoint makes Greeter a virtual object.
    let object = TestDeployment::start("object").await.unwrap();
    let (status, changed) =
        post_json(&format!("{admin}/deployments"), json!({"uri": object.uri})).await;
    assert_eq!(status, 409);
    assert_code(&changed, "META0006");
    let (status, _) = post_json(
        &format!("{admin}/deployments"),
        json!({"uri": object.uri, "dry_run": true, "breaking": true}),
    )
    .await;
    // A new deployment's dry run is 201, as the reference answers (its CLI reads a 200 as
    // "already exists" and registers nothing).
    assert_eq!(status, 201);
    let (_, list) = get_json(&format!("{admin}/deployments")).await;
    assert_eq!(
        list["deployments"].as_array().unwrap().len(),
        1,
        "a dry run stores nothing"
    );
}

#[tokio::test]
async fn in_place_updates_and_meta0016_and_meta0017() {
    let sluice = Sluice::builder().start().await.unwrap();
    let admin = &sluice.admin_url;
    let a = TestDeployment::start("v1").await.unwrap();
    let b = TestDeployment::start("v1").await.unwrap();
    let fewer = TestDeployment::start("fewer").await.unwrap();
    let (status, da) = post_json(&format!("{admin}/deployments"), json!({"uri": a.uri})).await;
    assert_eq!(status, 201, "{da}");
    let (status, db) = post_json(
        &format!("{admin}/deployments"),
        json!({"uri": b.uri, "force": true}),
    )
    .await;
    assert_eq!(status, 201, "{db}");
    let id_b = db["id"].as_str().unwrap();

    // A handler is gone at the new endpoint: refused.
    let (status, refused) = patch(
        &format!("{admin}/deployments/{id_b}"),
        json!({"uri": fewer.uri}),
    )
    .await;
    assert_eq!(status, 400);
    assert_code(&refused, "META0016");

    // Same services at A's URI: accepted, and now two deployments share it (the PUT spelling
    // of the same in-place update, as the reference lists it).
    let (status, moved) = send(
        reqwest::Method::PUT,
        &format!("{admin}/deployments/{id_b}"),
        json!({"uri": a.uri}),
    )
    .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["uri"], a.uri.as_str());
    let (status, ambiguous) = post_json(
        &format!("{admin}/deployments"),
        json!({"uri": a.uri, "force": true}),
    )
    .await;
    assert_eq!(status, 409);
    assert_code(&ambiguous, "META0017");
    assert!(
        ambiguous["message"]
            .as_str()
            .unwrap()
            .contains(da["id"].as_str().unwrap())
    );

    // Removing one: 202, then 404.
    let resp = reqwest::Client::new()
        .delete(format!("{admin}/deployments/{id_b}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let (status, _) = get_json(&format!("{admin}/deployments/{id_b}")).await;
    assert_eq!(status, 404);
    let (_, greeter) = get_json(&format!("{admin}/services/Greeter")).await;
    assert_eq!(
        greeter["deployment_id"], da["id"],
        "services fall back to the remaining deployment"
    );
}

#[tokio::test]
async fn the_registry_survives_a_restart() {
    let mut sluice = Sluice::builder().start().await.unwrap();
    let dep = TestDeployment::start("v1").await.unwrap();
    let (status, registered) = post_json(
        &format!("{}/deployments", sluice.admin_url),
        json!({"uri": dep.uri}),
    )
    .await;
    assert_eq!(status, 201);
    sluice.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(
        sluice
            .wait_exit(std::time::Duration::from_secs(10))
            .unwrap()
            .status
            .success()
    );
    let again = Sluice::builder()
        .data_dir(&sluice.data_dir)
        .start()
        .await
        .unwrap();
    let (_, list) = get_json(&format!("{}/deployments", again.admin_url)).await;
    assert_eq!(list["deployments"][0]["id"], registered["id"]);
    let (_, services) = get_json(&format!("{}/services", again.admin_url)).await;
    assert_eq!(services["services"].as_array().unwrap().len(), 4);
}

/// Serves a hand-rolled `/discover`.
async fn endpoint(content_type: &'static str, body: Value, http1_only: bool) -> SocketAddr {
    let router = Router::new().route(
        "/discover",
        get(move || async move { ([("content-type", content_type)], body.to_string()) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    if http1_only {
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let service = hyper_util::service::TowerToHyperService::new(router.clone());
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        });
    } else {
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    }
    addr
}

#[tokio::test]
async fn discovery_failures_carry_their_codes() {
    let sluice = Sluice::builder().start().await.unwrap();
    let url = format!("{}/deployments", sluice.admin_url);
    let manifest = |mode: Option<&str>, min: i64, max: i64| {
        let mut m = json!({"minProtocolVersion": min, "maxProtocolVersion": max,
            "services": [{"name": "S", "ty": "SERVICE", "handlers": [{"name": "h"}]}]});
        if let Some(mode) = mode {
            m["protocolMode"] = mode.into();
        }
        m
    };
    const V2: &str = "application/vnd.restate.endpointmanifest.v2+json";

    // Port 1 (tcpmux) is never served here; a "free" port could be taken by a parallel test.
    let (status, body) = post_json(&url, json!({"uri": "http://127.0.0.1:1/"})).await;
    assert_eq!(status, 500);
    assert_code(&body, "META0003");

    let old = endpoint(V2, manifest(Some("BIDI_STREAM"), 1, 3), false).await;
    let (status, body) = post_json(&url, json!({"uri": format!("http://{old}/")})).await;
    assert_eq!(status, 500);
    assert_code(&body, "META0012");

    let wrong_type = endpoint(
        "application/json",
        manifest(Some("BIDI_STREAM"), 5, 7),
        false,
    )
    .await;
    let (_, body) = post_json(&url, json!({"uri": format!("http://{wrong_type}/")})).await;
    assert_code(&body, "META0013");
    let no_mode = endpoint(V2, manifest(None, 5, 7), false).await;
    let (_, body) = post_json(&url, json!({"uri": format!("http://{no_mode}/")})).await;
    assert_code(&body, "META0013");

    let http1 = endpoint(V2, manifest(Some("REQUEST_RESPONSE"), 5, 7), true).await;
    let (status, body) = post_json(&url, json!({"uri": format!("http://{http1}/")})).await;
    assert_eq!(status, 500);
    assert_code(&body, "META0014");
    let (status, ok) = post_json(
        &url,
        json!({"uri": format!("http://{http1}/"), "use_http_11": true}),
    )
    .await;
    assert_eq!(status, 201, "{ok}");

    let bidi_http1 = endpoint(V2, manifest(Some("BIDI_STREAM"), 5, 7), true).await;
    let (_, body) = post_json(
        &url,
        json!({"uri": format!("http://{bidi_http1}/"), "use_http_11": true}),
    )
    .await;
    assert_code(&body, "META0015");

    let (status, body) = post_json(
        &url,
        json!({"arn": "arn:aws:lambda:eu-central-1:1:function:f"}),
    )
    .await;
    assert_eq!(status, 500);
    assert_code(&body, "META0003");
    assert!(body["message"].as_str().unwrap().contains("Lambda"));

    let (status, body) = post_json(&url, json!({})).await;
    assert_eq!(status, 422);
    assert_eq!(body["restate_code"], "ADM0001");
    let resp = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .body("{bad")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("the body is not valid JSON")
    );
    assert_eq!(body["restate_code"], "ADM0001");
}

#[tokio::test]
async fn typescript_sdk_over_http2_and_http11() {
    let sluice = Sluice::builder().start().await.unwrap();
    let url = format!("{}/deployments", sluice.admin_url);
    let h2 = TestDeployment::typescript("h2").await.unwrap();
    let h1 = TestDeployment::typescript("h1").await.unwrap();

    let (status, body) = post_json(&url, json!({"uri": h2.uri})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["sdk_version"], "restate-sdk-typescript/1.17.2");
    let (_, detail) = get_json(&format!("{url}/{}", body["id"].as_str().unwrap())).await;
    assert_eq!(
        (
            detail["protocol_type"].as_str(),
            detail["http_version"].as_str()
        ),
        (Some("BidiStream"), Some("HTTP/2.0"))
    );

    // The HTTP/1.1 server cannot be discovered over h2c…
    let (status, body) = post_json(&url, json!({"uri": h1.uri})).await;
    assert_eq!(status, 500);
    assert_code(&body, "META0014");
    // …but can with use_http_11, in request/response mode; its services replace the h2 ones.
    let (status, body) = post_json(&url, json!({"uri": h1.uri, "use_http_11": true})).await;
    assert_eq!(status, 201, "{body}");
    let (_, detail) = get_json(&format!("{url}/{}", body["id"].as_str().unwrap())).await;
    assert_eq!(
        (
            detail["protocol_type"].as_str(),
            detail["http_version"].as_str()
        ),
        (Some("RequestResponse"), Some("HTTP/1.1"))
    );
    let (_, counter) = get_json(&format!("{}/services/TsCounter", sluice.admin_url)).await;
    assert_eq!(counter["revision"], 2);
    assert_eq!(
        counter["inactivity_timeout"], "0s",
        "request/response deployments do not idle"
    );
    let types: Vec<&str> = counter["handlers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["ty"].as_str().unwrap())
        .collect();
    assert!(
        types.contains(&"Exclusive") && types.contains(&"Shared"),
        "{types:?}"
    );
}

#[tokio::test]
async fn deleting_a_deployment_with_pinned_invocations_needs_force() {
    let sluice = Sluice::builder().start().await.unwrap();
    let dep = TestDeployment::start("v1").await.unwrap();
    let admin = &sluice.admin_url;
    let (status, registered) =
        post_json(&format!("{admin}/deployments"), json!({"uri": dep.uri})).await;
    assert_eq!(status, 201);
    let id = registered["id"].as_str().unwrap().to_owned();
    let sent: Value = reqwest::Client::new()
        .post(format!("{}/service/send/Greeter/slow", sluice.ingress_url))
        .header("content-type", "application/json")
        .body("30000")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let invocation = sent["invocationId"].as_str().unwrap().to_owned();
    // Wait until the attempt has pinned the deployment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, seen) = get_json(&format!("{admin}/invocations/{invocation}")).await;
        if seen["deployment_id"] == id.as_str() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the attempt never pinned deployment {id}: {seen}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    let delete = |query: &'static str| {
        reqwest::Client::new()
            .delete(format!("{admin}/deployments/{id}{query}"))
            .send()
    };
    let refused = delete("").await.unwrap();
    assert_eq!(refused.status(), 409);
    let body: Value = refused.json().await.unwrap();
    let message = body["message"].as_str().unwrap();
    assert!(message.contains(&invocation), "{message}");
    assert!(message.contains("force=true"), "{message}");
    let (status, _) = get_json(&format!("{admin}/deployments/{id}")).await;
    assert_eq!(status, 200, "a refused delete keeps the deployment");

    assert_eq!(delete("?force=true").await.unwrap().status(), 202);
    let (status, _) = get_json(&format!("{admin}/deployments/{id}")).await;
    assert_eq!(status, 404);
}
