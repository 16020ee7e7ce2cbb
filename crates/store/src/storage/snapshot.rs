//! A partition's state as a snapshot (`docs/cluster.md`, "Snapshots"): every row of the
//! partition tables the partition owns, and its position in its log, read in one transaction so
//! that they are the state of exactly the log before that position. A leader writes it to the
//! snapshot topic as chunks and then a manifest; a node whose log position was deleted loads the
//! newest complete one and reads the log on from where it ends.
//!
//! The partition tables hold every partition's rows side by side, each partition's in a range
//! of its own (`layout.rs`): which partition owns a row follows from its key ([`owner`]), as
//! the invocation ids and object names in it say, and the view keys the row by it. Snapshot
//! rows carry the logical keys, as log records do; a store applying them keys them by its own
//! partition count.
//!
//! Snapshot records come from the network: decoding checks every length and answers a coded
//! error (CLU0003), never a panic.

use redb::{ReadableDatabase, ReadableTable};

use super::changes::{Changed, Changes};
use super::fencing::Position;
use super::layout;
use super::record::{Record, bad};
use super::write_set::WriteSet;
use crate::schema::{self, BytesTable, Role};
use sluice_core::errors::{Code, CodedError};

/// Version 2 manifests say what they build on; version 1 (whole snapshots only) is still read.
const VERSION: u8 = 2;
const KIND_CHUNK: u8 = 1;
const KIND_MANIFEST: u8 = 2;

/// What a snapshot's chunks add up to, written after the last of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Names the snapshot its chunks carry.
    pub id: u64,
    /// How many chunks came before it.
    pub chunks: u32,
    /// How many rows they hold.
    pub rows: u64,
    /// The partition's log position the state is at: a node that loads it reads on from
    /// `position.next`, with `position.leader` as the current leader.
    pub position: Position,
    /// `None`: the chunks hold the partition's whole state. Otherwise the id of the snapshot
    /// this one builds on: its chunks hold what changed since (puts, deletes and range
    /// deletes, applied in order over it).
    pub base: Option<u64>,
}

/// One record of a partition's snapshot topic.
#[derive(Debug)]
pub enum SnapshotRecord {
    /// Rows of snapshot `id`, the `seq`th chunk (from 0), as puts.
    Chunk {
        /// The snapshot.
        id: u64,
        /// Its place among the snapshot's chunks.
        seq: u32,
        /// The rows.
        rows: WriteSet,
    },
    /// The snapshot is complete.
    Manifest(Manifest),
}

