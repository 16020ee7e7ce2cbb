//! The ingress listener's connections, served on pingora's HTTP sessions: a cap on connections
//! open at once and one per client address (over either, a new connection is closed as soon as
//! it is accepted), a deadline for each request's headers however slowly their bytes trickle
//! in (pingora's own timeout is per read), and an idle timeout between requests. Each request's
//! headers are read here, the app answers it, and the answer is written here
//! (`answer_and_write`): no `HttpServer` in between, so no per-request module context, task
//! list or second timer. HTTP/2 connections are served here too (pingora's own accept loop has
//! none of these bounds): a connection's first stream must open within the header-read
//! timeout, each stream's body reads are held to it, a connection carries at most
//! `ingress.connections.max-streams` streams at once, and one whose stream stalled closes
//! after the header-read timeout without streams instead of the idle timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpPersistentSettings, ReusedHttpStream, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::http::v2::server::{H2Accept, HttpSession, default_h2_options, handshake};
use pingora::protocols::{Digest, Stream};
use pingora::server::ShutdownWatch;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use super::IngressApp;
use crate::head_cap::{HeadBudget, HeadCapped};
use sluice_config::ConnectionLimits;
use sluice_core::errors::Code;
use sluice_listeners::per_ip::PerIp;
use sluice_listeners::writes::{Stalled, WriteLimits, Writes};

tokio::task_local! {
    /// Set for each HTTP/2 stream's task: how long a read of its body may wait (pingora's h2
    /// session has no read timeout), and where to say that it stalled.
    static STREAM: StreamDeadline;
}

/// The body-read deadline of one HTTP/2 stream, and its connection's room for answers.
struct StreamDeadline {
    per_read: Duration,
    streams: Arc<OpenStreams>,
    /// The connection's answers, and the most unsent bytes it may hold.
    writes: Arc<Writes>,
    max_unsent: usize,
    /// This stream's turn to read a stored answer, held until its bytes are counted.
    room: std::sync::Mutex<Option<tokio::sync::OwnedMutexGuard<()>>>,
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

/// Waits for this HTTP/2 stream's turn to read a stored answer (an output, an attach's
/// result): a connection's streams read them one at a time, each counted as unsent as soon as
/// it is read, and once the connection holds `max-unsent-bytes` of answers its client has not
/// taken, the next is refused (ING0010) before it is read. A hundred streams asking for one
/// large output so cost at most the cap, not a hundred copies. Outside an HTTP/2 stream (one
/// answer at a time), answers at once. The turn ends when the answer is counted
/// ([`answer_and_write`]) or [`end_turn`] is called.
pub(super) async fn turn_to_read_answer() -> Result<(), super::error::IngressError> {
    let Ok((reading, writes, max)) = STREAM.try_with(|stream| {
        (
            Arc::clone(&stream.streams.reading),
            Arc::clone(&stream.writes),
            stream.max_unsent,
        )
    }) else {
        return Ok(());
    };
    let turn = reading.lock_owned().await;
    if writes.unsent() >= max {
        return Err(unsent_cap_reached(max));
    }
    let _ = STREAM.try_with(|stream| {
        *stream.room.lock().unwrap_or_else(|e| e.into_inner()) = Some(turn);
    });
    Ok(())
}

/// Ends this stream's turn to read a stored answer (before it waits for one, say).
pub(super) fn end_turn() {
    let _ = STREAM.try_with(|stream| stream.room.lock().unwrap_or_else(|e| e.into_inner()).take());
}

/// 503 ING0010: the connection holds `max` bytes of answers its client has not taken.
fn unsent_cap_reached(max: usize) -> super::error::IngressError {
    tracing::debug!(
        "ingress connection holds too many unsent answer bytes: a stream's answer refused (ingress.connections.max-unsent-bytes)"
    );
    let mut refused = super::error::IngressError::coded(
        sluice_core::errors::Code::ING0010,
        format!(
            "this connection holds {max} bytes or more of answers its client has not taken (ingress.connections.max-unsent-bytes): read the answers of its other streams first, or open another connection"
        ),
    );
    refused.retry_after_s = Some(1);
    refused
}

/// The streams open on one HTTP/2 connection, so its accept loop can tell a busy connection
/// from an idle one.
#[derive(Default)]
struct OpenStreams {
    open: AtomicUsize,
    none_open: Notify,
    /// A stream's body stopped arriving: the client is not one to keep a connection idle for.
    stalled: AtomicBool,
    /// Taken by the stream reading a stored answer ([`turn_to_read_answer`]).
    reading: Arc<tokio::sync::Mutex<()>>,
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

/// The first bytes of an HTTP/2 connection with prior knowledge.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The ingress HTTP server with its connections bounded. Clones share the bounds: each shard
/// serves its connections with one.
#[derive(Clone)]
pub struct GuardedHttp {
    app: Arc<IngressApp>,
    tls: Option<Arc<super::tls::IngressTls>>,
    permits: Arc<Semaphore>,
    per_ip: Arc<PerIp>,
    limits: ConnectionLimits,
    /// How answers are written, and the connections whose answers wait for their clients.
    answers: Answers,
}

/// What writing an answer needs beside the session: the listener's write bounds and its list
/// of stalled connections, and the connection's own writes.
#[derive(Clone)]
struct Answers {
    limits: WriteLimits,
    stalled: Arc<Stalled>,
}

impl GuardedHttp {
    /// Serves `app` with its connections bounded by `limits`, behind TLS when `tls` is set.
    pub fn new(
        app: IngressApp,
        limits: ConnectionLimits,
        tls: Option<Arc<super::tls::IngressTls>>,
    ) -> Self {
        // Shared with the clients' connections other nodes forward requests of.
        let per_ip = Arc::clone(app.state.relayed.per_ip());
        Self {
            app: Arc::new(app),
            tls,
            permits: Arc::new(Semaphore::new(limits.max.min(Semaphore::MAX_PERMITS))),
            per_ip,
            answers: Answers {
                limits: WriteLimits::of(&limits),
                stalled: Stalled::new(),
            },
            limits,
        }
    }

