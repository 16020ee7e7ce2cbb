//! One attempt of an invocation: `POST {uri}/invoke/{service}/{handler}` with the Start message
//! and the journal replayed, then the deployment's messages handed to a [`MessageSink`] as they
//! arrive, until it ends, suspends or fails.
//!
//! Two transports. Request/response: the request body closes after the replay and completions
//! arrive through later attempts. Bidi (HTTP/2 deployments that declare it): the request body
//! stays open and the partition streams notifications and acks into it as they become durable;
//! after `inactivity-timeout` without a message from the deployment the request body is closed,
//! which asks the SDK to suspend.
//!
//! HTTP and protocol failures map to their RT codes: 502/504 and connection errors RT0010,
//! 429/503 RT0023 (with `Retry-After`), 415 RT0015, 413 RT0019, any other status or a wrong
//! content type RT0012, silence for `abort-timeout` RT0001, an oversize message RT0003.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Request, StatusCode, Version, header};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;

use super::body::{Incoming, Sending, drain_tail};
use super::connections::{Address, Addresses, OpenError};

use crate::deployment_tls::{Connector, DeploymentTls};
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_flow::{LimitKey, Scope};
use sluice_protocol::message::{Kind, Sender};
use sluice_protocol::{Frame, FrameDecoder, Message, MessageType, ProtocolVersion, proto};

/// Everything one attempt needs.
#[derive(Debug, Clone)]
pub struct AttemptRequest {
    /// The deployment's base URI, as registered (parsed once per client, not per attempt).
    pub uri: String,
    /// Speak HTTP/1.1 (request/response deployments registered with `use_http_11`).
    pub use_http_11: bool,
    /// Sent with every request.
    pub additional_headers: BTreeMap<String, String>,
    /// Target service.
    pub service: String,
    /// Target handler.
    pub handler: String,
    /// Object or workflow key.
    pub key: Option<String>,
    /// The invocation.
    pub invocation_id: InvocationId,
    /// The pinned protocol version.
    pub protocol: ProtocolVersion,
    /// Journal to replay, Input first, as stored.
    pub journal: Vec<Frame>,
    /// Eager state for keyed targets.
    pub state: Vec<(Bytes, Bytes)>,
    /// Whether `state` is only part of the object's state.
    pub partial_state: bool,
    /// Seed for the SDK's deterministic random (V6+).
    pub random_seed: u64,
    /// Flow-control scope, sent in V7's Start message.
    pub scope: Option<Scope>,
    /// Limit key under the scope, sent in V7's Start message.
    pub limit_key: Option<LimitKey>,
    /// Attempts since the last stored entry.
    pub retry_count: u32,
    /// Give up after this long without a message once the request body is closed (RT0001).
    pub abort_timeout: Duration,
    /// Bidi only: close the request body after this long without a message.
    pub inactivity_timeout: Duration,
    /// Largest accepted message (RT0003).
    pub message_size_limit: usize,
    /// `traceparent` for the deployment: this attempt's span, so the SDK's spans join.
    pub traceparent: Option<String>,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// `EndMessage`: the invocation completed (its Output is among the messages).
    End,
    /// `SuspensionMessage`: waiting for completions or signals.
    Suspended(Message),
    /// `ErrorMessage`: the handler failed; retry per policy.
    Failed(proto::ErrorMessage),
}

/// What the deployment sent in one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// New messages after the replayed journal, with their ack flags, in order.
    pub messages: Vec<(Message, bool)>,
    /// How it ended.
    pub ending: Ending,
    /// `x-restate-server`, when sent.
    pub sdk: Option<String>,
}

/// A failed attempt: its code and, for RT0023, when to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptError {
    /// Code and message.
    pub error: CodedError,
    /// `Retry-After` of a 429/503.
    pub retry_after: Option<Duration>,
    /// The HTTP status the deployment answered instead of a stream, if it did.
    pub status: Option<u16>,
    /// No connection to the deployment could be made (refused, unresolvable, no TLS
    /// handshake): the one failure that says the deployment itself is down.
    pub unreachable: bool,
}

