//! API keys that bind a caller to a scope (`[[ingress.api-keys]]`). Without them a call's scope
//! and priority are whatever the client names, so any client can fill another tenant's queue or
//! jump one it shares. A key presented in `x-sluice-api-key` fixes the scope its calls run in and
//! the highest priority they may ask for; `ingress.require-api-key` refuses calls without one.
//! Only the keys' SHA-256 digests are configured, and a presented key is compared by digest.

use std::collections::HashMap;

use sha2::{Digest as _, Sha256};

use super::error::IngressError;
use sluice_config::IngressConfig;
use sluice_core::errors::{Code, CodedError};
use sluice_flow::{LimitKey, Priority, Scope};

/// The header a call presents its key in.
pub const HEADER: &str = "x-sluice-api-key";

/// What a key binds its calls to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The scope they run in.
    pub scope: Scope,
    /// The highest priority they may ask for.
    pub max_priority: Priority,
    /// The first level of their limit key, when the key binds one.
    pub limit_key: Option<LimitKey>,
}

impl Binding {
    /// The scope a call runs in: the key's. A path that named another one is refused (SEC0010).
    pub fn scope_for(&self, asked: Option<&str>) -> Result<String, IngressError> {
        match asked {
            Some(asked) if asked != self.scope.as_str() => Err(IngressError::coded(
                Code::SEC0010,
                format!(
                    "this API key runs calls in scope '{}', not '{asked}': leave the scope out of the path or use it",
                    self.scope
                ),
            )),
            _ => Ok(self.scope.as_str().to_owned()),
        }
    }

    /// Refuses invocation `id`, which runs in `scope`, unless that is the key's scope (SEC0010):
    /// a key's holder reads, attaches to and completes its own scope's invocations only. The
    /// refusal does not name the invocation's scope.
    pub fn may_reach(
        &self,
        id: impl std::fmt::Display,
        scope: Option<&str>,
    ) -> Result<(), IngressError> {
        if scope == Some(self.scope.as_str()) {
            return Ok(());
        }
        Err(IngressError::coded(
            Code::SEC0010,
            format!(
                "invocation {id} is not in scope '{}', the only one this API key reaches",
                self.scope
            ),
        ))
    }

    /// The limit key a call runs under: with a bound first level, the one it names under it
    /// (`x` becomes `l1/x`; `l1/x` stays), or the bound level alone; a two-level key under
    /// another first level is refused (SEC0010). Without one, what the call named.
    pub fn limit_key_for(&self, asked: Option<LimitKey>) -> Result<Option<LimitKey>, IngressError> {
        let Some(bound) = &self.limit_key else {
            return Ok(asked);
        };
        let Some(asked) = asked else {
            return Ok(Some(bound.clone()));
        };
        match asked.l2() {
            Some(_) if asked.l1() == bound.l1() => Ok(Some(asked)),
            Some(_) => Err(IngressError::coded(
                Code::SEC0010,
                format!(
                    "this API key runs calls under limit key '{bound}': name a second level only ('x' runs as '{bound}/x')"
                ),
            )),
            None => LimitKey::parse(&format!("{}/{}", bound.l1(), asked.l1()))
                .map(Some)
                .map_err(|e| IngressError::coded(Code::RT0024, e.message)),
        }
    }

