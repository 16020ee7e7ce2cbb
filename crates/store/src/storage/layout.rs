//! Where a partition table's rows sit in the view: keyed by partition first.
//!
//! Write sets, log records and snapshot records name rows by their *logical* key (an invocation
//! id, a timer's time and id, an object's name, as `crate::schema` lists them). The view stores
//! each under its owner's index first (u32 BE, [`owner`]): one partition's rows of a table are
//! one range, so a snapshot of it, a purge scan or a store letting it go reads that range and
//! nothing of the other partitions'. The owner follows from the key and the partition count,
//! which the store records (`partitions` in the `meta` table, [`partitions_in`]); every
//! transaction reads it there, so a reader and the writes it reads always agree on where a row
//! is. Changing the count (or opening a store written before rows were keyed by partition,
//! format 1) moves every row once, in one transaction ([`rekey`]).
//!
//! `paused_queues`, `flow_quotas`, `flow_budgets` and `flow_bursts` are keyed by their partition's index
//! already, and stay as they are.

use redb::ReadableTable;

use crate::schema::{BytesTable, META, NamedTable};
use sluice_core::ids::InvocationId;

/// The `meta` row holding the partition count the rows are keyed by (u32 BE).
pub(crate) const PARTITIONS_KEY: &str = "partitions";

/// The prefix of rows no partition owns (a key no partition's writes would make: a bug
/// elsewhere, or a row from a newer version). Kept, out of every partition's range.
pub(crate) const UNOWNED: u32 = u32::MAX;

/// The tables whose rows the view keys by partition.
pub(crate) const KEYED: [&str; 6] = [
    "invocations",
    "journal",
    "timers",
    "purges",
    "state",
    "promises",
];

/// Whether `table`'s rows are keyed by partition in the view.
pub(crate) fn keyed(table: &str) -> bool {
    KEYED.contains(&table)
}

/// The partition (of `partitions`) that owns `key` of partition table `table`: the one whose
/// write sets write it. `None` for a key no partition would write (a bug elsewhere, or a row
/// from a newer version), which a snapshot leaves out.
pub fn owner(table: &str, key: &[u8], partitions: u32) -> Option<u32> {
    let of_key = |partition_key: u64| (partition_key % u64::from(partitions.max(1))) as u32;
    let id_at = |at: usize| {
        key.get(at..at + 24)
            .and_then(|bytes| <[u8; 24]>::try_from(bytes).ok())
            .map(|bytes| of_key(InvocationId::from_bytes(bytes).partition_key()))
    };
    match table {
        // Key: invocation id ‖ …
        "invocations" | "journal" => id_at(0),
        // Key: a time (u64 BE) ‖ invocation id ‖ …
        "timers" | "purges" => id_at(8),
        // Key: the scope, service and object key, each after its u32 BE length ‖ …: a scoped
        // object lives on its scope's partition, any other on its own.
        "state" | "promises" => {
            let mut rest = key;
            let mut part = || -> Option<&str> {
                let (len, tail) = rest.split_first_chunk::<4>()?;
                let len = u32::from_be_bytes(*len) as usize;
                let (text, tail) = (tail.get(..len)?, tail.get(len..)?);
                rest = tail;
                std::str::from_utf8(text).ok()
            };
            let (scope, service, object) = (part()?, part()?, part()?);
            Some(of_key(if scope.is_empty() {
                crate::invocation::identity::partition_key(&[service, object])
            } else {
                crate::invocation::identity::partition_key(&[scope])
            }))
        }
        // Key: the partition's index (u32 BE) ‖ …
        "paused_queues" | "flow_quotas" | "flow_budgets" | "flow_bursts" => key
            .first_chunk::<4>()
            .map(|index| u32::from_be_bytes(*index))
            .filter(|index| *index < partitions),
        _ => None,
    }
}

