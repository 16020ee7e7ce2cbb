//! Identifiers in the Restate text format: `<prefix>_1<base62 payload>`.
//!
//! Payload integers are written fixed-width in base62 (alphabet `0-9a-zA-Z`, left-padded with
//! `0`: 11 chars for a u64, 22 for a u128), and the integer written is the value's big-endian
//! bytes read back as little-endian. That byte swap is what real Restate ids contain, so ids
//! printed by Sluice and by a Restate server parse the same way.

use std::fmt;
use std::str::FromStr;

const VERSION: char = '1';
const U64_WIDTH: usize = 11;
const U128_WIDTH: usize = 22;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The prefix before `_` is not the expected resource type.
    #[error("bad {kind} id '{input}': expected it to start with '{prefix}_'")]
    WrongPrefix {
        /// What kind of id was expected.
        kind: &'static str,
        /// The expected prefix.
        prefix: &'static str,
        /// The offending input.
        input: String,
    },
    /// The version character after `_` is not `1`.
    #[error("bad {kind} id '{input}': unrecognized codec version (expected '{prefix}_1…')")]
    UnknownVersion {
        /// What kind of id was expected.
        kind: &'static str,
        /// The expected prefix.
        prefix: &'static str,
        /// The offending input.
        input: String,
    },
    /// The payload has the wrong number of characters.
    #[error(
        "bad {kind} id '{input}': expected {expected} characters after '{prefix}_1', found {found}"
    )]
    BadLength {
        /// What kind of id was expected.
        kind: &'static str,
        /// The expected prefix.
        prefix: &'static str,
        /// The offending input.
        input: String,
        /// Expected payload length.
        expected: usize,
        /// Actual payload length.
        found: usize,
    },
    /// The payload is not base62 or does not fit its integer.
    #[error("bad {kind} id '{input}': payload is not valid base62 (only 0-9, a-z, A-Z)")]
    BadPayload {
        /// What kind of id was expected.
        kind: &'static str,
        /// The offending input.
        input: String,
    },
}

fn encode_u64(out: &mut String, value: u64) {
    push_padded(
        out,
        &base62::encode_alternative(value.swap_bytes()),
        U64_WIDTH,
    );
}

fn encode_u128(out: &mut String, value: u128) {
    push_padded(
        out,
        &base62::encode_alternative(value.swap_bytes()),
        U128_WIDTH,
    );
}

fn push_padded(out: &mut String, digits: &str, width: usize) {
    for _ in digits.len()..width {
        out.push('0');
    }
    out.push_str(digits);
}

fn decode_digits(digits: &str) -> Option<u128> {
    // base62 also accepts nothing outside its alphabet, but checking first keeps the error ours.
    if !digits.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    base62::decode_alternative(digits).ok()
}

/// Checks `<prefix>_1` and the payload length, returning the payload.
fn split_payload<'a>(
    input: &'a str,
    kind: &'static str,
    prefix: &'static str,
    payload_len: usize,
) -> Result<&'a str, IdError> {
    let rest = input
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('_'))
        .ok_or_else(|| IdError::WrongPrefix {
            kind,
            prefix,
            input: input.to_owned(),
        })?;
    let payload = rest
        .strip_prefix(VERSION)
        .ok_or_else(|| IdError::UnknownVersion {
            kind,
            prefix,
            input: input.to_owned(),
        })?;
    if payload.len() != payload_len {
        return Err(IdError::BadLength {
            kind,
            prefix,
            input: input.to_owned(),
            expected: payload_len,
            found: payload.len(),
        });
    }
    Ok(payload)
}

