//! Cluster mode: a request for a partition another node leads is forwarded to that node's
//! ingress, once, and its answer relayed (`docs/cluster.md`). A request that arrives forwarded
//! and still finds its partition elsewhere is answered 503 `CLU0001` instead of bouncing on.
//! A forwarded request names the client connection it came on (`x-sluice-forwarded-for`), and
//! the leader counts it under that client's address, as if the client had connected there.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use pingora::protocols::http::ServerSession;
use sluice_listeners::per_ip::{PerIp, Relayed, RelayedRequest};

use super::error::IngressError;
use sluice_core::errors::Code;
use sluice_runtime::partition::placement::Route;
use sluice_runtime::replication::relay::{from_node, relay};

fn not_here(partition_of: &str, why: &str) -> IngressError {
    IngressError::coded(
        Code::CLU0001,
        format!("{partition_of}: {why}; retry (GET /cluster-health shows who leads what)"),
    )
}

/// Sends the request (`body` already read) to where `route` says it runs, and answers with
/// what that node answered. The relay lasts no longer than its client: when the client
/// leaves, the request to the leader is dropped (its stream reset), and the leader drops its
/// wait in turn.
pub async fn forward(
    state: &super::IngressState,
    session: &mut ServerSession,
    body: Bytes,
    route: Route,
) -> Result<Response<Vec<u8>>, IngressError> {
    let what = "the invocation's partition is not led by this node";
    let ingress = match route {
        Route::Here => {
            return Err(not_here(what, "it runs here after all (a race)"));
        }
        Route::Nobody => return Err(not_here(what, "no node leads it right now (a takeover)")),
        Route::Elsewhere { ingress, .. } => ingress,
    };
    let placement = state.runtime.placement();
    let request = session.req_header();
    if from_node(placement, &request.headers) {
        return Err(not_here(
            what,
            "it was forwarded here already (leadership moved)",
        ));
    }
    let path = request
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str)
        .to_owned();
    let (method, mut headers) = (request.method.clone(), request.headers.clone());
    name_client(&mut headers, state, session);
    let client = state.forwarder.pick();
    let relayed = relay(placement, client, &ingress, method, &path, &headers, body);
    let answer = match super::wait::while_connected(session, None, relayed).await {
        Ok(answer) => answer.map_err(|why| not_here(what, &why))?,
        Err(_) => return Err(super::wait::gone()),
    };
    let mut resp = Response::new(answer.body.to_vec());
    *resp.status_mut() = answer.status;
    *resp.headers_mut() = answer.headers;
    Ok(resp)
}

/// Cluster mode: the answer of the node leading the partition of `id`, when that is not this
/// node (the request's body is read and sent on); `None` when it runs here.
pub async fn if_elsewhere(
    state: &super::IngressState,
    session: &mut ServerSession,
    id: sluice_core::ids::InvocationId,
) -> Option<Result<Response<Vec<u8>>, IngressError>> {
    let route = state.runtime.route(id);
    if route == Route::Here {
        return None;
    }
    let body = match super::body::read_body(state, session).await {
        Ok(body) => body,
        Err(e) => return Some(Err(e)),
    };
    Some(forward(state, session, body, route).await)
}

/// Names, on a request one node forwards to another, the client connection it came on: the
/// forwarding node's id, then the client's address and port, as `n2 192.0.2.7:53012`. The
/// leader honours it only on a request that carries the cluster's secret.
pub const FORWARDED_FOR: &str = "x-sluice-forwarded-for";

/// Names `session`'s client connection to this node in `headers` (a request going on to
/// another node): a client's own [`FORWARDED_FOR`] is replaced, only what this node saw goes.
pub fn name_client(headers: &mut HeaderMap, state: &super::IngressState, session: &ServerSession) {
    headers.remove(FORWARDED_FOR);
    let node = &state.config.cluster.node_id;
    let named = session
        .client_addr()
        .and_then(|client| client.as_inet())
        .and_then(|client| HeaderValue::from_str(&format!("{node} {client}")).ok());
    if let Some(named) = named {
        headers.insert(FORWARDED_FOR, named);
    }
}

/// The ingress listener's count of connections by client address under `limits`, with the
/// client connections other nodes forward requests of.
pub fn relayed_clients(limits: &sluice_config::ConnectionLimits) -> Arc<Relayed> {
    Relayed::new(PerIp::new(limits.per_ip()))
}

/// Counts a request another node forwarded under the address of the client it came from
/// (`headers`' [`FORWARDED_FOR`]): one place per client connection while it has requests in
/// flight here. `None` for a request not forwarded, or forwarded without a readable client
/// (a node of an older release); 429 `ING0012` when the client's address has every place.
pub fn count_relayed(
    state: &super::IngressState,
    headers: &HeaderMap,
) -> Result<Option<RelayedRequest>, IngressError> {
    let Some(named) = headers.get(FORWARDED_FOR) else {
        return Ok(None);
    };
    if !from_node(state.runtime.placement(), headers) {
        return Ok(None);
    }
    let Some(connection) = read_forwarded_for(named) else {
        return Ok(None);
    };
    let client = connection.1.ip();
    match state.relayed.enter(connection) {
        Some(request) => Ok(Some(request)),
        None => {
            tracing::debug!(
                %client,
                "a forwarded request's client address has every connection place here: refused (ingress.connections.max-per-ip)"
            );
            let mut refused = IngressError::coded(
                Code::ING0012,
                format!(
                    "{client} holds ingress.connections.max-per-ip connections to the node leading this request's partition, counting those other nodes forward there: wait for some of its calls to end, or use fewer connections"
                ),
            );
            refused.retry_after_s = Some(1);
            Err(refused)
        }
    }
}

/// The forwarding node and the client's address and port in a [`FORWARDED_FOR`] value.
fn read_forwarded_for(value: &HeaderValue) -> Option<(String, std::net::SocketAddr)> {
    let (node, client) = value.to_str().ok()?.split_once(' ')?;
    Some((node.to_owned(), client.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_for_value_reads_back_and_junk_reads_as_nothing() {
        let read = read_forwarded_for(&HeaderValue::from_static("n2 [::1]:4000")).unwrap();
        assert_eq!(read, ("n2".to_owned(), "[::1]:4000".parse().unwrap()));
        for junk in ["n2", "n2 nowhere", " 127.0.0.1", "n2 127.0.0.1"] {
            assert_eq!(
                read_forwarded_for(&HeaderValue::from_static(junk)),
                None,
                "{junk}"
            );
        }
    }
}