    /// Serves one HTTP/2 connection: its preface and settings within the header-read timeout
    /// of the accept, its first stream too; then each stream on its own task, with the
    /// connection closed once no stream has been open for the idle timeout (the header-read
    /// timeout after a stream's body stalled).
    async fn serve_h2(
        &self,
        stream: Stream,
        accepted: Instant,
        shutdown: &ShutdownWatch,
        writes: Arc<Writes>,
    ) {
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
        options.max_header_list_size(u32::try_from(self.max_header_bytes()).unwrap_or(u32::MAX));
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
                    // Every answer on it stalled, or a new connection at the cap took its place.
                    _ = writes.closing() => return,
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
                writes: Arc::clone(&writes),
                max_unsent: self.answers.limits.max_unsent,
                room: std::sync::Mutex::new(None),
            };
            let app = Arc::clone(&self.app);
            let answers = self.answers.clone();
            let writes = Arc::clone(&writes);
            tokio::spawn(STREAM.scope(deadline, async move {
                let _open = open;
                let mut session = ServerSession::new_http2(session);
                // An h2 stream's headers are in once it is accepted.
                if matches!(session.read_request().await, Ok(true)) {
                    answer_and_write(&app, session, &answers, &writes).await;
                }
            }));
        }
    }

    /// Serves one HTTP/1.1 connection, request after request: the first request's headers
    /// must all be in within the header-read timeout of the accept (a read timeout alone lets a
    /// byte every few seconds hold the connection for ever), a later request's within the idle
    /// timeout plus the header-read timeout, and every read of a body within the header-read
    /// timeout.
    ///
    /// One deadline per request bounds the whole header read. Pingora's own timer per read is
    /// off (its keep-alive set to "no timeout"): a request costs one timer, not one per read
    /// plus one for the request.
    async fn serve_h1(
        &self,
        stream: Stream,
        accepted: Instant,
        shutdown: &ShutdownWatch,
        writes: Arc<Writes>,
    ) {
        let header_timeout = self.limits.header_read_timeout.0;
        let head = HeadBudget::new(self.max_header_bytes());
        let stream = HeadCapped::wrap(stream, Arc::clone(&head));
        let mut session = ServerSession::new_http1(stream);
        let mut deadline = accepted + header_timeout;
        loop {
            session.set_keepalive(Some(0));
            session.set_read_timeout(Some(header_timeout));
            head.arm();
            let read = tokio::time::timeout_at(deadline, session.read_request()).await;
            head.disarm();
            match read {
                Ok(Ok(true)) => {}
                // Closed between requests.
                Ok(Ok(false)) => return,
                Ok(Err(_)) if head.tripped() => {
                    answer_head_too_large(session, head.max(), self.limits.write_timeout.0).await;
                    return;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "ingress request headers unreadable: closing the connection");
                    return;
                }
                Err(_) => {
                    tracing::debug!(
                        "ingress request headers not in by the deadline: closing the connection (ingress.connections.header-read-timeout, idle-timeout)"
                    );
                    return;
                }
            }
            // Kept alive unless the client asked otherwise (read from its request) or the
            // process is draining.
            if *shutdown.borrow() {
                session.set_keepalive(None);
            }
            let Some(reused) = answer_and_write(&self.app, session, &self.answers, &writes).await
            else {
                return;
            };
            let (stream, settings) = reused.consume();
            session = ServerSession::new_http1(stream);
            if let Some(settings) = settings {
                settings.apply_to_session(&mut session);
            }
            deadline = Instant::now() + self.limits.idle_timeout.0 + header_timeout;
        }
    }
}

