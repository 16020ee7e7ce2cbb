//! What a client can make Sluice hold, against the real binary: connections kept by clients
//! that left, waits for an outcome, one address taking every place, headers that trickle in.
//! Each test runs at a scale it can afford by lowering the caps in the node's config.

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::{Sluice, TestDeployment, closed_within, connect_from, status_within};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

fn attach_request(ingress: &str, id: &str) -> String {
    format!("GET /service/attach/{id} HTTP/1.1\r\nhost: {ingress}\r\n\r\n")
}

/// A new connection to `ingress` with an attach to `id` sent on it (the answer not read).
async fn attach(ingress: &str, id: &str) -> TcpStream {
    let mut stream = TcpStream::connect(ingress).await.unwrap();
    stream
        .write_all(attach_request(ingress, id).as_bytes())
        .await
        .unwrap();
    stream
}

/// A send that runs in a year: something to attach to that never completes.
async fn far_send(sluice: &Sluice) -> String {
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/service/send/Greeter/greet?delay=8760h",
            sluice.ingress_url
        ))
        .header("content-type", "application/json")
        .body("\"far\"")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    body["invocationId"].as_str().unwrap().to_owned()
}

async fn greet(sluice: &Sluice, client: &reqwest::Client) -> u16 {
    match client
        .post(format!("{}/service/call/Greeter/greet", sluice.ingress_url))
        .header("content-type", "application/json")
        .body("\"x\"")
        .timeout(Duration::from_secs(10))
        .send()
        .await
    {
        Ok(resp) => resp.status().as_u16(),
        Err(_) => 0,
    }
}

/// Attaches whose clients close at once give their connection back: 200 of them against a
/// cap of 40 leave room for everyone else (before, each kept its place for as long as the
/// invocation took, a year here).
#[tokio::test]
async fn attaches_whose_client_left_give_their_place_back() {
    let deployment = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .config(
            "[ingress.connections]\nmax = 40\nmax-per-ip = 40\n[worker]\nmax-waiters-per-invocation = 1000\n",
        )
        .start()
        .await
        .unwrap();
    sluice.register(&deployment.uri, false).await;
    let id = far_send(&sluice).await;
    let ingress = sluice.ingress_url.trim_start_matches("http://").to_owned();
    for _ in 0..200 {
        let Ok(mut stream) = TcpStream::connect(&ingress).await else {
            continue;
        };
        let _ = stream
            .write_all(attach_request(&ingress, &id).as_bytes())
            .await;
        drop(stream);
    }
    // Fresh clients are served while the invocation still has a year to go.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let started = Instant::now();
    let mut served = 0;
    while served < 20 && started.elapsed() < Duration::from_secs(20) {
        if greet(&sluice, &client).await == 200 {
            served += 1;
        }
    }
    assert_eq!(served, 20, "fresh calls were locked out");
    // And the waits are gone from the partition: a cap of 1000 waiters was never reached.
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(attach(&ingress, &id).await);
    }
    for stream in &mut held {
        assert_eq!(
            status_within(stream, Duration::from_millis(200)).await,
            None,
            "a live attach waits"
        );
    }
}

/// One invocation takes at most `worker.max-waiters-per-invocation` waits (429 SEC0008 past
/// it), waits whose client left are pruned before that is checked, and an attach ends after
/// `ingress.attach-max-wait` with 470, as `/output` answers.
#[tokio::test]
async fn waits_per_invocation_are_capped_pruned_and_bounded_in_time() {
    let deployment = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .config("[ingress]\nattach-max-wait = \"5s\"\n[worker]\nmax-waiters-per-invocation = 5\n")
        .start()
        .await
        .unwrap();
    sluice.register(&deployment.uri, false).await;
    let id = far_send(&sluice).await;
    let ingress = sluice.ingress_url.trim_start_matches("http://").to_owned();
    // Six attaches: the partition takes five and refuses one (whichever came last).
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(attach(&ingress, &id).await);
    }
    let mut answers = Vec::new();
    for stream in &mut held {
        answers.push(status_within(stream, Duration::from_millis(500)).await);
    }
    answers.sort();
    assert_eq!(
        answers,
        [None, None, None, None, None, Some(429)],
        "five wait, one is refused"
    );
    // The five leave; a new wait is taken (and answered 470 when its time is up).
    drop(held);
    let started = Instant::now();
    let mut waiting = attach(&ingress, &id).await;
    let status = status_within(&mut waiting, Duration::from_secs(15)).await;
    assert_eq!(status, Some(470), "after {:?}", started.elapsed());
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "answered after {:?}, before attach-max-wait",
        started.elapsed()
    );
}