impl SnapshotRecord {
    /// Its bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        match self {
            Self::Chunk { id, seq, rows } => {
                out.push(KIND_CHUNK);
                out.extend_from_slice(&id.to_be_bytes());
                out.extend_from_slice(&seq.to_be_bytes());
                // The rows as a write set's record, which has the bounded decoder already.
                out.extend_from_slice(&writes_record(rows));
            }
            Self::Manifest(manifest) => {
                out.push(KIND_MANIFEST);
                out.extend_from_slice(&manifest.id.to_be_bytes());
                out.extend_from_slice(&manifest.chunks.to_be_bytes());
                out.extend_from_slice(&manifest.rows.to_be_bytes());
                match manifest.base {
                    None => out.push(0),
                    Some(base) => {
                        out.push(1);
                        out.extend_from_slice(&base.to_be_bytes());
                    }
                }
                out.extend_from_slice(&manifest.position.encode());
            }
        }
        out
    }

    /// Reads a record of at most `max` bytes.
    pub fn decode(bytes: &[u8], max: usize) -> Result<Self, CodedError> {
        if bytes.len() > max {
            return Err(bad(format!(
                "a snapshot record of {} bytes, more than {max}",
                bytes.len()
            )));
        }
        let [version, kind, rest @ ..] = bytes else {
            return Err(bad("a snapshot record shorter than 2 bytes"));
        };
        if !(1..=VERSION).contains(version) {
            return Err(bad(format!("snapshot record version {version}")));
        }
        let (id, rest) = rest
            .split_first_chunk::<8>()
            .ok_or_else(|| bad("a snapshot record without its id"))?;
        let id = u64::from_be_bytes(*id);
        match *kind {
            KIND_CHUNK => {
                let (seq, rest) = rest
                    .split_first_chunk::<4>()
                    .ok_or_else(|| bad("a snapshot chunk without its number"))?;
                let Record::Writes { writes, .. } = Record::decode(rest, max)? else {
                    return Err(bad("a snapshot chunk without rows"));
                };
                Ok(Self::Chunk {
                    id,
                    seq: u32::from_be_bytes(*seq),
                    rows: writes,
                })
            }
            KIND_MANIFEST => {
                let (chunks, rest) = rest
                    .split_first_chunk::<4>()
                    .ok_or_else(|| bad("a snapshot manifest without its chunk count"))?;
                let (rows, rest) = rest
                    .split_first_chunk::<8>()
                    .ok_or_else(|| bad("a snapshot manifest without its row count"))?;
                let (base, rest) = match (*version, rest) {
                    (1, rest) => (None, rest),
                    (_, [0, rest @ ..]) => (None, rest),
                    (_, [1, rest @ ..]) => {
                        let (base, rest) = rest
                            .split_first_chunk::<8>()
                            .ok_or_else(|| bad("a snapshot manifest without its base"))?;
                        (Some(u64::from_be_bytes(*base)), rest)
                    }
                    _ => return Err(bad("a snapshot manifest without its kind")),
                };
                Ok(Self::Manifest(Manifest {
                    id,
                    chunks: u32::from_be_bytes(*chunks),
                    rows: u64::from_be_bytes(*rows),
                    position: Position::decode(rest)?,
                    base,
                }))
            }
            other => Err(bad(format!("unknown snapshot record kind {other}"))),
        }
    }
}

fn writes_record(rows: &WriteSet) -> Vec<u8> {
    // A write set's record carries an epoch, which a snapshot has no use for: its rows are
    // state, not a leader's writes.
    let record = Record::Writes {
        epoch: 0,
        incarnation: 0,
        at: None,
        writes: rows.clone(),
    };
    record.encode()
}

pub use super::layout::owner;

/// The logical key of a row of table `name` as the view holds it.
fn logical_of<'a>(name: &str, stored: &'a [u8]) -> &'a [u8] {
    if layout::keyed(name) {
        layout::logical(stored)
    } else {
        stored
    }
}

/// Every partition table.
fn partition_tables() -> impl Iterator<Item = (&'static str, BytesTable)> {
    schema::TABLES.iter().filter_map(|t| match t.role {
        Role::Partition { log_id } => schema::partition_table(log_id).map(|table| (t.name, table)),
        _ => None,
    })
}

fn storage(e: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::RT0009, format!("partition snapshot: {e}"))
}

/// A snapshot read from a store: where it is in the log, and its rows in chunks.
#[derive(Debug)]
pub struct Exported {
    /// The log position the rows are at.
    pub position: Position,
    /// Sets of about the chunk size each.
    pub chunks: Vec<WriteSet>,
    /// Whether the chunks hold the whole state (or only what changed).
    pub whole: bool,
}

/// Partition `p`'s state in `db` (of `partitions`): its position in its log and, when `whole`
/// or when `changes` cannot say what changed, all its rows as puts; otherwise what `changes`
/// noted, as it is at that position (a put for a key present, a delete for one gone, each range
/// deleted followed by the rows now in it). In sets of about `chunk_bytes` each. `None` when
/// this store never read the partition, or holds it only up to `newer_than` (the log did not
/// move since the last snapshot there: nothing is read).
pub fn export(
    db: &redb::Database,
    p: u32,
    partitions: u32,
    chunk_bytes: usize,
    newer_than: i64,
    changes: &Changes,
    whole: bool,
) -> Result<Option<Exported>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Some(position) = Position::load_in(&txn, p)?.filter(|at| at.next > newer_than) else {
        return Ok(None);
    };
    let mut chunks = Chunks::new(chunk_bytes);
    let changed = if whole {
        None
    } else {
        changes.take(position.next)
    };
    let whole = match changed {
        None => {
            changes.covered(position.next);
            owned_rows(&txn, p, partitions, |table, key, value| {
                chunks.put(table, key, value);
            })?;
            true
        }
        Some(changed) => {
            changed_rows(&txn, p, partitions, &changed, &mut chunks)?;
            false
        }
    };
    Ok(Some(Exported {
        position,
        chunks: chunks.done(),
        whole,
    }))
}