/// Defines an id that is one u128 (a ULID for new ids).
macro_rules! ulid_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u128);

        impl $name {
            /// The text prefix before `_1`.
            pub const PREFIX: &'static str = $prefix;

            /// A fresh id (a ULID: time-ordered, random in its low bits).
            pub fn new() -> Self {
                Self(ulid::Ulid::new().0)
            }

            /// The id of this raw value.
            pub const fn from_u128(raw: u128) -> Self {
                Self(raw)
            }

            /// The raw value.
            pub const fn as_u128(self) -> u128 {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut out = String::with_capacity(Self::PREFIX.len() + 2 + U128_WIDTH);
                out.push_str(Self::PREFIX);
                out.push('_');
                out.push(VERSION);
                encode_u128(&mut out, self.0);
                f.write_str(&out)
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(input: &str) -> Result<Self, IdError> {
                let payload = split_payload(input, $kind, Self::PREFIX, U128_WIDTH)?;
                let raw = decode_digits(payload).ok_or_else(|| IdError::BadPayload {
                    kind: $kind,
                    input: input.to_owned(),
                })?;
                Ok(Self(raw.swap_bytes()))
            }
        }

        crate::serde_via_str!($name);
    };
}

ulid_id!(
    /// A deployment: `dp_1` + 22 base62 characters.
    DeploymentId,
    "dp",
    "deployment"
);
ulid_id!(
    /// A Kafka subscription: `sub_1` + 22 base62 characters.
    SubscriptionId,
    "sub",
    "subscription"
);

/// An invocation: its partition key and a 128-bit uuid, `inv_1` + 11 + 22 base62 characters.
///
/// The uuid is kept as two `u64` halves, high first, so the id is 24 bytes aligned to 8 (a
/// `u128` field would align it to 16 and pad it to 32): ids are keys of the maps that hold
/// every live and held invocation, millions of them. The derived order is the same as
/// (partition key, uuid as `u128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InvocationId {
    partition_key: u64,
    uuid_high: u64,
    uuid_low: u64,
}

impl InvocationId {
    /// The text prefix before `_1`.
    pub const PREFIX: &'static str = "inv";

    /// An id from its parts.
    pub const fn new(partition_key: u64, uuid: u128) -> Self {
        Self {
            partition_key,
            uuid_high: (uuid >> 64) as u64,
            uuid_low: uuid as u64,
        }
    }

    /// A fresh id on a partition key, with a ULID as its uuid.
    pub fn generate(partition_key: u64) -> Self {
        Self::new(partition_key, Self::new_uuid())
    }

    /// An id of `uuid` on a partition key drawn from the uuid itself: work that belongs to no
    /// object spreads over the partitions (one hot handler is not one busy partition), while
    /// the same uuid always lands on the same partition (a child id derived again after a
    /// restart goes where it went before).
    ///
    /// The partition key is the ULID's 48-bit millisecond time with 16 hashed bits below it:
    /// the store keys rows by id, partition key first, so ids that sort by time append in one
    /// place of its B-trees (random keys doubled what a group commit costs, see `docs/perf.md`),
    /// while the low bits, which `key % partitions` reads, spread them.
    pub fn spread(uuid: u128) -> Self {
        let time_ms = (uuid >> 80) as u64;
        let lane = crate::hash::fnv1a_64(uuid.to_le_bytes()) & 0xffff;
        Self::new((time_ms << 16) | lane, uuid)
    }

    /// The id of `uuid` on partition `index` of `partitions` (its key modulo `partitions` is
    /// `index`), its key otherwise as [`Self::spread`] makes it (within `partitions` of it, so
    /// it still follows time): a new id is made for the partition chosen, never drawn until
    /// one happens to fit. `index` past `partitions` gives the spread id unchanged.
    pub fn spread_onto(uuid: u128, index: u64, partitions: u64) -> Self {
        let spread = Self::spread(uuid);
        if index >= partitions {
            return spread;
        }
        let base = spread.partition_key;
        let floor = base - base % partitions;
        // Past u64::MAX only for a uuid from outside with a time near the end of it: step
        // down one round instead (floor is at least `partitions` there).
        let key = floor
            .checked_add(index)
            .unwrap_or(floor - partitions + index);
        Self::new(key, uuid)
    }

    /// A fresh uuid for a new id: a ULID, so ids made later sort later.
    pub fn new_uuid() -> u128 {
        ulid::Ulid::new().0
    }

