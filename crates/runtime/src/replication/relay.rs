//! Sending a request on to the node that leads its partition, as both doors do (the ingress
//! and the admin API): the same method, path and headers, less those of one connection, with
//! `x-sluice-forwarded` carrying the cluster's secret (`cluster.secret`) so the leader knows a
//! node sent it and never forwards it again; the answer comes back whole, bounded, less its
//! connection headers. A client's own `x-sluice-forwarded` is worth nothing: [`from_node`]
//! honours the header only when it holds the secret.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

use crate::partition::placement::Placement;

/// Marks a request one node forwarded to another.
pub const FORWARDED: &str = "x-sluice-forwarded";

/// Whether `headers` are those of a request another node of the cluster forwarded: its
/// `x-sluice-forwarded` holds the cluster's secret. Never on an embedded node.
pub fn from_node(placement: &Placement, headers: &HeaderMap) -> bool {
    match (placement.secret(), headers.get(FORWARDED)) {
        (Some(secret), Some(offered)) => secret.matches(offered.as_bytes()),
        _ => false,
    }
}

/// Largest answer relayed from the leader (a call's output is bounded by the protocol's message
/// limit far below this).
const MAX_ANSWER: u64 = 64 * 1024 * 1024;

/// Headers that belong to one connection, not to the request or answer.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host"
            | "content-length"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-connection"
    )
}

/// How long connecting to a leader may take: a node that is gone fails the request at once
/// (503 to the client, which retries) rather than holding it.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How often an idle forwarded connection is probed: a leader that died mid-request (no FIN)
/// is noticed within about a minute even while a long call waits for its outcome.
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// A client for [`relay`]: HTTP/2 without upgrade (both doors take it in clear text), so the
/// requests to one peer share one connection as streams, however many are in flight, instead
/// of one connection each (which counted against the peer's per-address connection cap, so
/// one client's forwarded calls could fill it for every other client). `total` bounds a whole
/// exchange (the admin API's requests are short); `None` for the ingress, whose calls wait for
/// their outcome as long as they take.
pub fn client(total: Option<std::time::Duration>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .http2_prior_knowledge()
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_keepalive(KEEPALIVE)
        .http2_keep_alive_interval(KEEPALIVE)
        .http2_keep_alive_while_idle(true)
        .pool_idle_timeout(std::time::Duration::from_secs(60));
    if let Some(total) = total {
        builder = builder.timeout(total);
    }
    builder.build().unwrap_or_default()
}

/// How many connections the ingress keeps to each peer: a peer's ingress takes
/// `ingress.connections.max-streams` (100) streams on one, so calls forwarded to one leader
/// while they wait for their outcomes share `PEER_CONNECTIONS` × that before they queue here.
pub const PEER_CONNECTIONS: usize = 8;

/// The ingress's clients for [`relay`]: a few multiplexed connections per peer, taken in turn.
#[derive(Debug)]
pub struct Peers {
    clients: Vec<reqwest::Client>,
    next: std::sync::atomic::AtomicUsize,
}

impl Peers {
    /// [`PEER_CONNECTIONS`] clients without an overall timeout.
    pub fn new() -> Self {
        Self {
            clients: (0..PEER_CONNECTIONS).map(|_| client(None)).collect(),
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The client for the next request (each has its own connection per peer).
    pub fn pick(&self) -> &reqwest::Client {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.clients[i % self.clients.len()]
    }
}

impl Default for Peers {
    fn default() -> Self {
        Self::new()
    }
}

/// The headers of a JSON request this node makes of another on its caller's behalf: the
/// caller's `authorization` goes along (every node accepts the same tokens).
pub fn json_as_caller(authorization: Option<&HeaderValue>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(authorization) = authorization {
        headers.insert(http::header::AUTHORIZATION, authorization.clone());
    }
    headers
}

/// What the leader answered.
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers, less those of its connection.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

/// Sends `method path_and_query` with `headers` and `body` to the node at `base` (a URL), as a
/// node of `placement`'s cluster; why not, when it fails.
pub async fn relay(
    placement: &Placement,
    client: &reqwest::Client,
    base: &str,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Answer, String> {
    let Some(secret) = placement.secret() else {
        return Err("this node is not part of a cluster: it forwards nothing".into());
    };
    let url = format!("{}{path_and_query}", base.trim_end_matches('/'));
    let mut outgoing = client.request(method, &url).body(body);
    for (name, value) in headers {
        if !hop_by_hop(name) && name != FORWARDED {
            outgoing = outgoing.header(name, value);
        }
    }
    let answer = outgoing
        .header(FORWARDED, secret.expose())
        .send()
        .await
        .map_err(|e| format!("forwarding to {base} failed: {e}"))?;
    if answer.content_length().is_some_and(|len| len > MAX_ANSWER) {
        return Err(format!("the answer of {base} is too large to relay"));
    }
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut kept = HeaderMap::new();
    for (name, value) in answer.headers() {
        if !hop_by_hop(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    let body = answer
        .bytes()
        .await
        .map_err(|e| format!("reading the answer of {base} failed: {e}"))?;
    Ok(Answer {
        status,
        headers: kept,
        body,
    })
}
