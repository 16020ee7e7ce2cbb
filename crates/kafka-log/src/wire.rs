//! The few Kafka protocol messages a leader's shard speaks itself (`link.rs`): `ApiVersions`
//! (v0, to learn which `Produce` versions a broker takes) and `Produce` v3–v7 with record
//! batches of magic 2, uncompressed, without a producer id. Everything else (metadata,
//! consumers, the other topics' producers) stays with librdkafka.
//!
//! Answers come from the network: every read is bounded by the frame it is in, and a frame
//! that does not parse is an error, never a panic.

use sluice_core::errors::{Code, CodedError};

/// `ApiVersions`' key.
const API_VERSIONS: i16 = 18;
/// `Produce`'s key.
const PRODUCE: i16 = 0;
/// The oldest `Produce` spoken here: the first to carry record batches of magic 2.
pub(crate) const PRODUCE_MIN: i16 = 3;
/// The newest: the last before per-record errors and flexible versions, whose answer this
/// reads the same way as v3's plus the log's start offset (v5).
pub(crate) const PRODUCE_MAX: i16 = 7;
/// The client id the brokers log for these connections.
const CLIENT_ID: &str = "sluice-leader";

/// A request frame for `ApiVersions` v0, under `correlation`.
pub(crate) fn api_versions(correlation: i32) -> Vec<u8> {
    let mut out = frame_start();
    header(&mut out, API_VERSIONS, 0, correlation);
    frame_end(out)
}

/// The `Produce` version to speak with a broker whose `ApiVersions` v0 answer is `body`
/// (after the correlation id): the newest both sides take.
pub(crate) fn produce_version(body: &[u8]) -> Result<i16, CodedError> {
    let mut r = Reader::new(body);
    let error = r.i16()?;
    if error != 0 {
        return Err(refused(format!(
            "the broker answered ApiVersions with error {error}"
        )));
    }
    let count = r.count()?;
    for _ in 0..count {
        let (key, min, max) = (r.i16()?, r.i16()?, r.i16()?);
        if key == PRODUCE {
            let version = max.min(PRODUCE_MAX);
            if version < PRODUCE_MIN || min > version {
                return Err(refused(format!(
                    "the broker takes Produce v{min}-v{max}; this node speaks v{PRODUCE_MIN}-v{PRODUCE_MAX}"
                )));
            }
            return Ok(version);
        }
    }
    Err(refused("the broker does not take Produce at all".into()))
}

/// One partition's records in a produce request, in the order they are to land.
pub(crate) struct Part<'a> {
    pub partition: i32,
    pub records: Vec<&'a [u8]>,
}

/// A request frame for `Produce` `version` under `correlation`: `parts` of `topic`, each one
/// record batch, every replica acknowledging (`acks = -1`) within `timeout_ms`. `now_ms` is the
/// records' create time.
pub(crate) fn produce(
    version: i16,
    correlation: i32,
    topic: &str,
    timeout_ms: i32,
    now_ms: i64,
    parts: &[Part<'_>],
) -> Vec<u8> {
    let mut out = frame_start();
    header(&mut out, PRODUCE, version, correlation);
    out.extend_from_slice(&(-1i16).to_be_bytes()); // no transactional id
    out.extend_from_slice(&(-1i16).to_be_bytes()); // acks: every in-sync replica
    out.extend_from_slice(&timeout_ms.to_be_bytes());
    out.extend_from_slice(&1i32.to_be_bytes()); // one topic
    string(&mut out, topic);
    out.extend_from_slice(&len_i32(parts.len()).to_be_bytes());
    for part in parts {
        out.extend_from_slice(&part.partition.to_be_bytes());
        let size_at = out.len();
        out.extend_from_slice(&0i32.to_be_bytes());
        record_batch(&mut out, now_ms, &part.records);
        let size = len_i32(out.len() - size_at - 4);
        out[size_at..size_at + 4].copy_from_slice(&size.to_be_bytes());
    }
    frame_end(out)
}

/// What a broker answered for one partition of a produce request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Landed {
    pub partition: i32,
    /// Kafka's error code (0: stored).
    pub error: i16,
    /// The offset the batch's first record landed at.
    pub base_offset: i64,
}

