//! Invocation attempts against the real Rust and TypeScript SDK deployments, speaking the
//! service protocol directly (no ingress yet): output, terminal failure, state, `ctx.run`,
//! and a `ctx.sleep` that suspends and resumes through journal replay.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use sluice_core::errors::Code;
use sluice_core::ids::InvocationId;
use sluice_protocol::proto::{self, notification_template, output_command_message};
use sluice_protocol::{Frame, Message, ProtocolVersion};
use sluice_runtime::invoker::{AttemptClient, AttemptRequest, Ending};
use sluice_tests::TestDeployment;

fn input(json: &str) -> Frame {
    Message::Input(proto::InputCommandMessage {
        headers: vec![proto::Header {
            key: "x-restate-ingress-path".into(),
            value: "/test".into(),
        }],
        value: Some(proto::Value {
            content: Bytes::copy_from_slice(json.as_bytes()),
        }),
        name: String::new(),
    })
    .to_frame(false)
}

fn request(
    dep: &TestDeployment,
    service: &str,
    handler: &str,
    key: Option<&str>,
    journal: Vec<Frame>,
) -> AttemptRequest {
    AttemptRequest {
        uri: dep.uri.parse().unwrap(),
        use_http_11: false,
        additional_headers: BTreeMap::new(),
        service: service.into(),
        handler: handler.into(),
        key: key.map(Into::into),
        invocation_id: InvocationId::generate(7),
        protocol: ProtocolVersion::V6,
        journal,
        state: Vec::new(),
        partial_state: false,
        random_seed: 1,
        scope: None,
        limit_key: None,
        retry_count: 0,
        abort_timeout: Duration::from_secs(10),
        inactivity_timeout: Duration::from_secs(10),
        message_size_limit: 32 * 1024 * 1024,
        traceparent: None,
    }
}

fn output_value(messages: &[(Message, bool)]) -> Option<String> {
    messages.iter().find_map(|(m, _)| match m {
        Message::Output(proto::OutputCommandMessage {
            result: Some(output_command_message::Result::Value(v)),
            ..
        }) => Some(String::from_utf8(v.content.to_vec()).unwrap()),
        _ => None,
    })
}

#[tokio::test]
async fn greet_completes_over_protocol_v6_and_v7() {
    let dep = TestDeployment::start("v1").await.unwrap();
    for version in [ProtocolVersion::V6, ProtocolVersion::V7] {
        let mut req = request(&dep, "Greeter", "greet", None, vec![input("\"Bob\"")]);
        req.protocol = version;
        let attempt = AttemptClient::default().run(&req).await.unwrap();
        assert_eq!(attempt.ending, Ending::End, "{version}");
        assert_eq!(
            output_value(&attempt.messages).as_deref(),
            Some("\"Hello, Bob!\"")
        );
        assert_eq!(attempt.sdk.as_deref(), Some("restate-sdk-rust/0.13.0"));
    }
}

#[tokio::test]
async fn a_terminal_error_is_an_output_failure() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let attempt = AttemptClient::default()
        .run(&request(
            &dep,
            "Greeter",
            "fail",
            None,
            vec![input("\"boom\"")],
        ))
        .await
        .unwrap();
    assert_eq!(attempt.ending, Ending::End);
    let failure = attempt.messages.iter().find_map(|(m, _)| match m {
        Message::Output(proto::OutputCommandMessage {
            result: Some(output_command_message::Result::Failure(f)),
            ..
        }) => Some(f.clone()),
        _ => None,
    });
    let failure = failure.expect("an output failure");
    assert_eq!((failure.code, failure.message.as_str()), (500, "boom"));
}