impl From<CodedError> for AttemptError {
    fn from(error: CodedError) -> Self {
        Self {
            error,
            retry_after: None,
            status: None,
            unreachable: false,
        }
    }
}

impl AttemptError {
    /// What this failure says about the deployment, for its paced drain: overloaded (429/503,
    /// with its `Retry-After`), down (no connection could be made), or nothing. A 500, 502 or
    /// 504, or a connection that broke mid-attempt, is this attempt's (a handler that
    /// crashes, a gateway's timeout on one slow handler): the deployment answered, so it is
    /// judged per invocation, by that invocation's own retry back-off, and never holds back
    /// the deployment's other handlers.
    pub fn signal(&self) -> sluice_flow::pacing::Signal {
        use sluice_flow::pacing::Signal;
        match self.error.code {
            Some(Code::RT0023) => Signal::Overloaded {
                retry_after_ms: self
                    .retry_after
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            },
            _ if self.unreachable => Signal::Down,
            _ => Signal::Neutral,
        }
    }
}

/// Runs attempts. One per shard: its HTTP/2 connections (one per deployment address) serve
/// that shard's attempts, and their tasks run on that shard.
#[derive(Debug, Clone)]
pub struct AttemptClient {
    /// HTTP/1.1 deployments: hyper's pooled client (request/response only).
    h1: Client<Connector, Full<Bytes>>,
    /// HTTP/2 deployments: connections of our own on the `h2` crate (`connections.rs`).
    h2: Connector,
    addresses: Arc<Addresses>,
    /// A connection unused this long is closed before the next attempt
    /// (`worker.invoker.connection-idle-timeout`).
    idle: Duration,
}

