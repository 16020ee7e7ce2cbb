//! Bounds on the ingress listener's connections, in front of pingora's HTTP server: a cap on
//! connections open at once (over it, a new connection is closed as soon as it is accepted), a
//! deadline for a new connection's first request, and an idle timeout between requests on
//! HTTP/1.1 (HTTP/2 uses pingora's own idle timeout, set to the same value).

use std::sync::Arc;

use async_trait::async_trait;
use pingora::apps::http_app::HttpServer;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::Stream;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use tokio::sync::Semaphore;

use super::IngressApp;
use crate::config::ConnectionLimits;

/// The first bytes of an HTTP/2 connection with prior knowledge.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The ingress HTTP server with its connections bounded.
pub struct GuardedHttp {
    inner: Arc<HttpServer<IngressApp>>,
    permits: Arc<Semaphore>,
    limits: ConnectionLimits,
}

impl GuardedHttp {
    /// Guards `inner` with `limits`.
    pub fn new(inner: HttpServer<IngressApp>, limits: ConnectionLimits) -> Self {
        Self {
            inner: Arc::new(inner),
            permits: Arc::new(Semaphore::new(limits.max.min(Semaphore::MAX_PERMITS))),
            limits,
        }
    }

    fn idle_secs(&self) -> u64 {
        self.limits.idle_timeout.0.as_secs().max(1)
    }
}

#[async_trait]
impl ServerApp for GuardedHttp {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // Held for the connection's life; dropping the stream closes it.
        let Ok(_permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            tracing::debug!(
                max = self.limits.max,
                "ingress connection cap reached: closing a new connection (ingress.connections.max)"
            );
            return None;
        };
        // A client that connects and sends nothing is dropped after the header-read timeout.
        // The bytes peeked here are read again by whoever handles the connection.
        let mut preface = [0u8; H2_PREFACE.len()];
        let deadline = self.limits.header_read_timeout.0;
        match tokio::time::timeout(deadline, stream.try_peek(&mut preface)).await {
            Ok(Ok(true)) => {}
            _ => return None,
        }
        if &preface == H2_PREFACE {
            return ServerApp::process_new(&self.inner, stream, shutdown).await;
        }
        // HTTP/1.1: the first request's headers must come within the header-read timeout (per
        // read); between requests the connection may stay idle for the idle timeout.
        let mut session = ServerSession::new_http1(stream);
        session.set_keepalive(None);
        session.set_read_timeout(Some(deadline));
        let mut reused = self.inner.process_new_http(session, shutdown).await;
        while let Some((stream, settings)) = reused.map(|r| r.consume()) {
            let mut session = ServerSession::new_http1(stream);
            if let Some(settings) = settings {
                settings.apply_to_session(&mut session);
            }
            if *shutdown.borrow() {
                session.set_keepalive(None);
            } else {
                session.set_keepalive(Some(self.idle_secs()));
            }
            reused = self.inner.process_new_http(session, shutdown).await;
        }
        None
    }

    async fn cleanup(&self) {
        ServerApp::cleanup(&*self.inner).await;
    }
}