/// Reads a `Produce` `version` answer's `body` (after the correlation id).
pub(crate) fn produce_answer(version: i16, body: &[u8]) -> Result<Vec<Landed>, CodedError> {
    let mut r = Reader::new(body);
    let mut landed = Vec::new();
    let topics = r.count()?;
    for _ in 0..topics {
        r.string()?;
        let partitions = r.count()?;
        for _ in 0..partitions {
            let partition = r.i32()?;
            let error = r.i16()?;
            let base_offset = r.i64()?;
            r.i64()?; // log append time
            if version >= 5 {
                r.i64()?; // log start offset
            }
            landed.push(Landed {
                partition,
                error,
                base_offset,
            });
        }
    }
    r.i32()?; // throttle time
    Ok(landed)
}

/// Splits a response frame's body (after its length) into its correlation id and the rest.
pub(crate) fn correlation(frame: &[u8]) -> Result<(i32, &[u8]), CodedError> {
    let mut r = Reader::new(frame);
    let id = r.i32()?;
    Ok((id, r.rest()))
}

/// A record batch of magic 2 holding `records` (values without keys or headers), offsets
/// from 0, no producer id, uncompressed.
fn record_batch(out: &mut Vec<u8>, now_ms: i64, records: &[&[u8]]) {
    out.extend_from_slice(&0i64.to_be_bytes()); // base offset: the broker sets it
    let length_at = out.len();
    out.extend_from_slice(&0i32.to_be_bytes()); // batch length, below
    out.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    out.push(2); // magic
    let crc_at = out.len();
    out.extend_from_slice(&0u32.to_be_bytes()); // crc, below
    let attributes_at = out.len();
    out.extend_from_slice(&0i16.to_be_bytes()); // attributes: no compression, create time
    out.extend_from_slice(&len_i32(records.len().saturating_sub(1)).to_be_bytes());
    out.extend_from_slice(&now_ms.to_be_bytes()); // base timestamp
    out.extend_from_slice(&now_ms.to_be_bytes()); // max timestamp
    out.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    out.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    out.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    out.extend_from_slice(&len_i32(records.len()).to_be_bytes());
    let mut record = Vec::new();
    for (delta, value) in records.iter().enumerate() {
        record.clear();
        record.push(0); // attributes
        varint(&mut record, 0); // timestamp delta
        varint(&mut record, i64::from(len_i32(delta)));
        varint(&mut record, -1); // no key
        varint(&mut record, value.len() as i64);
        record.extend_from_slice(value);
        varint(&mut record, 0); // no headers
        varint(out, record.len() as i64);
        out.extend_from_slice(&record);
    }
    let length = len_i32(out.len() - length_at - 4);
    out[length_at..length_at + 4].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&out[attributes_at..]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_be_bytes());
}

/// A length the protocol carries as an `i32`. Requests are bounded far below it
/// (`cluster.max-record-bytes` per record, a few records in flight per partition).
fn len_i32(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

/// A zig-zag varint (records' lengths and deltas).
fn varint(out: &mut Vec<u8>, value: i64) {
    let mut v = ((value << 1) ^ (value >> 63)) as u64;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn frame_start() -> Vec<u8> {
    vec![0; 4]
}

fn frame_end(mut out: Vec<u8>) -> Vec<u8> {
    let size = len_i32(out.len() - 4);
    out[..4].copy_from_slice(&size.to_be_bytes());
    out
}

/// Request header v1: key, version, correlation id, client id.
fn header(out: &mut Vec<u8>, key: i16, version: i16, correlation: i32) {
    out.extend_from_slice(&key.to_be_bytes());
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&correlation.to_be_bytes());
    string(out, CLIENT_ID);
}

fn string(out: &mut Vec<u8>, s: &str) {
    let len = i16::try_from(s.len()).unwrap_or(i16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&s.as_bytes()[..len as usize]);
}

/// Reads big-endian fields from a frame, never past its end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], CodedError> {
        let Some((head, rest)) = self.bytes.split_first_chunk::<N>() else {
            return Err(refused("the broker's answer ends early".into()));
        };
        self.bytes = rest;
        Ok(*head)
    }

    fn i16(&mut self) -> Result<i16, CodedError> {
        self.take().map(i16::from_be_bytes)
    }

    fn i32(&mut self) -> Result<i32, CodedError> {
        self.take().map(i32::from_be_bytes)
    }

    fn i64(&mut self) -> Result<i64, CodedError> {
        self.take().map(i64::from_be_bytes)
    }

    /// An array's length: not negative, and not more entries than bytes left (every entry
    /// here is at least one byte), so a hostile count cannot make a reader loop for long.
    fn count(&mut self) -> Result<usize, CodedError> {
        let n = self.i32()?;
        match usize::try_from(n) {
            Ok(n) if n <= self.bytes.len() => Ok(n),
            _ => Err(refused(format!(
                "the broker's answer holds an array of {n}"
            ))),
        }
    }

    fn string(&mut self) -> Result<&'a [u8], CodedError> {
        let n = self.i16()?;
        let n = usize::try_from(n).map_err(|_| refused("a null topic name".into()))?;
        if n > self.bytes.len() {
            return Err(refused("the broker's answer ends early".into()));
        }
        let (s, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(s)
    }

    fn rest(self) -> &'a [u8] {
        self.bytes
    }
}

