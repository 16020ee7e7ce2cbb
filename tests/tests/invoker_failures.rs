//! Misbehaving deployments through the whole runtime: each failure is recorded on the
//! invocation with its code, and the invocation keeps retrying.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use serde_json::Value;
use sluice_protocol::{Message, proto};
use sluice_tests::{Sluice, fake_deployment, fake_deployment_declaring};

const V6: &str = "application/vnd.restate.invocation.v6";

/// A deployment that discovers fine and answers every invocation with `invoke`.
async fn deployment(invoke: fn() -> Response) -> SocketAddr {
    fake_deployment(6, invoke).await
}

/// Sends `Bad/go` and waits until the invocation records `code` on at least two attempts.
async fn recorded(sluice: &Sluice, addr: SocketAddr, code: &str) -> Value {
    sluice.register(&format!("http://{addr}/"), false).await;
    let client = reqwest::Client::new();
    let sent: Value = client
        .post(format!("{}/service/send/Bad/go", sluice.ingress_url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = sent["invocationId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen: Value = reqwest::get(format!("{}/invocations/{id}", sluice.admin_url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if seen["last_failure_error_code"] == code && seen["attempts"].as_u64().unwrap_or(0) >= 2 {
            return seen;
        }
        assert!(Instant::now() < deadline, "never recorded {code}: {seen}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_wrong_content_type_is_rt0012_and_retried() {
    let sluice = Sluice::builder().quick_retries().start().await.unwrap();
    let addr = deployment(|| {
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap()
    })
    .await;
    let seen = recorded(&sluice, addr, "RT0012").await;
    assert!(
        seen["last_failure"]
            .as_str()
            .unwrap()
            .contains("'application/json'"),
        "{seen}"
    );
    assert_ne!(seen["status"], "completed");
}

#[tokio::test]
async fn an_oversize_message_is_rt0003() {
    let sluice = Sluice::builder()
        .quick_retries()
        .env("SERVICE_WORKER__INVOKER__MESSAGE_SIZE_LIMIT", "64")
        .start()
        .await
        .unwrap();
    let addr = deployment(|| {
        // An Output frame header announcing a 1 MiB payload.
        let mut frame = vec![0x04, 0x01, 0, 0];
        frame.extend_from_slice(&(1u32 << 20).to_be_bytes());
        Response::builder()
            .header("content-type", V6)
            .body(Body::from(frame))
            .unwrap()
    })
    .await;
    let seen = recorded(&sluice, addr, "RT0003").await;
    assert!(
        seen["last_failure"]
            .as_str()
            .unwrap()
            .contains("message-size-limit"),
        "{seen}"
    );
}

#[tokio::test]
async fn a_silent_deployment_is_rt0001() {
    // Bidi: silence first closes the request body (inactivity), then aborts (RT0001).
    let sluice = Sluice::builder()
        .quick_retries()
        .env("SERVICE_WORKER__INVOKER__INACTIVITY_TIMEOUT", "200ms")
        .env("SERVICE_WORKER__INVOKER__ABORT_TIMEOUT", "300ms")
        .start()
        .await
        .unwrap();
    let addr = deployment(|| {
        let silence =
            futures_util::stream::pending::<Result<bytes::Bytes, std::convert::Infallible>>();
        Response::builder()
            .header("content-type", V6)
            .body(Body::from_stream(silence))
            .unwrap()
    })
    .await;
    let seen = recorded(&sluice, addr, "RT0001").await;
    assert!(
        seen["last_failure"]
            .as_str()
            .unwrap()
            .contains("abort timeout"),
        "{seen}"
    );
}

/// A V7 deployment that fails every attempt with code 418 and the given error behaviour.
fn v7_error(behavior: proto::ErrorBehavior) -> Response {
    let error = Message::Error(proto::ErrorMessage {
        code: 418,
        message: "teapot".into(),
        behavior: behavior.into(),
        ..Default::default()
    });
    let mut body = bytes::BytesMut::new();
    error.to_frame(false).encode(&mut body);
    Response::builder()
        .header("content-type", "application/vnd.restate.invocation.v7")
        .body(Body::from(body.freeze()))
        .unwrap()
}

#[tokio::test]
async fn a_v7_error_with_fail_behaviour_completes_the_invocation_with_that_failure() {
    let sluice = Sluice::builder().quick_retries().start().await.unwrap();
    let addr = fake_deployment(7, || v7_error(proto::ErrorBehavior::Fail)).await;
    sluice.register(&format!("http://{addr}/"), false).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/service/call/Bad/go", sluice.ingress_url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 418);
    let id = resp.headers()["x-service-id"].to_str().unwrap().to_owned();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["message"], "teapot");
    let seen: Value = reqwest::get(format!("{}/invocations/{id}", sluice.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(seen["status"], "completed", "{seen}");
    assert_eq!(seen["attempts"], 1, "not retried: {seen}");
}

#[tokio::test]
async fn a_v7_error_with_pause_behaviour_pauses_the_invocation() {
    let sluice = Sluice::builder().quick_retries().start().await.unwrap();
    let addr = fake_deployment(7, || v7_error(proto::ErrorBehavior::Pause)).await;
    sluice.register(&format!("http://{addr}/"), false).await;
    let sent: Value = reqwest::Client::new()
        .post(format!("{}/service/send/Bad/go", sluice.ingress_url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = sent["invocationId"].as_str().unwrap().to_owned();
    let seen = sluice
        .invocation_until(&id, "paused", |seen| seen["status"] == "paused")
        .await;
    assert_eq!(seen["last_failure"], "teapot", "{seen}");
    // Paused means no further attempts.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let later: Value = reqwest::get(format!("{}/invocations/{id}", sluice.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(later["attempts"], 1, "{later}");
}

/// Calls `Bad/go` and answers the call's status, its body and the invocation as the admin API
/// shows it.
async fn called(sluice: &Sluice) -> (u16, Value, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}/service/call/Bad/go", sluice.ingress_url))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let id = resp.headers()["x-service-id"].to_str().unwrap().to_owned();
    let body: Value = resp.json().await.unwrap();
    let seen: Value = reqwest::get(format!("{}/invocations/{id}", sluice.admin_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (status, body, seen)
}

#[tokio::test]
async fn retries_exhausted_under_on_max_attempts_kill_fail_the_call_with_its_last_error() {
    let sluice = Sluice::builder()
        .quick_retries()
        .env("SERVICE_WORKER__INVOKER__RETRY_POLICY__MAX_ATTEMPTS", "2")
        .env(
            "SERVICE_WORKER__INVOKER__RETRY_POLICY__ON_MAX_ATTEMPTS",
            "kill",
        )
        .start()
        .await
        .unwrap();
    let addr = fake_deployment(7, || v7_error(proto::ErrorBehavior::Retry)).await;
    sluice.register(&format!("http://{addr}/"), false).await;
    let (status, body, seen) = called(&sluice).await;
    assert_eq!(status, 500, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("teapot") && message.contains("on-max-attempts is kill"),
        "{body}"
    );
    assert_eq!(seen["status"], "completed", "{seen}");
    assert_eq!(seen["attempts"], 2, "{seen}");
}

#[tokio::test]
async fn a_retry_policy_the_handler_declares_beats_the_configured_one() {
    // Configured: pause after 70 attempts. Declared by the handler: kill after 3.
    let sluice = Sluice::builder().quick_retries().start().await.unwrap();
    let addr = fake_deployment_declaring(
        7,
        serde_json::json!({"retryPolicyMaxAttempts": 3, "retryPolicyOnMaxAttempts": "KILL"}),
        || v7_error(proto::ErrorBehavior::Retry),
    )
    .await;
    sluice.register(&format!("http://{addr}/"), false).await;
    let (status, body, seen) = called(&sluice).await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(seen["attempts"], 3, "{seen}");
    assert_eq!(seen["status"], "completed", "{seen}");
}