    /// Refuses a priority above the key's (SEC0010).
    pub fn check_priority(&self, asked: Option<Priority>) -> Result<(), IngressError> {
        match asked {
            Some(asked) if asked > self.max_priority => Err(IngressError::coded(
                Code::SEC0010,
                format!(
                    "this API key allows priorities up to {}, not {}",
                    self.max_priority.get(),
                    asked.get()
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// The configured keys, by digest.
#[derive(Debug, Default)]
pub struct ApiKeys {
    by_digest: HashMap<[u8; 32], Binding>,
    required: bool,
}

impl ApiKeys {
    /// The keys of `config`; RT0002 names the first entry that is not valid.
    pub fn from_config(config: &IngressConfig) -> Result<Self, CodedError> {
        let mut by_digest = HashMap::new();
        for (i, key) in config.api_keys.iter().enumerate() {
            let invalid = |what: String| {
                CodedError::new(
                    Code::RT0002,
                    format!("invalid configuration: ingress.api-keys[{i}]: {what}"),
                )
            };
            let digest = parse_digest(&key.sha256).ok_or_else(|| {
                invalid("sha256 must be 64 hex digits, the SHA-256 of the key".into())
            })?;
            let scope = Scope::parse(&key.scope).map_err(|e| invalid(e.message))?;
            let max_priority = match &key.max_priority {
                None => Priority::NORMAL,
                Some(text) => text
                    .parse::<Priority>()
                    .map_err(|e| invalid(format!("max-priority: {e}")))?,
            };
            let limit_key = match &key.limit_key {
                None => None,
                Some(text) => {
                    let parsed = LimitKey::parse(text).map_err(|e| invalid(e.message))?;
                    if parsed.l2().is_some() {
                        return Err(invalid(format!(
                            "limit-key '{text}' must be one level: calls name the second"
                        )));
                    }
                    Some(parsed)
                }
            };
            let binding = Binding {
                scope,
                max_priority,
                limit_key,
            };
            if by_digest.insert(digest, binding).is_some() {
                return Err(invalid("the same key is configured twice".into()));
            }
        }
        Ok(Self {
            by_digest,
            required: config.require_api_key,
        })
    }

    /// What the key in `headers` binds the call to: `None` without a key when none is
    /// required. An unknown key is refused whether or not keys are required (SEC0009): a
    /// client that means to present one should learn at once that it is wrong.
    pub fn bind(&self, headers: &http::HeaderMap) -> Result<Option<&Binding>, IngressError> {
        let Some(presented) = headers.get(HEADER) else {
            if self.required {
                return Err(IngressError::coded(
                    Code::SEC0009,
                    format!("this ingress needs an API key: send it in '{HEADER}'"),
                ));
            }
            return Ok(None);
        };
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        match self.by_digest.get(&digest) {
            Some(binding) => Ok(Some(binding)),
            None => Err(IngressError::coded(
                Code::SEC0009,
                format!("the key in '{HEADER}' is not one of this ingress's API keys"),
            )),
        }
    }
}

/// 64 hex digits as 32 bytes.
fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim().as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        let text = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::ApiKey;

    fn sha256_hex(key: &str) -> String {
        Sha256::digest(key.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn keys(required: bool) -> ApiKeys {
        let config = IngressConfig {
            api_keys: vec![
                ApiKey {
                    sha256: sha256_hex("alpha-key"),
                    scope: "alpha".into(),
                    max_priority: None,
                    limit_key: None,
                },
                ApiKey {
                    sha256: sha256_hex("ops-key").to_uppercase(),
                    scope: "ops".into(),
                    max_priority: Some("high".into()),
                    limit_key: Some("ops-team".into()),
                },
            ],
            require_api_key: required,
            ..IngressConfig::default()
        };
        ApiKeys::from_config(&config).unwrap()
    }

    fn with_key(key: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(HEADER, key.parse().unwrap());
        headers
    }

    #[test]
    fn a_key_binds_its_scope_and_highest_priority() {
        let keys = keys(false);
        let alpha = keys.bind(&with_key("alpha-key")).unwrap().unwrap();
        assert_eq!(alpha.scope_for(None).unwrap(), "alpha");
        assert_eq!(alpha.scope_for(Some("alpha")).unwrap(), "alpha");
        let other = alpha.scope_for(Some("beta")).unwrap_err();
        assert_eq!(other.code, Some(Code::SEC0010));
        assert!(alpha.check_priority(Some(Priority::NORMAL)).is_ok());
        assert!(alpha.check_priority(None).is_ok());
        let high = alpha.check_priority(Some(Priority::HIGH)).unwrap_err();
        assert_eq!(high.code, Some(Code::SEC0010));
        let ops = keys.bind(&with_key("ops-key")).unwrap().unwrap();
        assert!(ops.check_priority(Some(Priority::HIGH)).is_ok());
    }

    #[test]
    fn a_key_binding_a_limit_key_holds_every_call_under_its_first_level() {
        let keys = keys(false);
        let key = |k: &str| Some(LimitKey::parse(k).unwrap());
        let shown = |k: Option<LimitKey>| k.map(|k| k.as_str().to_owned());
        let ops = keys.bind(&with_key("ops-key")).unwrap().unwrap();
        assert_eq!(
            shown(ops.limit_key_for(None).unwrap()).as_deref(),
            Some("ops-team")
        );
        assert_eq!(
            shown(ops.limit_key_for(key("fresh-1")).unwrap()).as_deref(),
            Some("ops-team/fresh-1")
        );
        assert_eq!(
            shown(ops.limit_key_for(key("ops-team/x")).unwrap()).as_deref(),
            Some("ops-team/x")
        );
        let other = ops.limit_key_for(key("beta/x")).unwrap_err();
        assert_eq!(other.code, Some(Code::SEC0010));
        // A key without one leaves the call's own.
        let alpha = keys.bind(&with_key("alpha-key")).unwrap().unwrap();
        assert_eq!(
            shown(alpha.limit_key_for(key("a/b")).unwrap()).as_deref(),
            Some("a/b")
        );
        // Two levels in the configuration are refused at start.
        let config = IngressConfig {
            api_keys: vec![ApiKey {
                sha256: sha256_hex("k"),
                scope: "s".into(),
                max_priority: None,
                limit_key: Some("a/b".into()),
            }],
            ..IngressConfig::default()
        };
        let err = ApiKeys::from_config(&config).unwrap_err();
        assert!(err.message.contains("one level"), "{}", err.message);
    }

    #[test]
    fn a_key_reaches_only_invocations_of_its_scope() {
        let keys = keys(false);
        let alpha = keys.bind(&with_key("alpha-key")).unwrap().unwrap();
        assert!(alpha.may_reach("inv_1", Some("alpha")).is_ok());
        for other in [Some("beta"), Some("alph"), None] {
            let refused = alpha.may_reach("inv_1", other).unwrap_err();
            assert_eq!(refused.code, Some(Code::SEC0010));
            assert_eq!(refused.status, http::StatusCode::FORBIDDEN);
            assert!(!refused.message.contains("beta"), "{}", refused.message);
        }
    }

    #[test]
    fn unknown_keys_are_refused_and_missing_ones_only_when_required() {
        let open = keys(false);
        assert_eq!(open.bind(&http::HeaderMap::new()).unwrap(), None);
        let wrong = open.bind(&with_key("guess")).unwrap_err();
        assert_eq!(wrong.code, Some(Code::SEC0009));
        let closed = keys(true);
        let missing = closed.bind(&http::HeaderMap::new()).unwrap_err();
        assert_eq!(missing.code, Some(Code::SEC0009));
        assert_eq!(missing.status, http::StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn bad_entries_are_refused_naming_them() {
        let bad = |key: ApiKey| {
            let config = IngressConfig {
                api_keys: vec![key],
                ..IngressConfig::default()
            };
            ApiKeys::from_config(&config).unwrap_err().message
        };
        let good = || ApiKey {
            sha256: sha256_hex("k"),
            scope: "s".into(),
            max_priority: None,
            limit_key: None,
        };
        assert!(
            bad(ApiKey {
                sha256: "abc".into(),
                ..good()
            })
            .contains("ingress.api-keys[0]: sha256")
        );
        assert!(
            bad(ApiKey {
                scope: "no spaces".into(),
                ..good()
            })
            .contains("ingress.api-keys[0]")
        );
        assert!(
            bad(ApiKey {
                max_priority: Some("urgent".into()),
                ..good()
            })
            .contains("max-priority")
        );
    }
}
