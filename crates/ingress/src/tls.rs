//! TLS on the ingress listener (`ingress.tls-cert-file`, `ingress.tls-key-file`): rustls in
//! front of pingora's HTTP server, HTTP/2 or HTTP/1.1 by ALPN. The handshake runs inside the
//! connection guard, so it counts against the connection caps and is bounded by the
//! header-read timeout like a request's headers (pingora's own listener would give it a
//! minute). The certificate is read again on SIGHUP and when either file changes
//! (`sluice_listeners::certificates`).

use std::sync::Arc;

use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{ALPN, Peek, Shutdown, Ssl, Stream, UniqueID, UniqueIDType};
use pingora::protocols::{GetProxyDigest, GetSocketDigest, GetTimingDigest};
use pingora::protocols::{SocketDigest, TimingDigest};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use sluice_config::IngressConfig;
use sluice_core::errors::CodedError;
use sluice_listeners::certificates::ListenerTls;

/// The ingress's TLS acceptor and the certificate it serves.
pub struct IngressTls {
    tls: ListenerTls,
}

impl std::fmt::Debug for IngressTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngressTls")
            .field("cert", &self.tls.certificate)
            .finish_non_exhaustive()
    }
}

impl IngressTls {
    /// The acceptor `config` asks for: `None` when it names no certificate; RT0002 when only
    /// one of the two files is named or they do not load.
    pub fn from_config(config: &IngressConfig) -> Result<Option<Arc<Self>>, CodedError> {
        let tls = ListenerTls::from_files(
            "ingress",
            config.tls_cert_file.as_deref(),
            config.tls_key_file.as_deref(),
        )?;
        Ok(tls.map(|tls| Arc::new(Self { tls })))
    }

    /// Runs the handshake on `stream`: the TLS stream and whether the client chose HTTP/2;
    /// `None` when the handshake fails (the connection is then dropped).
    pub async fn accept(&self, stream: Stream) -> Option<(Stream, bool)> {
        let id = stream.id();
        match self.tls.acceptor.accept(stream).await {
            Ok(tls) => {
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
                let stream: Stream = Box::new(TlsIo { inner: tls, id, h2 });
                Some((stream, h2))
            }
            Err(e) => {
                tracing::debug!(error = %e, "ingress TLS handshake failed");
                None
            }
        }
    }

    /// Reads the certificate again on SIGHUP and when a file changes, until `stop` fires.
    pub async fn watch(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        Arc::clone(&self.tls.certificate).watch(stop).await;
    }
}

/// A TLS connection as pingora's HTTP server takes it.
struct TlsIo {
    inner: tokio_rustls::server::TlsStream<Stream>,
    id: UniqueIDType,
    h2: bool,
}

impl std::fmt::Debug for TlsIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIo")
            .field("id", &self.id)
            .field("h2", &self.h2)
            .finish_non_exhaustive()
    }
}

impl AsyncRead for TlsIo {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsIo {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for TlsIo {
    async fn shutdown(&mut self) {
        // The peer may be gone already; closing is best effort, as for a plain socket.
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut self.inner).await;
    }
}

impl UniqueID for TlsIo {
    fn id(&self) -> UniqueIDType {
        self.id
    }
}

impl Ssl for TlsIo {
    fn selected_alpn_proto(&self) -> Option<ALPN> {
        Some(if self.h2 { ALPN::H2 } else { ALPN::H1 })
    }
}

impl GetTimingDigest for TlsIo {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_ref().0.get_timing_digest()
    }
}

impl GetProxyDigest for TlsIo {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_ref().0.get_proxy_digest()
    }
}

impl GetSocketDigest for TlsIo {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_ref().0.get_socket_digest()
    }
}

#[async_trait]
impl Peek for TlsIo {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_files_no_tls_and_one_file_alone_is_refused() {
        let mut config = IngressConfig::default();
        assert!(IngressTls::from_config(&config).unwrap().is_none());
        config.tls_cert_file = Some("cert.pem".into());
        let err = IngressTls::from_config(&config).unwrap_err();
        assert!(
            err.message
                .contains("`ingress.tls-cert-file` and `ingress.tls-key-file` go together"),
            "{}",
            err.message
        );
    }
}
