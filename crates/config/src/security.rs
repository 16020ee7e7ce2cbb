//! Configuration values that guard the listeners: admin tokens and their roles, connection
//! limits, and which addresses discovery may reach.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{ByteSize, FriendlyDuration};

/// Shortest admin token accepted: a guessable token is no authentication.
pub const MIN_TOKEN_LENGTH: usize = 16;

/// What an admin token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AdminRole {
    /// GET routes and `POST /query`.
    Read,
    /// Everything.
    Admin,
}

impl fmt::Display for AdminRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AdminRole::Read => "read",
            AdminRole::Admin => "admin",
        })
    }
}

/// One admin token, written `role:token`. Its text never appears in `Debug` or a dump.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken {
    /// What it may do.
    pub role: AdminRole,
    /// The secret.
    pub token: String,
}

impl fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:<redacted>", self.role)
    }
}

impl FromStr for AuthToken {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let Some((role, token)) = text.split_once(':') else {
            return Err(
                "an admin token is written `role:token` with role `read` or `admin`".to_owned(),
            );
        };
        let role = match role.trim() {
            "read" => AdminRole::Read,
            "admin" => AdminRole::Admin,
            other => {
                return Err(format!(
                    "unknown admin role '{other}': expected `read` or `admin`"
                ));
            }
        };
        if token.len() < MIN_TOKEN_LENGTH {
            return Err(format!(
                "an admin token must be at least {MIN_TOKEN_LENGTH} characters long (a {role} token has {})",
                token.len()
            ));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
            return Err(format!(
                "a {role} token must be visible ASCII without commas or spaces"
            ));
        }
        Ok(Self {
            role,
            token: token.to_owned(),
        })
    }
}

/// The admin tokens: a TOML list of `role:token` strings, or one comma-separated string (how
/// `SERVICE_ADMIN__AUTH_TOKENS` sets them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthTokens(pub Vec<AuthToken>);

impl AuthTokens {
    /// Tokens of `text`: `role:token` items separated by commas or new lines; `#` starts a
    /// comment line (the format of `admin.auth-tokens-file`).
    pub fn parse_list(text: &str) -> Result<Self, String> {
        text.lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .flat_map(|line| line.split(','))
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(str::parse)
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }
}

impl Serialize for AuthTokens {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|t| format!("{}:<redacted>", t.role)))
    }
}

impl<'de> Deserialize<'de> for AuthTokens {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            One(String),
            Many(Vec<String>),
        }
        let text = match Form::deserialize(d)? {
            Form::One(text) => text,
            Form::Many(items) => items.join(","),
        };
        Self::parse_list(&text).map_err(serde::de::Error::custom)
    }
}

/// The secret the nodes of a cluster share (`cluster.secret`): a request one node forwards to
/// another carries it in `x-sluice-forwarded`, and a node honours that header only when it
/// matches, so a client cannot pass as a node. Its text never appears in `Debug` or a dump.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeSecret(String);

impl NodeSecret {
    /// The secret's text, for the header a node sends.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `offered` is the secret, compared in time that does not depend on where they
    /// differ.
    pub fn matches(&self, offered: &[u8]) -> bool {
        let own = self.0.as_bytes();
        own.len() == offered.len()
            && own
                .iter()
                .zip(offered)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

impl fmt::Debug for NodeSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl FromStr for NodeSecret {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.len() < MIN_TOKEN_LENGTH {
            return Err(format!(
                "the cluster secret must be at least {MIN_TOKEN_LENGTH} characters long (it has {})",
                text.len()
            ));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the cluster secret must be visible ASCII without spaces".to_owned());
        }
        Ok(Self(text.to_owned()))
    }
}

impl Serialize for NodeSecret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

impl<'de> Deserialize<'de> for NodeSecret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Which addresses discovery and invocations may reach when a deployment is registered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeploymentAddressPolicy {
    /// Public, private and loopback addresses; never link-local or cloud metadata addresses.
    #[default]
    AllowPrivate,
    /// Public addresses only.
    PublicOnly,
    /// Anything, link-local and metadata addresses included.
    Any,
}

/// Bounds on one listener's connections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ConnectionLimits {
    /// Connections open at once; a connection over it is closed as soon as it is accepted.
    pub max: usize,
    /// Connections open at once from one client address (IPv4-mapped IPv6 counts as its IPv4
    /// address), so one client cannot take every place under `max`; a connection over it is
    /// closed as soon as it is accepted. Unset: a quarter of `max`, whatever `max` is set to
    /// (a lowered `max` lowers it too, so one client cannot fill it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_per_ip: Option<usize>,
    /// Longest a client may take to send a request's headers, counted from the connection's
    /// accept (its first request) or from the first byte of a later request, however the bytes
    /// trickle in.
    pub header_read_timeout: FriendlyDuration,
    /// A connection with no request in flight for this long is closed (HTTP/1.1 keep-alive
    /// and HTTP/2 alike).
    pub idle_timeout: FriendlyDuration,
    /// Requests one HTTP/2 connection carries at once (its `SETTINGS_MAX_CONCURRENT_STREAMS`);
    /// each is held to the header-read timeout between its body's reads.
    pub max_streams: u32,
    /// Longest an answer's write may wait without the client taking a byte (a socket left
    /// unread, an HTTP/2 window held at zero): the connection (HTTP/1.1) or the stream
    /// (HTTP/2) is closed; an HTTP/2 connection on which no answer moved for this long is
    /// closed whole.
    pub write_timeout: FriendlyDuration,
    /// Slowest rate, bytes a second, at which a client may take an answer: writing one of `n`
    /// bytes may take `write-timeout` plus `n` at this rate, however steadily it trickles.
    pub min_send_rate: ByteSize,
    /// Answer bytes one HTTP/2 connection may hold unsent across its streams; a stream whose
    /// answer would go past it is refused (503 ING0010) unless it is the only one. HTTP/1.1
    /// connections hold one answer at a time.
    pub max_unsent_bytes: ByteSize,
    /// At the connection cap, a new connection closes the one whose answer has waited longest
    /// for its client, once it has waited this long, instead of being turned away.
    pub evict_stalled_after: FriendlyDuration,
    /// Most bytes of a request's head: its request line and headers over HTTP/1.1, its header
    /// list over HTTP/2 (`SETTINGS_MAX_HEADER_LIST_SIZE`). Past it: 431 `ING0011` and the
    /// connection closed (HTTP/1.1), the stream reset (HTTP/2).
    pub max_header_bytes: ByteSize,
}