#[tokio::test]
async fn eager_state_reaches_a_virtual_object() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut req = request(&dep, "Counter", "add", Some("k1"), vec![input("5")]);
    req.state = vec![(Bytes::from_static(b"count"), Bytes::from_static(b"2"))];
    let attempt = AttemptClient::default().run(&req).await.unwrap();
    assert_eq!(attempt.ending, Ending::End);
    assert_eq!(output_value(&attempt.messages).as_deref(), Some("7"));
    let set = attempt.messages.iter().find_map(|(m, _)| match m {
        Message::SetState(s) => Some((s.key.clone(), s.value.clone().unwrap().content)),
        _ => None,
    });
    assert_eq!(
        set,
        Some((Bytes::from_static(b"count"), Bytes::from_static(b"7")))
    );
}

#[tokio::test]
async fn sleep_suspends_then_resumes_by_replay() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let client = AttemptClient::default();
    let first = client
        .run(&request(&dep, "Greeter", "slow", None, vec![input("50")]))
        .await
        .unwrap();
    assert!(
        matches!(first.ending, Ending::Suspended(_)),
        "{:?}",
        first.ending
    );
    let (sleep, _) = first
        .messages
        .iter()
        .find(|(m, _)| matches!(m, Message::Sleep(_)))
        .expect("a sleep command")
        .clone();
    let Message::Sleep(cmd) = &sleep else {
        unreachable!()
    };
    let completion = Message::SleepCompletion(proto::NotificationTemplate {
        id: Some(notification_template::Id::CompletionId(
            cmd.result_completion_id,
        )),
        result: Some(notification_template::Result::Void(proto::Void {})),
    });
    // Second attempt: Input, the Sleep as journaled, and its completion.
    let journal = vec![
        input("50"),
        sleep.to_frame(false),
        completion.to_frame(false),
    ];
    let mut req = request(&dep, "Greeter", "slow", None, journal);
    req.retry_count = 0;
    let second = client.run(&req).await.unwrap();
    assert_eq!(second.ending, Ending::End);
    assert_eq!(output_value(&second.messages).as_deref(), Some("50"));
}

#[tokio::test]
async fn run_proposes_its_result() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let attempt = AttemptClient::default()
        .run(&request(
            &dep,
            "Greeter",
            "stamp",
            None,
            vec![input("null")],
        ))
        .await
        .unwrap();
    let kinds: Vec<u16> = attempt.messages.iter().map(|(m, _)| m.type_id()).collect();
    assert!(kinds.contains(&0x0411), "a Run command: {kinds:x?}");
    assert!(
        kinds.contains(&0x0005),
        "a ProposeRunCompletion: {kinds:x?}"
    );
    assert!(
        matches!(attempt.ending, Ending::Suspended(_)),
        "waits for the run's completion"
    );
}

#[tokio::test]
async fn an_unknown_handler_fails_the_attempt_retryably() {
    // The Rust SDK answers 200 and an ErrorMessage (code 500), not an HTTP 404.
    let dep = TestDeployment::start("v1").await.unwrap();
    let attempt = AttemptClient::default()
        .run(&request(&dep, "Greeter", "nope", None, vec![input("1")]))
        .await
        .unwrap();
    let Ending::Failed(error) = &attempt.ending else {
        panic!("{:?}", attempt.ending);
    };
    assert!(error.message.contains("Greeter/nope"), "{}", error.message);
    assert_eq!(
        sluice_runtime::invoker::attempt::failure_code(error),
        Code::RT0007
    );
}

#[tokio::test]
async fn typescript_over_http11_request_response() {
    let dep = TestDeployment::typescript("h1").await.unwrap();
    let mut req = request(&dep, "TsGreeter", "greet", None, vec![input("\"Ada\"")]);
    req.use_http_11 = true;
    let attempt = AttemptClient::default().run(&req).await.unwrap();
    assert_eq!(attempt.ending, Ending::End);
    assert_eq!(
        output_value(&attempt.messages).as_deref(),
        Some("\"Hello, Ada!\"")
    );
    assert_eq!(
        attempt.sdk.as_deref(),
        Some("restate-sdk-typescript/1.17.2")
    );
}
