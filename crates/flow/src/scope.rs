//! `Scope` and `LimitKey`: validated names. A scope is 1–36 bytes of `[a-zA-Z0-9_.-]`; a limit
//! key is `l1` or `l1/l2`, each level the same alphabet and length, a trailing `/` ignored.
//! Every rejection is RT0024 and names the value and the rule it broke.

use std::fmt;

use sluice_core::errors::{Code, CodedError};

/// Longest scope or limit-key level, in bytes.
pub const MAX_NAME_LEN: usize = 36;

/// The header naming the scope an invocation runs in: on a Kafka record, on a V6 call or send
/// command (V7 has a field for it), and in a V6 handler's input, which tells it its own.
pub const SCOPE_HEADER: &str = "x-service-scope";

/// The header naming its limit key, likewise (and the ingress's).
pub const LIMIT_KEY_HEADER: &str = "x-service-limit-key";

/// Why a single name (scope or one level of a key) is invalid, without the surrounding context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NameError {
    Empty,
    TooLong(usize),
    BadChar,
}

impl NameError {
    pub(crate) fn rule(&self) -> String {
        match self {
            NameError::Empty => "must not be empty".to_owned(),
            NameError::TooLong(len) => format!("at most {MAX_NAME_LEN} bytes, got {len}"),
            NameError::BadChar => "only [a-zA-Z0-9_.-] allowed".to_owned(),
        }
    }
}

/// Checks one name against the shared alphabet and length.
pub(crate) fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong(name.len()));
    }
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-');
    if !name.bytes().all(allowed) {
        return Err(NameError::BadChar);
    }
    Ok(())
}

/// Most characters of a rejected name an error repeats: a client's 1 MB header is not echoed.
const SHOWN_CHARS: usize = 64;

/// `text`, cut to [`SHOWN_CHARS`] characters with `…` when longer.
fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(SHOWN_CHARS) {
        None => text.into(),
        Some((end, _)) => format!("{}…", &text[..end]).into(),
    }
}

/// A tenant-like namespace: part of an invocation's identity and the key of its flow-control state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(Box<str>);

impl Scope {
    /// Validates `text` as a scope.
    pub fn parse(text: &str) -> Result<Self, CodedError> {
        check_name(text).map_err(|e| {
            CodedError::new(
                Code::RT0024,
                format!("invalid scope '{}': {}", shown(text), e.rule()),
            )
        })?;
        Ok(Self(text.into()))
    }

    /// The scope as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Scope {
    type Err = CodedError;

    fn from_str(text: &str) -> Result<Self, CodedError> {
        Self::parse(text)
    }
}

// Stored and shown as its text; reading one back validates it again.
sluice_core::serde_via_str!(Scope);

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `l1` or `l1/l2`: which counters under its scope an invocation touches. Not part of identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitKey {
    text: Box<str>,
    /// Byte offset of the `/` between the levels, if there are two.
    split: Option<u8>,
}

impl LimitKey {
    /// Validates `text` as a limit key (`l1` or `l1/l2`; one trailing `/` is ignored).
    pub fn parse(text: &str) -> Result<Self, CodedError> {
        let bad = |rule: String| {
            CodedError::new(
                Code::RT0024,
                format!("invalid limit key '{}': {rule}", shown(text)),
            )
        };
        let trimmed = text.strip_suffix('/').unwrap_or(text);
        if trimmed.is_empty() {
            return Err(bad("must not be empty (use l1 or l1/l2)".to_owned()));
        }
        let mut levels = trimmed.split('/');
        let l1 = levels.next().unwrap_or_default();
        let l2 = levels.next();
        if levels.next().is_some() {
            return Err(bad("at most 2 levels (l1 or l1/l2)".to_owned()));
        }
        check_name(l1).map_err(|e| bad(format!("level 1 '{}' {}", shown(l1), e.rule())))?;
        if let Some(l2) = l2 {
            check_name(l2).map_err(|e| bad(format!("level 2 '{}' {}", shown(l2), e.rule())))?;
        }
        let split = l2.map(|_| u8::try_from(l1.len()).expect("level length is at most 36"));
        Ok(Self {
            text: trimmed.into(),
            split,
        })
    }

