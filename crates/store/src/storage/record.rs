//! The write-set record: what a log (the local segment log, a partition's Kafka log) carries —
//! a leader's epoch record, or the writes of a group of sets — and how it is encoded.
//!
//! Records come from the disk and the network: decoding checks every length against the bytes
//! there are and against a maximum, names tables only by their number in [`crate::schema`], and
//! answers a coded error (CLU0003), never a panic.

use super::write_set::{BytesTable, Op, WriteSet};
use crate::schema;
use sluice_core::errors::{Code, CodedError};

const VERSION: u8 = 1;
const KIND_EPOCH: u8 = 1;
const KIND_WRITES: u8 = 2;
/// Writes that also name the offset they were meant to land at (every leader's since several
/// records may be in flight; `docs/cluster.md`).
const KIND_WRITES_AT: u8 = 3;
const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_DELETE_RANGE: u8 = 3;

/// Who leads a partition, as its epoch record says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leader {
    /// Grows with every accepted takeover.
    pub epoch: u64,
    /// Drawn at random by the taking node, so two epoch records of one number differ.
    pub incarnation: u64,
    /// The node's id.
    pub node: String,
    /// Its ingress URL.
    pub ingress: String,
    /// Its admin URL.
    pub admin: String,
}

/// One record of a partition's log.
#[derive(Debug)]
pub enum Record {
    /// A node takes the partition over.
    Epoch(Leader),
    /// Writes of the leader of `(epoch, incarnation)`.
    Writes {
        /// The writer's epoch.
        epoch: u64,
        /// The writer's incarnation.
        incarnation: u64,
        /// The offset the leader meant the record to land at: a record that landed anywhere
        /// else counts nowhere. `None` in the local log of embedded mode, which numbers its
        /// records itself.
        at: Option<i64>,
        /// The writes, in order.
        writes: WriteSet,
    },
}

pub(super) fn bad(why: impl std::fmt::Display) -> CodedError {
    CodedError::new(
        Code::CLU0003,
        format!("a partition log record cannot be read: {why}"),
    )
}

impl Record {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.push(VERSION);
        match self {
            Record::Epoch(leader) => {
                out.push(KIND_EPOCH);
                out.extend_from_slice(&leader.epoch.to_be_bytes());
                out.extend_from_slice(&leader.incarnation.to_be_bytes());
                for text in [&leader.node, &leader.ingress, &leader.admin] {
                    put_bytes(&mut out, text.as_bytes());
                }
            }
            Record::Writes {
                epoch,
                incarnation,
                at,
                writes,
            } => return encode_writes_with(*epoch, *incarnation, *at, [writes]),
        }
        out
    }

    /// Reads a record of at most `max` bytes.
    pub fn decode(bytes: &[u8], max: usize) -> Result<Self, CodedError> {
        Self::decode_with(bytes, max, true)
    }

    /// [`Record::decode`], but a write set record's writes are left unread (an empty set): what
    /// a replica needs of a record whose writes it does not apply (its own, read back by the
    /// leader; a partition not kept here). Its kind, epoch, incarnation and offset are read and
    /// checked; a damaged write is found by the nodes that apply it.
    pub fn decode_header(bytes: &[u8], max: usize) -> Result<Self, CodedError> {
        Self::decode_with(bytes, max, false)
    }

    fn decode_with(bytes: &[u8], max: usize, writes: bool) -> Result<Self, CodedError> {
        if bytes.len() > max {
            return Err(bad(format!(
                "{} bytes, more than cluster.max-record-bytes ({max})",
                bytes.len()
            )));
        }
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != VERSION {
            return Err(bad(format!(
                "format version {version}; this build reads {VERSION} (run the same Sluice version on every node)"
            )));
        }
        let kind = r.u8()?;
        let epoch = r.u64()?;
        let incarnation = r.u64()?;
        let record = match kind {
            KIND_EPOCH => Record::Epoch(Leader {
                epoch,
                incarnation,
                node: r.text()?,
                ingress: r.text()?,
                admin: r.text()?,
            }),
            KIND_WRITES | KIND_WRITES_AT => Record::Writes {
                epoch,
                incarnation,
                at: if kind == KIND_WRITES_AT {
                    Some(r.u64()? as i64)
                } else {
                    None
                },
                writes: if writes {
                    WriteSet {
                        ops: decode_ops(&mut r)?,
                    }
                } else {
                    r.0 = &[];
                    WriteSet::default()
                },
            },
            other => return Err(bad(format!("unknown kind {other}"))),
        };
        if !r.0.is_empty() {
            return Err(bad(format!("{} bytes after its end", r.0.len())));
        }
        Ok(record)
    }
}

/// The bytes of a write set record of `(epoch, incarnation)` holding `sets`' writes in order:
/// what [`Record::encode`] makes of `Record::Writes`, without first gathering the writes into
/// one set (a leader encodes every group this way, on the write path).
pub fn encode_writes<'a>(
    epoch: u64,
    incarnation: u64,
    sets: impl IntoIterator<Item = &'a WriteSet> + Clone,
) -> Vec<u8> {
    encode_writes_with(epoch, incarnation, None, sets)
}

