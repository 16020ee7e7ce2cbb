//! TCP_QUICKACK on connections to deployments. A deployment served with Nagle's algorithm on
//! (the SDKs' own servers leave it on) holds a small frame back while an earlier one is
//! unacknowledged; Linux delays that ACK by up to 40 ms, so two calls sharing a connection took
//! 40 ms each. Acknowledging at once, after every read, takes the deployment's socket options
//! out of the latency. Linux clears the flag as it pleases, hence the re-arm after each read.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// [`HttpConnector`] whose connections acknowledge what they read at once.
#[derive(Debug, Clone)]
pub struct QuickAckConnector {
    inner: HttpConnector,
}

impl QuickAckConnector {
    /// Connects through `inner`.
    pub fn new(inner: HttpConnector) -> Self {
        Self { inner }
    }
}

type Connecting = Pin<
    Box<dyn Future<Output = Result<QuickAck, Box<dyn std::error::Error + Send + Sync>>> + Send>,
>;

impl tower::Service<Uri> for QuickAckConnector {
    type Response = QuickAck;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            let stream = connecting.await?;
            arm(&stream);
            Ok(QuickAck { stream })
        })
    }
}

/// A TCP connection that re-arms TCP_QUICKACK after every read.
#[derive(Debug)]
pub struct QuickAck {
    stream: TokioIo<TcpStream>,
}

fn arm(stream: &TokioIo<TcpStream>) {
    // Best effort: without it the connection works, only slower against a Nagle peer.
    let _ = socket2::SockRef::from(stream.inner()).set_tcp_quickack(true);
}

impl Read for QuickAck {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if read.is_ready() {
            arm(&this.stream);
        }
        read
    }
}

impl Write for QuickAck {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }
}

impl Connection for QuickAck {
    fn connected(&self) -> Connected {
        self.stream.connected()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connects_and_carries_bytes_both_ways() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4];
            socket.read_exact(&mut buf).await.unwrap();
            socket.write_all(&buf).await.unwrap();
        });
        let mut connector = QuickAckConnector::new(HttpConnector::new());
        let uri: Uri = format!("http://{addr}/").parse().unwrap();
        let mut conn = tower::Service::call(&mut connector, uri).await.unwrap();
        let sock = socket2::SockRef::from(conn.stream.inner());
        assert!(sock.tcp_quickack().unwrap());
        let mut io = TokioIo::new(&mut conn);
        io.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        io.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");
        server.await.unwrap();
    }
}
