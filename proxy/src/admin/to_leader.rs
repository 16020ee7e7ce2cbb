//! Cluster mode: a request about one invocation (`/invocations/{id}…`: describe, cancel, kill,
//! pause, resume, purge, restart) is answered by the node leading its partition, which alone
//! holds its live state. Other requests are answered here from this node's replica.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use super::error::AdminError;
use crate::ids::InvocationId;
use crate::partition::Runtime;
use crate::partition::placement::Route;

/// Marks a request one node forwarded to another (never forwarded again).
const FORWARDED: &str = "x-sluice-forwarded";

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
            client: reqwest::Client::new(),
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
    if !to.runtime.placement().is_clustered() || request.headers().contains_key(FORWARDED) {
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
    let url = format!("{}{path}", admin.trim_end_matches('/'));
    let mut outgoing = to.client.request(parts.method, &url).body(body);
    for (name, value) in &parts.headers {
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "connection" | "transfer-encoding"
        ) {
            outgoing = outgoing.header(name, value);
        }
    }
    let answer = match outgoing.header(FORWARDED, "1").send().await {
        Ok(answer) => answer,
        Err(e) => {
            return unavailable(format!(
                "[CLU0001] forwarding to the leader {admin} failed: {e}"
            ));
        }
    };
    let status = answer.status();
    let headers = answer.headers().clone();
    let bytes = match answer.bytes().await {
        Ok(bytes) => bytes,
        Err(e) => return unavailable(format!("[CLU0001] reading the leader's answer failed: {e}")),
    };
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() =
        StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    for (name, value) in &headers {
        if !matches!(
            name.as_str(),
            "content-length" | "connection" | "transfer-encoding"
        ) {
            response.headers_mut().append(name.clone(), value.clone());
        }
    }
    response
}

fn unavailable(message: String) -> Response {
    AdminError::new(StatusCode::SERVICE_UNAVAILABLE, message).into_response()
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
