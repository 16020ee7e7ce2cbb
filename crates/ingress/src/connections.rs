//! Bounds on the ingress listener's connections, in front of pingora's HTTP server: a cap on
//! connections open at once and one per client address (over either, a new connection is
//! closed as soon as it is accepted), a deadline for each request's headers however slowly
//! their bytes trickle in (pingora's own timeout is per read), and an idle timeout between
//! requests. HTTP/2 connections are served here too (not by pingora's own accept loop, which
//! has neither): a connection's first stream must open within the header-read timeout, each
//! stream's body reads are held to it, a connection carries at most
//! `ingress.connections.max-streams` streams at once, and one whose stream stalled closes
//! after the header-read timeout without streams instead of the idle timeout.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::http_app::HttpServer;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::http::v2::server::{H2Accept, HttpSession, default_h2_options, handshake};
use pingora::protocols::{Digest, Stream};
use pingora::server::ShutdownWatch;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use super::IngressApp;
use super::in_flight::InFlightGuard;
use sluice_config::ConnectionLimits;
use sluice_listeners::per_ip::PerIp;

tokio::task_local! {
    /// Set by the app once a request's headers are read: the connection's header deadline no
    /// longer applies to that request.
    pub(super) static HEADERS_READ: Arc<AtomicBool>;
}

tokio::task_local! {
    /// Set around the serving of each request, its answer's writing included: the request's
    /// in-flight mark waits here until its response has been written, so a drain that finds
    /// nothing in flight (and ends the process) never cuts off an answer still being sent.
    static ANSWERING: RefCell<Option<InFlightGuard>>;
}

tokio::task_local! {
    /// Set for each HTTP/2 stream's task: how long a read of its body may wait (pingora's h2
    /// session has no read timeout), and where to say that it stalled.
    static STREAM: StreamDeadline;
}

/// The body-read deadline of one HTTP/2 stream.
struct StreamDeadline {
    per_read: Duration,
    streams: Arc<OpenStreams>,
}

/// Keeps `guard` (the current request's in-flight mark) until the request's response has been
/// written; returned when the request is served outside a connection of this module (then
/// its caller keeps it).
pub(super) fn hold_until_written(guard: InFlightGuard) -> Option<InFlightGuard> {
    let mut guard = Some(guard);
    let _ = ANSWERING.try_with(|slot| *slot.borrow_mut() = guard.take());
    guard
}

/// Tells the connection serving the current request that its headers are in.
pub(super) fn headers_read() {
    let _ = HEADERS_READ.try_with(|read| read.store(true, Ordering::Release));
}

/// How long one read of the current HTTP/2 stream's body may wait; `None` outside an h2
/// stream (HTTP/1.1 sessions carry their own read timeout).
pub(super) fn stream_read_timeout() -> Option<Duration> {
    STREAM.try_with(|stream| stream.per_read).ok()
}

/// Tells the connection serving the current HTTP/2 stream that the stream's body stalled: the
/// connection no longer gets the idle timeout between streams.
pub(super) fn stream_stalled() {
    let _ = STREAM.try_with(|stream| stream.streams.stalled.store(true, Ordering::Release));
}

/// The streams open on one HTTP/2 connection, so its accept loop can tell a busy connection
/// from an idle one.
#[derive(Default)]
struct OpenStreams {
    open: AtomicUsize,
    none_open: Notify,
    /// A stream's body stopped arriving: the client is not one to keep a connection idle for.
    stalled: AtomicBool,
}

impl OpenStreams {
    fn enter(self: &Arc<Self>) -> OpenStream {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenStream(Arc::clone(self))
    }

    /// Returns once no stream has been open for `quiet()` (read when the last one closed).
    async fn quiet_for(&self, quiet: impl Fn() -> Duration) {
        while self.open.load(Ordering::Acquire) != 0 {
            // A wake-up stored before this wait (notify_one keeps one) only costs a re-check.
            self.none_open.notified().await;
        }
        tokio::time::sleep(quiet()).await;
    }
}

/// One open stream; closing it (dropping this) may leave the connection idle.
struct OpenStream(Arc<OpenStreams>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none_open.notify_one();
        }
    }
}