/// [`encode_writes`] for a record meant to land at offset `at` of its partition's log (a
/// leader's record in cluster mode).
pub fn encode_writes_at<'a>(
    epoch: u64,
    incarnation: u64,
    at: i64,
    sets: impl IntoIterator<Item = &'a WriteSet> + Clone,
) -> Vec<u8> {
    encode_writes_with(epoch, incarnation, Some(at), sets)
}

fn encode_writes_with<'a>(
    epoch: u64,
    incarnation: u64,
    at: Option<i64>,
    sets: impl IntoIterator<Item = &'a WriteSet> + Clone,
) -> Vec<u8> {
    let kind = if at.is_some() {
        KIND_WRITES_AT
    } else {
        KIND_WRITES
    };
    let mut out = vec![VERSION, kind];
    out.extend_from_slice(&epoch.to_be_bytes());
    out.extend_from_slice(&incarnation.to_be_bytes());
    if let Some(at) = at {
        out.extend_from_slice(&(at as u64).to_be_bytes());
    }
    let count: usize = sets.clone().into_iter().map(|set| set.ops.len()).sum();
    out.extend_from_slice(&u32::try_from(count).unwrap_or(u32::MAX).to_be_bytes());
    for set in sets {
        encode_ops(&set.ops, &mut out);
    }
    out
}

/// How many bytes `writes` adds to a record.
pub fn encoded_len(writes: &WriteSet) -> usize {
    encoded_len_after(writes, 0) + 4
}