    /// The id an idempotency key gives: the same (scope, target, key) always maps to the same
    /// invocation, so a repeated request finds the first one. The uuid is the first 16 bytes of
    /// SHA-256("ik" [, scope], service [, object key], handler, idempotency key), comma-joined.
    pub fn idempotent(
        partition_key: u64,
        scope: Option<&str>,
        service: &str,
        key: Option<&str>,
        handler: &str,
        idempotency_key: &str,
    ) -> Self {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        hash.update(b"ik");
        for part in scope
            .into_iter()
            .chain([service])
            .chain(key)
            .chain([handler, idempotency_key])
        {
            hash.update(b",");
            hash.update(part.as_bytes());
        }
        let digest = hash.finalize();
        let uuid = u128::from_be_bytes(digest[..16].try_into().expect("16 bytes"));
        Self::new(partition_key, uuid)
    }

    /// The id of a workflow's `run` for one key: one run per (scope, workflow, key). The uuid is
    /// the first 16 bytes of SHA-256("wf" [, scope], workflow, key), comma-joined.
    pub fn workflow_run(
        partition_key: u64,
        scope: Option<&str>,
        workflow: &str,
        key: &str,
    ) -> Self {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        hash.update(b"wf");
        for part in scope.into_iter().chain([workflow, key]) {
            hash.update(b",");
            hash.update(part.as_bytes());
        }
        let digest = hash.finalize();
        Self::new(
            partition_key,
            u128::from_be_bytes(digest[..16].try_into().expect("16 bytes")),
        )
    }

    /// The partition key (the hash that places the invocation on a partition).
    pub const fn partition_key(&self) -> u64 {
        self.partition_key
    }

    /// The 128-bit uuid.
    pub const fn uuid(&self) -> u128 {
        ((self.uuid_high as u128) << 64) | self.uuid_low as u128
    }

    /// The 24 raw bytes sent to deployments (`StartMessage.id`): key BE ‖ uuid BE.
    pub fn to_bytes(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[..8].copy_from_slice(&self.partition_key.to_be_bytes());
        out[8..].copy_from_slice(&self.uuid().to_be_bytes());
        out
    }

    /// The inverse of [`InvocationId::to_bytes`].
    pub fn from_bytes(bytes: [u8; 24]) -> Self {
        let mut key = [0u8; 8];
        key.copy_from_slice(&bytes[..8]);
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&bytes[8..]);
        Self::new(u64::from_be_bytes(key), u128::from_be_bytes(uuid))
    }
}

impl fmt::Display for InvocationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::with_capacity(5 + U64_WIDTH + U128_WIDTH);
        out.push_str(Self::PREFIX);
        out.push('_');
        out.push(VERSION);
        encode_u64(&mut out, self.partition_key);
        encode_u128(&mut out, self.uuid());
        f.write_str(&out)
    }
}

impl FromStr for InvocationId {
    type Err = IdError;

    fn from_str(input: &str) -> Result<Self, IdError> {
        const KIND: &str = "invocation";
        let payload = split_payload(input, KIND, Self::PREFIX, U64_WIDTH + U128_WIDTH)?;
        let bad = || IdError::BadPayload {
            kind: KIND,
            input: input.to_owned(),
        };
        // `split_payload` counted bytes: a multi-byte character across the split point must be
        // a parse error, not a panic.
        let (key, uuid) = payload.split_at_checked(U64_WIDTH).ok_or_else(bad)?;
        let key = u64::try_from(decode_digits(key).ok_or_else(bad)?).map_err(|_| bad())?;
        let uuid = decode_digits(uuid).ok_or_else(bad)?;
        Ok(Self::new(key.swap_bytes(), uuid.swap_bytes()))
    }
}