    /// Like [`LimitKey::parse`], but an empty string means "no limit key".
    pub fn parse_optional(text: &str) -> Result<Option<Self>, CodedError> {
        if text.is_empty() {
            Ok(None)
        } else {
            Self::parse(text).map(Some)
        }
    }

    /// The first level.
    pub fn l1(&self) -> &str {
        match self.split {
            Some(at) => &self.text[..usize::from(at)],
            None => &self.text,
        }
    }

    /// The second level, if any.
    pub fn l2(&self) -> Option<&str> {
        self.split.map(|at| &self.text[usize::from(at) + 1..])
    }

    /// The key as written, without a trailing `/`.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl std::str::FromStr for LimitKey {
    type Err = CodedError;

    fn from_str(text: &str) -> Result<Self, CodedError> {
        Self::parse(text)
    }
}

// Stored and shown as its text; reading one back validates it again.
sluice_core::serde_via_str!(LimitKey);

impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn scope_err(text: &str) -> String {
        let err = Scope::parse(text).unwrap_err();
        assert_eq!(err.code, Some(Code::RT0024));
        err.message
    }

    fn key_err(text: &str) -> String {
        let err = LimitKey::parse(text).unwrap_err();
        assert_eq!(err.code, Some(Code::RT0024));
        err.message
    }

    #[test]
    fn scopes() {
        assert_eq!(Scope::parse("acme").unwrap().as_str(), "acme");
        assert!(Scope::parse("A-z_0.9").is_ok());
        assert!(Scope::parse(&"x".repeat(36)).is_ok());
        assert_eq!(
            scope_err("a:b"),
            "invalid scope 'a:b': only [a-zA-Z0-9_.-] allowed"
        );
        assert_eq!(scope_err(""), "invalid scope '': must not be empty");
        let long = "x".repeat(37);
        assert_eq!(
            scope_err(&long),
            format!("invalid scope '{long}': at most 36 bytes, got 37")
        );
        assert_eq!(
            scope_err("a/b"),
            "invalid scope 'a/b': only [a-zA-Z0-9_.-] allowed"
        );
        assert!(Scope::parse("é").is_err());
        // A huge input is named by its first 64 characters only.
        let huge = "é".repeat(100_000);
        let err = scope_err(&huge);
        assert!(err.len() < 250 && err.contains("…"), "{}", err.len());
        assert!(key_err(&huge).len() < 400);
    }

    #[test]
    fn limit_keys() {
        let k = LimitKey::parse("gold").unwrap();
        assert_eq!((k.l1(), k.l2()), ("gold", None));
        let k = LimitKey::parse("gold/eu").unwrap();
        assert_eq!((k.l1(), k.l2()), ("gold", Some("eu")));
        let k = LimitKey::parse("gold/eu/").unwrap();
        assert_eq!(k.as_str(), "gold/eu");
        assert_eq!(LimitKey::parse("gold/").unwrap().l2(), None);
        assert_eq!(
            key_err("a/b/c"),
            "invalid limit key 'a/b/c': at most 2 levels (l1 or l1/l2)"
        );
        assert_eq!(
            key_err(""),
            "invalid limit key '': must not be empty (use l1 or l1/l2)"
        );
        assert_eq!(
            key_err("/"),
            "invalid limit key '/': must not be empty (use l1 or l1/l2)"
        );
        assert_eq!(
            key_err("a//"),
            "invalid limit key 'a//': level 2 '' must not be empty"
        );
        assert_eq!(
            key_err("/b"),
            "invalid limit key '/b': level 1 '' must not be empty"
        );
        assert_eq!(
            key_err("a b"),
            "invalid limit key 'a b': level 1 'a b' only [a-zA-Z0-9_.-] allowed"
        );
        let long = "y".repeat(37);
        assert!(key_err(&format!("a/{long}")).contains("at most 36 bytes, got 37"));
        assert_eq!(LimitKey::parse_optional("").unwrap(), None);
    }

    proptest! {
        #[test]
        fn valid_names_round_trip(s in "[a-zA-Z0-9_.-]{1,36}", t in "[a-zA-Z0-9_.-]{1,36}") {
            let scope = Scope::parse(&s).unwrap();
            prop_assert_eq!(scope.as_str(), s.as_str());
            let key = LimitKey::parse(&format!("{s}/{t}")).unwrap();
            prop_assert_eq!(key.l1(), s.as_str());
            prop_assert_eq!(key.l2(), Some(t.as_str()));
            prop_assert_eq!(LimitKey::parse(key.as_str()).unwrap(), key);
        }

        #[test]
        fn parsing_agrees_with_the_rule(s in "\\PC{0,40}") {
            let valid = !s.is_empty()
                && s.len() <= 36
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            prop_assert_eq!(Scope::parse(&s).is_ok(), valid);
        }

        #[test]
        fn limit_key_parsing_never_panics(s in "\\PC{0,80}") {
            let _ = LimitKey::parse(&s);
        }
    }
}

