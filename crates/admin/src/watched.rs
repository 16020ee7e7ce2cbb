//! How the admin listener sees whether a client takes its answers: the connection's socket and
//! each answer's body report to the connection's [`Writes`]. An answer counts as waiting for
//! its client from when it is made until hyper asks for its first bytes, from each chunk
//! handed over until hyper asks for the next, and while a write to the socket cannot go on;
//! never while the handler is still producing the body (a long SQL query is not a slow client).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use sluice_listeners::writes::{Writes, Writing};

/// An answer's body, reporting to its connection's writes.
pub(crate) struct WatchedBody<B> {
    body: B,
    writes: Arc<Writes>,
    waiting: Option<Writing>,
}

impl<B> WatchedBody<B> {
    /// `body`, waiting for its client from now.
    pub(crate) fn new(body: B, writes: Arc<Writes>) -> Self {
        let waiting = Some(writes.writing());
        Self {
            body,
            writes,
            waiting,
        }
    }
}

impl<B> Body for WatchedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        // Asked for more: whatever was handed over before has gone on.
        this.writes.moved();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(_))) => {
                if this.waiting.is_none() {
                    this.waiting = Some(this.writes.writing());
                }
            }
            // Producing (its handler's time, not the client's), failed or done.
            Poll::Pending | Poll::Ready(_) => this.waiting = None,
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A connection's socket, reporting its writes' progress.
pub(crate) struct WatchedIo<I> {
    io: I,
    writes: Arc<Writes>,
    /// Set while a write (or, `true`, a flush) cannot go on.
    blocked: Option<(Writing, bool)>,
}

impl<I> WatchedIo<I> {
    pub(crate) fn new(io: I, writes: Arc<Writes>) -> Self {
        Self {
            io,
            writes,
            blocked: None,
        }
    }

    /// Reports a write's poll (`flush` false) or a flush's (`flush` true); `wrote` says
    /// whether it moved bytes. A write that cannot go on blocks until a write goes on: a
    /// flush is ready at once on a TCP socket whatever waits (hyper flushes on every turn),
    /// so only a flush that itself blocked (TLS's buffered bytes) is released by a ready one.
    fn report<T>(
        &mut self,
        polled: Poll<std::io::Result<T>>,
        flush: bool,
        wrote: impl FnOnce(&T) -> bool,
    ) -> Poll<std::io::Result<T>> {
        match &polled {
            Poll::Pending => {
                if self.blocked.is_none() {
                    self.blocked = Some((self.writes.writing(), flush));
                }
            }
            Poll::Ready(done) => {
                let released = match &self.blocked {
                    Some((_, by_flush)) => flush == *by_flush,
                    None => false,
                };
                if released {
                    self.blocked = None;
                }
                if released || matches!(done, Ok(done) if wrote(done)) {
                    self.writes.moved();
                }
            }
        }
        polled
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WatchedIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WatchedIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.report(polled, false, |n| *n > 0)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.report(polled, false, |n| *n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.report(polled, true, |()| false)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
