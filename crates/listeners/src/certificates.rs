//! A listener's TLS certificate, read from its PEM files (`<listener>.tls-cert-file`,
//! `<listener>.tls-key-file`) and read again on SIGHUP and when either file changes: a new one
//! serves new handshakes at once, connections already open keep theirs, and a pair that does
//! not load leaves the previous certificate in place (logged). The ingress and the admin
//! listener each hold one.
//!
//! Every process listens for SIGHUP ([`hangups`]), with or without a certificate, so the signal
//! an operator sends to reload one never stops a server that has none.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject as _;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

use sluice_config::{file_error, pem_certificates};
use sluice_core::errors::{Code, CodedError};

/// How often the certificate files are looked at for a change.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// A listener's TLS: the acceptor its handshakes go through, and the certificate they get (to
/// watch).
#[derive(Clone)]
pub struct ListenerTls {
    /// Accepts handshakes with the current certificate.
    pub acceptor: TlsAcceptor,
    /// The certificate, read again on SIGHUP and when its files change.
    pub certificate: Arc<Certificate>,
}

impl ListenerTls {
    /// The TLS `listener` configures with its two files: `None` when it names neither; RT0002
    /// when only one of the two is named or they do not load.
    pub fn from_files(
        listener: &'static str,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<Self>, CodedError> {
        let Some(certificate) = Certificate::from_files(listener, cert, key)? else {
            return Ok(None);
        };
        let server = certificate.server_config()?;
        Ok(Some(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            certificate,
        }))
    }
}

/// The certificate every new handshake of one listener gets, replaced when its files change.
#[derive(Debug)]
pub struct Certificate {
    /// `ingress` or `admin`: names its settings in errors and logs.
    listener: &'static str,
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    stamp: RwLock<[Option<SystemTime>; 2]>,
}

impl Certificate {
    /// The pair `listener` configures: `None` when it names neither file; RT0002 when only one
    /// of the two is named or they do not load.
    pub fn from_files(
        listener: &'static str,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<Arc<Self>>, CodedError> {
        let (cert_path, key_path) = match (cert, key) {
            (None, None) => return Ok(None),
            (Some(cert), Some(key)) => (cert.to_owned(), key.to_owned()),
            _ => {
                return Err(CodedError::new(
                    Code::RT0002,
                    format!(
                        "invalid configuration: `{listener}.tls-cert-file` and `{listener}.tls-key-file` go together: set both, or neither"
                    ),
                ));
            }
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let current = load(listener, &provider, &cert_path, &key_path)?;
        Ok(Some(Arc::new(Self {
            listener,
            stamp: RwLock::new(stamps(&cert_path, &key_path)),
            cert_path,
            key_path,
            provider,
            current: RwLock::new(current),
        })))
    }

    /// A TLS server configuration that serves this certificate, offering HTTP/2 and HTTP/1.1
    /// by ALPN.
    fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, CodedError> {
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| CodedError::new(Code::RT0002, format!("{} TLS: {e}", self.listener)))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(server)
    }

    /// Reads the certificate again on each SIGHUP and when a file changes, until `stop`
    /// fires.
    pub async fn watch(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut hangups = hangups();
        let mut tick = tokio::time::interval(WATCH_EVERY);
        loop {
            tokio::select! {
                Ok(()) = hangups.changed() => self.reload("SIGHUP"),
                _ = tick.tick() => {
                    if self.changed() {
                        self.reload("a changed certificate file");
                    }
                }
                _ = stop.changed() => return,
            }
        }
    }

    /// The certificate new handshakes get now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether either file changed since it was last read.
    pub fn changed(&self) -> bool {
        let now = stamps(&self.cert_path, &self.key_path);
        *self.stamp.read().unwrap_or_else(|e| e.into_inner()) != now
    }