/// The partition count `meta` says the rows are keyed by: 1 when it says nothing (a store
/// being created; a format-1 store is converted before anything reads it).
pub(crate) fn partitions_in(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<u32, redb::Error> {
    Ok(meta
        .get(PARTITIONS_KEY)?
        .and_then(|raw| <[u8; 4]>::try_from(raw.value()).ok())
        .map_or(1, u32::from_be_bytes)
        .max(1))
}

/// The partition count the rows of the store read by `txn` are keyed by.
pub fn partitions_read(txn: &redb::ReadTransaction) -> Result<u32, redb::Error> {
    match txn.open_table(META) {
        Ok(meta) => partitions_in(&meta),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(1),
        Err(e) => Err(e.into()),
    }
}

/// The same in a write transaction (the table is closed again before it returns).
pub(crate) fn partitions_written(txn: &redb::WriteTransaction) -> Result<u32, redb::Error> {
    partitions_in(&txn.open_table(META)?)
}

/// Turns logical keys into the view's keys for one transaction, into one reused buffer (the
/// applier does it for every write it applies).
pub(crate) struct Keys {
    partitions: u32,
    buf: Vec<u8>,
}

impl Keys {
    /// Keys for a store whose rows are keyed by `partitions`.
    pub(crate) fn new(partitions: u32) -> Self {
        Self {
            partitions: partitions.max(1),
            buf: Vec::with_capacity(64),
        }
    }

    /// Where `key` of `table` sits in the view: itself for a table not keyed by partition.
    pub(crate) fn of<'a>(&'a mut self, table: &str, key: &'a [u8]) -> &'a [u8] {
        if !keyed(table) {
            return key;
        }
        let p = owner(table, key, self.partitions).unwrap_or(UNOWNED);
        self.buf.clear();
        self.buf.extend_from_slice(&p.to_be_bytes());
        self.buf.extend_from_slice(key);
        &self.buf
    }

    /// Where the logical range `start..end` of `table` sits: both bounds under the owner of
    /// `start` (a range deleted is always within one owner's rows: one journal, one object).
    pub(crate) fn range(&self, table: &str, start: &[u8], end: &[u8]) -> (Vec<u8>, Vec<u8>) {
        if !keyed(table) {
            return (start.to_vec(), end.to_vec());
        }
        physical_range(table, start, end, self.partitions)
    }
}

/// `key` under partition `p`.
pub(crate) fn prefixed(p: u32, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + key.len());
    out.extend_from_slice(&p.to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The view's key of `key` of keyed table `table` in a store keyed by `partitions`.
pub(crate) fn physical(table: &str, key: &[u8], partitions: u32) -> Vec<u8> {
    prefixed(owner(table, key, partitions).unwrap_or(UNOWNED), key)
}

/// The view's bounds of the logical range `start..end` of keyed table `table`: both under the
/// owner of `start` (a range is always within one owner's rows: one journal, one object).
pub(crate) fn physical_range(
    table: &str,
    start: &[u8],
    end: &[u8],
    partitions: u32,
) -> (Vec<u8>, Vec<u8>) {
    let p = owner(table, start, partitions).unwrap_or(UNOWNED);
    (prefixed(p, start), prefixed(p, end))
}

/// The view's key of `key` of keyed table `table` in the store `txn` reads.
pub(crate) fn stored_key(
    txn: &redb::ReadTransaction,
    table: &str,
    key: &[u8],
) -> Result<Vec<u8>, redb::Error> {
    Ok(physical(table, key, partitions_read(txn)?))
}

/// The logical key of a keyed table's row as the view holds it (its partition prefix off).
pub(crate) fn logical(stored: &[u8]) -> &[u8] {
    stored.get(4..).unwrap_or_default()
}

/// The bounds of partition `p`'s rows in a keyed table: `p`'s prefix up to the next one's.
pub(crate) fn range_of(p: u32) -> (Vec<u8>, Option<Vec<u8>>) {
    (
        p.to_be_bytes().to_vec(),
        p.checked_add(1).map(|next| next.to_be_bytes().to_vec()),
    )
}

/// How the rows of a store sit before a [`rekey`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Before {
    /// Store format 1: by their logical keys alone.
    Unkeyed,
    /// Keyed by a partition count.
    Keyed,
}

/// Rows moved by a [`rekey`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// Rows rewritten under their new keys.
    pub rows: u64,
    /// Bytes of those rows (keys and values).
    pub bytes: u64,
}