/// Writes in sets of about a chunk's bytes.
struct Chunks {
    bytes: usize,
    size: usize,
    sets: Vec<WriteSet>,
}

impl Chunks {
    fn new(bytes: usize) -> Self {
        Self {
            bytes,
            size: 0,
            sets: vec![WriteSet::default()],
        }
    }

    /// The set the next write of `bytes` goes in.
    fn room(&mut self, bytes: usize) -> &mut WriteSet {
        if self.size > 0 && self.size + bytes > self.bytes {
            self.sets.push(WriteSet::default());
            self.size = 0;
        }
        self.size += bytes + 16;
        self.sets.last_mut().expect("never empty")
    }

    fn put(&mut self, table: BytesTable, key: &[u8], value: &[u8]) {
        self.room(key.len() + value.len())
            .put(table, key, value.to_vec());
    }

    fn done(mut self) -> Vec<WriteSet> {
        if self.sets.last().is_some_and(WriteSet::is_empty) && self.sets.len() > 1 {
            self.sets.pop();
        }
        self.sets
    }
}

/// The writes that bring a store holding partition `p`'s last snapshot to the state in `txn`,
/// given what `changed`: each range deleted then refilled with its rows now, and each key put
/// as it is now or deleted. Keys of another partition (which no leader of `p` writes) are left
/// out.
fn changed_rows(
    txn: &redb::ReadTransaction,
    p: u32,
    partitions: u32,
    changed: &Changed,
    chunks: &mut Chunks,
) -> Result<(), CodedError> {
    let stored = layout::partitions_read(txn).map_err(storage)?;
    let mut keys = layout::Keys::new(stored);
    for (table, start, end) in &changed.ranges {
        let name = redb::TableHandle::name(table);
        chunks
            .room(start.len() + end.len())
            .delete_range(*table, start.clone(), end.clone());
        let read = match txn.open_table(*table) {
            Ok(read) => read,
            Err(redb::TableError::TableDoesNotExist(_)) => continue,
            Err(e) => return Err(storage(e)),
        };
        let (from, to) = keys.range(name, start, end);
        for entry in read
            .range(from.as_slice()..to.as_slice())
            .map_err(storage)?
        {
            let (key, value) = entry.map_err(storage)?;
            let key = logical_of(name, key.value());
            if owner(name, key, partitions) == Some(p) {
                chunks.put(*table, key, value.value());
            }
        }
    }
    for (table, key) in &changed.keys {
        let name = redb::TableHandle::name(table);
        if owner(name, key, partitions) != Some(p) {
            continue;
        }
        let value = match txn.open_table(*table) {
            Ok(read) => read.get(keys.of(name, key)).map_err(storage)?,
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(storage(e)),
        };
        match value {
            Some(value) => chunks.put(*table, key, value.value()),
            None => chunks.room(key.len()).delete(*table, key),
        }
    }
    Ok(())
}

/// Calls `row` with every row of the partition tables in `txn` that partition `p` (of
/// `partitions`) owns: its table, key and value.
fn owned_rows(
    txn: &redb::ReadTransaction,
    p: u32,
    partitions: u32,
    mut row: impl FnMut(BytesTable, &[u8], &[u8]),
) -> Result<(), CodedError> {
    // Keyed by the same count, the partition's rows of a keyed table are one range; a store
    // keyed by another count (not yet told the cluster's) is read whole.
    let stored = layout::partitions_read(txn).map_err(storage)?;
    for (name, table) in partition_tables() {
        let read = match txn.open_table(table) {
            Ok(read) => read,
            Err(redb::TableError::TableDoesNotExist(_)) => continue,
            Err(e) => return Err(storage(e)),
        };
        let rows = if layout::keyed(name) && stored == partitions {
            match layout::range_of(p) {
                (start, Some(end)) => read.range(start.as_slice()..end.as_slice()),
                (start, None) => read.range(start.as_slice()..),
            }
        } else {
            read.iter()
        };
        for entry in rows.map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let key = logical_of(name, key.value());
            if owner(name, key, partitions) == Some(p) {
                row(table, key, value.value());
            }
        }
    }
    Ok(())
}

