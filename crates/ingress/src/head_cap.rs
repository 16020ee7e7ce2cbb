//! A bound on an HTTP/1.1 request's head (request line and headers): pingora's parser takes up
//! to 1 MiB of it, a fixed constant, so the ingress counts the bytes itself.
//!
//! [`HeadCapped`] wraps a connection's stream. While a request's head is being read, the
//! connection arms its [`HeadBudget`]; the parser reads again only while the head it holds is
//! incomplete, so every byte read before that next read belongs to the head. A read asked for
//! once `ingress.connections.max-header-bytes` of head bytes are in fails, and the connection
//! answers 431 `ING0011` and closes. HTTP/2 carries the same bound as its
//! `SETTINGS_MAX_HEADER_LIST_SIZE`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{
    ALPN, GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    Stream, TimingDigest, UniqueID, UniqueIDType,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a connection's current request head has read, and whether a head is being read.
#[derive(Debug)]
pub(crate) struct HeadBudget {
    /// Most head bytes (`ingress.connections.max-header-bytes`).
    max: usize,
    /// A head is being read: reads count.
    armed: AtomicBool,
    /// Bytes read since it was armed.
    read: AtomicUsize,
    /// A read was refused for a head over `max`.
    tripped: AtomicBool,
}

impl HeadBudget {
    /// A budget of `max` head bytes, not armed.
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            armed: AtomicBool::new(false),
            read: AtomicUsize::new(0),
            tripped: AtomicBool::new(false),
        })
    }

    /// A request's head is read from now on: its reads count from 0. Bytes a previous request
    /// left buffered are parsed without a read, so they count only when the head needs more.
    pub(crate) fn arm(&self) {
        self.read.store(0, Ordering::Relaxed);
        self.armed.store(true, Ordering::Relaxed);
    }

    /// The head is read (or the connection is done with it): reads no longer count.
    pub(crate) fn disarm(&self) {
        self.armed.store(false, Ordering::Relaxed);
    }

    /// Whether a head went over the bound (the read error came from here).
    pub(crate) fn tripped(&self) -> bool {
        self.tripped.load(Ordering::Relaxed)
    }

    /// The bound, for the answer.
    pub(crate) fn max(&self) -> usize {
        self.max
    }
}

/// A connection's stream whose reads are held to its [`HeadBudget`] while a head is read.
#[derive(Debug)]
pub(crate) struct HeadCapped {
    inner: Stream,
    budget: Arc<HeadBudget>,
}

impl HeadCapped {
    /// `inner`, its head reads held to `budget`.
    pub(crate) fn wrap(inner: Stream, budget: Arc<HeadBudget>) -> Stream {
        Box::new(Self { inner, budget })
    }
}

impl AsyncRead for HeadCapped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let armed = self.budget.armed.load(Ordering::Relaxed);
        if armed && self.budget.read.load(Ordering::Relaxed) >= self.budget.max {
            // The parser asks for more while it holds `max` bytes of an incomplete head.
            self.budget.tripped.store(true, Ordering::Relaxed);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "request head over {} bytes (ingress.connections.max-header-bytes)",
                    self.budget.max
                ),
            )));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if armed && let Poll::Ready(Ok(())) = polled {
            let n = buf.filled().len() - before;
            self.budget.read.fetch_add(n, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for HeadCapped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for HeadCapped {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await;
    }
}

impl UniqueID for HeadCapped {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for HeadCapped {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for HeadCapped {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> std::time::Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> std::time::Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for HeadCapped {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for HeadCapped {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for HeadCapped {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}