    /// Reads the pair again; a pair that does not load keeps the previous one.
    pub fn reload(&self, why: &str) {
        let stamp = stamps(&self.cert_path, &self.key_path);
        match load(
            self.listener,
            &self.provider,
            &self.cert_path,
            &self.key_path,
        ) {
            Ok(fresh) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                tracing::info!(listener = self.listener, reason = why, cert = %self.cert_path.display(), "TLS certificate reloaded");
            }
            Err(e) => tracing::error!(
                listener = self.listener,
                reason = why,
                error = %e,
                "the TLS certificate did not reload; the previous one is still served"
            ),
        }
        // Either way this version of the files was looked at: a half-written pair is tried
        // again when its second file lands.
        *self.stamp.write().unwrap_or_else(|e| e.into_inner()) = stamp;
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Listens for SIGHUP from now on (it no longer ends the process), whether or not a certificate
/// is configured; called by every listener's start.
pub fn listen_for_hangups() {
    drop(hangups());
}

/// SIGHUPs received, as a count every listener's certificate watches. The process listens from
/// the first call on; a process that cannot listen logs why and reloads on file changes only.
fn hangups() -> tokio::sync::watch::Receiver<u64> {
    static HANGUPS: std::sync::OnceLock<tokio::sync::watch::Sender<u64>> =
        std::sync::OnceLock::new();
    HANGUPS
        .get_or_init(|| {
            let (tx, _) = tokio::sync::watch::channel(0u64);
            let count = tx.clone();
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
                Ok(mut signals) => {
                    tokio::spawn(async move {
                        while signals.recv().await.is_some() {
                            tracing::info!("SIGHUP: reloading TLS certificates, if any");
                            count.send_modify(|n| *n += 1);
                        }
                    });
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "cannot listen for SIGHUP: TLS certificates reload only when their files change"
                ),
            }
            tx
        })
        .subscribe()
}

/// The modification times of the two files.
fn stamps(cert: &Path, key: &Path) -> [Option<SystemTime>; 2] {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    [modified(cert), modified(key)]
}

/// The certificate chain and key in the two files, checked to belong together.
fn load(
    listener: &str,
    provider: &CryptoProvider,
    cert_path: &Path,
    key_path: &Path,
) -> Result<Arc<CertifiedKey>, CodedError> {
    let cert_setting = format!("{listener}.tls-cert-file");
    let key_setting = format!("{listener}.tls-key-file");
    let certs = pem_certificates(&cert_setting, cert_path)?;
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| file_error(&key_setting, key_path, e))?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| file_error(&key_setting, key_path, e))?;
    let certified = CertifiedKey::new(certs, signing);
    certified.keys_match().map_err(|e| {
        file_error(
            &key_setting,
            key_path,
            format!("the key is not the certificate's ({e})"),
        )
    })?;
    Ok(Arc::new(certified))
}

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
        let load = |c: Option<&PathBuf>, k: Option<&PathBuf>| {
            Certificate::from_files("admin", c.map(PathBuf::as_path), k.map(PathBuf::as_path))
        };
        assert!(load(None, None).unwrap().is_none());
        let err = load(Some(&cert), None).unwrap_err();
        assert!(
            err.message
                .contains("`admin.tls-cert-file` and `admin.tls-key-file` go together"),
            "{}",
            err.message
        );
        let err = load(Some(&cert), Some(&other_key)).unwrap_err();
        assert!(
            err.message.contains("not the certificate's"),
            "{}",
            err.message
        );
        let err = load(Some(&cert), Some(&cert)).unwrap_err();
        assert!(
            err.message.contains("admin.tls-key-file"),
            "{}",
            err.message
        );
        assert!(load(Some(&cert), Some(&key)).unwrap().is_some());
    }

    #[test]
    fn a_bad_reload_keeps_the_previous_certificate_and_a_good_one_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pem_pair(dir.path(), "one");
        let served = Certificate::from_files("ingress", Some(&cert), Some(&key))
            .unwrap()
            .unwrap();
        let first = served.current();
        std::fs::write(&cert, "not a certificate").unwrap();
        served.reload("test");
        assert!(
            Arc::ptr_eq(&first, &served.current()),
            "a bad file keeps the old one"
        );
        assert!(!served.changed(), "that version was looked at");
        let (fresh_cert, fresh_key) = pem_pair(dir.path(), "fresh");
        std::fs::copy(&fresh_cert, &cert).unwrap();
        std::fs::copy(&fresh_key, &key).unwrap();
        served.reload("test");
        assert!(!Arc::ptr_eq(&first, &served.current()));
        assert_ne!(first.cert[0], served.current().cert[0]);
    }
}
