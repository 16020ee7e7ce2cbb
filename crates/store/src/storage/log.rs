//! The partition log of cluster mode (`docs/cluster.md`): the records a partition's leader
//! appends to its Kafka partition, how they are encoded, which of them count (epoch fencing),
//! and where a node's store keeps its position in each partition's log.
//!
//! Records come from the network: decoding checks every length against the bytes there are and
//! against a maximum, names tables only by their number in [`crate::schema`], and answers a
//! coded error (CLU0003), never a panic.

use redb::ReadableDatabase;

use super::write_set::{BytesTable, Op, WriteSet};
use crate::errors::{Code, CodedError};
use crate::schema;

// Where this node's store is in each partition's log. Key: partition (u32 BE). Value: a
// `Position` as `Position::encode` writes it.
use crate::schema::CLUSTER_LOG as POSITIONS;

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

fn bad(why: impl std::fmt::Display) -> CodedError {
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
                writes: WriteSet {
                    ops: decode_ops(&mut r)?,
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

/// What a reader does with a record, by the fencing rule of `docs/cluster.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// An epoch record that takes the partition over.
    Accepted,
    /// Writes of the current leader, landed where it meant them: apply them.
    Apply,
    /// A stale epoch record, writes of a leader that is not the current one, or writes that
    /// landed elsewhere than their leader meant (a record of its before them was lost).
    Ignore,
}

/// A partition's log read so far: the next offset to read and who leads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Position {
    /// The offset of the next record to read.
    pub next: i64,
    /// The current leader (epoch 0: none yet).
    pub leader: Leader,
}

impl Position {
    /// Reads the record at `offset`: what to do with it, and the position after it.
    pub fn admit(&mut self, offset: i64, record: &Record) -> Verdict {
        self.next = offset.saturating_add(1);
        match record {
            Record::Epoch(leader) if leader.epoch > self.leader.epoch => {
                self.leader = leader.clone();
                Verdict::Accepted
            }
            Record::Epoch(_) => Verdict::Ignore,
            Record::Writes {
                epoch,
                incarnation,
                at,
                ..
            } if *epoch == self.leader.epoch
                && *incarnation == self.leader.incarnation
                && self.leader.epoch > 0
                && at.is_none_or(|at| at == offset) =>
            {
                Verdict::Apply
            }
            Record::Writes { .. } => Verdict::Ignore,
        }
    }

    /// The row's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.next.to_be_bytes());
        out.extend_from_slice(&Record::Epoch(self.leader.clone()).encode());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, CodedError> {
        let (next, rest) = bytes
            .split_first_chunk::<8>()
            .ok_or_else(|| bad("a position row shorter than 8 bytes"))?;
        let Record::Epoch(leader) = Record::decode(rest, usize::MAX)? else {
            return Err(bad("a position row without its leader"));
        };
        Ok(Self {
            next: i64::from_be_bytes(*next),
            leader,
        })
    }

    /// Writes this position of `partition` with `writes`, in the same transaction.
    pub fn save(&self, partition: u32, writes: &mut WriteSet) {
        writes.put(POSITIONS, &partition.to_be_bytes(), self.encode());
    }

    /// The stored position of every partition (a partition never read is absent).
    pub fn load_all(
        db: &redb::Database,
    ) -> Result<std::collections::HashMap<u32, Position>, CodedError> {
        let txn = db.begin_read().map_err(read_failed)?;
        let table = match txn.open_table(POSITIONS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Default::default()),
            Err(e) => return Err(read_failed(e)),
        };
        let mut all = std::collections::HashMap::new();
        for row in redb::ReadableTable::iter(&table).map_err(read_failed)? {
            let (key, value) = row.map_err(read_failed)?;
            let partition = <[u8; 4]>::try_from(key.value())
                .map(u32::from_be_bytes)
                .map_err(|_| bad("a position row whose key is not a partition"))?;
            all.insert(partition, Position::decode(value.value())?);
        }
        Ok(all)
    }
}

fn read_failed(e: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::RT0009, format!("cannot read the log positions: {e}"))
}

