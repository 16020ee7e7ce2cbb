//! A request's deadline: `x-request-deadline` (RFC 3339, or ms since the epoch) or
//! `grpc-timeout` (gRPC's `<1-8 digits><H|M|S|m|u|n>`, from when the request arrived). With
//! both, the earlier wins. An invocation still waiting in its queue then is dropped with
//! FLO0003 without starting.

use http::HeaderMap;

use sluice_core::errors::Code;

use super::error::IngressError;

/// The absolute deadline header.
pub const DEADLINE_HEADER: &str = "x-request-deadline";
/// gRPC's relative timeout header.
pub const GRPC_TIMEOUT_HEADER: &str = "grpc-timeout";

/// The request's deadline, ms since the epoch, from its headers at `now`.
pub fn of(headers: &HeaderMap, now: u64) -> Result<Option<u64>, IngressError> {
    let text = |name: &str| -> Result<Option<&str>, IngressError> {
        headers
            .get(name)
            .map(|v| {
                v.to_str()
                    .map_err(|_| bad(format!("the '{name}' header must be ASCII text")))
            })
            .transpose()
    };
    let absolute = text(DEADLINE_HEADER)?.map(absolute).transpose()?;
    let relative = text(GRPC_TIMEOUT_HEADER)?
        .map(|t| grpc_timeout(t).map(|ms| now.saturating_add(ms)))
        .transpose()?;
    Ok(absolute.into_iter().chain(relative).min())
}

fn bad(message: String) -> IngressError {
    IngressError::coded(Code::RT0024, message)
}

/// `x-request-deadline`: ms since the epoch, or an RFC 3339 timestamp.
fn absolute(text: &str) -> Result<u64, IngressError> {
    sluice_core::clock::parse_time_ms(text).map_err(|why| bad(format!("x-request-deadline {why}")))
}

/// `grpc-timeout`: at most 8 digits and a unit, in ms (sub-millisecond rounds up).
fn grpc_timeout(text: &str) -> Result<u64, IngressError> {
    let invalid = || {
        bad(format!(
            "grpc-timeout '{text}' is not 1-8 digits followed by H, M, S, m, u or n (e.g. 500m)"
        ))
    };
    let text = text.trim();
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    Ok(match unit {
        "H" => n.saturating_mul(3_600_000),
        "M" => n.saturating_mul(60_000),
        "S" => n.saturating_mul(1_000),
        "m" => n,
        "u" => n.div_ceil(1_000),
        "n" => n.div_ceil(1_000_000),
        _ => return Err(invalid()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn either_header_sets_it_and_the_earlier_wins() {
        let now = 1_000_000;
        assert_eq!(of(&headers(&[]), now).unwrap(), None);
        assert_eq!(
            of(&headers(&[("grpc-timeout", "1500m")]), now).unwrap(),
            Some(1_001_500)
        );
        assert_eq!(
            of(&headers(&[("grpc-timeout", "2S")]), now).unwrap(),
            Some(1_002_000)
        );
        assert_eq!(
            of(&headers(&[("x-request-deadline", "1000700")]), now).unwrap(),
            Some(1_000_700)
        );
        assert_eq!(
            of(
                &headers(&[("x-request-deadline", "1970-01-01T00:16:41Z")]),
                now
            )
            .unwrap(),
            Some(1_001_000)
        );
        assert_eq!(
            of(
                &headers(&[("x-request-deadline", "1000700"), ("grpc-timeout", "1S")]),
                now
            )
            .unwrap(),
            Some(1_000_700)
        );
        assert_eq!(
            of(&headers(&[("grpc-timeout", "1u")]), now).unwrap(),
            Some(1_000_001),
            "under a millisecond rounds up"
        );
    }

    #[test]
    fn bad_values_are_rt0024_and_say_the_form() {
        for (name, value, says) in [
            ("grpc-timeout", "123456789S", "1-8 digits"),
            ("grpc-timeout", "10x", "H, M, S, m, u or n"),
            ("grpc-timeout", "S", "1-8 digits"),
            ("x-request-deadline", "tomorrow", "RFC 3339"),
            ("x-request-deadline", "99999999999999999999999", "too large"),
        ] {
            let e = of(&headers(&[(name, value)]), 0).unwrap_err();
            assert_eq!(e.code, Some(Code::RT0024), "{name}: {value}");
            assert!(e.message.contains(says), "{name}: {value}: {}", e.message);
        }
    }

    proptest::proptest! {
        #[test]
        fn any_header_value_parses_or_is_refused_without_panicking(
            deadline in "\\PC{0,40}",
            timeout in "[0-9]{0,12}[HMSmunx]?",
            now in proptest::num::u64::ANY,
        ) {
            let mut map = HeaderMap::new();
            if let Ok(v) = deadline.parse() {
                map.insert(DEADLINE_HEADER, v);
            }
            if let Ok(v) = timeout.parse() {
                map.insert(GRPC_TIMEOUT_HEADER, v);
            }
            let _ = of(&map, now);
        }
    }
}
