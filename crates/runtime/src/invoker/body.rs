//! The bodies of an attempt's exchange: the request body of a bidi HTTP/2 attempt while it is
//! open (what the partition streams into it) and the response body being read, HTTP/1.1 or
//! HTTP/2, with what is left of a bidi response after its end.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Body as _;
use tokio::sync::mpsc;

use sluice_core::ids::InvocationId;

/// The request body of an HTTP/2 attempt while it is open (bidi): what the partition sends on
/// the [`Outbound`] goes down the stream whenever the attempt's task is polled, in the same
/// turn as the frames it reads. The frames are in memory already, so handing them to `h2`
/// without waiting for its send window holds nothing more.
pub(super) struct Sending {
    pub(super) stream: Option<h2::SendStream<Bytes>>,
    pub(super) outbound: Option<mpsc::UnboundedReceiver<Bytes>>,
    /// Whether any frame besides the replay went down (an attempt that sent some cannot be
    /// resent as it was).
    pub(super) forwarded: bool,
}

impl Sending {
    pub(super) fn open(&self) -> bool {
        self.stream.is_some()
    }

    /// Ends the request body. Frames still queued stay behind: they are in the journal and
    /// reach the SDK through the next replay.
    pub(super) fn close(&mut self) {
        if let Some(mut stream) = self.stream.take() {
            let _ = stream.send_data(Bytes::new(), true);
        }
        self.outbound = None;
    }

    pub(super) fn pump(&mut self, cx: &mut Context<'_>) {
        let (Some(stream), Some(outbound)) = (&mut self.stream, &mut self.outbound) else {
            return;
        };
        loop {
            match outbound.poll_recv(cx) {
                Poll::Ready(Some(frame)) => {
                    self.forwarded = true;
                    // A stream the deployment reset fails here and in what the response
                    // reads next: that read reports it.
                    if stream.send_data(frame, false).is_err() {
                        self.stream = None;
                        self.outbound = None;
                        return;
                    }
                }
                // The partition let go of the attempt's body: it ends.
                Poll::Ready(None) => return self.close(),
                Poll::Pending => return,
            }
        }
    }
}

/// A response's body being read.
pub(super) enum Incoming {
    H1(hyper::body::Incoming),
    H2(h2::RecvStream, Sending),
}

impl Incoming {
    pub(super) fn request_open(&self) -> bool {
        matches!(self, Self::H2(_, sending) if sending.open())
    }

    pub(super) fn close_request(&mut self) {
        if let Self::H2(_, sending) = self {
            sending.close();
        }
    }

    /// The next bytes of the body; `None` at its end. Moves the bidi request body along.
    pub(super) fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, String>>> {
        match self {
            Self::H1(body) => loop {
                match std::task::ready!(Pin::new(&mut *body).poll_frame(cx)) {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            return Poll::Ready(Some(Ok(data)));
                        }
                    }
                    Some(Err(e)) => return Poll::Ready(Some(Err(e.to_string()))),
                    None => return Poll::Ready(None),
                }
            },
            Self::H2(body, sending) => {
                sending.pump(cx);
                match std::task::ready!(body.poll_data(cx)) {
                    Some(Ok(data)) => {
                        // The bytes are ours now (the decoder holds at most a message): the
                        // deployment may send more.
                        let _ = body.flow_control().release_capacity(data.len());
                        Poll::Ready(Some(Ok(data)))
                    }
                    Some(Err(e)) => Poll::Ready(Some(Err(e.to_string()))),
                    None => Poll::Ready(None),
                }
            }
        }
    }

    async fn data(&mut self) -> Option<Result<Bytes, String>> {
        std::future::poll_fn(|cx| self.poll_data(cx)).await
    }
}

/// Reads what is left of a bidi response after its terminal message. Anything but the end is
/// a protocol violation; the invocation has moved on, so it is only logged.
pub(super) async fn drain_tail(mut body: Incoming, within: Duration, id: InvocationId) {
    loop {
        match tokio::time::timeout(within, body.data()).await {
            Ok(None) => return,
            Ok(Some(Ok(data))) => {
                if !data.is_empty() {
                    tracing::warn!(invocation = %id, error.code = "RT0012", "the deployment wrote after the end of its stream; ignored");
                    return;
                }
            }
            Ok(Some(Err(_))) | Err(_) => return,
        }
    }
}