impl WriteSet {
    /// Moves the writes of `other` to the end of this set.
    pub fn append(&mut self, other: &mut WriteSet) {
        self.ops.append(&mut other.ops);
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

    fn leader(epoch: u64, incarnation: u64) -> Record {
        Record::Epoch(Leader {
            epoch,
            incarnation,
            ..Leader::default()
        })
    }

    fn writes(epoch: u64, incarnation: u64) -> Record {
        Record::Writes {
            epoch,
            incarnation,
            at: None,
            writes: WriteSet::default(),
        }
    }

    fn writes_at(epoch: u64, incarnation: u64, at: i64) -> Record {
        Record::Writes {
            epoch,
            incarnation,
            at: Some(at),
            writes: WriteSet::default(),
        }
    }

    #[test]
    fn a_leaders_record_counts_only_where_it_meant_to_land() {
        let mut at = Position::default();
        assert_eq!(at.admit(0, &leader(1, 10)), Verdict::Accepted);
        assert_eq!(at.admit(1, &writes_at(1, 10, 1)), Verdict::Apply);
        // The record meant for offset 2 was lost (a failed produce); the ones sent behind it
        // landed one early: none of them counts, or the state would miss the lost writes.
        assert_eq!(at.admit(2, &writes_at(1, 10, 3)), Verdict::Ignore);
        assert_eq!(at.admit(3, &writes_at(1, 10, 4)), Verdict::Ignore);
        // The next leader's records count again.
        assert_eq!(at.admit(4, &leader(2, 20)), Verdict::Accepted);
        assert_eq!(at.admit(5, &writes_at(2, 20, 5)), Verdict::Apply);
    }

    #[test]
    fn only_the_current_leaders_writes_count() {
        let mut at = Position::default();
        // Nobody leads yet: writes are ignored.
        assert_eq!(at.admit(0, &writes(0, 0)), Verdict::Ignore);
        assert_eq!(at.admit(1, &leader(1, 10)), Verdict::Accepted);
        assert_eq!(at.admit(2, &writes(1, 10)), Verdict::Apply);
        // A second epoch record of the same number (a race) loses.
        assert_eq!(at.admit(3, &leader(1, 11)), Verdict::Ignore);
        assert_eq!(at.admit(4, &writes(1, 11)), Verdict::Ignore);
        // A takeover; the old leader is now a zombie.
        assert_eq!(at.admit(5, &leader(2, 20)), Verdict::Accepted);
        assert_eq!(at.admit(6, &writes(1, 10)), Verdict::Ignore);
        assert_eq!(at.admit(7, &writes(2, 20)), Verdict::Apply);
        assert_eq!(at.next, 8);
    }

    #[test]
    fn positions_are_stored_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::storage::Store::open(dir.path()).unwrap();
        let position = Position {
            next: 42,
            leader: Leader {
                epoch: 2,
                incarnation: 5,
                node: "n2".into(),
                ..Leader::default()
            },
        };
        let mut set = WriteSet::default();
        position.save(3, &mut set);
        set.commit_now(&store);
        let all = store.with_db(Position::load_all).unwrap().unwrap();
        assert_eq!(all.get(&3), Some(&position));
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

        /// A reader that resumes from a stored position (a replica restarting from its store,
        /// a new leader's takeover) agrees with one that read the whole log on every verdict
        /// after it, whatever the log holds: the rule reads nothing but the log and what the
        /// stored position keeps. It fails if the position's row forgets state the rule uses.
        #[test]
        fn readers_agree(
            log in proptest::collection::vec((0..3u8, 0..4u64, 0..3u64, 0..40i64), 0..40),
            resume in 0..40usize,
        ) {
            let records: Vec<Record> = log
                .into_iter()
                .map(|(kind, epoch, incarnation, at)| match kind {
                    0 => leader(epoch, incarnation),
                    1 => writes(epoch, incarnation),
                    _ => writes_at(epoch, incarnation, at),
                })
                .collect();
            let mut whole = Position::default();
            let mut resumed: Option<Position> = None;
            let mut epochs = Vec::new();
            for (offset, record) in records.iter().enumerate() {
                if offset == resume {
                    let row = whole.encode();
                    resumed = Some(Position::decode(&row).unwrap());
                }
                let verdict = whole.admit(offset as i64, record);
                if let Some(resumed) = resumed.as_mut() {
                    prop_assert_eq!(&verdict, &resumed.admit(offset as i64, record));
                    prop_assert_eq!(&whole.leader, &resumed.leader);
                }
                if verdict == Verdict::Accepted {
                    epochs.push(whole.leader.epoch);
                }
            }
            // Accepted epochs only grow.
            prop_assert!(epochs.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