/// One client address holds at most `max-per-ip` connections, on both listeners: another
/// address is still served while it holds all of its own.
#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let sluice = Sluice::builder()
        .config(
            "[ingress.connections]\nmax = 50\nmax-per-ip = 10\n[admin.connections]\nmax = 30\nmax-per-ip = 5\n",
        )
        .start()
        .await
        .unwrap();
    for (address, cap) in [
        (sluice.ingress_url.trim_start_matches("http://"), 10),
        (sluice.admin_url.trim_start_matches("http://"), 5),
    ] {
        // One more than the address's cap: one of them (whichever the server took last) is
        // closed at once, the others stay open.
        let mut held = Vec::new();
        for _ in 0..=cap {
            held.push(connect_from([127, 0, 0, 2], address).await.unwrap());
        }
        let mut closed = 0;
        for stream in &mut held {
            if closed_within(stream, Duration::from_millis(300)).await {
                closed += 1;
            }
        }
        assert_eq!(closed, 1, "{address}: connections over the address's cap");
        // Another address is served.
        let mut other = connect_from([127, 0, 0, 3], address).await.unwrap();
        let path = if cap == 10 {
            "/service/health"
        } else {
            "/health"
        };
        other
            .write_all(format!("GET {path} HTTP/1.1\r\nhost: {address}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        assert_eq!(
            status_within(&mut other, Duration::from_secs(2)).await,
            Some(200),
            "{address}: another address was not served"
        );
        // The places come back when the connections close.
        drop(held);
        let started = Instant::now();
        loop {
            let mut again = connect_from([127, 0, 0, 2], address).await.unwrap();
            again
                .write_all(format!("GET {path} HTTP/1.1\r\nhost: {address}\r\n\r\n").as_bytes())
                .await
                .unwrap();
            if status_within(&mut again, Duration::from_secs(1)).await == Some(200) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{address}: the address's places never came back"
            );
        }
    }
}

/// Headers that trickle in a byte at a time must still all be in within the header-read
/// timeout (before, the timeout was per read, so a byte every few seconds held a connection
/// for ever); an admin connection that sends nothing is closed after it as well.
#[tokio::test]
async fn trickled_headers_and_silent_connections_are_closed() {
    let sluice = Sluice::builder()
        .config(
            "[ingress.connections]\nheader-read-timeout = \"1s\"\n[admin.connections]\nheader-read-timeout = \"1s\"\n",
        )
        .start()
        .await
        .unwrap();
    let ingress = sluice.ingress_url.trim_start_matches("http://").to_owned();
    let mut slow = TcpStream::connect(&ingress).await.unwrap();
    let started = Instant::now();
    let request = format!("GET /service/health HTTP/1.1\r\nhost: {ingress}\r\nx-pad: ");
    let mut closed = false;
    for byte in request.bytes().chain(std::iter::repeat(b'a')) {
        if slow.write_all(&[byte]).await.is_err() {
            closed = true;
            break;
        }
        if closed_within(&mut slow, Duration::from_millis(300)).await {
            closed = true;
            break;
        }
        if started.elapsed() > Duration::from_secs(6) {
            break;
        }
    }
    assert!(closed, "a connection trickling its headers stayed open");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "closed only after {:?}",
        started.elapsed()
    );
    let admin = sluice.admin_url.trim_start_matches("http://").to_owned();
    let mut silent = TcpStream::connect(&admin).await.unwrap();
    let started = Instant::now();
    assert!(closed_within(&mut silent, Duration::from_secs(3)).await);
    assert!(started.elapsed() < Duration::from_millis(2500));
}

