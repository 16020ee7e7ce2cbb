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
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Request, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Frame as BodyFrame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{mpsc, oneshot};

use crate::deployment_tls::{Connector, DeploymentTls};
use crate::errors::{Code, CodedError};
use crate::flow::{LimitKey, Scope};
use crate::ids::InvocationId;
use crate::protocol::message::{Kind, Sender};
use crate::protocol::{Frame, FrameDecoder, Message, MessageType, ProtocolVersion, proto};

/// Everything one attempt needs.
#[derive(Debug, Clone)]
pub struct AttemptRequest {
    /// The deployment's base URI.
    pub uri: url::Url,
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
    pub fn signal(&self) -> crate::flow::pacing::Signal {
        use crate::flow::pacing::Signal;
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

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Runs attempts; one per process (it pools connections).
#[derive(Debug, Clone)]
pub struct AttemptClient {
    h2: Client<Connector, Body>,
    h1: Client<Connector, Body>,
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

impl Default for AttemptClient {
    fn default() -> Self {
        Self::new(&DeploymentTls::default())
    }
}

impl AttemptClient {
    /// A client reaching `https://` deployments with what `tls` trusts.
    pub fn new(tls: &DeploymentTls) -> Self {
        Self {
            h2: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build(tls.connector(None, true)),
            h1: Client::builder(TokioExecutor::new()).build(tls.connector(None, false)),
        }
    }
}

fn err(code: Code, message: String) -> AttemptError {
    CodedError::new(code, message).into()
}

/// The replay: Start, then the journal as stored.
fn replay(req: &AttemptRequest) -> Bytes {
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
    let mut body = BytesMut::new();
    start.to_frame(false).encode(&mut body);
    for frame in &req.journal {
        frame.encode(&mut body);
    }
    body.freeze()
}

fn invoke_url(req: &AttemptRequest) -> String {
    let mut url = req.uri.clone();
    let base = req.uri.path().trim_end_matches('/');
    url.set_path(&format!("{base}/invoke/{}/{}", req.service, req.handler));
    url.to_string()
}

/// The request body: the replay, then (bidi) whatever arrives on `outbound` until it closes or
/// `close` fires.
fn request_body(
    req: &AttemptRequest,
    outbound: Option<(mpsc::UnboundedReceiver<Bytes>, oneshot::Receiver<()>)>,
) -> Body {
    let replay = replay(req);
    match outbound {
        None => Full::new(replay).boxed_unsync(),
        Some((rx, close)) => Streaming {
            replay: Some(replay),
            rx,
            close,
            done: false,
        }
        .boxed_unsync(),
    }
}

/// A bidi request body.
struct Streaming {
    replay: Option<Bytes>,
    rx: mpsc::UnboundedReceiver<Bytes>,
    close: oneshot::Receiver<()>,
    done: bool,
}

impl hyper::body::Body for Streaming {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if let Some(replay) = this.replay.take() {
            return Poll::Ready(Some(Ok(BodyFrame::data(replay))));
        }
        // Closing (or the attempt going away) ends the body even with frames still queued:
        // they are in the journal and reach the SDK through the next replay.
        if this.done || Pin::new(&mut this.close).poll(cx).is_ready() {
            this.done = true;
            return Poll::Ready(None);
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(bytes)) => Poll::Ready(Some(Ok(BodyFrame::data(bytes)))),
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

fn build(req: &AttemptRequest, body: Body) -> Result<Request<Body>, AttemptError> {
    let content_type = req.protocol.content_type();
    let mut builder = Request::post(invoke_url(req))
        .header(header::CONTENT_TYPE, content_type)
        .header(header::ACCEPT, content_type)
        .header("x-restate-invocation-id", req.invocation_id.to_string());
    if let Some(traceparent) = &req.traceparent {
        builder = builder.header("traceparent", traceparent);
    }
    if let Some(key) = &req.key {
        let encoded: String = url::form_urlencoded::byte_serialize(key.as_bytes()).collect();
        builder = builder.header("x-restate-service-key", encoded);
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
        builder = builder.header(name, value);
    }
    builder
        .body(body)
        .map_err(|e| err(Code::RT0006, format!("cannot build the request: {e}")))
}

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
    /// body stays open (bidi) and carries what is sent on the paired [`Outbound`].
    pub async fn stream(
        &self,
        req: &AttemptRequest,
        outbound: Option<mpsc::UnboundedReceiver<Bytes>>,
        sink: &mut impl MessageSink,
    ) -> Result<(Ending, Option<String>), AttemptError> {
        let (close, closed) = oneshot::channel();
        let mut close = outbound.is_some().then_some(close);
        let request = build(req, request_body(req, outbound.map(|rx| (rx, closed))))?;
        let client = if req.use_http_11 { &self.h1 } else { &self.h2 };
        let response = tokio::time::timeout(req.abort_timeout, client.request(request))
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
            .map_err(|e| AttemptError {
                unreachable: e.is_connect(),
                ..err(
                    Code::RT0010,
                    format!("cannot reach the deployment at {}: {e}", req.uri),
                )
            })?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        if !status.is_success() {
            return Err(status_error(status, retry_after));
        }
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if content_type != req.protocol.content_type() {
            return Err(err(
                Code::RT0012,
                format!(
                    "the deployment answered content type '{content_type}', expected '{}'",
                    req.protocol.content_type()
                ),
            ));
        }
        sink.answered().await;
        let sdk = response
            .headers()
            .get("x-restate-server")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut body = response.into_body();
        let mut decoder = FrameDecoder::new(req.message_size_limit);
        let mut ending = None;
        loop {
            while let Some(frame) = decoder.next_frame()? {
                if ending.is_some() {
                    return Err(err(
                        Code::RT0012,
                        format!("message {:#06x} after the end of the stream", frame.ty),
                    ));
                }
                let message = Message::decode(&frame, req.protocol)?;
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
                    Message::End(_) => ending = Some(Ending::End),
                    Message::Suspension(_) | Message::SuspensionV6(_) => {
                        ending = Some(Ending::Suspended(message))
                    }
                    Message::Error(e) => ending = Some(Ending::Failed(e)),
                    other => sink.deliver(other, frame.ack).await,
                }
            }
            // Bidi: the response only closes after the request does. Close it and report the
            // ending now; the rest of the stream is read off the invocation's path.
            if ending.is_some()
                && let Some(close) = close.take()
            {
                let _ = close.send(());
                tokio::spawn(drain_tail(body, req.abort_timeout, req.invocation_id));
                return Ok((ending.take().expect("checked"), sdk));
            }
            // While the request body is open, silence means "idle": close it so the SDK
            // suspends. Once it is closed, silence means the deployment is stuck (RT0001).
            let wait = if close.is_some() {
                req.inactivity_timeout
            } else {
                req.abort_timeout
            };
            let next = match tokio::time::timeout(wait, body.frame()).await {
                Ok(next) => next,
                Err(_) => match close.take() {
                    Some(close) => {
                        let _ = close.send(());
                        continue;
                    }
                    None => {
                        return Err(err(
                            Code::RT0001,
                            format!(
                                "no message from the deployment within the abort timeout ({:?})",
                                req.abort_timeout
                            ),
                        ));
                    }
                },
            };
            match next {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        decoder.push(&data);
                    }
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
}

/// Reads what is left of a bidi response after its terminal message. Anything but the end is
/// a protocol violation; the invocation has moved on, so it is only logged.
async fn drain_tail(mut body: hyper::body::Incoming, within: Duration, id: InvocationId) {
    loop {
        match tokio::time::timeout(within, body.frame()).await {
            Ok(None) => return,
            Ok(Some(Ok(frame))) => {
                if frame.data_ref().is_some_and(|d| !d.is_empty()) {
                    tracing::warn!(invocation = %id, error.code = "RT0012", "the deployment wrote after the end of its stream; ignored");
                    return;
                }
            }
            Ok(Some(Err(_))) | Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests;
