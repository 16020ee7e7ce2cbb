//! Cluster mode: a request for a partition another node leads is forwarded to that node's
//! ingress, once, and its answer relayed (`docs/cluster.md`). A request that arrives forwarded
//! and still finds its partition elsewhere is answered 503 `CLU0001` instead of bouncing on.

use bytes::Bytes;
use http::Response;
use pingora::protocols::http::ServerSession;

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
    placement: &sluice_runtime::partition::placement::Placement,
    client: &reqwest::Client,
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
    let (method, headers) = (request.method.clone(), request.headers.clone());
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
    Some(
        forward(
            state.runtime.placement(),
            state.forwarder.pick(),
            session,
            body,
            route,
        )
        .await,
    )
}
