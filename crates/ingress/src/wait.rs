//! Waiting for an invocation's outcome on behalf of a client, for no longer than the client is
//! there: pingora does not notice a client that leaves while its request is parked, so every
//! wait is raced against the connection closing (HTTP/1.1 FIN, HTTP/2 stream reset). A wait
//! that loses is dropped, which closes the partition's end of it, and the partition prunes it.

use std::future::Future;

use http::StatusCode;
use pingora::protocols::http::ServerSession;

use super::error::IngressError;

/// The status logged for a request whose client left before its answer (nginx's 499); the
/// client never sees it.
const CLIENT_GONE: u16 = 499;

/// Resolves once the client of `session` has closed its side (or broken the connection). The
/// request body must already have been read by whoever needed it: what is left is drained.
async fn client_gone(session: &mut ServerSession) {
    let mut body_done = false;
    loop {
        match session.read_body_or_idle(body_done).await {
            Ok(Some(_)) => {}
            Ok(None) => body_done = true,
            Err(_) => return,
        }
    }
}

/// Why a wait ended without its value.
pub(super) enum Ended {
    /// The client closed the connection.
    ClientGone,
    /// `max` passed first.
    TimedOut,
}

/// Waits for `outcome` while the client of `session` stays connected, for at most `max`.
pub(super) async fn while_connected<T>(
    session: &mut ServerSession,
    max: Option<std::time::Duration>,
    outcome: impl Future<Output = T>,
) -> Result<T, Ended> {
    let deadline = async {
        match max {
            Some(max) => tokio::time::sleep(max).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        value = outcome => Ok(value),
        () = client_gone(session) => {
            session.set_keepalive(None);
            Err(Ended::ClientGone)
        }
        () = deadline => Err(Ended::TimedOut),
    }
}

/// The (never delivered) answer to a request whose client left.
pub(super) fn gone() -> IngressError {
    IngressError {
        status: StatusCode::from_u16(CLIENT_GONE).expect("a valid status"),
        code: Some(sluice_core::errors::Code::ING0007),
        message: "the client closed the connection before the answer".to_owned(),
        retry_after_s: None,
    }
}
