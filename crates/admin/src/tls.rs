//! TLS for the admin listener: a certificate chain and its key from PEM files, offering HTTP/2
//! and HTTP/1.1 by ALPN, read again on SIGHUP and when either file changes
//! (`sluice_listeners::certificates`). An admin port reached from other machines carries tokens, which
//! must not cross the network in clear.

use sluice_config::AdminConfig;
use sluice_core::errors::CodedError;
pub use sluice_listeners::certificates::ListenerTls;

/// The TLS `config` asks for: `None` when it names no certificate.
pub fn acceptor(config: &AdminConfig) -> Result<Option<ListenerTls>, CodedError> {
    ListenerTls::from_files(
        "admin",
        config.tls_cert_file.as_deref(),
        config.tls_key_file.as_deref(),
    )
}
