//! Failure mapping against hand-rolled endpoints that misbehave on purpose.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use bytes::BytesMut;

use std::sync::Arc;

use super::*;

const V6: &str = "application/vnd.restate.invocation.v6";

fn frames(messages: &[Message]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for m in messages {
        m.to_frame(false).encode(&mut out);
    }
    out.to_vec()
}

fn end() -> Message {
    Message::End(proto::EndMessage {})
}

fn output() -> Message {
    Message::Output(proto::OutputCommandMessage {
        result: Some(proto::output_command_message::Result::Value(proto::Value {
            content: Bytes::from_static(b"\"hi\""),
        })),
        name: String::new(),
    })
}

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

fn answering(status: u16, content_type: &'static str, body: Vec<u8>) -> Router {
    Router::new().route(
        "/invoke/Greeter/greet",
        post(move || {
            let body = body.clone();
            async move {
                Response::builder()
                    .status(status)
                    .header("content-type", content_type)
                    .header("retry-after", "7")
                    .body(Body::from(body))
                    .unwrap()
            }
        }),
    )
}

fn request(addr: SocketAddr) -> AttemptRequest {
    let input = Message::Input(proto::InputCommandMessage {
        headers: Vec::new(),
        value: Some(proto::Value {
            content: Bytes::from_static(b"\"x\""),
        }),
        name: String::new(),
    });
    AttemptRequest {
        uri: format!("http://{addr}/"),
        use_http_11: false,
        additional_headers: BTreeMap::new(),
        service: "Greeter".into(),
        handler: "greet".into(),
        key: None,
        invocation_id: InvocationId::generate(1),
        protocol: ProtocolVersion::V6,
        journal: vec![input.to_frame(false)],
        state: Vec::new(),
        partial_state: false,
        random_seed: 42,
        scope: None,
        limit_key: None,
        retry_count: 0,
        abort_timeout: Duration::from_secs(5),
        inactivity_timeout: Duration::from_secs(5),
        message_size_limit: 1024,
        traceparent: None,
    }
}

async fn code_of(router: Router, tweak: impl FnOnce(&mut AttemptRequest)) -> AttemptError {
    let addr = serve(router).await;
    let mut req = request(addr);
    tweak(&mut req);
    AttemptClient::default().run(&req).await.unwrap_err()
}

#[tokio::test]
async fn a_well_behaved_stream_ends() {
    let addr = serve(answering(200, V6, frames(&[output(), end()]))).await;
    let attempt = AttemptClient::default().run(&request(addr)).await.unwrap();
    assert_eq!(attempt.ending, Ending::End);
    assert_eq!(attempt.messages, vec![(output(), false)]);
}

#[tokio::test]
async fn statuses_map_to_their_codes() {
    for (status, code) in [
        (502, Code::RT0010),
        (504, Code::RT0010),
        (415, Code::RT0015),
        (413, Code::RT0019),
        (500, Code::RT0012),
        (404, Code::RT0012),
    ] {
        let e = code_of(answering(status, V6, Vec::new()), |_| {}).await;
        assert_eq!(e.error.code, Some(code), "{status}: {}", e.error);
        // The deployment answered: this attempt's failure, not the deployment's.
        assert_eq!(
            e.signal(),
            sluice_flow::pacing::Signal::Neutral,
            "{status} paces the deployment"
        );
    }
    let e = code_of(answering(429, V6, Vec::new()), |_| {}).await;
    assert_eq!(
        (e.error.code, e.retry_after),
        (Some(Code::RT0023), Some(Duration::from_secs(7)))
    );
    assert_eq!(
        e.signal(),
        sluice_flow::pacing::Signal::Overloaded {
            retry_after_ms: Some(7_000)
        }
    );
}

#[tokio::test]
async fn a_wrong_content_type_is_rt0012() {
    let e = code_of(answering(200, "application/json", frames(&[end()])), |_| {}).await;
    assert_eq!(e.error.code, Some(Code::RT0012));
    assert!(
        e.error.message.contains("'application/json'"),
        "{}",
        e.error
    );
}

#[tokio::test]
async fn oversize_messages_are_rt0003() {
    let e = code_of(answering(200, V6, frames(&[output(), end()])), |r| {
        r.message_size_limit = 4
    })
    .await;
    assert_eq!(e.error.code, Some(Code::RT0003), "{}", e.error);
}

#[tokio::test]
async fn protocol_violations_are_rt0012() {
    let after_end = frames(&[end(), output()]);
    let e = code_of(answering(200, V6, after_end), |_| {}).await;
    assert_eq!(e.error.code, Some(Code::RT0012), "{}", e.error);
    assert!(e.error.message.contains("after the end"), "{}", e.error);
    let no_end = frames(&[output()]);
    let e = code_of(answering(200, V6, no_end), |_| {}).await;
    assert_eq!(e.error.code, Some(Code::RT0012), "{}", e.error);
    assert!(e.error.message.contains("without End"), "{}", e.error);
    let ack = Message::CommandAck(proto::CommandAckMessage { command_index: 1 });
    let e = code_of(answering(200, V6, frames(&[ack, end()])), |_| {}).await;
    assert_eq!(e.error.code, Some(Code::RT0012), "{}", e.error);
    assert!(
        e.error
            .message
            .contains("unexpected message CommandAckMessage"),
        "{}",
        e.error
    );
}

