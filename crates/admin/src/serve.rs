//! Serves the admin router with bounded connections: at most `admin.connections.max` open at
//! once (a connection over it is closed as soon as it is accepted), a header-read timeout, and an
//! idle timeout for connections with no request in flight, HTTP/1.1 and HTTP/2 alike. The
//! ingress can be flooded and the admin listener still has its own sockets to answer on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use sluice_config::ConnectionLimits;
use sluice_listeners::writes::{EVICTED_GIVES_BACK, Stalled, WriteLimits, Writes, given_back};

use crate::watched::{WatchedBody, WatchedIo};

/// When a connection last had a request in flight, and how many it has now.
struct Activity {
    opened: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `opened` at which the last request ended.
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let now = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    /// How long until the connection has been idle for `idle`; `None` once it has.
    fn idle_left(&self, idle: Duration) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Some(idle);
        }
        let last = self.opened + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        (last + idle)
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    }
}

/// Counts a request in flight while alive.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A place under a connection cap: taken now, or being given back by an evicted connection.
enum Place<P> {
    Now(P),
    Freed,
}

/// One accepted connection and what serving it needs.
struct Connection {
    builder: Arc<Builder<TokioExecutor>>,
    router: Router,
    stop: watch::Receiver<bool>,
    idle: Duration,
    /// Its place under the connection cap, given back when it closes.
    _permit: tokio::sync::OwnedSemaphorePermit,
    /// Its place under its client address's cap.
    _place: sluice_listeners::per_ip::Place,
    /// Its answers on their way out, and the listener's bounds on them.
    writes: Arc<Writes>,
    write_limits: WriteLimits,
    stalled: Arc<Stalled>,
}

impl Connection {
    /// Serves requests on `io` until the client closes, the connection idles out, or the
    /// listener stops (then requests in flight finish first).
    async fn drive<I>(mut self, io: I)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Arc::new(Activity::new());
        let service = {
            let activity = Arc::clone(&activity);
            let router = self.router.clone();
            let writes = Arc::clone(&self.writes);
            hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let in_flight = InFlight::enter(&activity);
                let router = router.clone();
                let writes = Arc::clone(&writes);
                async move {
                    let response = router.oneshot(request.map(axum::body::Body::new)).await;
                    drop(in_flight);
                    response.map(|response| {
                        response.map(|body| axum::body::Body::new(WatchedBody::new(body, writes)))
                    })
                }
            })
        };
        let io = WatchedIo::new(io, Arc::clone(&self.writes));
        let connection = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service);
        tokio::pin!(connection);
        let mut draining = false;
        let limits = self.write_limits;
        loop {
            let wait = activity.idle_left(self.idle);
            // While an answer waits for its client: when to look again (on the stalled list
            // at `evict-stalled-after`, closed at `write-timeout`).
            let stall_check = self.writes.stalled_for().map(|waited| {
                if waited < limits.evict_after {
                    limits.evict_after - waited
                } else {
                    limits.timeout.saturating_sub(waited)
                }
            });
            tokio::select! {
                _ = connection.as_mut() => break,
                _ = self.stop.wait_for(|stopped| *stopped), if !draining => {
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                }
                _ = tokio::time::sleep(wait.unwrap_or_default()), if !draining => {
                    if activity.idle_left(self.idle).is_none() {
                        draining = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
                _ = self.writes.started_writing() => {}
                _ = tokio::time::sleep(stall_check.unwrap_or_default()), if stall_check.is_some() => {
                    match self.writes.stalled_for() {
                        Some(waited) if waited >= limits.timeout => {
                            tracing::debug!(
                                ?waited,
                                "admin answer not taken by its client in time: closing the connection (admin.connections.write-timeout)"
                            );
                            break;
                        }
                        Some(waited) if waited >= limits.evict_after => self.stalled.list(&self.writes),
                        _ => {}
                    }
                }
                // A new connection at the cap took this one's place.
                _ = self.writes.closing() => break,
            }
        }
    }
}

