//! Which librdkafka settings a cluster may carry, and which of them are secrets. librdkafka has
//! settings that load libraries (`plugin.library.paths`), run commands (`sasl.kerberos.kinit.cmd`)
//! or read files; a request to the admin API must not reach them, so only client settings on
//! this list are accepted. Secrets are kept, but never shown.

use std::collections::BTreeMap;

use sluice_core::errors::{Code, CodedError};

/// Settings a cluster may set.
pub const ALLOWED: &[&str] = &[
    "allow.auto.create.topics",
    "api.version.request",
    "bootstrap.servers",
    "broker.address.family",
    "client.id",
    "client.rack",
    "enable.ssl.certificate.verification",
    "fetch.max.bytes",
    "fetch.message.max.bytes",
    "fetch.min.bytes",
    "fetch.wait.max.ms",
    "heartbeat.interval.ms",
    "isolation.level",
    "max.partition.fetch.bytes",
    "max.poll.interval.ms",
    "message.max.bytes",
    "metadata.max.age.ms",
    "partition.assignment.strategy",
    "queued.max.messages.kbytes",
    "queued.min.messages",
    "receive.message.max.bytes",
    "reconnect.backoff.max.ms",
    "reconnect.backoff.ms",
    "retry.backoff.ms",
    "sasl.kerberos.principal",
    "sasl.kerberos.service.name",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.password",
    "sasl.username",
    "security.protocol",
    "session.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "socket.keepalive.enable",
    "socket.timeout.ms",
    "ssl.ca.pem",
    "ssl.certificate.pem",
    "ssl.cipher.suites",
    "ssl.curves.list",
    "ssl.endpoint.identification.algorithm",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.sigalgs.list",
    "topic.metadata.refresh.interval.ms",
];

/// What a secret's value is shown as.
pub const REDACTED: &str = "<redacted>";

/// Whether `key` holds a secret.
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password")
        || key.contains("secret")
        || key.starts_with("ssl.key.")
        || key == "sasl.jaas.config"
        || key == "sasl.oauthbearer.config"
}

/// Checks every key of `properties` against [`ALLOWED`] (SEC0007 names the first that is not),
/// and refuses what this build's librdkafka cannot honour: it is built without OpenSSL, so TLS
/// (`security.protocol` ssl or sasl_ssl, any `ssl.*` setting) and SCRAM would be accepted here
/// and fail only in the consumer.
pub fn check(properties: &BTreeMap<String, String>) -> Result<(), CodedError> {
    if let Some(key) = properties.keys().find(|k| !ALLOWED.contains(&k.as_str())) {
        return Err(CodedError::new(
            Code::SEC0007,
            format!(
                "Kafka property '{key}' is not allowed: only client settings (bootstrap, security, SASL, SSL as PEM, timeouts, fetch sizes) may be set; see docs/security.md for the list"
            ),
        ));
    }
    let no_tls = |what: String| {
        Err(CodedError::new(
            Code::SEC0007,
            format!(
                "{what}: this build of Sluice has no TLS for Kafka (librdkafka without OpenSSL); use security.protocol plaintext or sasl_plaintext with PLAIN, or reach the brokers through a TLS-terminating proxy"
            ),
        ))
    };
    if let Some(protocol) = properties.get("security.protocol")
        && protocol.to_ascii_lowercase().ends_with("ssl")
    {
        return no_tls(format!("security.protocol '{protocol}'"));
    }
    if let Some(key) = properties.keys().find(|k| k.starts_with("ssl.")) {
        return no_tls(format!("Kafka property '{key}'"));
    }
    for key in ["sasl.mechanism", "sasl.mechanisms"] {
        if let Some(mechanism) = properties.get(key)
            && mechanism.to_ascii_uppercase().starts_with("SCRAM")
        {
            return no_tls(format!("{key} '{mechanism}' (SCRAM needs OpenSSL)"));
        }
    }
    Ok(())
}

/// `properties` with every secret's value replaced by [`REDACTED`].
pub fn redacted(properties: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    properties
        .iter()
        .map(|(k, v)| {
            let shown = if is_secret(k) {
                REDACTED.to_owned()
            } else {
                v.clone()
            };
            (k.clone(), shown)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_loading_settings_are_refused_and_secrets_hidden() {
        let props = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        for bad in [
            "plugin.library.paths",
            "sasl.kerberos.kinit.cmd",
            "ssl.key.location",
            "sasl.jaas.config",
        ] {
            let err = check(&props(&[("bootstrap.servers", "b:9092"), (bad, "x")])).unwrap_err();
            assert_eq!(err.code, Some(Code::SEC0007));
            assert!(err.message.contains(bad), "{}", err.message);
        }
        let ok = props(&[
            ("bootstrap.servers", "b:9092"),
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.password", "hunter2"),
        ]);
        check(&ok).unwrap();
        let shown = redacted(&ok);
        assert_eq!(shown["sasl.password"], REDACTED);
        assert_eq!(shown["bootstrap.servers"], "b:9092");
        assert_eq!(
            redacted(&props(&[("ssl.key.pem", "KEY")]))["ssl.key.pem"],
            REDACTED
        );
    }

    #[test]
    fn what_this_build_cannot_honour_is_refused_at_once() {
        let props = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        for refused in [
            props(&[("security.protocol", "SSL")]),
            props(&[("security.protocol", "sasl_ssl")]),
            props(&[("ssl.ca.pem", "CA")]),
            props(&[("sasl.mechanism", "SCRAM-SHA-512")]),
        ] {
            let err = check(&refused).unwrap_err();
            assert_eq!(err.code, Some(Code::SEC0007));
            assert!(err.message.contains("no TLS"), "{}", err.message);
        }
    }
}