/// A body that never comes is cut at the header-read timeout on a reused HTTP/1.1 connection
/// too (before, each read of a later request's body waited pingora's 60 s).
#[tokio::test]
async fn a_missing_body_on_a_reused_connection_is_cut_at_the_header_read_timeout() {
    let sluice = Sluice::builder()
        .config("[ingress.connections]\nheader-read-timeout = \"1s\"\n")
        .start()
        .await
        .unwrap();
    let ingress = sluice.ingress_url.trim_start_matches("http://").to_owned();
    let mut conn = TcpStream::connect(&ingress).await.unwrap();
    conn.write_all(format!("GET /service/health HTTP/1.1\r\nhost: {ingress}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(
        status_within(&mut conn, Duration::from_secs(10)).await,
        Some(200)
    );
    // The second request on the same connection announces 10 bytes and sends none.
    conn.write_all(
        format!(
            "POST /restate/status HTTP/1.1\r\nhost: {ingress}\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let started = Instant::now();
    assert!(
        closed_within(&mut conn, Duration::from_secs(10)).await,
        "the connection stayed open"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "closed only after {:?}",
        started.elapsed()
    );
}

/// Sends `count` `Meter/inflate(bytes)` with idempotency keys (their results are kept for the
/// retention), and waits until every one completed.
async fn kept_results(sluice: &Sluice, count: usize, bytes: usize) {
    let client = reqwest::Client::new();
    for i in 0..count {
        let resp = client
            .post(format!("{}/Meter/inflate/send", sluice.ingress_url))
            .header("content-type", "application/json")
            .header("idempotency-key", format!("kept-{i}"))
            .body(bytes.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while sluice
        .count("SELECT count(*) AS n FROM sys_invocation WHERE status = 'completed'")
        .await
        < count as u64
    {
        assert!(Instant::now() < deadline, "the sends never completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Listing invocations reads no output and runs beside the admin listener's thread: `/health`
/// answers within 50 ms while lists over large kept results run (before, every list decoded
/// every output on that thread, and `/health` waited behind it for seconds).
#[tokio::test]
async fn lists_over_large_results_never_stall_health() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    kept_results(&sluice, 40, 1_000_000).await;

    let listing = {
        let admin = sluice.admin_url.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut slowest = Duration::ZERO;
            for _ in 0..100 {
                let started = Instant::now();
                let resp = client
                    .get(format!("{admin}/invocations?limit=1"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200);
                let body: Value = resp.json().await.unwrap();
                assert_eq!(body["invocations"].as_array().unwrap().len(), 1);
                slowest = slowest.max(started.elapsed());
            }
            slowest
        })
    };
    let client = reqwest::Client::new();
    let mut health = Vec::new();
    while !listing.is_finished() {
        let started = Instant::now();
        let resp = client
            .get(format!("{}/health", sluice.admin_url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        health.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let slowest_list = listing.await.unwrap();
    let slowest_health = health.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{} health checks, slowest {slowest_health:?}; slowest list {slowest_list:?}",
        health.len()
    );
    assert!(slowest_health < Duration::from_millis(50), "{health:?}");
}

/// Results kept for their idempotency keys rest in the store, not in memory: once the store's
/// page cache is full, 30 calls with 4 MB outputs, made one after another, leave the process
/// about one output larger (before, every kept output stayed in memory for the retention:
/// +120 MB and more).
#[tokio::test]
async fn kept_results_rest_in_the_store() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let client = reqwest::Client::new();
    let call = |i: usize| {
        client
            .post(format!("{}/Meter/inflate", sluice.ingress_url))
            .header("content-type", "application/json")
            .header("idempotency-key", format!("big-{i}"))
            .body("4000000")
            .send()
    };
    // Warm up: the store's page cache (64 MiB) fills with the first 80 MB written.
    for i in 0..20 {
        assert_eq!(call(i).await.unwrap().status(), 200);
    }
    let before = sluice.metrics().await["process_resident_memory_bytes"];
    for i in 20..50 {
        let resp = call(i).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.bytes().await.unwrap().len(), 4_000_002);
    }
    let after = sluice.metrics().await["process_resident_memory_bytes"];
    let grown = (after - before) / 1e6;
    eprintln!("30 kept 4 MB results: resident memory grew {grown:.1} MB");
    assert!(grown < 60.0, "grew {grown:.1} MB");
    // Still answered, from the store: a repeat of a key, and an attach.
    let resp = call(5).await.unwrap();
    assert_eq!(resp.bytes().await.unwrap().len(), 4_000_002);
}

/// Attaching to, and asking for the output of, resting invocations (delayed sends) leaves them
/// at rest: their inputs are not read back into memory (before, each attach woke its
/// invocation: held 30 → 0).
#[tokio::test]
async fn attaches_and_peeks_leave_resting_invocations_at_rest() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    let mut ids = Vec::new();
    for _ in 0..30 {
        ids.push(far_send(&sluice).await);
    }
    let held = |m: std::collections::HashMap<String, f64>| m["sluice_held_invocations"];
    assert_eq!(held(sluice.metrics().await), 30.0);
    let client = reqwest::Client::new();
    let mut attached = Vec::new();
    for id in &ids {
        let resp = client
            .get(format!(
                "{}/restate/invocation/{id}/output",
                sluice.ingress_url
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 470, "{id}");
        attached.push(attach(&sluice.ingress_url.replace("http://", ""), id).await);
    }
    // Every attach is registered (a cheap request behind them on each connection's
    // partition answers after it), and nothing woke.
    assert_eq!(held(sluice.metrics().await), 30.0);
    for mut stream in attached {
        assert_eq!(
            status_within(&mut stream, Duration::from_millis(100)).await,
            None
        );
    }
    assert_eq!(held(sluice.metrics().await), 30.0);
}

/// A suspended invocation is not attempted again for completions of awakeables it does not
/// await (before, each forged completion started an attempt that replayed its journal), and it
/// takes at most `ingress.max-awakeable-completion-bytes` of them in all.
#[tokio::test]
async fn forged_completions_neither_wake_a_suspension_nor_pass_their_bytes() {
    use base64::Engine as _;
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .env("SERVICE_WORKER__INVOKER__INACTIVITY_TIMEOUT", "200ms")
        .env("SERVICE_INGRESS__MAX_AWAKEABLE_COMPLETION_BYTES", "4KiB")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let ingress = sluice.ingress_url.clone();
    let waiting = {
        let ingress = ingress.clone();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{ingress}/service/call/Meter/awaitAwakeable"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        })
    };
    let id = sluice_tests::next_awakeable(&ingress, "Meter", "").await;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(id.trim_start_matches("sign_1"))
        .unwrap();
    let real = u32::from_be_bytes(raw[24..28].try_into().unwrap());
    let invocation =
        sluice_core::ids::InvocationId::from_bytes(raw[..24].try_into().unwrap()).to_string();
    let forged = |index: u32| {
        let mut bytes = raw[..24].to_vec();
        bytes.extend_from_slice(&index.to_be_bytes());
        format!(
            "sign_1{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
        )
    };
    let resolve = |awakeable: String, body: String| {
        let ingress = ingress.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{ingress}/service/awakeables/{awakeable}/resolve"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let state = || {
        let sluice = &sluice;
        let invocation = invocation.clone();
        async move {
            let (_, rows) = sluice
                .query(&format!(
                    "SELECT status, attempts FROM sys_invocation WHERE id = '{invocation}'"
                ))
                .await;
            let row = &rows["rows"][0];
            (
                row["status"].as_str().unwrap_or_default().to_owned(),
                row["attempts"].as_u64().unwrap_or_default(),
            )
        }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let attempts = loop {
        let (status, attempts) = state().await;
        if status == "suspended" {
            break attempts;
        }
        assert!(Instant::now() < deadline, "never suspended: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Ten forged completions, 300 bytes each: journaled, and no attempt.
    let body = format!("\"{}\"", "x".repeat(300));
    for extra in 1..=10 {
        assert_eq!(resolve(forged(real + extra), body.clone()).await, 202);
    }
    // One more of 1,000 bytes would pass 4 KiB in all.
    let big = format!("\"{}\"", "y".repeat(1000));
    assert_eq!(resolve(forged(real + 11), big).await, 409);
    assert_eq!(state().await, ("suspended".to_owned(), attempts));
    // The awaited one wakes it, and it answers.
    assert_eq!(resolve(id.clone(), "\"hello\"".into()).await, 202);
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer, "\"hello\"");
    assert_eq!(state().await.1, attempts + 1);
}

/// Suspended invocations keep no journal in memory: once the store's page cache is full, 20
/// sends with 4 MB inputs to a handler that suspends leave the process about an input larger
/// (before, every suspended journal stayed in memory with its input: +80 MB).
#[tokio::test]
async fn suspended_journals_rest_in_the_store() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .env("SERVICE_WORKER__INVOKER__INACTIVITY_TIMEOUT", "100ms")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let client = reqwest::Client::new();
    let body = format!("\"{}\"", "z".repeat(4_000_000));
    let send = || {
        client
            .post(format!("{}/Meter/sleepOn/send", sluice.ingress_url))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
    };
    let suspended = || async {
        sluice
            .count("SELECT count(*) AS n FROM sys_invocation WHERE status = 'suspended'")
            .await
    };
    let until_suspended = |n: u64| async move {
        let deadline = Instant::now() + Duration::from_secs(30);
        while suspended().await < n {
            assert!(Instant::now() < deadline, "never {n} suspended");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // Warm up: the store's page cache (64 MiB) fills with the first 80 MB written.
    for n in 1..=20 {
        assert_eq!(send().await.unwrap().status(), 202);
        until_suspended(n).await;
    }
    let before = sluice.metrics().await["process_resident_memory_bytes"];
    for n in 21..=40 {
        assert_eq!(send().await.unwrap().status(), 202);
        // One at a time: memory given back is reused by the next.
        until_suspended(n).await;
    }
    // Journals rest once everything applied is stored; the next metrics read is after that.
    let after = sluice.metrics().await["process_resident_memory_bytes"];
    let grown = (after - before) / 1e6;
    eprintln!("20 suspended 4 MB journals: resident memory grew {grown:.1} MB");
    assert!(grown < 40.0, "grew {grown:.1} MB");
}

/// Invocations backing off keep no journal in memory either: with their deployment gone, 20
/// sends with 4 MB inputs whose first attempts fail leave the process about an input larger
/// (before, every backing-off journal stayed in memory with its input: +80 MB, outside every
/// budget).
#[tokio::test]
async fn backing_off_journals_rest_in_the_store() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        // Each waits its first back-off for the whole test.
        .env(
            "SERVICE_WORKER__INVOKER__RETRY_POLICY__INITIAL_INTERVAL",
            "10min",
        )
        .env(
            "SERVICE_WORKER__INVOKER__RETRY_POLICY__MAX_INTERVAL",
            "10min",
        )
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    // The deployment goes away: every attempt fails to connect.
    drop(dep);
    let client = reqwest::Client::new();
    let body = format!("\"{}\"", "z".repeat(4_000_000));
    let send = || {
        client
            .post(format!("{}/Greeter/greet/send", sluice.ingress_url))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
    };
    let backing_off = || async {
        sluice
            .count("SELECT count(*) AS n FROM sys_invocation WHERE status = 'backing-off'")
            .await
    };
    let until_backing_off = |n: u64| async move {
        let deadline = Instant::now() + Duration::from_secs(30);
        while backing_off().await < n {
            assert!(Instant::now() < deadline, "never {n} backing off");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // Warm up: the store's page cache (64 MiB) fills with the first 80 MB written.
    for n in 1..=20 {
        assert_eq!(send().await.unwrap().status(), 202);
        until_backing_off(n).await;
    }
    let before = sluice.metrics().await["process_resident_memory_bytes"];
    for n in 21..=40 {
        assert_eq!(send().await.unwrap().status(), 202);
        until_backing_off(n).await;
    }
    let metrics = sluice.metrics().await;
    let grown = (metrics["process_resident_memory_bytes"] - before) / 1e6;
    // What the partitions hold for them, by the state gauges: records, not inputs.
    let held = metrics["sluice_invocation_memory_bytes{state=\"backing-off\"}"];
    eprintln!(
        "20 backing-off 4 MB journals: resident memory grew {grown:.1} MB; backing-off invocations hold {held} bytes"
    );
    assert!(grown < 40.0, "grew {grown:.1} MB");
    assert!(
        held < 1e6,
        "40 backing-off invocations hold {held} bytes in memory"
    );
}

/// With API keys a client can no longer name another tenant's scope (to fill its queue) or a
/// priority above its own: the key decides both, and a call without one is refused.
#[tokio::test]
async fn api_keys_bind_scope_and_priority() {
    use sha2::Digest as _;
    let digest = |key: &str| -> String {
        sha2::Sha256::digest(key.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .config(&format!(
            "[ingress]\nrequire-api-key = true\n\n[[ingress.api-keys]]\nsha256 = \"{}\"\nscope = \"alpha\"\n\n[[ingress.api-keys]]\nsha256 = \"{}\"\nscope = \"beta\"\nmax-priority = \"high\"\n",
            digest("alpha-secret"),
            digest("beta-secret")
        ))
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let client = reqwest::Client::new();
    let call = |path: &str, key: Option<&str>, priority: Option<&str>| {
        let mut request = client
            .post(format!("{}{path}", sluice.ingress_url))
            .header("content-type", "application/json")
            .body("\"k\"");
        if let Some(key) = key {
            request = request.header("x-sluice-api-key", key);
        }
        if let Some(priority) = priority {
            request = request.header("x-service-priority", priority);
        }
        async move {
            let resp = request.send().await.unwrap();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            (status, body["error_code"].as_str().map(str::to_owned))
        }
    };
    let coded = |status: u16, code: &str| (status, Some(code.to_owned()));
    let greet = "/Greeter/greet";
    assert_eq!(call(greet, None, None).await, coded(401, "SEC0009"));
    assert_eq!(
        call(greet, Some("guess"), None).await,
        coded(401, "SEC0009")
    );
    // Another tenant's scope, or a priority above the key's: refused.
    assert_eq!(
        call(
            "/service/scope/beta/call/Greeter/greet",
            Some("alpha-secret"),
            None
        )
        .await,
        coded(403, "SEC0010")
    );
    assert_eq!(
        call(greet, Some("alpha-secret"), Some("high")).await,
        coded(403, "SEC0010")
    );
    // The key's own scope: the call runs there, whatever path it took.
    assert_eq!(call(greet, Some("alpha-secret"), None).await.0, 200);
    assert_eq!(
        call(
            "/service/scope/alpha/call/Greeter/greet",
            Some("alpha-secret"),
            Some("low")
        )
        .await
        .0,
        200
    );
    assert_eq!(call(greet, Some("beta-secret"), Some("high")).await.0, 200);
    let (_, rows) = sluice
        .query("SELECT scope, count(*) AS n FROM sys_invocation GROUP BY scope ORDER BY scope")
        .await;
    assert_eq!(
        rows["rows"],
        serde_json::json!([{"scope": "alpha", "n": 2}, {"scope": "beta", "n": 1}]),
        "{rows}"
    );
}

/// A status list is bounded before it is parsed: six clients posting 10 MB `[0,0,…]` bodies
/// three times each leave the process about where it was (before, the whole body was parsed
/// into a list and then checked against its 100-target cap: +1.1 GB), and a list just past
/// the body bound is refused with its code.
#[tokio::test]
async fn huge_status_lists_are_refused_before_they_are_parsed() {
    let sluice = Sluice::builder().start().await.unwrap();
    let url = format!("{}/restate/status", sluice.ingress_url);
    let client = reqwest::Client::new();
    // Just past `ingress.target-body-limit` (256 KiB): refused with SEC0004, in body and header.
    let over = format!("[{}0]", "0,".repeat(140_000));
    let resp = client
        .post(&url)
        .header("content-type", "application/json")
        .body(over)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.headers()["x-service-error-code"], "SEC0004");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error_code"], "SEC0004", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("ingress.target-body-limit"),
        "{body}"
    );

    let before = sluice.metrics().await["process_resident_memory_bytes"];
    let huge = bytes::Bytes::from(format!("[{}0]", "0,".repeat(5_000_000)));
    let mut clients = Vec::new();
    for _ in 0..6 {
        let (client, url, huge) = (client.clone(), url.clone(), huge.clone());
        clients.push(tokio::spawn(async move {
            for _ in 0..3 {
                // The answer (413) may come while the body is still on its way, and the
                // connection closes behind it: either way nothing of it is kept.
                if let Ok(resp) = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(huge.clone())
                    .send()
                    .await
                {
                    assert_eq!(resp.status(), 413);
                }
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
    let after = sluice.metrics().await["process_resident_memory_bytes"];
    let grown = (after - before) / 1e6;
    eprintln!("18 status lists of 10 MB: resident memory grew {grown:.1} MB");
    assert!(grown < 40.0, "grew {grown:.1} MB");
}

/// A request body that announces itself and never sends a byte.
struct Stalled;

impl hyper::body::Body for Stalled {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Pending
    }
}

/// An HTTP/2 connection (prior knowledge) to `ingress`: the handle streams are sent on, and
/// the task driving the connection, which ends when the server closes it.
async fn h2_connect(
    ingress: &str,
) -> (
    hyper::client::conn::http2::SendRequest<Stalled>,
    tokio::task::JoinHandle<()>,
) {
    let tcp = TcpStream::connect(ingress).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, driver)
}

/// HTTP/2 gets the deadlines HTTP/1.1 has: a connection that opens no stream is closed after
/// the header-read timeout, not the idle timeout; a stream whose body never comes is answered
/// 408 `ING0008` after it, and its connection closes once it has no stream for that long
/// again. Connections holding such streams took every place for as long as the client liked
/// before (the idle timeout here, 60 s, is what "as long as it liked" would show as).
#[tokio::test]
async fn http2_streams_and_connections_are_held_to_the_header_read_timeout() {
    let sluice = Sluice::builder()
        .config(
            "[ingress.connections]\nmax = 4\nmax-per-ip = 4\nheader-read-timeout = \"1s\"\nidle-timeout = \"60s\"\n",
        )
        .start()
        .await
        .unwrap();
    let ingress = sluice.ingress_url.trim_start_matches("http://").to_owned();
    let before_idle = Duration::from_secs(30);

    let (_silent, driver) = h2_connect(&ingress).await;
    let started = Instant::now();
    tokio::time::timeout(before_idle, driver)
        .await
        .expect("an HTTP/2 connection without streams stayed open")
        .unwrap();
    println!("no stream: closed after {:?}", started.elapsed());

    let mut held = Vec::new();
    for _ in 0..4 {
        let (mut send, driver) = h2_connect(&ingress).await;
        send.ready().await.unwrap();
        let request = http::Request::post(format!("http://{ingress}/restate/status"))
            .header("content-type", "application/json")
            .header("content-length", "10")
            .body(Stalled)
            .unwrap();
        let answer = tokio::spawn(send.send_request(request));
        held.push((send, answer, driver));
    }
    let started = Instant::now();
    for (send, answer, driver) in held {
        let resp = tokio::time::timeout(before_idle, answer)
            .await
            .expect("a stream whose body never came was not answered")
            .unwrap()
            .unwrap();
        assert_eq!(resp.status(), 408);
        assert_eq!(
            resp.headers()
                .get("x-service-error-code")
                .and_then(|v| v.to_str().ok()),
            Some("ING0008")
        );
        // The client keeps its side open (hyper closes a connection whose handles are gone).
        let _send = send;
        tokio::time::timeout(before_idle, driver)
            .await
            .expect("the connection of a stalled stream stayed open for its idle timeout")
            .unwrap();
    }
    println!(
        "stalled streams: connections closed after {:?}",
        started.elapsed()
    );
    // Their places come back: a fresh client is served (the server may drop its side a moment
    // after the client saw the close, so the first try may still be turned away).
    let health = format!("{}/service/health", sluice.ingress_url);
    let deadline = Instant::now() + before_idle;
    loop {
        let fresh = reqwest::Client::new();
        if let Ok(resp) = fresh.get(&health).send().await {
            assert_eq!(resp.status(), 200);
            break;
        }
        assert!(Instant::now() < deadline, "no place came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A handler that journals 600 run steps of 1 MiB in one attempt is stopped at
/// `worker.max-journal-bytes` (its default, 256 MiB): each attempt fails JNL0001 when its
/// journal would pass the cap, is retried, and the retry policy pauses it after two; the
/// process grows by at most twice the cap (before: the whole 600 MiB journal held in the one
/// attempt; a retry's replay copied it once more).
#[tokio::test]
async fn a_journal_is_held_to_its_bytes_cap() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .env("SERVICE_WORKER__INVOKER__RETRY_POLICY__MAX_ATTEMPTS", "2")
        .quick_retries()
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let before = sluice.metrics().await["process_resident_memory_bytes"];
    let id = sluice.send("/Meter/bloat/send", &600).await;
    let sql = format!(
        "SELECT status, retry_count, last_failure_error_code AS code, last_failure AS failure FROM sys_invocation WHERE id = '{id}'"
    );
    let row = loop {
        let (status, rows) = sluice.query(&sql).await;
        assert_eq!(status, 200, "{rows}");
        let row = rows["rows"][0].clone();
        if row["status"] == "paused" {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let after = sluice.metrics().await["process_resident_memory_bytes"];
    let grown = (after - before) / f64::from(1 << 20);
    println!("600 x 1 MiB run steps at the 256 MiB journal cap: {row}; RSS +{grown:.1} MiB");
    assert_eq!(row["code"], "JNL0001", "{row}");
    assert_eq!(row["retry_count"], 2, "{row}");
    assert!(
        row["failure"]
            .as_str()
            .is_some_and(|f| f.contains("worker.max-journal-bytes")),
        "{row}"
    );
    assert!(grown <= 512.0, "resident memory grew {grown:.1} MiB");
}

/// Sends `head` (a request line and headers) on a new connection to `address` and reads what
/// comes back until the server closes it: the whole answer.
async fn answer_to_head(address: &str, head: &[u8]) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    // The server may answer and close before it took the whole head: a failed write is fine.
    let _ = stream.write_all(head).await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got)).await;
    String::from_utf8_lossy(&got).into_owned()
}

/// A request head of `pad` bytes of one header on `path`, closing after its answer.
fn head_with_pad(address: &str, path: &str, pad: usize) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\nx-pad: {}\r\n\r\n",
        "a".repeat(pad)
    )
    .replace(
        "localhost",
        address.split(':').next().unwrap_or("localhost"),
    )
    .into_bytes()
}

#[tokio::test]
async fn request_heads_over_their_bound_are_answered_431_on_both_listeners() {
    let sluice = Sluice::builder()
        .config("[ingress.connections]\nmax-header-bytes = \"16KiB\"\n[admin.connections]\nmax-header-bytes = \"16KiB\"\n")
        .start()
        .await
        .unwrap();
    let ingress = sluice.ingress_url.trim_start_matches("http://").to_owned();
    // Under the bound: answered.
    let answer = answer_to_head(
        &ingress,
        &head_with_pad(&ingress, "/restate/health", 12 * 1024),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Over it (a 1 MiB head pingora alone would have taken): 431 ING0011, then closed.
    let answer = answer_to_head(
        &ingress,
        &head_with_pad(&ingress, "/restate/health", 1 << 20),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(
        answer.contains("ING0011") && answer.contains("max-header-bytes"),
        "{answer}"
    );
    // HTTP/2: the header list is held to the same bound.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let health = format!("{}/restate/health", sluice.ingress_url);
    let small = h2
        .get(&health)
        .header("x-pad", "a".repeat(12 * 1024))
        .send()
        .await;
    assert_eq!(small.unwrap().status(), 200);
    let over = h2
        .get(&health)
        .header("x-pad", "a".repeat(20 * 1024))
        .send()
        .await;
    let over = over
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"));
    assert_eq!(over, Ok(431));
    // Far over it, the connection itself is closed (a GOAWAY, which the client may see as
    // a broken pipe while it still writes); a new one is served.
    let far = h2
        .get(&health)
        .header("x-pad", "a".repeat(1 << 20))
        .send()
        .await;
    let far = far
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"));
    assert!(far.is_err() || far == Ok(431), "{far:?}");
    // The admin listener too.
    let admin = sluice.admin_url.trim_start_matches("http://").to_owned();
    let answer = answer_to_head(&admin, &head_with_pad("localhost", "/health", 1 << 20)).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // And the listeners go on serving.
    let client = reqwest::Client::new();
    assert_eq!(client.get(&health).send().await.unwrap().status(), 200);
}