/// Receives the deployment's messages (after the replayed journal) as they arrive, with their
/// ack flags. Terminal messages are not handed over: they are the attempt's [`Ending`].
pub trait MessageSink: Send {
    /// The deployment answered the request (a 2xx head of the protocol's content type),
    /// before any message: it is reachable and not overloaded.
    fn answered(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// One message.
    fn deliver(&mut self, message: Message, ack: bool) -> impl Future<Output = ()> + Send;
}

impl MessageSink for Vec<(Message, bool)> {
    async fn deliver(&mut self, message: Message, ack: bool) {
        self.push((message, ack));
    }
}

/// The open request body of a bidi attempt: frames written here reach the deployment.
pub type Outbound = mpsc::UnboundedSender<Bytes>;

/// `worker.invoker.connection-idle-timeout`'s default.
pub const CONNECTION_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

impl Default for AttemptClient {
    fn default() -> Self {
        Self::new(&DeploymentTls::default(), CONNECTION_IDLE_TIMEOUT)
    }
}

impl AttemptClient {
    /// A client reaching `https://` deployments with what `tls` trusts, closing connections
    /// unused for `idle`.
    pub fn new(tls: &DeploymentTls, idle: Duration) -> Self {
        Self {
            h1: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(idle)
                .build(tls.connector(None, false)),
            h2: tls.connector(None, true),
            addresses: Arc::default(),
            idle,
        }
    }
}

fn err(code: Code, message: String) -> AttemptError {
    CodedError::new(code, message).into()
}

/// The replay: Start, then the journal as stored, as pieces that share the journal's bytes
/// (each entry's header, then its payload as stored): a journal of hundreds of MiB is not
/// copied into one buffer to be sent.
fn replay(req: &AttemptRequest) -> Vec<Bytes> {
    let known = u32::try_from(req.journal.len()).expect("journals are shorter than 2^32");
    let start = Message::Start(proto::StartMessage {
        id: Bytes::copy_from_slice(&req.invocation_id.to_bytes()),
        debug_id: req.invocation_id.to_string(),
        known_entries: known,
        state_map: req
            .state
            .iter()
            .map(|(key, value)| proto::start_message::StateEntry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        partial_state: req.partial_state,
        key: req.key.clone().unwrap_or_default(),
        retry_count_since_last_stored_entry: req.retry_count,
        random_seed: if req.protocol >= ProtocolVersion::V6 {
            req.random_seed
        } else {
            0
        },
        scope: req
            .scope
            .as_ref()
            .filter(|_| req.protocol >= ProtocolVersion::V7)
            .map(|s| s.as_str().to_owned()),
        limit_key: req
            .limit_key
            .as_ref()
            .filter(|_| req.protocol >= ProtocolVersion::V7)
            .map(|k| k.as_str().to_owned()),
        ..Default::default()
    });
    let mut first = BytesMut::new();
    start.to_frame(false).encode(&mut first);
    let mut pieces = Vec::with_capacity(1 + 2 * req.journal.len());
    pieces.push(first.freeze());
    // Before V7 the start message has no scope or limit key: the handler reads its own in its
    // input's headers (a scoped client over `x-service-scope`, `x-service-limit-key`).
    let scoped_input = (req.protocol < ProtocolVersion::V7 && req.scope.is_some())
        .then(|| {
            req.journal
                .first()
                .and_then(|input| with_scope_headers(req, input))
        })
        .flatten();
    for (at, frame) in req.journal.iter().enumerate() {
        let frame = match (&scoped_input, at) {
            (Some(input), 0) => input,
            _ => frame,
        };
        let (header, payload) = frame.pieces();
        pieces.push(header);
        if !payload.is_empty() {
            pieces.push(payload);
        }
    }
    pieces
}

/// `input` (an invocation's input entry) with its scope and limit key in its headers, in place
/// of any the headers held; `None` when it is not an input entry.
fn with_scope_headers(req: &AttemptRequest, input: &Frame) -> Option<Frame> {
    use sluice_flow::{LIMIT_KEY_HEADER, SCOPE_HEADER};
    let Ok(Message::Input(mut input)) = Message::decode(input, req.protocol) else {
        return None;
    };
    input.headers.retain(|h| {
        !h.key.eq_ignore_ascii_case(SCOPE_HEADER) && !h.key.eq_ignore_ascii_case(LIMIT_KEY_HEADER)
    });
    let named = [
        (
            SCOPE_HEADER,
            req.scope.as_ref().map(|s| s.as_str().to_owned()),
        ),
        (
            LIMIT_KEY_HEADER,
            req.limit_key.as_ref().map(|k| k.as_str().to_owned()),
        ),
    ];
    for (key, value) in named {
        if let Some(value) = value {
            input.headers.push(proto::Header {
                key: key.to_owned(),
                value,
            });
        }
    }
    Some(Message::Input(input).to_frame(false))
}

/// The replay in one buffer (HTTP/1.1 sends one body).
fn replay_joined(req: &AttemptRequest) -> Bytes {
    let pieces = replay(req);
    let mut body = BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
    for piece in pieces {
        body.extend_from_slice(&piece);
    }
    body.freeze()
}

/// The request's head: the address's template, then the protocol's headers and the
/// deployment's own.
fn head(
    req: &AttemptRequest,
    address: &Address,
    version: Version,
) -> Result<Request<()>, AttemptError> {
    let invalid = |what: String| err(Code::RT0006, format!("cannot build the request: {what}"));
    let mut request = address
        .invoke(&req.service, &req.handler, version)
        .ok_or_else(|| {
            invalid(format!(
                "'{}/{}' is no valid path",
                req.service, req.handler
            ))
        })?;
    let headers = request.headers_mut();
    let content_type = HeaderValue::from_static(req.protocol.content_type());
    headers.insert(header::CONTENT_TYPE, content_type.clone());
    headers.insert(header::ACCEPT, content_type);
    // Values unique to one attempt are sent unindexed (HPACK's never-indexed literal): indexed,
    // each would enter the connection's table only to push out entries still useful.
    let mut id = HeaderValue::try_from(req.invocation_id.to_string())
        .map_err(|e| invalid(format!("invocation id: {e}")))?;
    id.set_sensitive(true);
    headers.insert(INVOCATION_ID, id);
    if let Some(traceparent) = &req.traceparent {
        let mut value = HeaderValue::try_from(traceparent.as_str())
            .map_err(|e| invalid(format!("traceparent: {e}")))?;
        value.set_sensitive(true);
        headers.insert(TRACEPARENT, value);
    }
    if let Some(key) = &req.key {
        let encoded: String = url::form_urlencoded::byte_serialize(key.as_bytes()).collect();
        let value =
            HeaderValue::try_from(encoded).map_err(|e| invalid(format!("service key: {e}")))?;
        headers.insert(SERVICE_KEY, value);
    }
    for (name, value) in &req.additional_headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) else {
            return Err(err(
                Code::RT0006,
                format!("invalid additional header '{name}'"),
            ));
        };
        headers.append(name, value);
    }
    Ok(request)
}