/// Answers the request whose headers `session` has read and writes the answer; returns the
/// connection when it can carry another request (HTTP/1.1 keep-alive).
///
/// The request counts as in flight until its answer is written, so a drain that finds nothing
/// in flight (and ends the process) never cuts off an answer still being sent. The answer is
/// written under its deadline (`write-timeout` plus its size at `min-send-rate`), in chunks,
/// each of which may wait at most `write-timeout` for the client: past either, the connection
/// (HTTP/1.1) or the stream (HTTP/2) ends.
async fn answer_and_write(
    app: &IngressApp,
    mut session: ServerSession,
    answers: &Answers,
    writes: &Arc<Writes>,
) -> Option<ReusedHttpStream> {
    let _in_flight = app.state.in_flight.enter();
    let resp = app.respond(&mut session).await;
    let limits = &answers.limits;
    let (resp, mut unsent) = match writes.hold(resp.body().len(), limits.max_unsent) {
        Some(unsent) => (resp, Some(unsent)),
        None => {
            // Its bytes go now, not when the refusal is written (a stalled client may take
            // the whole write timeout for that).
            drop(resp);
            (unsent_cap_reached(limits.max_unsent).into_response(), None)
        }
    };
    // Counted: the next stream may read its stored answer.
    end_turn();
    let (parts, body) = resp.into_parts();
    let body = bytes::Bytes::from(body);
    let deadline = limits.deadline(body.len());
    let _writing = writes.writing();
    let written = async {
        step(
            answers,
            writes,
            deadline,
            session.write_response_header(Box::new(parts.into())),
        )
        .await?;
        let mut rest = body;
        while !rest.is_empty() {
            let chunk = rest.split_to(rest.len().min(CHUNK));
            let n = chunk.len();
            step(
                answers,
                writes,
                deadline,
                session.write_response_body(chunk, rest.is_empty()),
            )
            .await?;
            if let Some(unsent) = &mut unsent {
                unsent.sent(n);
            }
        }
        let settings = HttpPersistentSettings::for_session(&session);
        let reusable = step(answers, writes, deadline, session.finish()).await?;
        Ok::<_, Unwritten>(reusable.map(|s| ReusedHttpStream::from_reusable_stream(s, settings)))
    };
    match written.await {
        Ok(reused) => reused,
        Err(Unwritten::Gone(e)) => {
            tracing::debug!(error = %e, "ingress answer not written: the client is gone");
            None
        }
        Err(Unwritten::Stalled) => {
            tracing::debug!(
                "ingress answer not taken by its client in time: closing (ingress.connections.write-timeout, min-send-rate)"
            );
            // An HTTP/2 stream ends alone unless no answer on its connection moved for the
            // whole timeout: then every stream has stalled and the connection closes.
            stream_stalled();
            if writes
                .stalled_for()
                .is_some_and(|waited| waited >= limits.timeout)
            {
                writes.close();
            }
            None
        }
        Err(Unwritten::Evicted) => None,
    }
}

/// Bytes of an answer handed to the session at once: small enough that a slow client's
/// progress shows between them, large enough that a fast one costs few writes.
const CHUNK: usize = 64 << 10;

/// Why an answer was not written.
enum Unwritten {
    /// The client closed, or the session failed.
    Gone(Box<pingora::Error>),
    /// The client did not take it in time.
    Stalled,
    /// A new connection at the cap took this one's place.
    Evicted,
}

