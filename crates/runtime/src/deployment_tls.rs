//! How Sluice reaches deployments over `https://`, for discovery and for invocations alike: rustls
//! with the system's CA roots, plus the CAs of `deployment-ca-file` (a private CA, a self-signed
//! test certificate), offering h2 or HTTP/1.1 by ALPN. `http://` URIs stay plain TCP.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

use crate::quickack::QuickAckConnector;
use sluice_config::{file_error, pem_certificates};
use sluice_core::errors::CodedError;

/// A connector for `http://` and `https://` deployments.
pub type Connector = HttpsConnector<QuickAckConnector>;

/// The TLS settings every connection to a deployment uses. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DeploymentTls {
    config: Arc<rustls::ClientConfig>,
}

impl Default for DeploymentTls {
    /// The system's roots only.
    fn default() -> Self {
        Self::with_roots(system_roots())
    }
}

impl DeploymentTls {
    /// The system's roots and the PEM certificates in `ca_file` (`deployment-ca-file`).
    pub fn load(ca_file: Option<&Path>) -> Result<Self, CodedError> {
        let mut roots = system_roots();
        if let Some(path) = ca_file {
            for cert in pem_certificates("deployment-ca-file", path)? {
                roots
                    .add(cert)
                    .map_err(|e| file_error("deployment-ca-file", path, e))?;
            }
        }
        Ok(Self::with_roots(roots))
    }

    fn with_roots(roots: rustls::RootCertStore) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self {
            config: Arc::new(config),
        }
    }

    /// A connector offering HTTP/2 (`http2`) or HTTP/1.1 over TLS; `connect_timeout` bounds the
    /// TCP connect. Nagle is off: attempts exchange small frames both ways on one connection,
    /// and a frame written while another is unacknowledged would wait for the delayed ACK.
    /// For the same reason Sluice acknowledges what it reads at once ([`QuickAckConnector`]):
    /// the deployment may have Nagle on.
    pub fn connector(&self, connect_timeout: Option<Duration>, http2: bool) -> Connector {
        let mut tcp = HttpConnector::new();
        tcp.set_connect_timeout(connect_timeout);
        tcp.set_nodelay(true);
        tcp.enforce_http(false);
        let tcp = QuickAckConnector::new(tcp);
        let builder = HttpsConnectorBuilder::new()
            .with_tls_config(rustls::ClientConfig::clone(&self.config))
            .https_or_http();
        if http2 {
            builder.enable_http2().wrap_connector(tcp)
        } else {
            builder.enable_http1().wrap_connector(tcp)
        }
    }
}

/// The system's CA certificates; unreadable ones are skipped with a warning (a missing store
/// leaves only `deployment-ca-file`, and `https://` deployments fail to verify otherwise).
fn system_roots() -> rustls::RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::warn!(%error, "cannot read some system CA certificates");
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        tracing::warn!(
            ignored,
            "no system CA certificates found: https deployments verify only against deployment-ca-file"
        );
    }
    roots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_loads_and_bad_files_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, cert.cert.pem()).unwrap();
        DeploymentTls::load(Some(&good)).unwrap();
        DeploymentTls::load(None).unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "nothing here").unwrap();
        let err = DeploymentTls::load(Some(&empty)).unwrap_err();
        assert!(err.message.contains("deployment-ca-file"), "{err}");
        let missing = dir.path().join("missing.pem");
        let err = DeploymentTls::load(Some(&missing)).unwrap_err();
        assert!(err.message.contains("deployment-ca-file"), "{err}");
    }
}