/// Rewrites every row of the keyed tables in `txn` from how they sit `before` to keys by `partitions`, and
/// records the count. Each table is copied into a new one and renamed over the old, so the
/// transaction never reads a row it wrote.
pub(crate) fn rekey(
    txn: &redb::WriteTransaction,
    before: Before,
    partitions: u32,
) -> Result<Moved, redb::Error> {
    let mut moved = Moved::default();
    let partitions = partitions.max(1);
    for name in KEYED {
        let old: BytesTable = redb::TableDefinition::new(name);
        let scratch_name = format!("{name}.rekeying");
        let scratch = redb::TableDefinition::<&[u8], &[u8]>::new(&scratch_name);
        {
            let read = txn.open_table(old)?;
            let mut write = txn.open_table(scratch)?;
            for row in read.iter()? {
                let (key, value) = row?;
                let key = key.value();
                let key = match before {
                    Before::Unkeyed => key,
                    Before::Keyed => logical(key),
                };
                write.insert(physical(name, key, partitions).as_slice(), value.value())?;
                moved.rows += 1;
                moved.bytes += (key.len() + value.value().len()) as u64;
            }
        }
        txn.delete_table(old)?;
        txn.rename_table(scratch, old)?;
    }
    let meta: NamedTable = META;
    txn.open_table(meta)?
        .insert(PARTITIONS_KEY, partitions.to_be_bytes().as_slice())?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use redb::ReadableDatabase;

    use super::*;
    use crate::invocation::state::{self, Object};
    use crate::invocation::store::{self, Purge, Timer};
    use crate::storage::Store;
    use crate::storage::writer::WriteSet;
    use sluice_protocol::Frame;

    const OBJECT: Object<'static> = Object {
        scope: "",
        service: "Counter",
        key: "acme",
    };

    /// Rows of every keyed table, for invocations on partitions 0..8 of 8.
    fn rows() -> WriteSet {
        let mut writes = WriteSet::default();
        for n in 0..8u64 {
            let id = InvocationId::new(n, u128::from(n));
            store::put_entry(&mut writes, id, 0, &frame(n));
            store::put_entry(&mut writes, id, 1, &frame(n + 100));
            store::put_timer(&mut writes, timer(n));
            store::put_purge(&mut writes, 1_000 + n, id, Purge::Journal);
        }
        state::set(&mut writes, OBJECT, b"count", b"5");
        writes
    }

    fn frame(n: u64) -> Frame {
        Frame {
            ty: 0x0400,
            ack: false,
            payload: bytes::Bytes::from(n.to_be_bytes().to_vec()),
        }
    }

    fn timer(n: u64) -> Timer {
        Timer {
            at_ms: 10_000 - n,
            invocation: InvocationId::new(n, u128::from(n)),
            completion: 1,
        }
    }

    /// What the store holds, read through the store's own reads.
    fn read(store: &Store) -> (Vec<Vec<Frame>>, Vec<Timer>, usize, Option<bytes::Bytes>) {
        store
            .with_db(|db| {
                let ids: Vec<_> = (0..8u64)
                    .map(|n| InvocationId::new(n, u128::from(n)))
                    .collect();
                (
                    store::load_journals(db, &ids).unwrap(),
                    store::load_timers(db).unwrap(),
                    store::due_purges(db, 2_000, 100, |_| true).unwrap().len(),
                    state::get(db, OBJECT, b"count").unwrap(),
                )
            })
            .unwrap()
    }

    /// The prefixes the timers table's rows sit under.
    fn timer_prefixes(store: &Store) -> Vec<u32> {
        store
            .with_db(|db| {
                let txn = db.begin_read().unwrap();
                let table = txn.open_table(crate::schema::TIMERS).unwrap();
                table
                    .iter()
                    .unwrap()
                    .map(|row| {
                        let (key, _) = row.unwrap();
                        u32::from_be_bytes(*key.value().first_chunk::<4>().unwrap())
                    })
                    .collect()
            })
            .unwrap()
    }

    #[test]
    fn a_new_partition_count_moves_every_row_and_reads_find_them_where_they_went() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        rows().commit_now(&store);
        let before = read(&store);
        assert_eq!(before.0.iter().map(Vec::len).sum::<usize>(), 16);
        assert_eq!(before.1.len(), 8);
        assert!(before.1.is_sorted(), "timers earliest first");
        assert_eq!(before.2, 8);
        assert_eq!(timer_prefixes(&store), [0; 8]);

        let moved = store.use_partitions(4).unwrap().expect("rows moved");
        assert_eq!(moved.rows, 16 + 8 + 8 + 1);
        assert_eq!(read(&store), before);
        assert_eq!(timer_prefixes(&store), [0, 0, 1, 1, 2, 2, 3, 3]);
        assert_eq!(
            store.use_partitions(4).unwrap(),
            None,
            "nothing moves twice"
        );

        // Writes after the change land under the new count, and a reopened store keeps it.
        let mut more = WriteSet::default();
        store::delete_journal(&mut more, InvocationId::new(5, 5));
        state::clear_all(&mut more, OBJECT);
        more.commit_now(&store);
        store.close();
        let store = Store::open(dir.path()).unwrap();
        let after = read(&store);
        assert_eq!(after.0[5], Vec::<Frame>::new());
        assert_eq!(after.0[4].len(), 2);
        assert_eq!(after.3, None);
        assert_eq!(store.use_partitions(4).unwrap(), None);
    }

    #[test]
    fn a_format_1_store_is_keyed_by_partition_when_it_opens() {
        let dir = tempfile::tempdir().unwrap();
        // A format-1 store: the same rows by their logical keys alone.
        {
            let db = redb::Database::create(dir.path().join(crate::storage::DB_FILE)).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut meta = txn.open_table(META).unwrap();
                meta.insert("format_version", 1u32.to_be_bytes().as_slice())
                    .unwrap();
                for op in &rows().ops {
                    let crate::storage::write_set::Op::Put(table, key, value) = op else {
                        unreachable!("only puts")
                    };
                    txn.open_table(*table)
                        .unwrap()
                        .insert(key.as_slice(), value.as_slice())
                        .unwrap();
                }
            }
            txn.commit().unwrap();
        }
        let store = Store::open_keyed(
            dir.path(),
            crate::storage::local::segments::Options::default(),
            4,
        )
        .unwrap();
        assert_eq!(
            store.format_version().unwrap(),
            super::super::FORMAT_VERSION
        );
        assert_eq!(timer_prefixes(&store), [0, 0, 1, 1, 2, 2, 3, 3]);
        assert_eq!(store.use_partitions(4).unwrap(), None, "keyed by 4 already");
        let converted = read(&store);
        assert_eq!(converted.0.iter().map(Vec::len).sum::<usize>(), 16);
        assert_eq!(converted.1.len(), 8);
        assert_eq!(converted.2, 8);
        assert_eq!(converted.3.as_deref(), Some(b"5".as_slice()));
        store.use_partitions(8).unwrap();
        assert_eq!(read(&store), converted);
    }

    #[test]
    fn keys_of_a_keyed_table_lead_with_their_owner_and_others_stay() {
        let id = InvocationId::new(13, 7);
        let mut keys = Keys::new(4);
        let stored = keys.of("invocations", &id.to_bytes()).to_vec();
        assert_eq!(&stored[..4], &1u32.to_be_bytes(), "13 % 4");
        assert_eq!(logical(&stored), id.to_bytes());
        assert_eq!(keys.of("flow_quotas", b"\0\0\0\x02x"), b"\0\0\0\x02x");
        assert_eq!(&keys.of("timers", b"short")[..4], &UNOWNED.to_be_bytes());
        let (start, end) = range_of(1);
        assert!(start.as_slice() <= stored.as_slice());
        assert!(stored.as_slice() < end.unwrap().as_slice());
        assert_eq!(range_of(UNOWNED).1, None);
    }
}