/// One write of an answer. Most are done at their first poll and cost no timer; one that
/// waits gets `write-timeout` (and the answer's deadline), puts its connection on the stalled
/// list once it has waited `evict-stalled-after`, and ends if the connection is evicted.
async fn step<T>(
    answers: &Answers,
    writes: &Arc<Writes>,
    deadline: Instant,
    write: impl std::future::Future<Output = pingora::Result<T>>,
) -> Result<T, Unwritten> {
    let mut write = std::pin::pin!(write);
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(write.as_mut().poll(cx))).await;
    let done = match first {
        std::task::Poll::Ready(done) => done,
        std::task::Poll::Pending => {
            let limits = &answers.limits;
            let waited_from = Instant::now();
            let listed_at = (waited_from + limits.evict_after).min(deadline);
            let ends_at = (waited_from + limits.timeout).min(deadline);
            let early = tokio::select! {
                done = write.as_mut() => Some(done),
                _ = tokio::time::sleep_until(listed_at) => None,
            };
            match early {
                Some(done) => done,
                None => {
                    answers.stalled.list(writes);
                    tokio::select! {
                        done = write.as_mut() => done,
                        _ = tokio::time::sleep_until(ends_at) => return Err(Unwritten::Stalled),
                        _ = writes.closing() => {
                            // Told for the connection: HTTP/2's accept loop closes it too.
                            writes.close();
                            return Err(Unwritten::Evicted);
                        }
                    }
                }
            }
        }
    };
    writes.moved();
    done.map_err(Unwritten::Gone)
}

#[async_trait]
impl ServerApp for GuardedHttp {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let peer = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        // Held for the connection's life; dropping the stream closes it.
        let Some(_permit) = self
            .place_under_cap(None, || Arc::clone(&self.permits).try_acquire_owned().ok())
            .await
        else {
            tracing::debug!(
                max = self.limits.max,
                "ingress connection cap reached: closing a new connection (ingress.connections.max)"
            );
            return None;
        };
        let _place = match peer {
            Some(ip) => match self
                .place_under_cap(Some(ip), || self.per_ip.enter(ip))
                .await
            {
                Some(place) => Some(place),
                None => {
                    tracing::debug!(
                        %ip,
                        max = self.limits.per_ip(),
                        "ingress connection cap for one address reached: closing a new connection (ingress.connections.max-per-ip)"
                    );
                    return None;
                }
            },
            None => None,
        };
        let writes = Writes::new(peer);
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
            self.serve_h2(stream, accepted, shutdown, writes).await;
            return None;
        }
        self.serve_h1(stream, accepted, shutdown, writes).await;
        None
    }
}

impl GuardedHttp {
    /// `ingress.connections.max-header-bytes`, at least what a request line and a few
    /// headers need.
    fn max_header_bytes(&self) -> usize {
        usize::try_from(self.limits.max_header_bytes.0)
            .unwrap_or(usize::MAX)
            .max(MIN_HEAD_BYTES)
    }
}

/// The smallest head bound taken: below it ordinary requests would be refused.
const MIN_HEAD_BYTES: usize = 1024;

/// Answers 431 `ING0011` on the connection of `session`, whose request head went over `max`
/// bytes, and closes it (the rest of the head is never read).
async fn answer_head_too_large(session: ServerSession, max: usize, write_timeout: Duration) {
    use tokio::io::AsyncWriteExt;
    let ServerSession::H1(session) = session else {
        return;
    };
    tracing::debug!(
        max,
        "ingress request head over its bound: answering 431 and closing the connection (ingress.connections.max-header-bytes)"
    );
    let answer = crate::error::IngressError::coded(
        Code::ING0011,
        format!(
            "the request line and headers are over {max} bytes (ingress.connections.max-header-bytes); send large values in the body"
        ),
    )
    .into_response();
    let mut head = format!(
        "HTTP/1.1 {} {}\r\n",
        answer.status().as_u16(),
        answer.status().canonical_reason().unwrap_or("")
    );
    for (name, value) in answer.headers() {
        if let Ok(value) = value.to_str() {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    head.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n",
        answer.body().len()
    ));
    let mut stream = session.into_inner();
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(answer.body()).await?;
        stream.flush().await
    };
    // A client that does not take it within the write timeout loses it.
    let _ = tokio::time::timeout(write_timeout, write).await;
    let _ = AsyncWriteExt::shutdown(&mut stream).await;
}

impl GuardedHttp {
    /// A place under a cap (`take`); when there is none, the connection (of `peer`, when the
    /// cap is per address) whose answer has waited longest for its client is closed to make
    /// one, and the place it gives back is taken.
    async fn place_under_cap<P>(
        &self,
        peer: Option<std::net::IpAddr>,
        take: impl Fn() -> Option<P>,
    ) -> Option<P> {
        if let Some(place) = take() {
            return Some(place);
        }
        if !self
            .answers
            .stalled
            .evict(self.answers.limits.evict_after, peer)
        {
            return None;
        }
        sluice_listeners::writes::given_back(take).await
    }
}