const INVOCATION_ID: HeaderName = HeaderName::from_static("x-restate-invocation-id");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const SERVICE_KEY: HeaderName = HeaderName::from_static("x-restate-service-key");

/// The code an `ErrorMessage` is recorded with: 570 journal mismatch (RT0016), 571 protocol
/// violation (RT0012), anything else a retryable handler error (RT0007).
pub fn failure_code(error: &proto::ErrorMessage) -> Code {
    match error.code {
        570 => Code::RT0016,
        571 => Code::RT0012,
        _ => Code::RT0007,
    }
}

fn status_error(status: StatusCode, retry_after: Option<Duration>) -> AttemptError {
    let (code, what) = match status.as_u16() {
        502 | 504 => (Code::RT0010, "a gateway in front of the deployment failed"),
        429 | 503 => (Code::RT0023, "the deployment is overloaded"),
        415 => (
            Code::RT0015,
            "the deployment rejected the negotiated protocol version",
        ),
        413 => (
            Code::RT0019,
            "the deployment rejected the request as too large",
        ),
        _ => (Code::RT0012, "unexpected http status code"),
    };
    AttemptError {
        error: CodedError::new(code, format!("{what} ({status})")),
        retry_after: retry_after.filter(|_| code == Code::RT0023),
        status: Some(status.as_u16()),
        unreachable: false,
    }
}

impl AttemptClient {
    /// Runs one request/response attempt and collects its messages.
    pub async fn run(&self, req: &AttemptRequest) -> Result<Attempt, AttemptError> {
        let mut messages = Vec::new();
        let (ending, sdk) = self.stream(req, None, &mut messages).await?;
        Ok(Attempt {
            messages,
            ending,
            sdk,
        })
    }

