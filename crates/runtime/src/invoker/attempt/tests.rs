//! Failure mapping against hand-rolled endpoints that misbehave on purpose.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use bytes::BytesMut;

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
        uri: format!("http://{addr}/").parse().unwrap(),
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
            crate::flow::pacing::Signal::Neutral,
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
        crate::flow::pacing::Signal::Overloaded {
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
    assert_eq!(e.signal(), crate::flow::pacing::Signal::Down);
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
fn the_deployment_gets_the_traceparent() {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut req = request(addr);
    let built = build(&req, Full::new(Bytes::new()).boxed_unsync()).unwrap();
    assert!(built.headers().get("traceparent").is_none());
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    req.traceparent = Some(traceparent.into());
    let built = build(&req, Full::new(Bytes::new()).boxed_unsync()).unwrap();
    assert_eq!(built.headers()["traceparent"], traceparent);
}