/// A broker answer this node cannot use (CLU0001: the partition's leader steps down).
fn refused(why: String) -> CodedError {
    CodedError::new(Code::CLU0001, format!("the log's broker link: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a zig-zag varint back (for the tests' own decoding).
    fn read_varint(bytes: &mut &[u8]) -> i64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let (b, rest) = bytes.split_first().unwrap();
            *bytes = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        ((v >> 1) as i64) ^ -((v & 1) as i64)
    }

    #[test]
    fn varints_zig_zag_as_kafka_writes_them() {
        for (value, bytes) in [
            (0i64, vec![0u8]),
            (-1, vec![1]),
            (1, vec![2]),
            (63, vec![0x7e]),
            (64, vec![0x80, 0x01]),
            (-65, vec![0x81, 0x01]),
        ] {
            let mut out = Vec::new();
            varint(&mut out, value);
            assert_eq!(out, bytes, "{value}");
            assert_eq!(read_varint(&mut out.as_slice()), value);
        }
    }

    #[test]
    fn a_record_batch_carries_its_records_in_order_under_a_checked_crc() {
        let mut out = Vec::new();
        record_batch(
            &mut out,
            1_700_000_000_000,
            &[b"first", b"", b"third record"],
        );
        let mut r = Reader::new(&out);
        assert_eq!(r.i64().unwrap(), 0);
        let length = r.i32().unwrap() as usize;
        assert_eq!(length, out.len() - 12);
        assert_eq!(r.i32().unwrap(), -1);
        let magic: [u8; 1] = r.take().unwrap();
        assert_eq!(magic, [2]);
        let crc = u32::from_be_bytes(r.take().unwrap());
        assert_eq!(crc, crc32c::crc32c(r.bytes));
        assert_eq!(r.i16().unwrap(), 0);
        assert_eq!(r.i32().unwrap(), 2, "last offset delta");
        assert_eq!(r.i64().unwrap(), 1_700_000_000_000);
        assert_eq!(r.i64().unwrap(), 1_700_000_000_000);
        assert_eq!(r.i64().unwrap(), -1);
        assert_eq!(r.i16().unwrap(), -1);
        assert_eq!(r.i32().unwrap(), -1);
        assert_eq!(r.i32().unwrap(), 3);
        let mut rest = r.rest();
        for (delta, value) in [&b"first"[..], b"", b"third record"].iter().enumerate() {
            let len = read_varint(&mut rest) as usize;
            let (mut record, after) = rest.split_at(len);
            rest = after;
            assert_eq!(record[0], 0);
            record = &record[1..];
            assert_eq!(read_varint(&mut record), 0);
            assert_eq!(read_varint(&mut record), delta as i64);
            assert_eq!(read_varint(&mut record), -1);
            let n = read_varint(&mut record) as usize;
            assert_eq!(&record[..n], *value);
            record = &record[n..];
            assert_eq!(read_varint(&mut record), 0);
            assert!(record.is_empty());
        }
        assert!(rest.is_empty());
    }

    #[test]
    fn a_produce_request_frames_each_part_as_one_batch() {
        let frame = produce(
            7,
            42,
            "sluice-log",
            5000,
            1,
            &[
                Part {
                    partition: 3,
                    records: vec![b"a", b"b"],
                },
                Part {
                    partition: 0,
                    records: vec![b"c"],
                },
            ],
        );
        let mut r = Reader::new(&frame);
        assert_eq!(r.i32().unwrap() as usize, frame.len() - 4);
        assert_eq!((r.i16().unwrap(), r.i16().unwrap()), (PRODUCE, 7));
        assert_eq!(r.i32().unwrap(), 42);
        assert_eq!(r.string().unwrap(), CLIENT_ID.as_bytes());
        assert_eq!(r.i16().unwrap(), -1);
        assert_eq!(r.i16().unwrap(), -1);
        assert_eq!(r.i32().unwrap(), 5000);
        assert_eq!(r.count().unwrap(), 1);
        assert_eq!(r.string().unwrap(), b"sluice-log");
        assert_eq!(r.count().unwrap(), 2);
        for (partition, records) in [(3, 2), (0, 1)] {
            assert_eq!(r.i32().unwrap(), partition);
            let size = r.i32().unwrap() as usize;
            let batch = &r.bytes[..size];
            r.bytes = &r.bytes[size..];
            // The record count sits 57 bytes into a batch.
            assert_eq!(
                i32::from_be_bytes(batch[57..61].try_into().unwrap()),
                records
            );
        }
        assert!(r.rest().is_empty());
    }

    /// A `Produce` answer of `version` as a broker writes it.
    fn answer(version: i16, parts: &[(i32, i16, i64)]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&1i32.to_be_bytes());
        string(&mut out, "log");
        out.extend_from_slice(&(parts.len() as i32).to_be_bytes());
        for (partition, error, base) in parts {
            out.extend_from_slice(&partition.to_be_bytes());
            out.extend_from_slice(&error.to_be_bytes());
            out.extend_from_slice(&base.to_be_bytes());
            out.extend_from_slice(&(-1i64).to_be_bytes());
            if version >= 5 {
                out.extend_from_slice(&0i64.to_be_bytes());
            }
        }
        out.extend_from_slice(&0i32.to_be_bytes());
        out
    }

    #[test]
    fn produce_answers_of_every_version_spoken_read_the_same() {
        for version in PRODUCE_MIN..=PRODUCE_MAX {
            let body = answer(version, &[(3, 0, 17), (0, 6, -1)]);
            assert_eq!(
                produce_answer(version, &body).unwrap(),
                vec![
                    Landed {
                        partition: 3,
                        error: 0,
                        base_offset: 17
                    },
                    Landed {
                        partition: 0,
                        error: 6,
                        base_offset: -1
                    }
                ],
                "v{version}"
            );
        }
    }

    #[test]
    fn a_cut_or_hostile_answer_is_an_error_not_a_panic() {
        let body = answer(7, &[(3, 0, 17)]);
        for end in 0..body.len() {
            assert!(produce_answer(7, &body[..end]).is_err(), "cut at {end}");
        }
        let mut huge = body.clone();
        huge[..4].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(produce_answer(7, &huge).is_err());
        let mut negative = body;
        negative[..4].copy_from_slice(&(-5i32).to_be_bytes());
        assert!(produce_answer(7, &negative).is_err());
        assert!(correlation(&[0, 0]).is_err());
        assert_eq!(correlation(&[0, 0, 0, 9, 1]).unwrap(), (9, &[1u8][..]));
    }

    #[test]
    fn the_produce_version_is_the_newest_both_sides_take() {
        let versions = |entries: &[(i16, i16, i16)]| {
            let mut out = 0i16.to_be_bytes().to_vec();
            out.extend_from_slice(&(entries.len() as i32).to_be_bytes());
            for (key, min, max) in entries {
                for v in [key, min, max] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
            }
            out
        };
        assert_eq!(produce_version(&versions(&[(18, 0, 3), (0, 3, 12)])), Ok(7));
        assert_eq!(produce_version(&versions(&[(0, 0, 5)])), Ok(5));
        let refused = produce_version(&versions(&[(0, 0, 2)])).unwrap_err();
        assert_eq!(refused.code, Some(Code::CLU0001));
        assert!(refused.message.contains("v0-v2"), "{refused}");
        assert!(produce_version(&versions(&[(0, 8, 12)])).is_err());
        assert!(produce_version(&versions(&[(1, 0, 12)])).is_err());
        let mut failed = versions(&[(0, 3, 9)]);
        failed[..2].copy_from_slice(&35i16.to_be_bytes());
        assert!(produce_version(&failed).is_err());
    }
}