/// The writes that replace partition `p`'s rows in `db` with a snapshot's (`chunks`) and set
/// its position to `position`: once committed, the store holds the partition exactly as the
/// snapshot does. Nothing else may write the partition's rows meanwhile (it is not led here,
/// and the replica reader, its only writer, builds these).
pub fn replacing(
    db: &redb::Database,
    p: u32,
    partitions: u32,
    chunks: Vec<WriteSet>,
    position: &Position,
) -> Result<WriteSet, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let mut writes = WriteSet::default();
    owned_rows(&txn, p, partitions, |table, key, _| {
        writes.delete(table, key)
    })?;
    for mut chunk in chunks {
        writes.append(&mut chunk);
    }
    position.save(p, &mut writes);
    Ok(writes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Store;
    use sluice_core::ids::InvocationId;

    fn id(partition_key: u64, n: u128) -> InvocationId {
        InvocationId::new(partition_key, n)
    }

    fn object_key(scope: &str, service: &str, object: &str, name: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for part in [scope, service, object] {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(part.as_bytes());
        }
        out.extend_from_slice(name.as_bytes());
        out
    }

    #[test]
    fn every_partition_table_has_an_owner_rule() {
        // A table without one would be left out of every snapshot: a new partition table must
        // say here which partition owns its rows.
        for (name, _) in partition_tables() {
            let key = vec![0; 64];
            assert!(
                owner(name, &key, 4).is_some(),
                "no owner rule for partition table {name}"
            );
        }
    }

    #[test]
    fn rows_belong_to_the_partition_of_their_invocation_or_object() {
        let a = id(5, 1);
        let mut timer = 7u64.to_be_bytes().to_vec();
        timer.extend_from_slice(&a.to_bytes());
        assert_eq!(owner("invocations", &a.to_bytes(), 4), Some(1));
        assert_eq!(owner("timers", &timer, 4), Some(1));
        let plain = crate::invocation::identity::partition_key(&["Counter", "k"]);
        assert_eq!(
            owner("state", &object_key("", "Counter", "k", "n"), 4),
            Some((plain % 4) as u32)
        );
        let scoped = crate::invocation::identity::partition_key(&["acme"]);
        assert_eq!(
            owner("promises", &object_key("acme", "Flow", "k", "p"), 4),
            Some((scoped % 4) as u32)
        );
        assert_eq!(owner("flow_quotas", &3u32.to_be_bytes(), 4), Some(3));
        assert_eq!(owner("flow_quotas", &9u32.to_be_bytes(), 4), None);
        // Hostile keys: too short, lengths past the end.
        assert_eq!(owner("journal", &[1, 2, 3], 4), None);
        assert_eq!(owner("state", &[0, 0, 0, 200, 1], 4), None);
    }

    /// `chunks` encoded as a snapshot's chunk records and decoded again, as a replica reads them.
    fn through_the_topic(chunks: Vec<WriteSet>) -> Vec<WriteSet> {
        chunks
            .into_iter()
            .enumerate()
            .map(|(seq, rows)| {
                let record = SnapshotRecord::Chunk {
                    id: 7,
                    seq: seq as u32,
                    rows,
                }
                .encode();
                match SnapshotRecord::decode(&record, 1 << 20).unwrap() {
                    SnapshotRecord::Chunk { rows, .. } => rows,
                    SnapshotRecord::Manifest(_) => unreachable!(),
                }
            })
            .collect()
    }

    #[test]
    fn a_snapshot_moves_exactly_one_partitions_state_to_another_store() {
        let (from_dir, to_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (from, to) = (
            Store::open(from_dir.path()).unwrap(),
            Store::open(to_dir.path()).unwrap(),
        );
        // The leader's store keyed by the cluster's count (a snapshot reads one range); the
        // other's by another, read whole.
        from.use_partitions(4).unwrap();
        let mut rows = WriteSet::default();
        for n in 0..200u128 {
            let inv = id(n as u64, n);
            rows.put(schema::INVOCATIONS, &inv.to_bytes(), vec![n as u8; 100]);
        }
        let position = Position {
            next: 42,
            ..Position::default()
        };
        position.save(1, &mut rows);
        rows.commit_now(&from);
        // The other store holds stale rows of partition 1 and rows of partition 2.
        let mut stale = WriteSet::default();
        stale.put(
            schema::INVOCATIONS,
            &id(1, 999).to_bytes(),
            b"stale".to_vec(),
        );
        stale.put(
            schema::INVOCATIONS,
            &id(2, 998).to_bytes(),
            b"other".to_vec(),
        );
        stale.commit_now(&to);

        let Exported {
            position: read_position,
            chunks,
            whole,
        } = from
            .with_db(|db| export(db, 1, 4, 2_000, -1, &Changes::new(1 << 20), false))
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(whole, "nothing noted since the last snapshot here: whole");
        assert_eq!(read_position, position);
        assert!(chunks.len() > 1, "{} chunks", chunks.len());
        let decoded = through_the_topic(chunks);
        let replace = to
            .with_db(|db| replacing(db, 1, 4, decoded, &read_position))
            .unwrap()
            .unwrap();
        replace.commit_now(&to);
        let moved = whole_rows(&to, 1);
        assert_eq!(moved.iter().map(WriteSet::len).sum::<usize>(), 50);
        let stored = |id: InvocationId| {
            to.with_db(|db| {
                let txn = db.begin_read().unwrap();
                let table = txn.open_table(schema::INVOCATIONS).unwrap();
                let partitions = layout::partitions_read(&txn).unwrap();
                let key = layout::physical("invocations", &id.to_bytes(), partitions);
                table.get(key.as_slice()).unwrap().is_some().then_some(())
            })
            .unwrap()
        };
        assert!(stored(id(1, 999)).is_none(), "stale row");
        assert!(stored(id(2, 998)).is_some(), "another partition's row");
        let positions = to.with_db(Position::load_all).unwrap().unwrap();
        assert_eq!(positions.get(&1), Some(&read_position));
    }

    /// Partition `p`'s rows in `store`, whole, as one sorted list of (table, key, value).
    fn whole_rows(store: &Store, p: u32) -> Vec<WriteSet> {
        store
            .with_db(|db| export(db, p, 4, usize::MAX, -1, &Changes::new(0), true))
            .unwrap()
            .unwrap()
            .unwrap()
            .chunks
    }

    fn rows_of(store: &Store, p: u32) -> Vec<(String, Vec<u8>, Vec<u8>)> {
        let txn = store.with_db(|db| db.begin_read().unwrap()).unwrap();
        let mut rows = Vec::new();
        owned_rows(&txn, p, 4, |table, key, value| {
            rows.push((
                redb::TableHandle::name(&table).to_string(),
                key.to_vec(),
                value.to_vec(),
            ));
        })
        .unwrap();
        rows
    }

    /// Commits `writes` to `store` as the record at log offset `at` of partition 1, noted in
    /// `changes` as a leader's pipeline notes it.
    fn lead(store: &Store, changes: &Changes, at: i64, mut writes: WriteSet) {
        let (writer, mut staged) = crate::storage::writer::Writer::staged();
        drop(writer.commit(writes.clone()));
        changes.note(at, &staged.try_group(usize::MAX).unwrap());
        Position {
            next: at + 1,
            ..Position::default()
        }
        .save(1, &mut writes);
        writes.commit_now(store);
    }

    #[test]
    fn a_whole_snapshot_and_the_incrementals_after_it_compose_to_the_leaders_state() {
        let (from_dir, to_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (from, to) = (
            Store::open(from_dir.path()).unwrap(),
            Store::open(to_dir.path()).unwrap(),
        );
        let changes = Changes::new(1 << 20);
        // Partition 1 of 4: invocations 1, 5, 9, ... and their journals.
        let inv = |n: u64| id(1 + 4 * n, u128::from(n)).to_bytes();
        let journal = |n: u64, entry: u8| {
            let mut key = inv(n).to_vec();
            key.push(entry);
            key
        };
        let mut first = WriteSet::default();
        for n in 0..100 {
            first.put(schema::INVOCATIONS, &inv(n), vec![1; 50]);
            for entry in 0..3 {
                first.put(schema::JOURNAL, &journal(n, entry), vec![entry; 20]);
            }
        }
        lead(&from, &changes, 0, first);
        let whole = from
            .with_db(|db| export(db, 1, 4, 4_000, -1, &changes, false))
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(whole.whole, "the first snapshot a leader takes is whole");
        let whole_rows_count: usize = whole.chunks.iter().map(WriteSet::len).sum();
        assert_eq!(whole_rows_count, 400);

        // A few rows change: puts, a delete, a range delete (one invocation's journal), and a
        // range delete refilled in the same interval.
        let mut second = WriteSet::default();
        second.put(schema::INVOCATIONS, &inv(3), vec![2; 50]);
        second.put(schema::INVOCATIONS, &inv(500), vec![3; 50]);
        second.delete(schema::INVOCATIONS, &inv(4));
        second.delete_range(schema::JOURNAL, journal(7, 0), journal(7, 9));
        second.delete_range(schema::JOURNAL, journal(8, 0), journal(8, 9));
        lead(&from, &changes, 1, second);
        let mut third = WriteSet::default();
        third.put(schema::JOURNAL, &journal(8, 5), vec![9; 20]);
        lead(&from, &changes, 2, third);
        let first_inc = from
            .with_db(|db| export(db, 1, 4, 4_000, whole.position.next - 1, &changes, false))
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(!first_inc.whole);
        let ops: usize = first_inc.chunks.iter().map(WriteSet::len).sum();
        assert!(
            ops < 20,
            "an incremental holds what changed, not the state: {ops} writes"
        );

        let mut fourth = WriteSet::default();
        fourth.delete(schema::INVOCATIONS, &inv(500));
        fourth.put(schema::INVOCATIONS, &inv(6), vec![4; 50]);
        lead(&from, &changes, 3, fourth);
        let second_inc = from
            .with_db(|db| {
                export(
                    db,
                    1,
                    4,
                    4_000,
                    first_inc.position.next - 1,
                    &changes,
                    false,
                )
            })
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(!second_inc.whole);

        // Through the topic's encoding, onto a store with stale rows of the partition.
        let mut stale = WriteSet::default();
        stale.put(schema::INVOCATIONS, &inv(900), b"stale".to_vec());
        stale.commit_now(&to);
        let mut chain = through_the_topic(whole.chunks);
        chain.extend(through_the_topic(first_inc.chunks));
        chain.extend(through_the_topic(second_inc.chunks));
        to.with_db(|db| replacing(db, 1, 4, chain, &second_inc.position))
            .unwrap()
            .unwrap()
            .commit_now(&to);
        assert_eq!(rows_of(&to, 1), rows_of(&from, 1));
        assert!(rows_of(&to, 1).iter().any(|(_, _, v)| v == &vec![9; 20]));
        let positions = to.with_db(Position::load_all).unwrap().unwrap();
        assert_eq!(positions.get(&1), Some(&second_inc.position));
    }

    #[test]
    fn hostile_snapshot_records_are_refused_with_a_code() {
        let manifest = SnapshotRecord::Manifest(Manifest {
            id: 3,
            chunks: 2,
            rows: 10,
            position: Position::default(),
            base: Some(2),
        })
        .encode();
        assert!(matches!(
            SnapshotRecord::decode(&manifest, 1 << 20).unwrap(),
            SnapshotRecord::Manifest(Manifest {
                id: 3,
                chunks: 2,
                rows: 10,
                base: Some(2),
                ..
            })
        ));
        for cut in 0..manifest.len() {
            let e = SnapshotRecord::decode(&manifest[..cut], 1 << 20).unwrap_err();
            assert_eq!(e.code, Some(Code::CLU0003), "{cut}: {e}");
        }
        assert!(
            SnapshotRecord::decode(&manifest, 4).is_err(),
            "over the bound"
        );
        assert!(SnapshotRecord::decode(&[1, 9, 0, 0, 0, 0, 0, 0, 0, 0], 64).is_err());
    }
}
