//! TLS for the admin listener: a certificate chain and its key from PEM files, offering HTTP/2
//! and HTTP/1.1 by ALPN, read again on SIGHUP and when either file changes
//! (`crate::certificates`). An admin port reached from other machines carries tokens, which
//! must not cross the network in clear.

use std::sync::Arc;

use tokio_rustls::TlsAcceptor;

use crate::certificates::Certificate;
use crate::config::AdminConfig;
use crate::errors::CodedError;

/// The admin listener's TLS: the acceptor and the certificate it serves (to watch).
#[derive(Clone)]
pub struct AdminTls {
    /// Accepts handshakes with the current certificate.
    pub acceptor: TlsAcceptor,
    /// The certificate, read again on SIGHUP and when its files change.
    pub certificate: Arc<Certificate>,
}

/// The TLS `config` asks for: `None` when it names no certificate.
pub fn acceptor(config: &AdminConfig) -> Result<Option<AdminTls>, CodedError> {
    let Some(certificate) = Certificate::from_files(
        "admin",
        config.tls_cert_file.as_deref(),
        config.tls_key_file.as_deref(),
    )?
    else {
        return Ok(None);
    };
    let server = certificate.server_config()?;
    Ok(Some(AdminTls {
        acceptor: TlsAcceptor::from(Arc::new(server)),
        certificate,
    }))
}
