//! Bounds on the ingress listener's connections, in front of pingora's HTTP server: a cap on
//! connections open at once and one per client address (over either, a new connection is
//! closed as soon as it is accepted), a deadline for each request's headers however slowly
//! their bytes trickle in (pingora's own timeout is per read), and an idle timeout between
//! requests on HTTP/1.1 (HTTP/2 uses pingora's own idle timeout, set to the same value).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use pingora::apps::http_app::HttpServer;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::Stream;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use tokio::sync::Semaphore;

use super::IngressApp;
use crate::config::ConnectionLimits;
use crate::per_ip::PerIp;

tokio::task_local! {
    /// Set by the app once a request's headers are read: the connection's header deadline no
    /// longer applies to that request.
    pub(super) static HEADERS_READ: Arc<AtomicBool>;
}

/// Tells the connection serving the current request that its headers are in.
pub(super) fn headers_read() {
    let _ = HEADERS_READ.try_with(|read| read.store(true, Ordering::Release));
}

/// Runs `request` (reading one request's headers, then answering it) and drops it, which
/// closes the connection, if its headers are not all in by `deadline`.
async fn with_header_deadline<T>(
    deadline: tokio::time::Instant,
    request: impl std::future::Future<Output = Option<T>>,
) -> Option<T> {
    let read = Arc::new(AtomicBool::new(false));
    let request = HEADERS_READ.scope(Arc::clone(&read), request);
    tokio::pin!(request);
    tokio::select! {
        done = &mut request => return done,
        _ = tokio::time::sleep_until(deadline) => {}
    }
    if read.load(Ordering::Acquire) {
        request.await
    } else {
        tracing::debug!(
            "ingress request headers not in by the deadline: closing the connection (ingress.connections.header-read-timeout)"
        );
        None
    }
}

/// The first bytes of an HTTP/2 connection with prior knowledge.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The ingress HTTP server with its connections bounded.
pub struct GuardedHttp {
    inner: Arc<HttpServer<IngressApp>>,
    tls: Option<Arc<super::tls::IngressTls>>,
    permits: Arc<Semaphore>,
    per_ip: Arc<PerIp>,
    limits: ConnectionLimits,
}

impl GuardedHttp {
    /// Guards `inner` with `limits`, behind TLS when `tls` is set.
    pub fn new(
        inner: HttpServer<IngressApp>,
        limits: ConnectionLimits,
        tls: Option<Arc<super::tls::IngressTls>>,
    ) -> Self {
        Self {
            inner: Arc::new(inner),
            tls,
            permits: Arc::new(Semaphore::new(limits.max.min(Semaphore::MAX_PERMITS))),
            per_ip: PerIp::new(limits.max_per_ip.min(limits.max)),
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
        let peer = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        let _place = match peer {
            Some(ip) => match self.per_ip.enter(ip) {
                Some(place) => Some(place),
                None => {
                    tracing::debug!(
                        %ip,
                        max = self.limits.max_per_ip,
                        "ingress connection cap for one address reached: closing a new connection (ingress.connections.max-per-ip)"
                    );
                    return None;
                }
            },
            None => None,
        };
        // A client that connects and sends nothing is dropped after the header-read timeout.
        // The bytes peeked here are read again by whoever handles the connection.
        let header_timeout = self.limits.header_read_timeout.0;
        let accepted = tokio::time::Instant::now();
        let (stream, h2) = match &self.tls {
            // The TLS handshake must be done within the header-read timeout too, and ALPN
            // says which protocol follows.
            Some(tls) => match tokio::time::timeout(header_timeout, tls.accept(stream)).await {
                Ok(Some(accepted)) => accepted,
                Ok(None) => return None,
                Err(_) => {
                    tracing::debug!(
                        "ingress TLS handshake not done by the deadline: closing the connection (ingress.connections.header-read-timeout)"
                    );
                    return None;
                }
            },
            None => {
                let mut preface = [0u8; H2_PREFACE.len()];
                match tokio::time::timeout(header_timeout, stream.try_peek(&mut preface)).await {
                    Ok(Ok(true)) => {}
                    _ => return None,
                }
                let h2 = &preface == H2_PREFACE;
                (stream, h2)
            }
        };
        if h2 {
            return ServerApp::process_new(&self.inner, stream, shutdown).await;
        }
        // HTTP/1.1: the first request's headers must all be in within the header-read timeout
        // of the accept (a read timeout alone lets a byte every few seconds hold the connection
        // for ever); a later request's within the idle timeout plus the header-read timeout;
        // every read of a body within the header-read timeout.
        let mut session = ServerSession::new_http1(stream);
        session.set_keepalive(None);
        session.set_read_timeout(Some(header_timeout));
        let mut reused = with_header_deadline(
            accepted + header_timeout,
            self.inner.process_new_http(session, shutdown),
        )
        .await;
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
            // The idle timeout bounds the wait for the next request's first bytes; each read of
            // its body gets the header-read timeout, as the first request's does (pingora's
            // default would let a body that never comes hold the connection a minute a read).
            session.set_read_timeout(Some(header_timeout));
            let deadline = tokio::time::Instant::now()
                + std::time::Duration::from_secs(self.idle_secs())
                + header_timeout;
            reused = with_header_deadline(deadline, self.inner.process_new_http(session, shutdown))
                .await;
        }
        None
    }

    async fn cleanup(&self) {
        ServerApp::cleanup(&*self.inner).await;
    }
}