/// How many bytes the writes of `writes` after its first `skip` add to a record (the count in
/// front of them aside): a set measured as it grows is measured once per write.
pub fn encoded_len_after(writes: &WriteSet, skip: usize) -> usize {
    writes
        .ops
        .iter()
        .skip(skip)
        .map(|op| match op {
            Op::Put(_, a, b) | Op::DeleteRange(_, a, b) => 2 + 8 + a.len() + b.len(),
            Op::Delete(_, a) => 2 + 4 + a.len(),
        })
        .sum::<usize>()
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Lengths past u32 cannot occur: a record is bounded far below that.
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn table_index(table: &BytesTable) -> u8 {
    let name = redb::TableHandle::name(table);
    schema::log_id(name)
        // A table outside the list would be lost on other nodes: that is a bug, not input.
        .unwrap_or_else(|| panic!("table {name} is not a partition table (crate::schema)"))
}

/// Appends `ops` (their count is written before them, by the caller).
fn encode_ops(ops: &[Op], out: &mut Vec<u8>) {
    for op in ops {
        match op {
            Op::Put(table, key, value) => {
                out.extend_from_slice(&[OP_PUT, table_index(table)]);
                put_bytes(out, key);
                put_bytes(out, value);
            }
            Op::Delete(table, key) => {
                out.extend_from_slice(&[OP_DELETE, table_index(table)]);
                put_bytes(out, key);
            }
            Op::DeleteRange(table, start, end) => {
                out.extend_from_slice(&[OP_DELETE_RANGE, table_index(table)]);
                put_bytes(out, start);
                put_bytes(out, end);
            }
        }
    }
}

fn decode_ops(r: &mut Reader<'_>) -> Result<Vec<Op>, CodedError> {
    let count = r.u32()? as usize;
    // Each op takes at least 6 bytes: a count beyond that is a lie, not an allocation.
    if count > r.0.len() / 6 {
        return Err(bad(format!("{count} writes in {} bytes", r.0.len())));
    }
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let code = r.u8()?;
        let index = r.u8()?;
        let table =
            schema::partition_table(index).ok_or_else(|| bad(format!("unknown table {index}")))?;
        ops.push(match code {
            OP_PUT => Op::Put(table, r.bytes()?.to_vec(), r.bytes()?.to_vec()),
            OP_DELETE => Op::Delete(table, r.bytes()?.to_vec()),
            OP_DELETE_RANGE => Op::DeleteRange(table, r.bytes()?.to_vec(), r.bytes()?.to_vec()),
            other => return Err(bad(format!("unknown write {other}"))),
        });
    }
    Ok(ops)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodedError> {
        if self.0.len() < n {
            return Err(bad(format!(
                "it ends early ({n} bytes wanted, {} left)",
                self.0.len()
            )));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, CodedError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, CodedError> {
        let raw = self.take(4)?;
        Ok(u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]))
    }
    fn u64(&mut self) -> Result<u64, CodedError> {
        let raw = self.take(8)?;
        let mut array = [0; 8];
        array.copy_from_slice(raw);
        Ok(u64::from_be_bytes(array))
    }
    fn bytes(&mut self) -> Result<&'a [u8], CodedError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn text(&mut self) -> Result<String, CodedError> {
        let raw = self.bytes()?;
        if raw.len() > 4096 {
            return Err(bad("a name longer than 4096 bytes"));
        }
        String::from_utf8(raw.to_vec()).map_err(|_| bad("a name that is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample() -> WriteSet {
        let mut writes = WriteSet::default();
        writes.put(schema::INVOCATIONS, b"id", b"record".to_vec());
        writes.delete(schema::JOURNAL, b"j");
        writes.delete_range(schema::STATE, b"a".to_vec(), b"b".to_vec());
        writes
    }

    #[test]
    fn records_round_trip() {
        let leader = Leader {
            epoch: 3,
            incarnation: 77,
            node: "n1".into(),
            ingress: "http://127.0.0.1:8080".into(),
            admin: "http://127.0.0.1:9070".into(),
        };
        for record in [
            Record::Epoch(leader),
            Record::Writes {
                epoch: 3,
                incarnation: 77,
                at: None,
                writes: sample(),
            },
            Record::Writes {
                epoch: 3,
                incarnation: 77,
                at: Some(12),
                writes: sample(),
            },
        ] {
            let bytes = record.encode();
            let back = Record::decode(&bytes, usize::MAX).unwrap();
            assert_eq!(back.encode(), bytes);
        }
    }

    #[test]
    fn a_header_read_keeps_who_wrote_where_and_leaves_the_writes() {
        let bytes = encode_writes_at(3, 77, 12, [&sample()]);
        let Ok(Record::Writes {
            epoch: 3,
            incarnation: 77,
            at: Some(12),
            writes,
        }) = Record::decode_header(&bytes, usize::MAX)
        else {
            panic!("the header must read as the record's")
        };
        assert!(writes.is_empty());
        // The header itself is checked as in a full read.
        assert!(Record::decode_header(&bytes[..10], usize::MAX).is_err());
        assert!(Record::decode_header(&bytes, 10).is_err());
        let epoch = Record::Epoch(Leader {
            epoch: 4,
            ..Leader::default()
        })
        .encode();
        assert!(matches!(
            Record::decode_header(&epoch, usize::MAX),
            Ok(Record::Epoch(Leader { epoch: 4, .. }))
        ));
    }

    #[test]
    fn several_sets_encode_as_their_writes_in_one_set() {
        let (first, second) = (sample(), sample());
        let mut both = sample();
        both.append(&mut sample());
        let whole = Record::Writes {
            epoch: 2,
            incarnation: 9,
            at: None,
            writes: both,
        };
        assert_eq!(encode_writes(2, 9, [&first, &second]), whole.encode());
        let Record::Writes { writes: both, .. } = whole else {
            unreachable!()
        };
        let whole_at = Record::Writes {
            epoch: 2,
            incarnation: 9,
            at: Some(4),
            writes: both,
        };
        assert_eq!(
            encode_writes_at(2, 9, 4, [&first, &second]),
            whole_at.encode()
        );
    }

    #[test]
    fn a_record_over_the_limit_or_from_another_version_is_clu0003() {
        let bytes = Record::Writes {
            epoch: 1,
            incarnation: 1,
            at: None,
            writes: sample(),
        }
        .encode();
        let err = Record::decode(&bytes, 10).unwrap_err();
        assert_eq!(err.code, Some(Code::CLU0003));
        let mut other = bytes.clone();
        other[0] = 9;
        assert!(
            Record::decode(&other, usize::MAX)
                .unwrap_err()
                .message
                .contains("format version 9")
        );
    }

    fn any_writes() -> impl Strategy<Value = WriteSet> {
        let op = (
            0..3u8,
            // Every partition table, and one number past them.
            0..8u8,
            proptest::collection::vec(any::<u8>(), 0..16),
            proptest::collection::vec(any::<u8>(), 0..16),
        );
        proptest::collection::vec(op, 0..8).prop_map(|ops| {
            let mut set = WriteSet::default();
            for (kind, table, a, b) in ops {
                let Some(table) = schema::partition_table(table) else {
                    continue;
                };
                match kind {
                    0 => set.put(table, &a, b),
                    1 => set.delete(table, &a),
                    _ => set.delete_range(table, a, b),
                }
            }
            set
        })
    }

    proptest! {
        /// Any bytes: an error or a record, never a panic; a record re-encodes to the bytes.
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(record) = Record::decode(&bytes, 1 << 20) {
                prop_assert_eq!(record.encode(), bytes);
            }
        }

        #[test]
        fn writes_round_trip(
            set in any_writes(),
            epoch in any::<u64>(),
            incarnation in any::<u64>(),
            at in proptest::option::of(0..i64::MAX),
        ) {
            let record = Record::Writes { epoch, incarnation, at, writes: set };
            let bytes = record.encode();
            let back = Record::decode(&bytes, usize::MAX).unwrap();
            prop_assert_eq!(back.encode(), bytes);
        }
    }
}
