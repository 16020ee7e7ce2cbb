//! Misbehaving deployments through the whole runtime: each failure is recorded on the
//! invocation with its code, and the invocation keeps retrying.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};
use sluice_tests::Sluice;

const V6: &str = "application/vnd.restate.invocation.v6";

/// A deployment that discovers fine and answers every invocation with `invoke`.
async fn deployment(invoke: fn() -> Response) -> SocketAddr {
    let manifest = json!({
        "protocolMode": "BIDI_STREAM", "minProtocolVersion": 5, "maxProtocolVersion": 6,
        "services": [{"name": "Bad", "ty": "SERVICE", "handlers": [{"name": "go"}]}]
    });
    let router = Router::new()
        .route(
            "/discover",
            get(move || {
                let body = manifest.to_string();
                async move {
                    (
                        [(
                            "content-type",
                            "application/vnd.restate.endpointmanifest.v2+json",
                        )],
                        body,
                    )
                }
            }),
        )
        .route("/invoke/Bad/go", post(move || async move { invoke() }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
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

fn quick_retries(builder: sluice_tests::Builder) -> sluice_tests::Builder {
    builder
        .env(
            "SERVICE_WORKER__INVOKER__RETRY_POLICY__INITIAL_INTERVAL",
            "50ms",
        )
        .env(
            "SERVICE_WORKER__INVOKER__RETRY_POLICY__MAX_INTERVAL",
            "100ms",
        )
}

#[tokio::test]
async fn a_wrong_content_type_is_rt0012_and_retried() {
    let sluice = quick_retries(Sluice::builder()).start().await.unwrap();
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
    let sluice = quick_retries(Sluice::builder())
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
    let sluice = quick_retries(Sluice::builder())
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