impl ConnectionLimits {
    /// Limits with `max` connections, a quarter of them per client address, and the default
    /// timeouts.
    pub fn with_max(max: usize) -> Self {
        Self {
            max,
            max_per_ip: None,
            header_read_timeout: FriendlyDuration::from_secs(10),
            idle_timeout: FriendlyDuration::from_secs(60),
            max_streams: 100,
            write_timeout: FriendlyDuration::from_secs(10),
            // 128 kbit/s: what a slow mobile link sustains.
            min_send_rate: ByteSize::kib(16),
            max_unsent_bytes: ByteSize::mib(8),
            evict_stalled_after: FriendlyDuration::from_secs(1),
            max_header_bytes: ByteSize::kib(64),
        }
    }
}

impl ConnectionLimits {
    /// Connections one client address may hold: `max-per-ip` if set, else a quarter of `max`;
    /// never more than `max`.
    pub fn per_ip(&self) -> usize {
        self.max_per_ip
            .unwrap_or((self.max / 4).max(1))
            .min(self.max)
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self::with_max(10_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_address_bound_follows_max_unless_set() {
        let lowered: ConnectionLimits = toml::from_str("max = 20").unwrap();
        assert_eq!(lowered.per_ip(), 5);
        let set: ConnectionLimits = toml::from_str("max = 20\nmax-per-ip = 50").unwrap();
        assert_eq!(set.per_ip(), 20, "never more than max");
        let set: ConnectionLimits = toml::from_str("max = 20\nmax-per-ip = 3").unwrap();
        assert_eq!(set.per_ip(), 3);
        assert_eq!(ConnectionLimits::default().per_ip(), 2500);
        assert_eq!(ConnectionLimits::with_max(1).per_ip(), 1);
    }

    #[test]
    fn tokens_parse_from_a_string_or_a_list_and_never_print() {
        let tokens =
            AuthTokens::parse_list("# ops\nadmin:0123456789abcdef0123, read:fedcba9876543210ab\n")
                .unwrap();
        assert_eq!(tokens.0.len(), 2);
        assert_eq!(tokens.0[0].role, AdminRole::Admin);
        assert_eq!(tokens.0[1].token, "fedcba9876543210ab");
        let debug = format!("{tokens:?}");
        assert!(!debug.contains("0123456789"), "{debug}");
        let dumped = toml::to_string(&std::collections::BTreeMap::from([("t", &tokens)])).unwrap();
        assert!(!dumped.contains("0123456789"), "{dumped}");
    }

    #[test]
    fn bad_tokens_say_what_is_wrong() {
        let err = |t: &str| AuthTokens::parse_list(t).unwrap_err();
        assert!(err("0123456789abcdef0123").contains("role:token"));
        assert!(err("root:0123456789abcdef0123").contains("unknown admin role 'root'"));
        assert!(err("admin:short").contains("at least 16"));
        assert!(err("admin:0123456789abcdef 0123").contains("visible ASCII"));
    }
}
