//! Cluster mode: a request for a partition another node leads is forwarded to that node's
//! ingress, once, and its answer relayed (`docs/cluster.md`). A request that arrives forwarded
//! and still finds its partition elsewhere is answered 503 `CLU0001` instead of bouncing on.

use bytes::Bytes;
use http::{HeaderName, Response, StatusCode};
use pingora::protocols::http::ServerSession;

use super::error::IngressError;
use crate::errors::Code;
use crate::partition::placement::Route;

/// Marks a request one node forwarded to another.
pub const FORWARDED: &str = "x-sluice-forwarded";

/// Largest answer relayed from the leader (a call's output is bounded by the protocol's message
/// limit far below this).
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// Headers that belong to one connection, not to the request.
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

fn not_here(partition_of: &str, why: &str) -> IngressError {
    IngressError::coded(
        Code::CLU0001,
        format!("{partition_of}: {why}; retry (GET /cluster-health shows who leads what)"),
    )
}

/// Sends the request (`body` already read) to where `route` says it runs, and answers with
/// what that node answered.
pub async fn forward(
    client: &reqwest::Client,
    session: &ServerSession,
    body: Bytes,
    route: Route,
) -> Result<Response<Vec<u8>>, IngressError> {
    let what = "the invocation's partition is led by another node";
    let ingress = match route {
        Route::Here => {
            return Err(not_here(what, "it runs here after all (a race)"));
        }
        Route::Nobody => return Err(not_here(what, "no node leads it right now (a takeover)")),
        Route::Elsewhere { ingress, .. } => ingress,
    };
    let request = session.req_header();
    if request.headers.contains_key(FORWARDED) {
        return Err(not_here(
            what,
            "it was forwarded here already (leadership moved)",
        ));
    }
    let path = request
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let url = format!("{}{path}", ingress.trim_end_matches('/'));
    let mut outgoing = client.request(request.method.clone(), &url).body(body);
    for (name, value) in &request.headers {
        if !hop_by_hop(name) {
            outgoing = outgoing.header(name, value);
        }
    }
    let answer = outgoing
        .header(FORWARDED, "1")
        .send()
        .await
        .map_err(|e| not_here(what, &format!("forwarding to {ingress} failed: {e}")))?;
    let status = answer.status();
    let headers = answer.headers().clone();
    if answer
        .content_length()
        .is_some_and(|len| len > MAX_ANSWER as u64)
    {
        return Err(not_here(what, "the leader's answer is too large to relay"));
    }
    let bytes = answer.bytes().await.map_err(|e| {
        not_here(
            what,
            &format!("reading the answer of {ingress} failed: {e}"),
        )
    })?;
    let mut resp = Response::builder()
        .status(StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY))
        .body(bytes.to_vec())
        .map_err(|e| not_here(what, &e.to_string()))?;
    for (name, value) in &headers {
        if !hop_by_hop(name) {
            resp.headers_mut().append(name.clone(), value.clone());
        }
    }
    Ok(resp)
}

/// Cluster mode: the answer of the node leading the partition of `id`, when that is not this
/// node (the request's body is read and sent on); `None` when it runs here.
pub async fn if_elsewhere(
    state: &super::IngressState,
    session: &mut ServerSession,
    id: crate::ids::InvocationId,
) -> Option<Result<Response<Vec<u8>>, IngressError>> {
    let route = state.runtime.route(id);
    if route == Route::Here {
        return None;
    }
    let body = match super::invoke::read_body(session).await {
        Ok(body) => body,
        Err(e) => return Some(Err(e)),
    };
    Some(forward(&state.forwarder, session, body, route).await)
}
