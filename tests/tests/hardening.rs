//! Hostile input against the real binary: each test covers findings of the hardening review
//! (admin authentication, read-only SQL, connection bounds, id parsing, awakeables, input caps,
//! outbound requests, Kafka properties).

use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use sluice_tests::{
    ADMIN_TOKEN, READ_TOKEN, Sluice, TestDeployment, assert_startup_error, binary, closed_within,
    next_awakeable,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Status and JSON answer of a request.
async fn answer(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = req.send().await.expect("the server answers");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

#[tokio::test]
async fn admin_tokens_decide_who_may_do_what() {
    let sluice = Sluice::builder().with_tokens().start().await.unwrap();
    let url = |path: &str| format!("{}{path}", sluice.admin_url);
    let rules = json!([{"pattern": "*", "limits": {"concurrency": 2}}]);

    // Nothing but /health without a token.
    let resp = client().get(url("/version")).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["restate_code"], "SEC0001", "{body}");
    let (status, _) = answer(client().get(url("/health"))).await;
    assert_eq!(status, 200);
    let (status, body) = answer(client().put(url("/limits/rules")).json(&rules)).await;
    assert_eq!(
        (status, body["restate_code"].as_str()),
        (401, Some("SEC0001"))
    );
    let (status, _) = answer(
        client()
            .get(url("/deployments"))
            .bearer_auth("not-a-token-at-all-0000"),
    )
    .await;
    assert_eq!(status, 401);

    // A read token reads and queries, and nothing more.
    let (status, _) = answer(client().get(url("/v4/deployments")).bearer_auth(READ_TOKEN)).await;
    assert_eq!(status, 200);
    let query = json!({"query": "SELECT 1 AS n"});
    let (status, _) = answer(
        client()
            .post(url("/query"))
            .bearer_auth(READ_TOKEN)
            .json(&query),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = answer(
        client()
            .put(url("/limits/rules"))
            .bearer_auth(READ_TOKEN)
            .json(&rules),
    )
    .await;
    assert_eq!(
        (status, body["restate_code"].as_str()),
        (403, Some("SEC0002")),
        "{body}"
    );

    // An admin token does everything.
    let (status, body) = answer(
        client()
            .put(url("/limits/rules"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&rules),
    )
    .await;
    assert!(status < 300, "{status} {body}");

    // DNS rebinding: a browser sent here by another name is refused.
    let (status, body) = answer(
        client()
            .get(url("/version"))
            .bearer_auth(ADMIN_TOKEN)
            .header("host", "rebound.example.com"),
    )
    .await;
    assert_eq!(
        (status, body["restate_code"].as_str()),
        (421, Some("SEC0003")),
        "{body}"
    );

    // The CLI sends SLUICE_ADMIN_TOKEN, or the restate CLI's RESTATE_AUTH_TOKEN.
    let cli = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(binary());
        cmd.args(["rules", "list", "--admin-url", &sluice.admin_url])
            .env_remove("SLUICE_ADMIN_TOKEN")
            .env_remove("RESTATE_AUTH_TOKEN")
            .envs(env.iter().copied());
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = cli(&[]);
    assert!(!ok && out.contains("SEC0001"), "{out}");
    let (ok, out) = cli(&[("SLUICE_ADMIN_TOKEN", READ_TOKEN)]);
    assert!(ok && out.contains('*'), "{out}");
    let (ok, out) = cli(&[("RESTATE_AUTH_TOKEN", ADMIN_TOKEN)]);
    assert!(ok, "{out}");
}

#[test]
fn an_admin_listener_beyond_loopback_without_tokens_refuses_to_start() {
    // Refused before anything is bound.
    let finished = Sluice::builder()
        .admin_host("0.0.0.0")
        .run_to_exit()
        .unwrap();
    assert_startup_error(&finished, "RT0002");
    assert!(
        finished.stderr.contains("admin.auth-tokens"),
        "{}",
        finished.stderr
    );
    let finished = Sluice::builder()
        .env("SERVICE_ADMIN__AUTH_TOKENS", "admin:short")
        .run_to_exit()
        .unwrap();
    assert_startup_error(&finished, "RT0002");
    assert!(
        finished.stderr.contains("at least 16"),
        "{}",
        finished.stderr
    );
}

#[tokio::test]
async fn sql_runs_only_bounded_read_only_queries() {
    let sluice = Sluice::builder()
        .env("SERVICE_ADMIN__QUERY_TIMEOUT", "2s")
        .start()
        .await
        .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let target = scratch.path().join("written.csv");
    let target = target.display();
    for sql in [
        format!("COPY (SELECT 'x') TO '{target}' STORED AS CSV"),
        "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/hostname'".to_owned(),
        "SET datafusion.execution.batch_size = 1".to_owned(),
        "CREATE TABLE t AS SELECT 1".to_owned(),
        "INSERT INTO sys_rules VALUES (1)".to_owned(),
        "DROP TABLE sys_rules".to_owned(),
        format!("EXPLAIN ANALYZE COPY (SELECT 'x') TO '{target}' STORED AS CSV"),
    ] {
        let (status, body) = sluice.query(&sql).await;
        assert_eq!(status, 400, "{sql}: {body}");
        assert_eq!(body["restate_code"], "SEC0006", "{sql}: {body}");
    }
    assert!(
        !std::path::Path::new(&target.to_string()).exists(),
        "COPY wrote {target}"
    );
    let (status, body) = sluice.query("SELECT 1; SELECT 2").await;
    assert_eq!(status, 400, "{body}");
    for sql in ["SELECT 1 AS n", "EXPLAIN SELECT 1"] {
        let (status, body) = sluice.query(sql).await;
        assert_eq!(status, 200, "{sql}: {body}");
    }
    let long = format!("SELECT '{}'", "x".repeat(70 * 1024));
    let (status, body) = sluice.query(&long).await;
    assert_eq!(
        (status, body["restate_code"].as_str()),
        (400, Some("SEC0006")),
        "{body}"
    );

    // A deeply nested expression is an error or an answer, never a dead process.
    let deep = format!("SELECT {}", vec!["1"; 5000].join("+"));
    let (status, _) = sluice.query(&deep).await;
    assert!(status == 200 || status == 400, "{status}");
    let (status, _) = answer(client().get(format!("{}/version", sluice.admin_url))).await;
    assert_eq!(status, 200, "the process survived the deep query");

    // Amplifying functions are refused before they allocate.
    let (status, body) = sluice.query("SELECT repeat('x', 200000000) AS r").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.to_string().contains("admin.query-memory-limit"),
        "{body}"
    );

    // A cross join that would run for minutes: answered at the timeout, while the admin API
    // keeps answering meanwhile.
    let started = Instant::now();
    let heavy = tokio::spawn({
        let admin = sluice.admin_url.clone();
        async move {
            answer(client().post(format!("{admin}/query")).header("accept", "application/json").json(&json!({
                "query": "SELECT sum(a.value * b.value) AS s FROM generate_series(1, 200000) a CROSS JOIN generate_series(1, 200000) b"
            })))
            .await
        }
    });
    // The join is running: the process burns CPU on it.
    let cpu = || async { sluice.metrics().await["process_cpu_seconds_total"] };
    let idle = cpu().await;
    while cpu().await < idle + 0.2 {
        assert!(
            !heavy.is_finished(),
            "the query ended before it was seen running"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let probe = Instant::now();
    let (status, _) = answer(client().get(format!("{}/version", sluice.admin_url))).await;
    assert_eq!(status, 200);
    assert!(
        probe.elapsed() < Duration::from_secs(1),
        "/version took {:?} during a query",
        probe.elapsed()
    );
    let (status, body) = heavy.await.unwrap();
    let took = started.elapsed();
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("admin.query-timeout"), "{body}");
    assert!(
        took < Duration::from_secs(3),
        "a 2 s timeout answered after {took:?}"
    );
    // And the work stopped with the answer: the process is idle again (before, the join went
    // on burning a core after the 400).
    let (from, since) = (cpu().await, Instant::now());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let busy = (cpu().await - from) / since.elapsed().as_secs_f64();
    assert!(
        busy < 0.5,
        "the process used {busy:.2} of a core after the timeout"
    );
}

/// One request on a new connection to `address`, then silence: the server closes it.
async fn keep_alive_closes(address: &str, path: &str) {
    let mut kept = TcpStream::connect(address).await.unwrap();
    kept.write_all(format!("GET {path} HTTP/1.1\r\nhost: {address}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert!(
        closed_within(&mut kept, Duration::from_secs(5)).await,
        "an idle keep-alive connection to {address} stayed open"
    );
}

#[tokio::test]
async fn connections_are_bounded_and_the_admin_listener_keeps_answering() {
    // A low open-files limit, as on a box where a flood would exhaust it.
    let sluice = Sluice::builder()
        .wrapper("prlimit", &["--nofile=256:256", "--"])
        .env("SERVICE_INGRESS__CONNECTIONS__MAX", "100")
        .env("SERVICE_INGRESS__CONNECTIONS__HEADER_READ_TIMEOUT", "1s")
        .env("SERVICE_INGRESS__CONNECTIONS__IDLE_TIMEOUT", "2s")
        .env("SERVICE_ADMIN__CONNECTIONS__MAX", "20")
        .env("SERVICE_ADMIN__CONNECTIONS__HEADER_READ_TIMEOUT", "1s")
        .env("SERVICE_ADMIN__CONNECTIONS__IDLE_TIMEOUT", "2s")
        .start()
        .await
        .unwrap();
    let ingress = sluice.ingress_url.trim_start_matches("http://").to_owned();
    let admin = sluice.admin_url.trim_start_matches("http://").to_owned();

    // 300 idle connections to the ingress: more than the process could hold open.
    let mut idle = Vec::new();
    for _ in 0..300 {
        if let Ok(stream) = TcpStream::connect(&ingress).await {
            idle.push(stream);
        }
    }
    let probe = Instant::now();
    let (status, _) = answer(client().get(format!("{}/version", sluice.admin_url))).await;
    assert_eq!(status, 200, "the admin listener answers during the flood");
    assert!(
        probe.elapsed() < Duration::from_secs(1),
        "{:?}",
        probe.elapsed()
    );
    // Every idle connection is closed: over the cap at once, the rest after the header-read
    // timeout.
    let started = Instant::now();
    for stream in &mut idle {
        assert!(
            closed_within(stream, Duration::from_secs(5)).await,
            "an idle ingress connection stayed open"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    drop(idle);
    let (status, _) = answer(client().get(format!("{}/service/health", sluice.ingress_url))).await;
    assert_eq!(status, 200, "the ingress answers once the flood is gone");

    // The admin listener closes a silent connection, and one idle after a request.
    let mut silent = TcpStream::connect(&admin).await.unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(4)).await,
        "a silent admin connection stayed open"
    );
    keep_alive_closes(&admin, "/health").await;
    keep_alive_closes(&ingress, "/service/health").await;
}

#[tokio::test]
async fn crafted_ids_and_framing_are_refused_not_panicked_on() {
    let sluice = Sluice::builder().start().await.unwrap();
    // 10 bytes, a two-byte 'é' across the key/uuid split, 21 bytes: 33 bytes after inv_1.
    let crafted = format!("inv_1{}%C3%A9{}", "a".repeat(10), "a".repeat(21));
    for path in [
        format!("/service/attach/{crafted}"),
        format!("/service/output/{crafted}"),
    ] {
        let (status, _) = answer(client().get(format!("{}{path}", sluice.ingress_url))).await;
        assert_eq!(status, 400, "{path}");
    }
    let raw = format!("inv_1{}é{}", "a".repeat(10), "a".repeat(21));
    let (status, _) = answer(
        client()
            .post(format!("{}/service/attach", sluice.ingress_url))
            .json(&json!({"target": "invocation", "invocationId": raw})),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) =
        answer(client().get(format!("{}/invocations/{crafted}", sluice.admin_url))).await;
    assert_eq!(status, 400);
    // '%+f' is not percent-encoding.
    let (status, _) =
        answer(client().post(format!("{}/service/call/Greeter/%+f", sluice.ingress_url))).await;
    assert_eq!(status, 400);

    // Both Content-Length and Transfer-Encoding: refused, and the connection closed.
    let ingress = sluice.ingress_url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(ingress).await.unwrap();
    stream
        .write_all(
            format!("POST /service/send/Greeter/greet HTTP/1.1\r\nhost: {ingress}\r\ncontent-type: application/json\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\n\"Bob\"\r\n0\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(reply.contains("Transfer-Encoding"), "{reply}");
    // Still alive.
    let (status, _) = answer(client().get(format!("{}/service/health", sluice.ingress_url))).await;
    assert_eq!(status, 200);
}

/// One HTTP/1.1 answer read off `stream`: its head (lower-cased) and body, by its
/// `content-length`.
async fn read_answer(stream: &mut TcpStream) -> (String, String) {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 1024];
    let head_end = loop {
        if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(n > 0, "closed before the answer's head");
        bytes.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .expect("a content-length");
    while bytes.len() < head_end + length {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the answer's body");
        bytes.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&bytes[head_end..head_end + length]).into_owned();
    (head, body)
}

#[tokio::test]
async fn an_ingress_connection_carries_requests_until_the_client_asks_to_close_it() {
    // The idle timeout is the default minute: a close seen within seconds is the server's
    // answer to the client, not the timeout.
    let sluice = Sluice::builder().start().await.unwrap();
    let ingress = sluice.ingress_url.trim_start_matches("http://");
    let get = format!("GET /service/health HTTP/1.1\r\nhost: {ingress}\r\n\r\n");
    let mut kept = TcpStream::connect(ingress).await.unwrap();
    for _ in 0..3 {
        kept.write_all(get.as_bytes()).await.unwrap();
        let (head, body) = read_answer(&mut kept).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("connection: keep-alive"), "{head}");
        assert!(body.contains("services"), "{body}");
    }
    for (version, header) in [("HTTP/1.1", "connection: close\r\n"), ("HTTP/1.0", "")] {
        let mut closing = TcpStream::connect(ingress).await.unwrap();
        closing
            .write_all(
                format!("GET /service/health {version}\r\nhost: {ingress}\r\n{header}\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
        let (head, _) = read_answer(&mut closing).await;
        assert!(head.contains(" 200"), "{version}: {head}");
        assert!(head.contains("connection: close"), "{version}: {head}");
        assert!(
            closed_within(&mut closing, Duration::from_secs(10)).await,
            "{version} {header:?}: the connection stayed open after its answer"
        );
    }
}

/// The awakeable id of `invocation` bytes and `index`.
fn awakeable_id(raw: &[u8], index: u32) -> String {
    let mut bytes = raw[..24].to_vec();
    bytes.extend_from_slice(&index.to_be_bytes());
    format!(
        "sign_1{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

#[tokio::test]
async fn awakeables_complete_once_within_their_caps() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .env("SERVICE_INGRESS__AWAKEABLE_PAYLOAD_LIMIT", "1 KiB")
        .env("SERVICE_INGRESS__MAX_AWAKEABLE_COMPLETIONS", "3")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let ingress = sluice.ingress_url.clone();
    let wait = || {
        client()
            .post(format!("{ingress}/service/call/Meter/awaitAwakeable"))
            .send()
    };
    // Resolves awakeable `id` with `body`: the status and the error code.
    let resolve = |id: &str, body: &str| {
        let req = client()
            .post(format!("{ingress}/service/awakeables/{id}/resolve"))
            .header("content-type", "application/json")
            .body(body.to_owned());
        async move {
            let (status, body) = answer(req).await;
            (status, body["error_code"].as_str().map(str::to_owned))
        }
    };
    let conflict = (409, Some("AWK0001".to_owned()));
    let waiting = tokio::spawn(wait());
    let id = next_awakeable(&ingress, "Meter", "").await;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(id.trim_start_matches("sign_1"))
        .unwrap();
    let real = u32::from_be_bytes(raw[24..28].try_into().unwrap());

    // Index 1 is the runtime's cancel signal: a client cannot forge it.
    assert_eq!(resolve(&awakeable_id(&raw, 1), "1").await, conflict);
    // Over the payload cap.
    let big = format!("\"{}\"", "x".repeat(2048));
    assert_eq!(resolve(&id, &big).await, (413, Some("SEC0004".to_owned())));
    // The real one completes once.
    assert_eq!(resolve(&id, "\"hello\"").await, (202, None));
    assert_eq!(resolve(&id, "\"again\"").await, conflict);
    let done = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(done.text().await.unwrap(), "\"hello\"");
    // Made-up indexes of a completed invocation are refused.
    assert_eq!(resolve(&awakeable_id(&raw, real + 7), "1").await, conflict);

    // A waiting invocation takes at most max-awakeable-completions of them.
    let waiting = tokio::spawn(wait());
    let second = next_awakeable(&ingress, "Meter", &id).await;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(second.trim_start_matches("sign_1"))
        .unwrap();
    let real = u32::from_be_bytes(raw[24..28].try_into().unwrap());
    for extra in 1..=4 {
        let (status, _) = resolve(&awakeable_id(&raw, real + extra), "1").await;
        let want = if extra <= 3 { 202 } else { 409 };
        assert_eq!(status, want, "forged completion {extra}");
    }
    // The cap counts completions, so the real one is refused too now; kill the waiter.
    let inv = sluice_ids(&raw);
    let (status, _) =
        answer(client().patch(format!("{}/invocations/{inv}/kill", sluice.admin_url))).await;
    assert!(status < 300, "{status}");
    let _ = tokio::time::timeout(Duration::from_secs(10), waiting).await;
}

/// The text form of the invocation id in the first 24 bytes of `raw`.
fn sluice_ids(raw: &[u8]) -> String {
    let bytes: [u8; 24] = raw[..24].try_into().unwrap();
    sluice_core::ids::InvocationId::from_bytes(bytes).to_string()
}

#[tokio::test]
async fn idempotency_keys_are_capped() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let send = |key: String| {
        client()
            .post(format!("{}/service/send/Greeter/greet", sluice.ingress_url))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body("\"Bob\"")
    };
    let (status, _) = answer(send("k".repeat(256))).await;
    assert_eq!(status, 202);
    let (status, body) = answer(send("k".repeat(257))).await;
    assert_eq!(
        (status, body["error_code"].as_str()),
        (400, Some("SEC0004")),
        "{body}"
    );
    let (status, _) = answer(send("k".repeat(100_000))).await;
    assert!((400..500).contains(&status), "{status}");
}

#[tokio::test]
async fn discovery_neither_echoes_internal_pages_nor_reaches_metadata_addresses() {
    // An "internal" page that answers everything with a secret past its first line.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let secret = "SECRET-INTERNAL-VALUE";
    let page = format!(
        "{}{secret}{}",
        "internal status page ".repeat(5),
        "z".repeat(500)
    );
    let app = axum::Router::new().fallback(move || {
        let page = page.clone();
        async move { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, page) }
    });
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let sluice = Sluice::builder().start().await.unwrap();
    let register = |uri: String| {
        client()
            .post(format!("{}/deployments", sluice.admin_url))
            .json(&json!({"uri": uri, "use_http_11": true}))
    };
    let (status, body) = answer(register(format!("http://127.0.0.1:{port}/internal"))).await;
    assert!(status >= 400, "{status}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        !message.contains(secret),
        "the internal page leaked: {message}"
    );
    assert!(message.len() < 400, "{message}");
    for uri in [
        "http://169.254.169.254/latest/",
        "http://[fd00:ec2::254]/",
        "http://[fe80::1]:9080/",
    ] {
        let started = Instant::now();
        let (status, body) = answer(register(uri.to_owned())).await;
        assert_eq!(
            (status, body["restate_code"].as_str()),
            (400, Some("SEC0005")),
            "{uri}: {body}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{uri} was tried"
        );
    }
    server.abort();
}

#[tokio::test]
async fn kafka_properties_are_allow_listed_and_secrets_never_shown() {
    let sluice = Sluice::builder().start().await.unwrap();
    let create = |properties: Value| {
        client()
            .post(format!("{}/kafka-clusters", sluice.admin_url))
            .json(&json!({"name": "k", "properties": properties}))
    };
    for (key, value) in [
        ("plugin.library.paths", "/tmp/evil.so"),
        ("sasl.kerberos.kinit.cmd", "touch /tmp/pwned"),
        ("ssl.key.location", "/etc/shadow"),
    ] {
        let (status, body) = answer(create(
            json!({"bootstrap.servers": "127.0.0.1:1", key: value}),
        ))
        .await;
        assert_eq!(
            (status, body["restate_code"].as_str()),
            (400, Some("SEC0007")),
            "{key}: {body}"
        );
        assert!(body["message"].as_str().unwrap().contains(key), "{body}");
    }
    let (status, body) = answer(create(json!({
        "bootstrap.servers": "127.0.0.1:1",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "me",
        "sasl.password": "hunter2-hunter2",
    })))
    .await;
    assert!(status < 300, "{status}: {body}");
    for path in ["/kafka-clusters", "/kafka-clusters/k"] {
        let (status, body) = answer(client().get(format!("{}{path}", sluice.admin_url))).await;
        assert_eq!(status, 200);
        let text = body.to_string();
        assert!(!text.contains("hunter2"), "{path}: {text}");
        assert!(
            text.contains("<redacted>") && text.contains("\"me\""),
            "{path}: {text}"
        );
    }
    assert!(!sluice.stderr().contains("hunter2"));
}

#[tokio::test]
async fn plugin_settings_are_capped_by_the_server() {
    let sluice = Sluice::builder().start().await.unwrap();
    for query in [
        "hook=extract&deadline=1h",
        "hook=extract&memory-limit=8%20GiB",
        "hook=extract&fuel=99999999999999",
    ] {
        let (status, body) = answer(
            client()
                .put(format!("{}/plugins/greedy?{query}", sluice.admin_url))
                .body(b"\0asm not really".to_vec()),
        )
        .await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(
            body.to_string().contains("plugin-limits"),
            "{query}: {body}"
        );
    }
}

#[tokio::test]
async fn the_admin_listener_serves_tls_when_given_a_certificate() {
    let scratch = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_path = scratch.path().join("admin.pem");
    let key_path = scratch.path().join("admin.key");
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let sluice = Sluice::builder()
        .with_tokens()
        .admin_tls(&cert_path, &key_path)
        .start()
        .await
        .unwrap();
    let admin = sluice.admin_url.trim_start_matches("http://").to_owned();

    // A client that trusts the certificate gets its answer over TLS.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = TcpStream::connect(&admin).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(
        format!("GET /version HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {ADMIN_TOKEN}\r\nconnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("max_admin_api_version"), "{reply}");

    // Plain HTTP gets no answer from it.
    let plain = client()
        .get(format!("{}/version", sluice.admin_url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
}

/// A chain of functions that each double a value the first built (`repeat` under the memory
/// cap, then `encode` after `encode`) aborted the process on a 1.6 GB allocation: only the
/// `repeat` was charged. Every function's answer is charged now, and no value over
/// `admin.query-max-value-size` reaches the next one: the chain is refused with a coded 400,
/// under an address space where the old 1.6 GB could not be allocated, and the next query is
/// answered at once.
#[tokio::test]
async fn a_chain_of_growing_functions_is_refused_and_the_next_query_runs_at_once() {
    let sluice = Sluice::builder()
        .wrapper("prlimit", &["--as=4294967296", "--"])
        .start()
        .await
        .unwrap();
    for sql in [
        "SELECT length(encode(encode(encode(encode(repeat('x', 100000000), 'hex'), 'hex'), 'hex'), 'hex'))",
        "SELECT length(encode(encode(encode(encode(encode(repeat('x', 10000000), 'hex'), 'hex'), 'hex'), 'hex'), 'hex'))",
        "SELECT length(to_hex(1) || encode(encode(encode(encode(encode(repeat('x', 10000000), 'base64'), 'base64'), 'base64'), 'base64'), 'base64'))",
    ] {
        let (status, body) = sluice.query(sql).await;
        assert_eq!(
            (status, body["restate_code"].as_str()),
            (400, Some("SQL0001")),
            "{sql}: {body}"
        );
        assert!(
            body.to_string().contains("admin.query-max-value-size"),
            "{sql}: {body}"
        );
        let asked = Instant::now();
        let (status, body) = sluice.query("SELECT 1 AS n").await;
        assert_eq!((status, &body["rows"][0]["n"]), (200, &json!(1)), "{body}");
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "SELECT 1 took {:?} after the chain",
            asked.elapsed()
        );
    }
}

/// A query past its timeout gives its place back at once: while one query is stopped at its
/// timeout, the next is answered without waiting for it.
#[tokio::test]
async fn a_timed_out_query_does_not_hold_up_the_next() {
    let sluice = Sluice::builder()
        .env("SERVICE_ADMIN__QUERY_TIMEOUT", "1s")
        .start()
        .await
        .unwrap();
    let heavy = "SELECT sum(a.value * b.value) AS s FROM generate_series(1, 200000) a CROSS JOIN generate_series(1, 200000) b";
    let (status, body) = sluice.query(heavy).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("admin.query-timeout"), "{body}");
    let asked = Instant::now();
    let (status, body) = sluice.query("SELECT 1 AS n").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "SELECT 1 took {:?} after a timed-out query",
        asked.elapsed()
    );
}

/// What one query's functions build is bounded per query, not per call: pieces each under
/// `admin.query-memory-limit` (128 MiB) that add up to gigabytes are refused, under an address
/// space of 4 GiB where building them aborted the process.
#[tokio::test]
async fn a_query_cannot_add_up_pieces_past_its_memory_cap() {
    // Values as large as the pieces are allowed here: the bound under test is the sum.
    let sluice = Sluice::builder()
        .wrapper("prlimit", &["--as=4294967296", "--"])
        .env("SERVICE_ADMIN__QUERY_MAX_VALUE_SIZE", "1GiB")
        .start()
        .await
        .unwrap();
    let twelve = ["repeat('x', 120000000)"; 12];
    for sql in [
        format!("SELECT concat({}) AS r", twelve.join(", ")),
        format!("SELECT {} AS r", twelve[..3].join(" || ")),
        "WITH t AS (SELECT repeat('x', 100000000) AS s) SELECT concat(s, s, s, s, s, s, s, s, s, s, s, s) AS r FROM t".to_owned(),
    ] {
        let (status, body) = sluice.query(&sql).await;
        assert_eq!(status, 400, "{sql}: {body}");
        assert!(
            body.to_string().contains("admin.query-memory-limit"),
            "{sql}: {body}"
        );
    }
    let (status, _) = answer(client().get(format!("{}/version", sluice.admin_url))).await;
    assert_eq!(status, 200, "the process survived the queries");
    // A join within the cap is answered.
    let (status, body) = sluice
        .query("SELECT length(repeat('x', 1000000) || repeat('y', 1000000)) AS n")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rows"][0]["n"], 2_000_000, "{body}");
}