#[tokio::test]
async fn a_silent_deployment_is_rt0001() {
    let router = Router::new().route(
        "/invoke/Greeter/greet",
        post(|| async {
            // Headers go out, then nothing.
            let stream = futures_util::stream::pending::<Result<Bytes, Infallible>>();
            Response::builder()
                .header("content-type", V6)
                .body(Body::from_stream(stream))
                .unwrap()
        }),
    );
    let e = code_of(router, |r| r.abort_timeout = Duration::from_millis(300)).await;
    assert_eq!(e.error.code, Some(Code::RT0001), "{}", e.error);
}

#[tokio::test]
async fn unreachable_is_rt0010() {
    let closed: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let e = AttemptClient::default()
        .run(&request(closed))
        .await
        .unwrap_err();
    assert_eq!(e.error.code, Some(Code::RT0010), "{}", e.error);
    assert_eq!(e.signal(), sluice_flow::pacing::Signal::Down);
}

#[test]
fn error_messages_map_to_codes() {
    let with = |code| proto::ErrorMessage {
        code,
        ..Default::default()
    };
    assert_eq!(failure_code(&with(570)), Code::RT0016);
    assert_eq!(failure_code(&with(571)), Code::RT0012);
    assert_eq!(failure_code(&with(500)), Code::RT0007);
}

#[test]
fn the_deployment_gets_the_traceparent_the_key_and_its_own_headers() {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut req = request(addr);
    let addresses = Addresses::default();
    let address = addresses.get(&req.uri).unwrap();
    let built = head(&req, &address, Version::HTTP_2).unwrap();
    assert!(built.headers().get("traceparent").is_none());
    assert!(built.headers().get("x-restate-service-key").is_none());
    assert_eq!(built.headers()["content-type"], V6);
    assert_eq!(built.headers()["accept"], V6);
    assert_eq!(
        built.headers()["x-restate-invocation-id"],
        req.invocation_id.to_string().as_str()
    );
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    req.traceparent = Some(traceparent.into());
    req.key = Some("a key/ü".into());
    req.additional_headers
        .insert("x-tenant".into(), "acme".into());
    let built = head(&req, &address, Version::HTTP_2).unwrap();
    assert_eq!(built.headers()["traceparent"], traceparent);
    assert_eq!(built.headers()["x-restate-service-key"], "a+key%2F%C3%BC");
    assert_eq!(built.headers()["x-tenant"], "acme");
    req.additional_headers
        .insert("bad header".into(), "x".into());
    let e = head(&req, &address, Version::HTTP_2).unwrap_err();
    assert_eq!(e.error.code, Some(Code::RT0006), "{}", e.error);
}

/// An HTTP/2 deployment on the `h2` crate that answers every stream with Output and End,
/// and sends each connection away (GOAWAY) after `streams_per_connection` streams (a
/// deployment restarting, a proxy's idle timeout). Counts the connections it accepted.
async fn h2_deployment(
    streams_per_connection: usize,
) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut connection = h2::server::handshake(socket).await.unwrap();
                for _ in 0..streams_per_connection {
                    let Some(Ok((request, mut respond))) = connection.accept().await else {
                        return;
                    };
                    let mut body = request.into_body();
                    while let Some(Ok(data)) = body.data().await {
                        let _ = body.flow_control().release_capacity(data.len());
                    }
                    let response = http::Response::builder()
                        .header("content-type", V6)
                        .body(())
                        .unwrap();
                    let mut send = respond.send_response(response, false).unwrap();
                    send.send_data(Bytes::from(frames(&[output(), end()])), true)
                        .unwrap();
                }
                // Go away (GOAWAY), letting the last answer out first.
                connection.graceful_shutdown();
                while let Some(Ok((_, mut respond))) = connection.accept().await {
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn attempts_of_one_client_share_one_h2_connection() {
    let (addr, accepted) = h2_deployment(usize::MAX).await;
    let client = AttemptClient::default();
    let req = request(addr);
    let attempts = (0..8).map(|_| client.run(&req));
    for attempt in futures_util::future::join_all(attempts).await {
        assert_eq!(attempt.unwrap().ending, Ending::End);
    }
    client.run(&req).await.unwrap();
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_connection_the_deployment_closed_is_replaced_by_the_next_attempt() {
    let (addr, accepted) = h2_deployment(1).await;
    let client = AttemptClient::default();
    let req = request(addr);
    for _ in 0..3 {
        let attempt = client.run(&req).await.unwrap();
        assert_eq!(attempt.ending, Ending::End);
        assert_eq!(attempt.messages, vec![(output(), false)]);
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_connection_unused_past_the_idle_timeout_is_replaced() {
    let (addr, accepted) = h2_deployment(usize::MAX).await;
    // With no idle time allowed, every attempt finds the last one's connection stale.
    let client = AttemptClient::new(&DeploymentTls::default(), Duration::ZERO);
    let req = request(addr);
    for _ in 0..3 {
        assert_eq!(client.run(&req).await.unwrap().ending, Ending::End);
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_response_head_over_16_kib_fails_the_attempt_as_rt0010() {
    let router = Router::new().route(
        "/invoke/Greeter/greet",
        post(|| async {
            Response::builder()
                .header("content-type", V6)
                .header("x-padding", "x".repeat(20 * 1024))
                .body(Body::from(frames(&[output(), end()])))
                .unwrap()
        }),
    );
    let e = code_of(router, |_| {}).await;
    assert_eq!(e.error.code, Some(Code::RT0010), "{}", e.error);
}