    /// Runs one attempt, handing messages to `sink` as they arrive. With `outbound` the request
    /// body stays open (bidi, HTTP/2 only) and carries what is sent on the paired
    /// [`Outbound`].
    pub async fn stream(
        &self,
        req: &AttemptRequest,
        outbound: Option<mpsc::UnboundedReceiver<Bytes>>,
        sink: &mut impl MessageSink,
    ) -> Result<(Ending, Option<String>), AttemptError> {
        let (parts, mut body) = self.open(req, outbound).await?;
        let sdk = accepted_head(&parts, req)?;
        sink.answered().await;
        let mut decoder = FrameDecoder::new(req.message_size_limit);
        let mut ending = None;
        // One timer for the whole attempt: a message only moves the deadline, and the timer
        // is re-armed when it fires before it.
        let mut deadline = tokio::time::Instant::now();
        let timer = tokio::time::sleep_until(deadline);
        tokio::pin!(timer);
        let mut waiting = None;
        loop {
            deliver_frames(&mut decoder, &mut ending, req.protocol, sink).await?;
            // Bidi: the response only closes after the request does. Close it and report the
            // ending now; the rest of the stream is read off the invocation's path.
            if ending.is_some() && body.request_open() {
                body.close_request();
                tokio::spawn(drain_tail(body, req.abort_timeout, req.invocation_id));
                return Ok((ending.take().expect("checked"), sdk));
            }
            // While the request body is open, silence means "idle": close it so the SDK
            // suspends. Once it is closed, silence means the deployment is stuck (RT0001).
            let wait = if body.request_open() {
                req.inactivity_timeout
            } else {
                req.abort_timeout
            };
            if waiting != Some(wait) {
                waiting = Some(wait);
                deadline = tokio::time::Instant::now() + wait;
            }
            let next = std::future::poll_fn(|cx| {
                if let Poll::Ready(next) = body.poll_data(cx) {
                    return Poll::Ready(Some(next));
                }
                while timer.as_mut().poll(cx).is_ready() {
                    if timer.deadline() >= deadline {
                        return Poll::Ready(None);
                    }
                    timer.as_mut().reset(deadline);
                }
                Poll::Pending
            })
            .await;
            let Some(next) = next else {
                if body.request_open() {
                    body.close_request();
                    waiting = None;
                    continue;
                }
                return Err(err(
                    Code::RT0001,
                    format!(
                        "no message from the deployment within the abort timeout ({:?})",
                        req.abort_timeout
                    ),
                ));
            };
            match next {
                Some(Ok(data)) => {
                    deadline = tokio::time::Instant::now() + wait;
                    decoder.push(&data);
                }
                Some(Err(e)) => {
                    return Err(err(Code::RT0010, format!("the response stream broke: {e}")));
                }
                None => break,
            }
        }
        if decoder.buffered() > 0 {
            return Err(err(
                Code::RT0012,
                format!(
                    "the stream ended inside a message ({} bytes left)",
                    decoder.buffered()
                ),
            ));
        }
        let ending = ending.ok_or_else(|| {
            err(
                Code::RT0012,
                "the deployment closed the stream without End, Suspension or Error".to_owned(),
            )
        })?;
        Ok((ending, sdk))
    }
    /// Sends the attempt's request (over HTTP/1.1 or HTTP/2, as its deployment takes it) and
    /// waits, at most the abort timeout, for the response's head.
    async fn open(
        &self,
        req: &AttemptRequest,
        outbound: Option<mpsc::UnboundedReceiver<Bytes>>,
    ) -> Result<(http::response::Parts, Incoming), AttemptError> {
        let address = self.addresses.get(&req.uri).ok_or_else(|| {
            err(
                Code::RT0011,
                format!("the deployment's uri '{}' is no http(s) URI", req.uri),
            )
        })?;
        let opening = async {
            if req.use_http_11 {
                self.open_h1(req, &address).await
            } else {
                self.open_h2(req, &address, outbound).await
            }
        };
        tokio::time::timeout(req.abort_timeout, opening)
            .await
            .map_err(|_| {
                err(
                    Code::RT0001,
                    format!(
                        "no answer from the deployment within the abort timeout ({:?})",
                        req.abort_timeout
                    ),
                )
            })?
    }

    /// Sends the request over HTTP/1.1 (hyper's pool) and waits for the response's head.
    async fn open_h1(
        &self,
        req: &AttemptRequest,
        address: &Address,
    ) -> Result<(http::response::Parts, Incoming), AttemptError> {
        let request = head(req, address, Version::HTTP_11)?.map(|()| Full::new(replay_joined(req)));
        let response = self.h1.request(request).await.map_err(|e| AttemptError {
            unreachable: e.is_connect(),
            ..transport_error(req, &e)
        })?;
        let (parts, body) = response.into_parts();
        Ok((parts, Incoming::H1(body)))
    }

