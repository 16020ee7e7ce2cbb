//! Calls, JSON requests and measurements against a server under test (the handler's own
//! peak concurrency, a counter's state, the next awakeable, a connection closing).

use std::time::{Duration, Instant};

use crate::server::Sluice;

/// Runs `calls` concurrently (each a `Meter/hold` path of 400 ms, with its extra headers) and
/// answers the peak concurrency the handler itself saw.
pub async fn peak_of_calls(sluice: &Sluice, calls: &[(String, Vec<(&str, &str)>)]) -> u64 {
    let client = reqwest::Client::new();
    let running: Vec<_> = calls
        .iter()
        .map(|(path, headers)| {
            let mut request = client
                .post(format!("{}{path}", sluice.ingress_url))
                .header("content-type", "application/json")
                .body("400");
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            tokio::spawn(request.send())
        })
        .collect();
    for call in running {
        let resp = call
            .await
            .expect("the call task")
            .expect("the call answers");
        let status = resp.status();
        assert_eq!(status, 200, "{}", resp.text().await.unwrap_or_default());
    }
    peak(&sluice.ingress_url).await
}

/// The most `Meter/hold`s that ran at once in the deployment since the last ask (it resets),
/// asked through the ingress at `ingress_url`.
pub async fn peak(ingress_url: &str) -> u64 {
    reqwest::Client::new()
        .post(format!("{ingress_url}/service/call/Meter/peak"))
        .send()
        .await
        .expect("Meter/peak answers")
        .text()
        .await
        .expect("a text answer")
        .parse()
        .expect("a number")
}

/// [`peak_of_calls`] without extra headers.
pub async fn peak_of(sluice: &Sluice, paths: &[String]) -> u64 {
    let calls: Vec<_> = paths.iter().map(|p| (p.clone(), Vec::new())).collect();
    peak_of_calls(sluice, &calls).await
}

/// POSTs `body` as JSON to `url`: the status, and the answer as JSON (as a string when it is
/// not JSON).
pub async fn post_json(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let resp = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("server reachable");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// GETs `url`: the status and the JSON answer (null when it is not JSON).
pub async fn get_json(url: &str) -> (u16, serde_json::Value) {
    let resp = reqwest::get(url).await.expect("server reachable");
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or_default(),
    )
}

/// Calls the handler at `path` (e.g. `Meter/ticks`) without a body; asserts the 200 and
/// answers its JSON.
pub async fn call_json<T: serde::de::DeserializeOwned>(sluice: &Sluice, path: &str) -> T {
    let resp = reqwest::Client::new()
        .post(format!("{}/service/call/{path}", sluice.ingress_url))
        .send()
        .await
        .expect("ingress reachable");
    assert_eq!(resp.status(), 200, "{path}");
    resp.json().await.expect("a JSON answer")
}

/// The flow-control counter of `scope` at `level` (`scope`, `level1`, `level2`) from
/// `GET /limits/counters`, if it lives.
pub async fn counter(sluice: &Sluice, scope: &str, level: &str) -> Option<serde_json::Value> {
    let (_, counters) = get_json(&format!("{}/limits/counters", sluice.admin_url)).await;
    counters["counters"]
        .as_array()?
        .iter()
        .find(|c| c["scope"] == scope && c["level"] == level)
        .cloned()
}

/// Calls `{service}/lastAwakeable` until it names an awakeable other than `previous`: the id
/// of the one `{service}/awaitAwakeable` waits on now (at most 15 s).
pub async fn next_awakeable(ingress_url: &str, service: &str, previous: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let id: String = reqwest::Client::new()
            .post(format!(
                "{ingress_url}/service/call/{service}/lastAwakeable"
            ))
            .send()
            .await
            .expect("ingress reachable")
            .json()
            .await
            .unwrap_or_default();
        if !id.is_empty() && id != previous {
            return id;
        }
        assert!(
            Instant::now() < deadline,
            "{service} never waited on a new awakeable"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A connection to `address` from the loopback address `from` (127.0.0.x: another client).
pub async fn connect_from(from: [u8; 4], address: &str) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::from((from, 0)))?;
    socket.connect(address.parse().expect("an address")).await
}

