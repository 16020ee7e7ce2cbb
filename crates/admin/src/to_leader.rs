//! Cluster mode: a request about one invocation (`/invocations/{id}…`: describe, cancel, kill,
//! pause, resume, purge, restart) is answered by the node leading its partition, which alone
//! holds its live state. Other requests are answered here from this node's replica.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::AdminError;
use sluice_core::errors::Code;
use sluice_core::ids::InvocationId;
use sluice_runtime::partition::Runtime;
use sluice_runtime::partition::placement::Route;
use sluice_runtime::replication::relay::{from_node, relay};

/// Largest request body forwarded (the admin API's bodies are small).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// What forwarding needs.
#[derive(Debug, Clone)]
pub struct ToLeader {
    runtime: Runtime,
    client: reqwest::Client,
}

impl ToLeader {
    /// Forwards through `runtime`'s placement.
    pub fn new(runtime: Runtime) -> Self {
        Self {
            runtime,
            // Admin requests are short; one the leader does not answer in time is a 503.
            client: sluice_runtime::replication::relay::client(Some(
                std::time::Duration::from_secs(30),
            )),
        }
    }
}

/// The invocation a path is about: `/[vN/]invocations/{id}[/…]`.
fn invocation_of(path: &str) -> Option<InvocationId> {
    let path = match path.strip_prefix("/v") {
        Some(rest) => &rest[rest.find('/')?..],
        None => path,
    };
    let rest = path.strip_prefix("/invocations/")?;
    rest.split('/').next()?.parse().ok()
}

/// Sends the request on to the leader of its invocation's partition when that is another node.
pub async fn forward(State(to): State<ToLeader>, request: Request, next: Next) -> Response {
    let placement = to.runtime.placement();
    if !placement.is_clustered() || from_node(placement, request.headers()) {
        return next.run(request).await;
    }
    let Some(id) = invocation_of(request.uri().path()) else {
        return next.run(request).await;
    };
    let admin = match to.runtime.route(id) {
        Route::Here => return next.run(request).await,
        Route::Nobody => {
            return unavailable(format!(
                "[CLU0001] no node leads the partition of {id} right now (a takeover); retry"
            ));
        }
        Route::Elsewhere { admin, .. } => admin,
    };
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return unavailable("[CLU0001] the request body is too large to forward".into());
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let answer = match relay(
        placement,
        &to.client,
        &admin,
        parts.method,
        path,
        &parts.headers,
        body,
    )
    .await
    {
        Ok(answer) => answer,
        Err(why) => return unavailable(format!("[CLU0001] {why}")),
    };
    let mut response = Response::new(Body::from(answer.body));
    *response.status_mut() = answer.status;
    *response.headers_mut() = answer.headers;
    response
}

fn unavailable(message: String) -> Response {
    AdminError::coded(Code::ADM0010, message).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_invocation() {
        let id = InvocationId::generate(3);
        assert_eq!(invocation_of(&format!("/invocations/{id}")), Some(id));
        assert_eq!(
            invocation_of(&format!("/v3/invocations/{id}/kill")),
            Some(id)
        );
        assert_eq!(invocation_of("/invocations"), None);
        assert_eq!(invocation_of("/deployments/x"), None);
        assert_eq!(invocation_of("/v2"), None);
    }
}
