//! Clients that do not take their answers: an HTTP/1.1 socket left unread, an HTTP/2
//! connection whose streams' windows stay at zero. Each holds its connection, its place under
//! the connection cap and its answer's bytes only as long as the write bounds allow
//! (`ingress.connections.write-timeout`, `min-send-rate`, `max-unsent-bytes`,
//! `evict-stalled-after`; the same keys under `admin.connections`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_tests::{Sluice, TestDeployment};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpSocket, TcpStream};

/// Bytes of the output the HTTP/1.1 readers ask for: more than the kernel's socket buffers on
/// both ends hold (4 MiB to send at most, 4 KiB to receive as the readers set), so its write
/// waits for them.
const LARGE: u64 = 8_000_000;

/// Sluice with a deployment, its ingress bounded by `env` (`SERVICE_INGRESS__CONNECTIONS__…`).
async fn sluice_with(env: &[(&str, &str)]) -> (Sluice, TestDeployment) {
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut builder = Sluice::builder();
    for (key, value) in env {
        builder = builder.env(&format!("SERVICE_INGRESS__CONNECTIONS__{key}"), value);
    }
    let sluice = builder.start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    (sluice, dep)
}

/// The invocation id of a completed `Meter/inflate(bytes)`, whose output is `bytes` + 2 bytes.
async fn inflated(sluice: &Sluice, bytes: u64) -> String {
    let resp = reqwest::Client::new()
        .post(format!("{}/Meter/inflate", sluice.ingress_url))
        .header("content-type", "application/json")
        .header("idempotency-key", format!("inflated-{bytes}"))
        .body(bytes.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.headers()["x-restate-id"].to_str().unwrap().to_owned()
}

fn addr_of(url: &str) -> std::net::SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

/// An HTTP/1.1 connection that asks for `path` and never reads: its receive buffer is 4 KiB.
async fn unread(sluice: &Sluice, path: &str) -> TcpStream {
    unread_request(
        &sluice.ingress_url,
        &format!("GET {path} HTTP/1.1\r\nhost: sluice\r\n\r\n"),
    )
    .await
}

/// An HTTP/1.1 connection to `url` that sends `request` and never reads: its receive buffer
/// is 4 KiB.
async fn unread_request(url: &str, request: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr_of(url)).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

/// Whether the server still holds its end of `stream` open: its socket, as /proc/net/tcp
/// lists it, is ESTABLISHED. Read without reading `stream` (a read would let the server's
/// stalled write go on).
fn server_end_open(stream: &TcpStream) -> bool {
    let ours = stream.local_addr().unwrap().port();
    let theirs = stream.peer_addr().unwrap().port();
    let port =
        |address: &str| u16::from_str_radix(address.rsplit(':').next().unwrap(), 16).unwrap();
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .any(|row| {
            let fields: Vec<&str> = row.split_whitespace().collect();
            port(fields[1]) == theirs && port(fields[2]) == ours && fields[3] == "01"
        })
}

/// Awaits the server's closing its end of `stream` (see [`server_end_open`]), up to `within`.
async fn server_closes(stream: &TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while server_end_open(stream) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Awaits the server's closing every zero-window connection (`h2`, whose driving tasks end)
/// and every unread one (`readers`), each within 30 s; answers how long after `started`.
async fn all_closed(
    h2: Vec<tokio::task::JoinHandle<()>>,
    readers: &[TcpStream],
    started: Instant,
) -> Duration {
    for driving in h2 {
        tokio::time::timeout(Duration::from_secs(30), driving)
            .await
            .expect("the zero-window connection is closed")
            .unwrap();
    }
    for reader in readers {
        assert!(server_closes(reader, Duration::from_secs(30)).await);
    }
    started.elapsed()
}

/// An HTTP/2 connection (prior knowledge) whose streams' windows are zero, with `streams`
/// requests for `path` whose answers' heads have come (their bodies cannot). Answers the
/// statuses and the task driving the connection, which ends when the server closes it.
async fn zero_window(
    sluice: &Sluice,
    path: &str,
    streams: usize,
) -> (Vec<u16>, tokio::task::JoinHandle<()>) {
    zero_window_to(&sluice.ingress_url, path, streams).await
}

/// [`zero_window`] to the listener at `url`.
async fn zero_window_to(
    url: &str,
    path: &str,
    streams: usize,
) -> (Vec<u16>, tokio::task::JoinHandle<()>) {
    let tcp = TcpStream::connect(addr_of(url)).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake::<_, Empty<Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    let driving = tokio::spawn(async move {
        let _ = conn.await;
    });
    let uri: http::Uri = format!("{url}{path}").parse().unwrap();
    let heads: Vec<_> = (0..streams)
        .map(|_| {
            let mut send = send.clone();
            let uri = uri.clone();
            tokio::spawn(async move {
                send.ready().await.unwrap();
                let request = http::Request::get(uri).body(Empty::new()).unwrap();
                let resp = send.send_request(request).await.unwrap();
                let status = resp.status().as_u16();
                // The body stays unread, held with the connection.
                std::mem::forget(resp);
                status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for head in heads {
        statuses.push(head.await.unwrap());
    }
    std::mem::forget(send);
    (statuses, driving)
}

/// How long a fresh client took to be answered 200 by `url`, trying a new connection each
/// time: at a full cap each refusal closes the connection at once, and a place frees only
/// through eviction, which takes an answer that has waited a second for its client.
async fn fresh_client_served(url: &str) -> Duration {
    let started = Instant::now();
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    loop {
        match fresh.get(url).send().await {
            Ok(resp) if resp.status() == 200 => return started.elapsed(),
            _ => assert!(
                started.elapsed() < Duration::from_secs(30),
                "no fresh client served by {url} in 30 s beside the stalled readers"
            ),
        }
    }
}

/// An admin connection that asks for an 8 MB query answer and never reads it.
async fn unread_query(sluice: &Sluice) -> TcpStream {
    let query = r#"{"query": "SELECT repeat('x', 8000000) AS v"}"#;
    unread_request(
        &sluice.admin_url,
        &format!(
            "POST /query HTTP/1.1\r\nhost: localhost\r\naccept: application/json\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{query}",
            query.len()
        ),
    )
    .await
}

/// At `connections.max = 20`, ten HTTP/1.1 clients that never read an 8 MB output and ten
/// HTTP/2 clients whose windows stay at zero take every place; a fresh client is served all
/// the same, long before their write timeout, because a connection whose answer has waited a
/// second for its client gives its place up at the cap.
#[tokio::test]
async fn a_fresh_client_is_served_while_stalled_readers_fill_the_connection_cap() {
    let (sluice, _dep) = sluice_with(&[
        ("MAX", "20"),
        ("MAX_PER_IP", "20"),
        ("WRITE_TIMEOUT", "60s"),
    ])
    .await;
    let id = inflated(&sluice, LARGE).await;
    let mut readers = Vec::new();
    for _ in 0..10 {
        readers.push(unread(&sluice, &format!("/restate/invocation/{id}/output")).await);
    }
    let mut h2 = Vec::new();
    for _ in 0..10 {
        let (statuses, driving) = zero_window(&sluice, "/restate/health", 1).await;
        assert_eq!(statuses, vec![200]);
        h2.push(driving);
    }
    let served = fresh_client_served(&format!("{}/restate/health", sluice.ingress_url)).await;
    println!("a fresh client served {served:?} after 20 stalled readers filled the cap");
    drop((readers, h2));
}

/// With `write-timeout = 2s`, clients that never take their answers are closed once their
/// answers have waited that long: HTTP/1.1 readers of an 8 MB output, and HTTP/2 connections
/// whose every stream's window stays at zero. Fresh clients are served meanwhile.
#[tokio::test]
async fn clients_that_never_take_their_answers_are_closed_after_the_write_timeout() {
    let (sluice, _dep) = sluice_with(&[("WRITE_TIMEOUT", "2s")]).await;
    let id = inflated(&sluice, LARGE).await;
    let started = Instant::now();
    let mut readers = Vec::new();
    for _ in 0..5 {
        readers.push(unread(&sluice, &format!("/restate/invocation/{id}/output")).await);
    }
    let mut h2 = Vec::new();
    for _ in 0..5 {
        let (statuses, driving) = zero_window(&sluice, "/restate/health", 3).await;
        assert_eq!(statuses, vec![200; 3]);
        h2.push(driving);
    }
    let took = all_closed(h2, &readers, started).await;
    println!("ten stalled readers closed within {took:?} of a 2 s write timeout");
    assert!(
        took >= Duration::from_secs(2),
        "closed before the timeout: {took:?}"
    );
    let resp = reqwest::get(format!("{}/restate/health", sluice.ingress_url))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// Four HTTP/2 connections with 100 zero-window streams each, all asking for one 2 MiB output,
/// hold at most `max-unsent-bytes` (8 MiB) of answers per connection: the streams past it
/// are refused 503 ING0010, and the process grows by at most 64 MiB (before: +900 MiB, every
/// stream's answer held until the client left).
#[tokio::test]
async fn zero_window_streams_hold_at_most_the_unsent_cap_of_answers() {
    let (sluice, _dep) = sluice_with(&[]).await;
    let id = inflated(&sluice, 2 << 20).await;
    let path = format!("/restate/invocation/{id}/output");
    // The output is read once, so the store's own caching is not counted as the streams'.
    let resp = reqwest::get(format!("{}{path}", sluice.ingress_url))
        .await
        .unwrap();
    assert_eq!(resp.bytes().await.unwrap().len(), (2 << 20) + 2);
    let before = sluice.metrics().await["process_resident_memory_bytes"];
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let (answered, driving) = zero_window(&sluice, &path, 100).await;
        statuses.extend(answered);
        held.push(driving);
    }
    let after = sluice.metrics().await["process_resident_memory_bytes"];
    let grown = (after - before) / f64::from(1 << 20);
    let taken = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 503).count();
    println!(
        "4 x 100 zero-window streams: {taken} answers held, {refused} refused, RSS +{grown:.1} MiB"
    );
    assert_eq!(taken + refused, 400, "{statuses:?}");
    assert!(taken <= 4 * 4, "{taken} answers of 2 MiB held");
    assert!(grown <= 64.0, "resident memory grew {grown:.1} MiB");
}

/// The admin listener holds the same bounds (`admin.connections.write-timeout`): a client that
/// never reads an 8 MB query answer, and HTTP/2 connections whose windows stay at zero, are
/// closed once their answers have waited 2 s; the admin API answers meanwhile.
#[tokio::test]
async fn the_admin_listener_closes_clients_that_never_take_their_answers() {
    let sluice = Sluice::builder()
        .env("SERVICE_ADMIN__CONNECTIONS__WRITE_TIMEOUT", "2s")
        .start()
        .await
        .unwrap();
    let started = Instant::now();
    let mut readers = Vec::new();
    for _ in 0..3 {
        readers.push(unread_query(&sluice).await);
    }
    let mut h2 = Vec::new();
    for _ in 0..3 {
        let (statuses, driving) = zero_window_to(&sluice.admin_url, "/version", 2).await;
        assert_eq!(statuses, vec![200; 2]);
        h2.push(driving);
    }
    let (status, _) = sluice.query("SELECT 1 AS n").await;
    assert_eq!(status, 200, "the admin API answers beside them");
    let took = all_closed(h2, &readers, started).await;
    println!("six stalled admin readers closed within {took:?} of a 2 s write timeout");
    assert!(
        took >= Duration::from_secs(2),
        "closed before the timeout: {took:?}"
    );
}

/// At `admin.connections.max = 6`, three clients that never read a query's answer and three
/// zero-window HTTP/2 clients take every place; an operator's query is answered all the same,
/// long before their write timeout: the connection whose answer waited longest gives its place.
#[tokio::test]
async fn an_admin_request_is_served_while_stalled_readers_fill_the_admin_cap() {
    let sluice = Sluice::builder()
        .env("SERVICE_ADMIN__CONNECTIONS__MAX", "6")
        .env("SERVICE_ADMIN__CONNECTIONS__MAX_PER_IP", "6")
        .env("SERVICE_ADMIN__CONNECTIONS__WRITE_TIMEOUT", "60s")
        .start()
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(unread_query(&sluice).await);
    }
    let mut h2 = Vec::new();
    for _ in 0..3 {
        let (statuses, driving) = zero_window_to(&sluice.admin_url, "/version", 1).await;
        assert_eq!(statuses, vec![200]);
        h2.push(driving);
    }
    let served = fresh_client_served(&format!("{}/version", sluice.admin_url)).await;
    println!("an admin request served {served:?} after 6 stalled readers filled the cap");
    drop((held, h2));
}