crate::serde_via_str!(InvocationId);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_an_id_printed_by_a_restate_server() {
        // Recorded from a real server; its uuid is a ULID minted on 2024-03-18.
        let text = "inv_1gdJBtdVEcM942bjcDmb1c1khoaJe11Hbz";
        let id: InvocationId = text.parse().unwrap();
        assert_eq!(id.to_string(), text);
        let millis = ulid::Ulid(id.uuid()).timestamp_ms();
        let day = jiff::Timestamp::from_millisecond(i64::try_from(millis).unwrap())
            .unwrap()
            .to_zoned(jiff::tz::TimeZone::UTC)
            .date();
        assert_eq!(day, jiff::civil::date(2024, 3, 18));
    }

    #[test]
    fn lengths_match_the_reference() {
        assert_eq!(InvocationId::generate(7).to_string().len(), 38);
        assert_eq!(DeploymentId::new().to_string().len(), 26);
        assert_eq!(SubscriptionId::new().to_string().len(), 27);
        assert_eq!(
            InvocationId::new(0, 0).to_string(),
            format!("inv_1{}", "0".repeat(33))
        );
    }

    #[test]
    fn errors_name_the_input_and_the_rule() {
        let err = "inv_bogus".parse::<InvocationId>().unwrap_err().to_string();
        assert_eq!(
            err,
            "bad invocation id 'inv_bogus': unrecognized codec version (expected 'inv_1…')"
        );
        let err = "dp_1abc".parse::<DeploymentId>().unwrap_err().to_string();
        assert!(
            err.contains("expected 22 characters") && err.contains("found 3"),
            "{err}"
        );
        let err = "sub_1".parse::<DeploymentId>().unwrap_err().to_string();
        assert!(err.contains("start with 'dp_'"), "{err}");
        let bad_char = format!("dp_1{}-", "0".repeat(21));
        let err = bad_char.parse::<DeploymentId>().unwrap_err().to_string();
        assert!(err.contains("not valid base62"), "{err}");
        // 22 'Z's overflow a u128.
        let overflow = format!("dp_1{}", "Z".repeat(22));
        assert!(matches!(
            overflow.parse::<DeploymentId>(),
            Err(IdError::BadPayload { .. })
        ));
    }

    #[test]
    fn raw_bytes_are_key_then_uuid_big_endian() {
        let id = InvocationId::new(
            0x0102_0304_0506_0708,
            0x1112_1314_1516_1718_191a_1b1c_1d1e_1f20,
        );
        let bytes = id.to_bytes();
        assert_eq!(&bytes[..3], &[1, 2, 3]);
        assert_eq!(bytes[8], 0x11);
        assert_eq!(InvocationId::from_bytes(bytes), id);
    }

    #[test]
    fn serde_uses_the_text_form() {
        let id = DeploymentId::new();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{id}\""));
        assert_eq!(serde_json::from_str::<DeploymentId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<DeploymentId>("\"dp_x\"").is_err());
    }

    #[test]
    fn an_invocation_id_is_24_bytes_aligned_to_8() {
        assert_eq!(std::mem::size_of::<InvocationId>(), 24);
        assert_eq!(std::mem::align_of::<InvocationId>(), 8);
        assert_eq!(std::mem::size_of::<Option<InvocationId>>(), 32);
    }

    proptest! {
        #[test]
        fn an_id_made_for_a_partition_lands_on_it_near_its_spread_key(
            uuid in any::<u128>(),
            partitions in 1u64..1024,
            pick in any::<u64>(),
        ) {
            let index = pick % partitions;
            let id = InvocationId::spread_onto(uuid, index, partitions);
            prop_assert_eq!(id.partition_key() % partitions, index);
            prop_assert_eq!(id.uuid(), uuid);
            let spread = InvocationId::spread(uuid).partition_key();
            prop_assert!(id.partition_key().abs_diff(spread) < partitions);
        }

        #[test]
        fn invocation_ids_order_by_partition_key_then_uuid(
            a in (any::<u64>(), any::<u128>()),
            b in (any::<u64>(), any::<u128>()),
            same_key in any::<bool>(),
        ) {
            let b = if same_key { (a.0, b.1) } else { b };
            let (x, y) = (InvocationId::new(a.0, a.1), InvocationId::new(b.0, b.1));
            prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            prop_assert_eq!(x == y, a == b);
        }

        #[test]
        fn invocation_ids_round_trip(key in any::<u64>(), uuid in any::<u128>()) {
            let id = InvocationId::new(key, uuid);
            let text = id.to_string();
            prop_assert_eq!(text.len(), 38);
            prop_assert_eq!(text.parse::<InvocationId>().unwrap(), id);
        }

        #[test]
        fn deployment_and_subscription_ids_round_trip(raw in any::<u128>()) {
            let dp = DeploymentId::from_u128(raw);
            prop_assert_eq!(dp.to_string().parse::<DeploymentId>().unwrap(), dp);
            let sub = SubscriptionId::from_u128(raw);
            prop_assert_eq!(sub.to_string().parse::<SubscriptionId>().unwrap(), sub);
        }

        #[test]
        fn arbitrary_text_never_panics(text in ".{0,60}") {
            parse_every_id(&text);
        }

        /// Right-length payloads with multi-byte characters anywhere, including across the
        /// place where an invocation id's payload splits into key and uuid.
        #[test]
        fn right_length_payloads_with_any_characters_never_panic(
            prefix in prop::sample::select(vec!["inv_1", "dp_1", "sub_1", "sign_1", "prom_1"]),
            chars in prop::collection::vec(prop_oneof![Just('a'), Just('é'), Just('€'), Just('😀'), any::<char>()], 0..40),
        ) {
            let mut text = String::from(prefix);
            for c in chars {
                if text.len() - prefix.len() >= 33 {
                    break;
                }
                text.push(c);
            }
            parse_every_id(&text);
        }
    }

    fn parse_every_id(text: &str) {
        let _ = text.parse::<InvocationId>();
        let _ = text.parse::<DeploymentId>();
        let _ = text.parse::<SubscriptionId>();
        let _ = text.parse::<AwakeableId>();
    }

    #[test]
    fn a_character_across_the_key_uuid_split_is_an_error() {
        // 10 ASCII bytes, then a 2-byte 'é' over bytes 11-12, then 21 bytes: 33 in all.
        let text = format!("inv_1{}é{}", "a".repeat(10), "a".repeat(21));
        assert!(matches!(
            text.parse::<InvocationId>(),
            Err(IdError::BadPayload { .. })
        ));
    }
}

