//! W3C trace context (`traceparent`): parsed strictly from a request, stored with an
//! invocation, and passed on to the deployment so the SDK's spans join the caller's trace.
//! Span ids that must be known before their span ends (an invocation's, read by its attempts
//! across restarts) are derived from the invocation id instead of drawn at random.

use std::fmt;

/// `version-traceid-parentid-flags`, version 00.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// The parent span: 8 bytes, not all zero.
    pub span_id: [u8; 8],
    /// Bit 0: sampled.
    pub flags: u8,
}

/// Longest `traceparent` value read (version 00 is 55 characters; later versions may add
/// fields after a dash).
const MAX_LEN: usize = 256;

impl TraceParent {
    /// Parses a `traceparent` header value; `None` when it is not a valid one (a receiver then
    /// starts a new trace, as the W3C recommendation says).
    pub fn parse(value: &str) -> Option<Self> {
        if value.len() > MAX_LEN {
            return None;
        }
        let mut parts = value.trim().split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        let rest = parts.next();
        if version.len() != 2 || version.eq_ignore_ascii_case("ff") {
            return None;
        }
        let version = u8::from_str_radix(version, 16).ok()?;
        // Version 00 has exactly four fields; a later version may have more.
        if version == 0 && rest.is_some() {
            return None;
        }
        let trace_id: [u8; 16] = hex(trace)?;
        let span_id: [u8; 8] = hex(span)?;
        let [flags] = hex::<1>(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The same trace with `span_id` as the parent.
    pub fn child(self, span_id: [u8; 8]) -> Self {
        Self { span_id, ..self }
    }

    /// Whether the caller sampled it.
    pub fn sampled(self) -> bool {
        self.flags & 1 == 1
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-")?;
        for b in self.trace_id {
            write!(f, "{b:02x}")?;
        }
        write!(f, "-")?;
        for b in self.span_id {
            write!(f, "{b:02x}")?;
        }
        write!(f, "-{:02x}", self.flags)
    }
}

/// Lower-case hex of exactly `N` bytes (upper case is invalid in `traceparent`).
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let bytes = text.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

/// A new trace id: a ULID (48 bits of time, 80 random), never zero.
pub fn new_trace_id() -> [u8; 16] {
    ulid::Ulid::new().0.max(1).to_be_bytes()
}

/// A new span id: the random low 64 bits of a ULID, never zero.
pub fn new_span_id() -> [u8; 8] {
    (ulid::Ulid::new().0 as u64).max(1).to_be_bytes()
}

/// A span id derived from `seed` (FNV-1a), never zero: the same seed gives the same span.
pub fn derived_span_id(seed: impl IntoIterator<Item = u8>) -> [u8; 8] {
    crate::hash::fnv1a_64(seed).max(1).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_w3c_example_round_trips() {
        let parsed = TraceParent::parse(EXAMPLE).unwrap();
        assert_eq!(parsed.to_string(), EXAMPLE);
        assert!(parsed.sampled());
        assert_eq!(
            parsed.span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
    }

    #[test]
    fn invalid_values_start_a_new_trace() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
        // A later version may carry more fields.
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what")
                .is_some()
        );
        assert!(TraceParent::parse(&"0".repeat(10_000)).is_none());
    }

    #[test]
    fn derived_ids_are_stable_and_never_zero() {
        assert_eq!(derived_span_id(*b"inv_1"), derived_span_id(*b"inv_1"));
        assert_ne!(derived_span_id(*b"inv_1"), derived_span_id(*b"inv_2"));
        assert_ne!(derived_span_id(*b""), [0; 8]);
    }

    proptest! {
        #[test]
        fn any_text_parses_without_panicking(text in ".{0,80}") {
            if let Some(parsed) = TraceParent::parse(&text) {
                prop_assert_eq!(TraceParent::parse(&parsed.to_string()), Some(parsed));
            }
        }

        #[test]
        fn every_valid_value_round_trips(trace in any::<[u8; 16]>(), span in any::<[u8; 8]>(), flags in any::<u8>()) {
            prop_assume!(trace != [0; 16] && span != [0; 8]);
            let tp = TraceParent { trace_id: trace, span_id: span, flags };
            prop_assert_eq!(TraceParent::parse(&tp.to_string()), Some(tp));
        }
    }
}
