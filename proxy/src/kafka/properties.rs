//! Which librdkafka settings a cluster may carry, and which of them are secrets. librdkafka has
//! settings that load libraries (`plugin.library.paths`), run commands (`sasl.kerberos.kinit.cmd`)
//! or read files; a request to the admin API must not reach them, so only client settings on
//! this list are accepted. Secrets are kept, but never shown.

use std::collections::BTreeMap;

use crate::errors::{Code, CodedError};

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

/// Checks every key of `properties` against [`ALLOWED`] (SEC0007 names the first that is not).
pub fn check(properties: &BTreeMap<String, String>) -> Result<(), CodedError> {
    match properties.keys().find(|k| !ALLOWED.contains(&k.as_str())) {
        None => Ok(()),
        Some(key) => Err(CodedError::new(
            Code::SEC0007,
            format!(
                "Kafka property '{key}' is not allowed: only client settings (bootstrap, security, SASL, SSL as PEM, timeouts, fetch sizes) may be set; see docs/security.md for the list"
            ),
        )),
    }
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
            ("sasl.password", "hunter2"),
            ("ssl.key.pem", "KEY"),
        ]);
        check(&ok).unwrap();
        let shown = redacted(&ok);
        assert_eq!(shown["sasl.password"], REDACTED);
        assert_eq!(shown["ssl.key.pem"], REDACTED);
        assert_eq!(shown["bootstrap.servers"], "b:9092");
    }
}
