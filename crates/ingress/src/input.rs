//! Request checks before an invocation is created: the handler's input rules and `delay`.

use std::time::Duration;

use super::error::IngressError;
use super::path::Mode;
use sluice_config::FriendlyDuration;
use sluice_runtime::discovery::manifest::InputRules;

/// Checks body and content type against the handler's input rules (default: anything).
pub fn check(
    rules: Option<&InputRules>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<(), IngressError> {
    let Some(rules) = rules else {
        return Ok(());
    };
    let fail = |why: String| IngressError::bad_request(format!("input validation error: {why}"));
    let no_input_allowed =
        rules.content_type.is_none() && rules.required.is_none() && rules.json_schema.is_none();
    if no_input_allowed {
        if !body.is_empty() || content_type.is_some() {
            return Err(fail(
                "expected body and content-type to be empty: this handler takes no input".into(),
            ));
        }
        return Ok(());
    }
    if body.is_empty() {
        if rules.required.unwrap_or(false) {
            return Err(fail(
                "empty body not allowed: this handler requires an input".into(),
            ));
        }
        return Ok(());
    }
    let expected = rules.content_type.as_deref().unwrap_or("*/*");
    let Some(given) = content_type else {
        return Err(fail(format!(
            "empty content-type: send 'content-type: {expected}' with the body"
        )));
    };
    if !media_type_matches(expected, given) {
        return Err(fail(format!(
            "content-type '{given}' does not match '{expected}'"
        )));
    }
    Ok(())
}

/// Accept-style match of `given` (parameters ignored) against `pattern` (`type/sub`, `type/*`, `*/*`).
fn media_type_matches(pattern: &str, given: &str) -> bool {
    let essence = |s: &str| {
        s.split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    };
    let (pattern, given) = (essence(pattern), essence(given));
    let split = |s: &str| -> Option<(String, String)> {
        let (t, sub) = s.split_once('/')?;
        Some((t.to_owned(), sub.to_owned()))
    };
    match (split(&pattern), split(&given)) {
        (Some((pt, ps)), Some((gt, gs))) => (pt == "*" || pt == gt) && (ps == "*" || ps == gs),
        _ => false,
    }
}

/// The `delay` query parameter: sends only, friendly (`10s`) or ISO-8601 (`PT10S`).
pub fn delay(query: Option<&str>, mode: Mode) -> Result<Option<Duration>, IngressError> {
    let Some(raw) = query.and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "delay")
            .map(|(_, v)| v.into_owned())
    }) else {
        return Ok(None);
    };
    if mode == Mode::Call {
        return Err(IngressError::bad_request(
            "cannot use the delay query parameter with calls: the delay is supported only with sends (/service/send/…)",
        ));
    }
    raw.parse::<FriendlyDuration>()
        .map(|d| Some(d.0))
        .map_err(|e| IngressError::bad_request(format!("bad delay query parameter: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(content_type: Option<&str>, required: Option<bool>) -> InputRules {
        InputRules {
            required,
            content_type: content_type.map(Into::into),
            json_schema: None,
        }
    }

    #[test]
    fn input_rules() {
        let json = rules(Some("application/json"), Some(true));
        assert!(check(Some(&json), Some("application/json; charset=utf-8"), b"1").is_ok());
        let err = check(Some(&json), Some("text/plain"), b"1").unwrap_err();
        assert_eq!(
            err.message,
            "input validation error: content-type 'text/plain' does not match 'application/json'"
        );
        assert!(
            check(Some(&json), None, b"1")
                .unwrap_err()
                .message
                .contains("empty content-type")
        );
        assert!(
            check(Some(&json), None, b"")
                .unwrap_err()
                .message
                .contains("empty body not allowed")
        );
        let optional = rules(Some("application/*"), Some(false));
        assert!(check(Some(&optional), None, b"").is_ok());
        assert!(check(Some(&optional), Some("application/cbor"), b"x").is_ok());
        let none = rules(None, None);
        assert!(check(Some(&none), None, b"").is_ok());
        assert!(check(Some(&none), Some("application/json"), b"").is_err());
        assert!(check(None, Some("anything/at-all"), b"x").is_ok());
    }

    #[test]
    fn delays() {
        assert_eq!(
            delay(Some("delay=10s"), Mode::Send).unwrap(),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            delay(Some("x=1&delay=PT1M"), Mode::Send).unwrap(),
            Some(Duration::from_secs(60))
        );
        assert_eq!(delay(Some("x=1"), Mode::Call).unwrap(), None);
        assert_eq!(delay(None, Mode::Send).unwrap(), None);
        assert!(
            delay(Some("delay=1s"), Mode::Call)
                .unwrap_err()
                .message
                .starts_with("cannot use the delay")
        );
        assert!(
            delay(Some("delay=soon"), Mode::Send)
                .unwrap_err()
                .message
                .starts_with("bad delay query parameter")
        );
    }
}