/// The status line and headers of the first answer on `stream` (an HTTP/1.1 connection), if
/// they come within `within`.
pub async fn head_within(stream: &mut tokio::net::TcpStream, within: Duration) -> Option<String> {
    use tokio::io::AsyncReadExt as _;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&got).into_owned())
}

/// The status line's code of the first answer on `stream`, if one comes within `within`.
pub async fn status_within(stream: &mut tokio::net::TcpStream, within: Duration) -> Option<u16> {
    head_within(stream, within)
        .await?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

/// Reads from `stream` until the server closes it (or `within` passes): whether it was closed.
pub async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Most `Meter/timed` calls that ran at once, from the start and end times the handler
/// recorded.
pub async fn peak_in_handler(sluice: &Sluice, expected: usize) -> usize {
    let runs: Vec<(String, u64, u64)> = call_json(sluice, "Meter/timings").await;
    assert_eq!(runs.len(), expected, "every call ran once: {runs:?}");
    let mut edges: Vec<(u64, i32)> = runs
        .iter()
        .flat_map(|(_, start, end)| [(*start, 1), (*end, -1)])
        .collect();
    // An end at the same ms as a start comes first: they did not overlap.
    edges.sort();
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        peak = peak.max(now);
    }
    peak as usize
}

/// `PUT /plugins/{name}?{query}` with the component `bytes`: status and answer.
pub async fn put_plugin(
    sluice: &Sluice,
    name: &str,
    bytes: Vec<u8>,
    query: &str,
) -> (u16, serde_json::Value) {
    let resp = reqwest::Client::new()
        .put(format!("{}/plugins/{name}?{query}", sluice.admin_url))
        .header("content-type", "application/wasm")
        .body(bytes)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// `Greeter/greet("Ada")` through `sluice`'s ingress with `headers`: status,
/// `x-service-error-code` and body.
pub async fn greet(sluice: &Sluice, headers: &[(&str, &str)]) -> (u16, Option<String>, String) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/service/call/Greeter/greet", sluice.ingress_url))
        .header("content-type", "application/json")
        .body("\"Ada\"");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let resp = request.send().await.unwrap();
    let code = resp
        .headers()
        .get("x-service-error-code")
        .map(|v| v.to_str().unwrap().to_owned());
    (resp.status().as_u16(), code, resp.text().await.unwrap())
}

/// A 429 answer: its `Retry-After` in seconds (a whole number) and its body.
pub async fn refused_with_retry_after(resp: reqwest::Response) -> (u64, String) {
    assert_eq!(resp.status(), 429);
    let retry = resp.headers()["retry-after"]
        .to_str()
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("a whole number of seconds");
    (retry, resp.text().await.unwrap())
}

/// Waits until `Meter/timed` has recorded `n` calls (at most `within`); answers them (label,
/// start, end).
pub async fn timings(sluice: &Sluice, n: usize, within: Duration) -> Vec<(String, u64, u64)> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + within;
    while seen.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} calls ran: {seen:?}",
            seen.len()
        );
        let more: Vec<(String, u64, u64)> = call_json(sluice, "Meter/timings").await;
        if more.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen.extend(more);
    }
    seen
}

/// Most of `runs` (from [`timings`]) whose labels start with `prefix` that ran at once.
pub fn peak_among(runs: &[(String, u64, u64)], prefix: &str) -> usize {
    let mine: Vec<_> = runs
        .iter()
        .filter(|(l, ..)| l.starts_with(prefix))
        .collect();
    mine.iter()
        .map(|(_, start, _)| {
            mine.iter()
                .filter(|(_, s, e)| s <= start && start < e)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// `scope`'s burst budget as `sluice` reads it in `sys_user_limits`: (spent, left) ms.
pub async fn burst_of(sluice: &Sluice, scope: &str) -> (u64, u64) {
    let (status, rows) = sluice
        .query(&format!("SELECT burst_spent_ms, burst_left_ms FROM sys_user_limits WHERE scope = '{scope}' AND level = 'Scope'"))
        .await;
    assert_eq!(status, 200, "{rows}");
    let row = &rows["rows"][0];
    let ms = |column: &str| {
        row[column]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: {rows}", sluice.admin_url))
    };
    (ms("burst_spent_ms"), ms("burst_left_ms"))
}