/// A request's scope and limit key, validated: what is stored, counted and shown is this
/// normalised form (`a/` is `a`).
pub type Classified = (Option<Scope>, Option<LimitKey>);

/// Parses the scope and limit key a request carries (RT0024), checked in this order: the scope,
/// the limit key, then a limit key without a scope. An empty limit key is none.
pub fn parse_request(
    scope: Option<&str>,
    limit_key: Option<&str>,
) -> Result<Classified, CodedError> {
    let rt0024 = |m: String| CodedError::new(Code::RT0024, m);
    // Both parsers answer RT0024 themselves.
    let scope = scope.map(Scope::parse).transpose()?;
    let limit_key = match limit_key.filter(|k| !k.is_empty()) {
        None => None,
        Some(key) => {
            let parsed = LimitKey::parse(key)?;
            if scope.is_none() {
                return Err(rt0024(format!(
                    "limit key '{key}' requires a scope: call /service/scope/<scope>/call|send/… (or give the call a scope) to put the invocation under flow control"
                )));
            }
            Some(parsed)
        }
    };
    Ok((scope, limit_key))
}

#[cfg(test)]
mod request_tests {
    use super::parse_request;
    use sluice_core::errors::Code;

    #[test]
    fn requests_are_checked_scope_then_limit_key() {
        let code = |s, k| parse_request(s, k).map_err(|e| (e.code, e.message));
        assert!(code(None, None).is_ok());
        assert!(code(Some("acme"), None).is_ok());
        assert!(code(Some("acme"), Some("gold/eu")).is_ok());
        let (c, m) = code(Some("bad scope!"), Some("also bad!")).unwrap_err();
        assert_eq!(c, Some(Code::RT0024));
        assert!(m.contains("scope"), "{m}");
        let (_, m) = code(None, Some("gold")).unwrap_err();
        assert!(m.contains("requires a scope"), "{m}");
    }

    #[test]
    fn a_trailing_slash_is_dropped_and_an_empty_key_is_none() {
        let (scope, key) = parse_request(Some("acme"), Some("a/")).unwrap();
        assert_eq!(scope.unwrap().as_str(), "acme");
        assert_eq!(key.unwrap().as_str(), "a");
        let (_, key) = parse_request(Some("acme"), Some("gold/eu/")).unwrap();
        assert_eq!(key.unwrap().as_str(), "gold/eu");
        assert_eq!(parse_request(Some("acme"), Some("")).unwrap().1, None);
    }
}