/// A signal or awakeable of an invocation: `sign_1…` (V5+) or the legacy `prom_1…`, both
/// base64url of the invocation's 24 raw bytes and a u32 BE index: written without padding, read
/// with or without it (the Java SDK 2.4 pads the ids it makes, and the reference accepts them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AwakeableId {
    /// The invocation waiting on it.
    pub invocation: InvocationId,
    /// Its signal index (`sign_1`) or journal entry index (`prom_1`).
    pub index: u32,
}

impl FromStr for AwakeableId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        use base64::Engine as _;
        let encoded = s
            .strip_prefix("sign_1")
            .or_else(|| s.strip_prefix("prom_1"))
            .ok_or_else(|| format!("'{s}' is not an awakeable id: expected sign_1… or prom_1…"))?;
        const EITHER: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
            &base64::alphabet::URL_SAFE,
            base64::engine::GeneralPurposeConfig::new()
                .with_encode_padding(false)
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        let raw = EITHER
            .decode(encoded)
            .map_err(|e| format!("'{s}' is not an awakeable id: {e}"))?;
        let raw: [u8; 28] = raw
            .try_into()
            .map_err(|_| format!("'{s}' is not an awakeable id: wrong length"))?;
        let mut invocation = [0u8; 24];
        invocation.copy_from_slice(&raw[..24]);
        Ok(Self {
            invocation: InvocationId::from_bytes(invocation),
            index: u32::from_be_bytes(raw[24..].try_into().expect("4 bytes")),
        })
    }
}

impl fmt::Display for AwakeableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use base64::Engine as _;
        let mut raw = [0u8; 28];
        raw[..24].copy_from_slice(&self.invocation.to_bytes());
        raw[24..].copy_from_slice(&self.index.to_be_bytes());
        write!(
            f,
            "sign_1{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
        )
    }
}

/// A scheduler queue: `vq_1…` in the reference's format (a u64 and a u128, 37 characters), which
/// carries the partition's index and the queue's index within it; stable while the queue lives.
/// The older `vq_{partition}_{queue}` is still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VQueueId {
    /// The partition's index.
    pub partition: u64,
    /// The queue's index in its partition's scheduler.
    pub queue: u32,
}

impl VQueueId {
    const PREFIX: &'static str = "vq";
}

