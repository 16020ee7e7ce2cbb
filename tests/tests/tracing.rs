//! Spans of a scoped call exported over OTLP/HTTP to a receiver in the test: the caller's
//! `traceparent` is continued, and the chain is caller → ingress → invocation → queue wait and
//! attempt, with the invocation's id, scope and outcome on them.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{OtlpReceiver, Sluice, TestDeployment};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

fn attribute(span: &Value, key: &str) -> Option<Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| a["value"].clone())
}

fn named<'a>(spans: &'a [Value], prefix: &str) -> &'a Value {
    spans
        .iter()
        .find(|s| s["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .unwrap_or_else(|| panic!("no span '{prefix}…' in {spans:#?}"))
}

fn nanos(span: &Value, field: &str) -> u128 {
    match &span[field] {
        Value::String(s) => s.parse().unwrap(),
        other => other.as_u64().unwrap().into(),
    }
}

#[tokio::test]
async fn a_scoped_call_is_traced_from_ingress_to_attempt() {
    let receiver = OtlpReceiver::start().await;
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .config(&format!(
            "[tracing]\nendpoint = \"{}\"\nprotocol = \"http/json\"\nexport-interval = \"100ms\"\nservice-name = \"sluice-test\"\n",
            receiver.endpoint
        ))
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    sluice
        .set_rules(json!([{"pattern": "traced", "limits": {"concurrency": 1}}]))
        .await;
    let client = reqwest::Client::new();
    // A blocker holds the scope's one slot for a second: the traced call waits in its queue.
    let resp = client
        .post(format!(
            "{}/service/scope/traced/send/Greeter/slow",
            sluice.ingress_url
        ))
        .header("content-type", "application/json")
        .body("1000")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let resp = client
        .post(format!(
            "{}/service/scope/traced/call/Greeter/greet",
            sluice.ingress_url
        ))
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{TRACE}-{CALLER}-01"))
        .body("\"Ann\"")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let id = resp.headers()["x-service-id"].to_str().unwrap().to_owned();

    let deadline = Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let spans: Vec<Value> = receiver
            .spans()
            .into_iter()
            .filter(|s| {
                s["traceId"]
                    .as_str()
                    .is_some_and(|t| t.eq_ignore_ascii_case(TRACE))
            })
            .collect();
        if spans
            .iter()
            .any(|s| s["name"] == "invocation Greeter/greet")
        {
            break spans;
        }
        assert!(Instant::now() < deadline, "spans never arrived: {spans:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let ingress = named(&spans, "ingress");
    let invocation = named(&spans, "invocation Greeter/greet");
    let wait = named(&spans, "queue wait");
    let attempt = named(&spans, "attempt");
    // The chain: caller → ingress → invocation → queue wait, attempt.
    assert_eq!(
        ingress["parentSpanId"].as_str().unwrap().to_lowercase(),
        CALLER
    );
    assert_eq!(invocation["parentSpanId"], ingress["spanId"]);
    assert_eq!(wait["parentSpanId"], invocation["spanId"]);
    assert_eq!(attempt["parentSpanId"], invocation["spanId"]);
    // What they carry.
    for span in [invocation, wait, attempt] {
        assert_eq!(
            attribute(span, "restate.invocation.id").unwrap()["stringValue"],
            id.as_str()
        );
        assert_eq!(
            attribute(span, "sluice.scope").unwrap()["stringValue"],
            "traced"
        );
    }
    assert_eq!(
        attribute(invocation, "sluice.outcome").unwrap()["stringValue"],
        "success"
    );
    assert_eq!(
        attribute(attempt, "sluice.attempt.outcome").unwrap()["stringValue"],
        "completed"
    );
    assert_eq!(
        attribute(ingress, "restate.invocation.id").unwrap()["stringValue"],
        id.as_str()
    );
    assert_eq!(ingress["kind"], json!(2), "server span: {ingress}");
    let service = ingress["resource"]["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["key"] == "service.name")
        .unwrap();
    assert_eq!(service["value"]["stringValue"], "sluice-test");
    // It waited behind the blocker, then ran: the wait ends where the attempt starts.
    let waited = nanos(wait, "endTimeUnixNano") - nanos(wait, "startTimeUnixNano");
    assert!(waited >= 500_000_000, "waited only {waited} ns");
    assert!(nanos(wait, "endTimeUnixNano") <= nanos(attempt, "startTimeUnixNano"));
    assert!(nanos(invocation, "startTimeUnixNano") <= nanos(wait, "startTimeUnixNano") + 1_000_000);
    assert!(nanos(attempt, "endTimeUnixNano") <= nanos(invocation, "endTimeUnixNano"));
    println!("{}", serde_json::to_string_pretty(&spans).unwrap());
}