/// Accepts connections on `listener` until `stop` turns true, then lets each connection finish
/// its requests in flight and returns once all are closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    tls: Option<TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    // Every open connection holds a permit: the drain below waits until all are back.
    let cap = u32::try_from(limits.max).unwrap_or(u32::MAX);
    let permits = Arc::new(Semaphore::new(usize::try_from(cap).unwrap_or(usize::MAX)));
    let per_ip = sluice_listeners::per_ip::PerIp::new(limits.per_ip());
    let builder = Arc::new(http_builder(&limits));
    let write_limits = WriteLimits::of(&limits);
    let stalled = Stalled::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        let (socket, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "admin listener cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // At a cap, the connection whose answer waited longest for its client (at least
        // `evict-stalled-after`) is closed to make room; the new one waits for its place on
        // a task of its own, so the accept loop goes on.
        let permit = match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => Place::Now(permit),
            Err(_) if stalled.evict(write_limits.evict_after, None) => Place::Freed,
            Err(_) => {
                tracing::debug!(
                    max = limits.max,
                    "admin connection cap reached: closing a new connection (admin.connections.max)"
                );
                continue;
            }
        };
        let place = match per_ip.enter(peer.ip()) {
            Some(place) => Place::Now(place),
            None if stalled.evict(write_limits.evict_after, Some(peer.ip())) => Place::Freed,
            None => {
                tracing::debug!(
                    ip = %peer.ip(),
                    max = limits.per_ip(),
                    "admin connection cap for one address reached: closing a new connection (admin.connections.max-per-ip)"
                );
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let builder = Arc::clone(&builder);
        let router = router.clone();
        let connection_stop = stop.clone();
        let idle = limits.idle_timeout.0;
        let (permits_left, per_ip_left) = (Arc::clone(&permits), Arc::clone(&per_ip));
        let stalled_list = Arc::clone(&stalled);
        let placed = async move {
            let permit = match permit {
                Place::Now(permit) => permit,
                Place::Freed => {
                    tokio::time::timeout(EVICTED_GIVES_BACK, permits_left.acquire_owned())
                        .await
                        .ok()?
                        .ok()?
                }
            };
            let place = match place {
                Place::Now(place) => place,
                Place::Freed => given_back(|| per_ip_left.enter(peer.ip())).await?,
            };
            Some(Connection {
                builder,
                router,
                stop: connection_stop,
                idle,
                _permit: permit,
                _place: place,
                writes: Writes::new(Some(peer.ip())),
                write_limits,
                stalled: stalled_list,
            })
        };
        start(placed, socket, tls.clone(), limits.header_read_timeout.0);
    }
    drop(listener);
    let _ = permits.acquire_many(cap).await;
}

/// hyper's connection builder with the admin listener's limits on heads and streams.
fn http_builder(limits: &ConnectionLimits) -> Builder<TokioExecutor> {
    let head_bytes = usize::try_from(limits.max_header_bytes.0).unwrap_or(usize::MAX);
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout.0)
        // hyper answers a head over its buffer with a bare 431 (it takes no less than 8 KiB).
        .max_buf_size(head_bytes.max(8 * 1024))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(head_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(limits.max_streams.max(1));
    builder
}

/// Drives `socket` on a task of its own once it has its place (`placed`), over TLS when the
/// listener has an acceptor; a client that sends nothing (or finishes no handshake) within
/// `first_bytes` is closed.
fn start(
    placed: impl std::future::Future<Output = Option<Connection>> + Send + 'static,
    socket: tokio::net::TcpStream,
    tls: Option<TlsAcceptor>,
    first_bytes: Duration,
) {
    tokio::spawn(async move {
        let Some(connection) = placed.await else {
            tracing::debug!(
                "admin connection: the evicted connection's place did not come back in time; closed"
            );
            return;
        };
        match tls {
            None => {
                // hyper's header timer starts once it knows the version, which takes a
                // first byte: a connection that sends nothing is closed here instead.
                let mut probe = [0u8; 1];
                match tokio::time::timeout(first_bytes, socket.peek(&mut probe)).await {
                    Ok(Ok(n)) if n > 0 => connection.drive(socket).await,
                    _ => tracing::debug!(
                        "admin connection sent nothing within admin.connections.header-read-timeout: closed"
                    ),
                }
            }
            Some(acceptor) => {
                // A client that never finishes its handshake is one that never sends headers.
                match tokio::time::timeout(first_bytes, acceptor.accept(socket)).await {
                    Ok(Ok(stream)) => connection.drive(stream).await,
                    Ok(Err(e)) => tracing::debug!(error = %e, "admin TLS handshake failed"),
                    Err(_) => tracing::debug!("admin TLS handshake timed out"),
                }
            }
        }
    });
}