impl fmt::Display for VQueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::with_capacity(4 + U64_WIDTH + U128_WIDTH);
        out.push_str(Self::PREFIX);
        out.push('_');
        out.push(VERSION);
        encode_u64(&mut out, self.partition);
        encode_u128(&mut out, u128::from(self.queue));
        f.write_str(&out)
    }
}

impl FromStr for VQueueId {
    type Err = IdError;

    fn from_str(input: &str) -> Result<Self, IdError> {
        const KIND: &str = "virtual queue";
        let bad = || IdError::BadPayload {
            kind: KIND,
            input: input.to_owned(),
        };
        // The older form: `vq_{partition}_{queue}` in decimal.
        if let Some((partition, queue)) = input
            .strip_prefix("vq_")
            .and_then(|rest| rest.split_once('_'))
        {
            return match (partition.parse(), queue.parse()) {
                (Ok(partition), Ok(queue)) => Ok(Self { partition, queue }),
                _ => Err(bad()),
            };
        }
        let payload = split_payload(input, KIND, Self::PREFIX, U64_WIDTH + U128_WIDTH)?;
        let (partition, queue) = payload.split_at_checked(U64_WIDTH).ok_or_else(bad)?;
        let partition = u64::try_from(decode_digits(partition).ok_or_else(bad)?)
            .map_err(|_| bad())?
            .swap_bytes();
        let queue =
            u32::try_from(decode_digits(queue).ok_or_else(bad)?.swap_bytes()).map_err(|_| bad())?;
        Ok(Self { partition, queue })
    }
}

#[cfg(test)]
mod vqueue_tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_old_form_still_parses_and_bad_ones_do_not() {
        let id: VQueueId = "vq_3_17".parse().unwrap();
        assert_eq!((id.partition, id.queue), (3, 17));
        assert_eq!(id.to_string().len(), 37);
        for bad in [
            "",
            "vq_",
            "vq_1",
            "q_1_2",
            "vq_-1_2",
            "vq_1_99999999999",
            "vq_2abc",
            "vq_1é0000000000000000000000000000000000",
        ] {
            assert!(bad.parse::<VQueueId>().is_err(), "{bad}");
        }
        // A u128 payload past a u32 is no queue of ours.
        let wide = format!("vq_1{}{}", "0".repeat(11), "z".repeat(22));
        assert!(wide.parse::<VQueueId>().is_err());
    }

    proptest! {
        #[test]
        fn ids_round_trip(partition in any::<u64>(), queue in any::<u32>()) {
            let id = VQueueId { partition, queue };
            let text = id.to_string();
            prop_assert!(text.starts_with("vq_1"));
            prop_assert_eq!(text.parse::<VQueueId>().unwrap(), id);
        }

        #[test]
        fn no_input_panics(input in "\\PC{0,50}") {
            let _ = input.parse::<VQueueId>();
        }
    }
}

#[cfg(test)]
mod awakeable_tests {
    use super::*;

    #[test]
    fn idempotent_ids_depend_on_every_part() {
        let id = |scope, key, ik| InvocationId::idempotent(1, scope, "S", key, "h", ik);
        assert_eq!(id(None, None, "k"), id(None, None, "k"));
        assert_ne!(id(None, None, "k"), id(None, None, "k2"));
        assert_ne!(id(None, None, "k"), id(Some("t"), None, "k"));
        assert_ne!(id(None, None, "k"), id(None, Some("o"), "k"));
    }

    #[test]
    fn awakeable_ids_round_trip_and_reject_garbage() {
        let id = AwakeableId {
            invocation: InvocationId::generate(9),
            index: 17,
        };
        let text = id.to_string();
        assert_eq!(text.len(), 44);
        assert_eq!(text.parse::<AwakeableId>().unwrap(), id);
        let legacy = text.replacen("sign_1", "prom_1", 1);
        assert_eq!(legacy.parse::<AwakeableId>().unwrap(), id);
        // As the Java SDK writes them: padded.
        assert_eq!(format!("{text}==").parse::<AwakeableId>().unwrap(), id);
        for bad in [
            "",
            "sign_1",
            "sign_1!!!!",
            "inv_1abc",
            &text[..30],
            &format!("{text}==="),
        ] {
            assert!(bad.parse::<AwakeableId>().is_err(), "{bad}");
        }
    }
}