/// Runs `request` (reading one request's headers, then answering it) and drops it, which
/// closes the connection, if its headers are not all in by `deadline`.
async fn with_header_deadline<T>(
    deadline: tokio::time::Instant,
    request: impl std::future::Future<Output = Option<T>>,
) -> Option<T> {
    let read = Arc::new(AtomicBool::new(false));
    let request = ANSWERING.scope(
        RefCell::new(None),
        HEADERS_READ.scope(Arc::clone(&read), request),
    );
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

/// The ingress HTTP server with its connections bounded. Clones share the bounds: each shard
/// serves its connections with one.
#[derive(Clone)]
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

    /// Serves one HTTP/2 connection: its preface and settings within the header-read timeout
    /// of the accept, its first stream too; then each stream on its own task, with the
    /// connection closed once no stream has been open for the idle timeout (the header-read
    /// timeout after a stream's body stalled).
    async fn serve_h2(&self, stream: Stream, accepted: Instant, shutdown: &ShutdownWatch) {
        let header_timeout = self.limits.header_read_timeout.0;
        let idle_timeout = self.limits.idle_timeout.0;
        let digest = Arc::new(Digest {
            ssl_digest: stream.get_ssl_digest(),
            timing_digest: stream.get_timing_digest(),
            proxy_digest: stream.get_proxy_digest(),
            socket_digest: stream.get_socket_digest(),
        });
        let mut options = default_h2_options();
        options.max_concurrent_streams(self.limits.max_streams.max(1));
        let mut conn = match tokio::time::timeout_at(
            accepted + header_timeout,
            handshake(stream, Some(options)),
        )
        .await
        {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "ingress HTTP/2 handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(
                    "ingress HTTP/2 preface not in by the deadline: closing the connection (ingress.connections.header-read-timeout)"
                );
                return;
            }
        };
        let streams = Arc::new(OpenStreams::default());
        let mut shutdown = shutdown.clone();
        let mut closing = *shutdown.borrow();
        if closing {
            conn.graceful_shutdown();
        }
        let mut first = true;
        loop {
            let next = if closing {
                // Streams already sent are served; the connection ends when they are done.
                HttpSession::from_h2_conn(&mut conn, Arc::clone(&digest)).await
            } else {
                let quiet = || {
                    if first {
                        // The first stream is due within the header-read timeout of the accept.
                        (accepted + header_timeout).saturating_duration_since(Instant::now())
                    } else if streams.stalled.load(Ordering::Acquire) {
                        header_timeout
                    } else {
                        idle_timeout
                    }
                };
                tokio::select! {
                    biased;
                    _ = shutdown.changed() => {
                        conn.graceful_shutdown();
                        closing = true;
                        continue;
                    }
                    next = HttpSession::from_h2_conn(&mut conn, Arc::clone(&digest)) => next,
                    _ = streams.quiet_for(quiet) => {
                        tracing::debug!(
                            first,
                            "ingress HTTP/2 connection without streams past its timeout: closing it (ingress.connections.idle-timeout, header-read-timeout)"
                        );
                        return;
                    }
                }
            };
            let session = match next {
                Ok(Some(H2Accept::Session(session))) => session,
                // Answered or reset already; its siblings go on.
                Ok(Some(H2Accept::Rejected)) => continue,
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "ingress HTTP/2 connection ended");
                    return;
                }
            };
            first = false;
            let open = streams.enter();
            let deadline = StreamDeadline {
                per_read: header_timeout,
                streams: Arc::clone(&streams),
            };
            let app = Arc::clone(&self.inner);
            let shutdown = shutdown.clone();
            tokio::spawn(STREAM.scope(
                deadline,
                ANSWERING.scope(RefCell::new(None), async move {
                    let _open = open;
                    app.process_new_http(ServerSession::new_http2(session), &shutdown)
                        .await;
                }),
            ));
        }
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
            self.serve_h2(stream, accepted, shutdown).await;
            return None;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::in_flight::InFlight;

    #[tokio::test]
    async fn a_request_stays_in_flight_until_its_serving_ends_not_when_its_answer_is_made() {
        let in_flight = Arc::new(InFlight::default());
        let served = ANSWERING.scope(RefCell::new(None), async {
            // What the app does while making the answer.
            let kept = hold_until_written(in_flight.enter());
            assert!(kept.is_none(), "the connection keeps it");
            drop(kept);
            // The answer is made; its writing (still in the scope) counts as in flight.
            tokio::task::yield_now().await;
            in_flight.current()
        });
        assert_eq!(served.await, 1, "in flight while the response is written");
        assert_eq!(in_flight.current(), 0, "done once the serving ended");
        // Outside a connection of this module, the caller keeps the mark.
        let kept = hold_until_written(in_flight.enter());
        assert!(kept.is_some());
        assert_eq!(in_flight.current(), 1);
        drop(kept);
        assert_eq!(in_flight.current(), 0);
    }
}