    /// Opens a stream on the address's HTTP/2 connection, sends the replay (and, bidi, keeps
    /// the body open) and waits for the response's head. A stream the deployment refused
    /// before reading it (`REFUSED_STREAM`, or a connection going away past it) is sent once
    /// more on a fresh stream, as long as nothing but the replay went down it.
    async fn open_h2(
        &self,
        req: &AttemptRequest,
        address: &Address,
        mut outbound: Option<mpsc::UnboundedReceiver<Bytes>>,
    ) -> Result<(http::response::Parts, Incoming), AttemptError> {
        let replay = replay(req);
        let mut tries = 0;
        loop {
            tries += 1;
            let mut sender =
                address
                    .ready(&self.h2, self.idle)
                    .await
                    .map_err(|e| AttemptError {
                        unreachable: matches!(e, OpenError::Connect(_)),
                        ..transport_error(req, &e)
                    })?;
            let head = head(req, address, Version::HTTP_2)?;
            let bidi = outbound.is_some();
            let (mut response, mut stream) = sender
                .send_request(head, false)
                .map_err(|e| transport_error(req, &e))?;
            let last = replay.len() - 1;
            for (i, piece) in replay.iter().enumerate() {
                stream
                    .send_data(piece.clone(), i == last && !bidi)
                    .map_err(|e| transport_error(req, &e))?;
            }
            let mut sending = Sending {
                stream: bidi.then_some(stream),
                outbound: outbound.take(),
                forwarded: false,
            };
            let answer = std::future::poll_fn(|cx| {
                sending.pump(cx);
                Pin::new(&mut response).poll(cx)
            })
            .await;
            match answer {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    return Ok((parts, Incoming::H2(body, sending)));
                }
                Err(e) if tries == 1 && !sending.forwarded && refused(&e) => {
                    outbound = sending.outbound.take();
                }
                Err(e) => return Err(transport_error(req, &e)),
            }
        }
    }
}

/// Checks the head of a deployment's answer: a success, in the protocol's content type; the
/// SDK it names (`x-restate-server`). A refusal carries the deployment's `Retry-After`.
fn accepted_head(
    parts: &http::response::Parts,
    req: &AttemptRequest,
) -> Result<Option<String>, AttemptError> {
    let status = parts.status;
    let retry_after = parts
        .headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    if !status.is_success() {
        return Err(status_error(status, retry_after));
    }
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if content_type != req.protocol.content_type() {
        return Err(err(
            Code::RT0012,
            format!(
                "the deployment answered content type '{content_type}', expected '{}'",
                req.protocol.content_type()
            ),
        ));
    }
    Ok(parts
        .headers
        .get("x-restate-server")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned))
}

/// Hands the whole messages `decoder` holds to `sink`, up to the one that ends the attempt
/// (End, Suspension, Error), kept in `ending`; a message after it, or one only the runtime
/// sends, is a protocol violation.
async fn deliver_frames(
    decoder: &mut FrameDecoder,
    ending: &mut Option<Ending>,
    protocol: ProtocolVersion,
    sink: &mut impl MessageSink,
) -> Result<(), AttemptError> {
    while let Some(frame) = decoder.next_frame()? {
        if ending.is_some() {
            return Err(err(
                Code::RT0012,
                format!("message {:#06x} after the end of the stream", frame.ty),
            ));
        }
        let message = Message::decode(&frame, protocol)?;
        if let Some(ty) = MessageType::from_id(frame.ty)
            && (ty.sender() == Sender::Runtime || ty.kind() == Kind::Notification)
        {
            return Err(err(
                Code::RT0012,
                format!(
                    "received unexpected message {} from the deployment",
                    ty.name()
                ),
            ));
        }
        match message {
            Message::End(_) => *ending = Some(Ending::End),
            Message::Suspension(_) | Message::SuspensionV6(_) => {
                *ending = Some(Ending::Suspended(message));
            }
            Message::Error(e) => *ending = Some(Ending::Failed(e)),
            other => sink.deliver(other, frame.ack).await,
        }
    }
    Ok(())
}

/// Whether the deployment turned the stream away before processing it.
fn refused(e: &h2::Error) -> bool {
    e.reason() == Some(h2::Reason::REFUSED_STREAM) || (e.is_go_away() && e.is_remote())
}

/// A failure of the connection or the stream under an attempt (RT0010). It only says the
/// deployment is down when no connection could be made; the callers that know set
/// `unreachable`.
fn transport_error(req: &AttemptRequest, e: &dyn std::fmt::Display) -> AttemptError {
    err(
        Code::RT0010,
        format!("cannot reach the deployment at {}: {e}", req.uri),
    )
}

#[cfg(test)]
mod tests;
