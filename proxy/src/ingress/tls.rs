//! TLS on the ingress listener (`ingress.tls-cert-file`, `ingress.tls-key-file`): rustls in
//! front of pingora's HTTP server, HTTP/2 or HTTP/1.1 by ALPN. The handshake runs inside the
//! connection guard, so it counts against the connection caps and is bounded by the
//! header-read timeout like a request's headers (pingora's own listener would give it a
//! minute). The certificate is read again on SIGHUP and when either file changes; a new one
//! serves new handshakes at once, connections already open keep theirs, and a file that does
//! not load leaves the previous certificate in place (logged).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{ALPN, Peek, Shutdown, Ssl, Stream, UniqueID, UniqueIDType};
use pingora::protocols::{GetProxyDigest, GetSocketDigest, GetTimingDigest};
use pingora::protocols::{SocketDigest, TimingDigest};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject as _;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::TlsAcceptor;

use crate::config::{IngressConfig, file_error, pem_certificates};
use crate::errors::{Code, CodedError};

/// How often the certificate files are looked at for a change.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The ingress's TLS acceptor and the certificate it serves.
pub struct IngressTls {
    acceptor: TlsAcceptor,
    certificate: Arc<Reloading>,
}

impl std::fmt::Debug for IngressTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngressTls")
            .field("cert", &self.certificate.cert_path)
            .finish_non_exhaustive()
    }
}

impl IngressTls {
    /// The acceptor `config` asks for: `None` when it names no certificate; RT0002 when only
    /// one of the two files is named or they do not load.
    pub fn from_config(config: &IngressConfig) -> Result<Option<Arc<Self>>, CodedError> {
        let (cert_path, key_path) = match (&config.tls_cert_file, &config.tls_key_file) {
            (None, None) => return Ok(None),
            (Some(cert), Some(key)) => (cert.clone(), key.clone()),
            _ => {
                return Err(CodedError::new(
                    Code::RT0002,
                    "invalid configuration: `ingress.tls-cert-file` and `ingress.tls-key-file` go together: set both, or neither",
                ));
            }
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let current = load(&provider, &cert_path, &key_path)?;
        let certificate = Arc::new(Reloading {
            stamp: RwLock::new(stamps(&cert_path, &key_path)),
            cert_path,
            key_path,
            provider: Arc::clone(&provider),
            current: RwLock::new(current),
        });
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| CodedError::new(Code::RT0002, format!("ingress TLS: {e}")))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&certificate) as Arc<dyn ResolvesServerCert>);
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Some(Arc::new(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            certificate,
        })))
    }

    /// Runs the handshake on `stream`: the TLS stream and whether the client chose HTTP/2;
    /// `None` when the handshake fails (the connection is then dropped).
    pub async fn accept(&self, stream: Stream) -> Option<(Stream, bool)> {
        let id = stream.id();
        match self.acceptor.accept(stream).await {
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
    pub async fn watch(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => Some(hangups),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP: the ingress certificate reloads only when its files change");
                None
            }
        };
        let mut tick = tokio::time::interval(WATCH_EVERY);
        loop {
            let hangup = async {
                match hangups.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = hangup => self.certificate.reload("SIGHUP"),
                _ = tick.tick() => {
                    if self.certificate.changed() {
                        self.certificate.reload("a changed certificate file");
                    }
                }
                _ = stop.changed() => return,
            }
        }
    }
}

/// The modification times of the two files.
fn stamps(cert: &Path, key: &Path) -> [Option<SystemTime>; 2] {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    [modified(cert), modified(key)]
}

/// The certificate chain and key in the two files, checked to belong together.
fn load(
    provider: &CryptoProvider,
    cert_path: &Path,
    key_path: &Path,
) -> Result<Arc<CertifiedKey>, CodedError> {
    let certs = pem_certificates("ingress.tls-cert-file", cert_path)?;
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| file_error("ingress.tls-key-file", key_path, e))?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| file_error("ingress.tls-key-file", key_path, e))?;
    let certified = CertifiedKey::new(certs, signing);
    certified.keys_match().map_err(|e| {
        file_error(
            "ingress.tls-key-file",
            key_path,
            format!("the key is not the certificate's ({e})"),
        )
    })?;
    Ok(Arc::new(certified))
}

/// The certificate every new handshake gets, replaced when the files change.
#[derive(Debug)]
struct Reloading {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    stamp: RwLock<[Option<SystemTime>; 2]>,
}

impl Reloading {
    fn changed(&self) -> bool {
        let now = stamps(&self.cert_path, &self.key_path);
        *self.stamp.read().unwrap_or_else(|e| e.into_inner()) != now
    }

    fn reload(&self, why: &str) {
        let stamp = stamps(&self.cert_path, &self.key_path);
        match load(&self.provider, &self.cert_path, &self.key_path) {
            Ok(fresh) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                tracing::info!(reason = why, cert = %self.cert_path.display(), "ingress TLS certificate reloaded");
            }
            Err(e) => tracing::error!(
                reason = why,
                error = %e,
                "the ingress TLS certificate did not reload; the previous one is still served"
            ),
        }
        // Either way this version of the files was looked at: a half-written pair is tried
        // again when its second file lands.
        *self.stamp.write().unwrap_or_else(|e| e.into_inner()) = stamp;
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(|e| e.into_inner()),
        ))
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

    fn pem_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        let cert_path = dir.join(format!("{name}.crt"));
        let key_path = dir.join(format!("{name}.key"));
        std::fs::write(&cert_path, cert.cert.pem()).unwrap();
        std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    #[test]
    fn both_files_or_neither_and_the_key_must_be_the_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pem_pair(dir.path(), "one");
        let (_, other_key) = pem_pair(dir.path(), "two");
        let mut config = IngressConfig::default();
        assert!(IngressTls::from_config(&config).unwrap().is_none());
        config.tls_cert_file = Some(cert.clone());
        let err = IngressTls::from_config(&config).unwrap_err();
        assert!(err.message.contains("go together"), "{}", err.message);
        config.tls_key_file = Some(other_key);
        let err = IngressTls::from_config(&config).unwrap_err();
        assert!(
            err.message.contains("not the certificate's"),
            "{}",
            err.message
        );
        config.tls_key_file = Some(cert.clone());
        let err = IngressTls::from_config(&config).unwrap_err();
        assert!(
            err.message.contains("ingress.tls-key-file"),
            "{}",
            err.message
        );
        config.tls_key_file = Some(key);
        assert!(IngressTls::from_config(&config).unwrap().is_some());
    }

    #[test]
    fn a_bad_reload_keeps_the_previous_certificate_and_a_good_one_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pem_pair(dir.path(), "one");
        let config = IngressConfig {
            tls_cert_file: Some(cert.clone()),
            tls_key_file: Some(key.clone()),
            ..IngressConfig::default()
        };
        let tls = IngressTls::from_config(&config).unwrap().unwrap();
        let served = || Arc::clone(&tls.certificate.current.read().unwrap());
        let first = served();
        std::fs::write(&cert, "not a certificate").unwrap();
        tls.certificate.reload("test");
        assert!(
            Arc::ptr_eq(&first, &served()),
            "a bad file keeps the old one"
        );
        assert!(!tls.certificate.changed(), "that version was looked at");
        let (fresh_cert, fresh_key) = pem_pair(dir.path(), "fresh");
        std::fs::copy(&fresh_cert, &cert).unwrap();
        std::fs::copy(&fresh_key, &key).unwrap();
        tls.certificate.reload("test");
        assert!(!Arc::ptr_eq(&first, &served()));
        assert_ne!(first.cert[0], served().cert[0]);
    }
}
