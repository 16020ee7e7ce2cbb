//! Reading a request's body within its bounds: a size limit (413 `SEC0004`, naming the
//! setting) and, over HTTP/2, the per-read deadline of its stream (408 `ING0008`).

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use pingora::protocols::http::ServerSession;

use super::IngressState;
use super::error::IngressError;
use sluice_core::errors::Code;

/// Reads a call's or send's body, up to the ingress body limit (`ingress.max-body-size`).
pub(super) async fn read_body(
    state: &IngressState,
    session: &mut ServerSession,
) -> Result<Bytes, IngressError> {
    let limit = state.config.ingress_body_limit();
    read_body_up_to(session, limit, "ingress.max-body-size").await
}

/// Reads the body, refusing it (413) once it is over `max` bytes; `key` names the setting.
pub(super) async fn read_body_up_to(
    session: &mut ServerSession,
    max: usize,
    key: &str,
) -> Result<Bytes, IngressError> {
    let mut body = BytesMut::new();
    loop {
        // HTTP/1.1 sessions time their own reads; an HTTP/2 stream's are timed here.
        let read = match super::connections::stream_read_timeout() {
            Some(per_read) => {
                match tokio::time::timeout(per_read, session.read_request_body()).await {
                    Ok(read) => read,
                    Err(_) => {
                        super::connections::stream_stalled();
                        return Err(IngressError::coded(
                            Code::ING0008,
                            format!(
                                "no bytes of the request body for {} ms after {} bytes (ingress.connections.header-read-timeout)",
                                per_read.as_millis(),
                                body.len()
                            ),
                        ));
                    }
                }
            }
            None => session.read_request_body().await,
        };
        match read {
            Ok(Some(chunk)) => {
                if body.len().saturating_add(chunk.len()) > max {
                    let setting = if key.is_empty() {
                        String::new()
                    } else {
                        format!(" ({key})")
                    };
                    return Err(IngressError {
                        status: StatusCode::PAYLOAD_TOO_LARGE,
                        code: Some(Code::SEC0004),
                        message: format!("request body over {max} bytes{setting}"),
                        retry_after_s: None,
                    });
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body.freeze()),
            Err(e) => {
                return Err(IngressError::bad_request(format!(
                    "cannot read the request body: {e}"
                )));
            }
        }
    }
}
