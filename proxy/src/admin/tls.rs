//! TLS for the admin listener: a certificate chain and its key from PEM files, offering HTTP/2
//! and HTTP/1.1 by ALPN. An admin port reached from other machines carries tokens, which must
//! not cross the network in clear.

use std::sync::Arc;

use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject as _;
use tokio_rustls::TlsAcceptor;

use crate::config::{AdminConfig, file_error, pem_certificates};
use crate::errors::{Code, CodedError};

/// The acceptor `config` asks for: `None` when it names no certificate.
pub fn acceptor(config: &AdminConfig) -> Result<Option<TlsAcceptor>, CodedError> {
    let (cert_path, key_path) = match (&config.tls_cert_file, &config.tls_key_file) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => (cert, key),
        _ => {
            return Err(CodedError::new(
                Code::RT0002,
                "invalid configuration: `admin.tls-cert-file` and `admin.tls-key-file` go together: set both, or neither",
            ));
        }
    };
    let certs = pem_certificates("admin.tls-cert-file", cert_path)?;
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| file_error("admin.tls-key-file", key_path, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| file_error("admin.tls-cert-file", cert_path, e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| file_error("admin.tls-key-file", key_path, e))?;
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Some(TlsAcceptor::from(Arc::new(server))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_load_from_pem_and_bad_files_say_which_key() {
        let dir = tempfile::tempdir().unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let cert_path = dir.path().join("cert.pem");
        let key_path = dir.path().join("key.pem");
        std::fs::write(&cert_path, cert.cert.pem()).unwrap();
        std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
        let mut config = AdminConfig::default();
        assert!(acceptor(&config).unwrap().is_none());
        config.tls_cert_file = Some(cert_path.clone());
        let err = acceptor(&config).err().unwrap();
        assert!(err.message.contains("go together"), "{}", err.message);
        config.tls_key_file = Some(key_path);
        assert!(acceptor(&config).unwrap().is_some());
        config.tls_key_file = Some(cert_path);
        let err = acceptor(&config).err().unwrap();
        assert!(
            err.message.contains("admin.tls-key-file"),
            "{}",
            err.message
        );
    }
}
