//! A write set: the writes one partition batch makes, applied atomically and in order, to
//! the view or into a log record; and applying sets to a redb transaction, where only the last
//! write to a key counts.

#[cfg(any(test, feature = "testing"))]
use super::Store;
use super::{key_index, layout};
pub use crate::schema::BytesTable;

#[derive(Clone)]
pub(crate) enum Op {
    Put(BytesTable, Vec<u8>, Vec<u8>),
    Delete(BytesTable, Vec<u8>),
    DeleteRange(BytesTable, Vec<u8>, Vec<u8>),
}

/// Writes to apply atomically, in order.
#[derive(Default, Clone)]
pub struct WriteSet {
    pub(crate) ops: Vec<Op>,
}

impl std::fmt::Debug for WriteSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteSet")
            .field("ops", &self.ops.len())
            .finish()
    }
}

impl WriteSet {
    /// Inserts or replaces `key`.
    pub fn put(&mut self, table: BytesTable, key: &[u8], value: Vec<u8>) {
        self.ops.push(Op::Put(table, key.to_vec(), value));
    }

    /// Removes `key` (nothing when absent).
    pub fn delete(&mut self, table: BytesTable, key: &[u8]) {
        self.ops.push(Op::Delete(table, key.to_vec()));
    }

    /// Removes every key in `start..end`.
    pub fn delete_range(&mut self, table: BytesTable, start: Vec<u8>, end: Vec<u8>) {
        self.ops.push(Op::DeleteRange(table, start, end));
    }

    /// How many writes it holds.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Commits the writes at once in a transaction of their own (tests, which have no writer).
    #[cfg(any(test, feature = "testing"))]
    pub fn commit_now(&self, store: &Store) {
        store
            .with_db(|db| {
                let txn = db.begin_write().expect("a write transaction");
                self.apply(&txn).expect("the writes apply");
                txn.commit().expect("the commit");
            })
            .expect("the store is open");
    }

    /// Applies the writes inside `txn`.
    pub fn apply(&self, txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
        apply_all(std::iter::once(self), txn)
    }

    /// Applies `sets`, in order, inside `txn`, as the view's applier does (coalesced).
    pub fn apply_all<'a>(
        sets: impl IntoIterator<Item = &'a WriteSet>,
        txn: &redb::WriteTransaction,
    ) -> Result<(), redb::Error> {
        apply_all(sets, txn)
    }
}

/// A table open in the group's transaction.
type OpenTable<'txn> = redb::Table<'txn, &'static [u8], &'static [u8]>;

/// Applies `sets` in order inside `txn`, opening each table once: opening one looks it up in
/// redb's table of tables, which cost more than the insert itself when it was done per write.
///
/// A put or delete of a key that a later put or delete of the same key overwrites is skipped
/// (coalescing): the last write to a key alone decides its value, whatever ranges are deleted
/// between, so an invocation that ran and completed within one applied batch costs the view
/// its final record only, not each state it passed through.
pub(crate) fn apply_all<'a>(
    sets: impl IntoIterator<Item = &'a WriteSet>,
    txn: &redb::WriteTransaction,
) -> Result<(), redb::Error> {
    let ops: Vec<&Op> = sets.into_iter().flat_map(|set| &set.ops).collect();
    let live = last_writes(&ops);
    // The logical keys go into the view under their partition (`layout.rs`).
    let mut keys = layout::Keys::new(layout::partitions_written(txn)?);
    let mut open: Vec<(&str, OpenTable<'_>)> = Vec::new();
    // Invocations added and removed, for their index by scope and key.
    let mut indexed = key_index::Changes::default();
    for (op, live) in ops.into_iter().zip(live) {
        if !live {
            continue;
        }
        let (Op::Put(definition, ..) | Op::Delete(definition, _) | Op::DeleteRange(definition, ..)) =
            op;
        let name = redb::TableHandle::name(definition);
        let index = match open.iter().position(|(open, _)| *open == name) {
            Some(index) => index,
            None => {
                open.push((name, txn.open_table(*definition)?));
                open.len() - 1
            }
        };
        let table = &mut open[index].1;
        let invocations = name == INVOCATIONS_NAME;
        match op {
            Op::Put(_, key, value) => {
                let replaced = table.insert(keys.of(name, key), value.as_slice())?;
                if invocations && replaced.is_none() {
                    indexed.added(key, value);
                }
            }
            Op::Delete(_, key) => {
                let removed = table.remove(keys.of(name, key))?;
                if let Some(old) = removed.filter(|_| invocations) {
                    indexed.removed(key, old.value());
                }
            }
            Op::DeleteRange(_, start, end) => {
                let (start, end) = keys.range(name, start, end);
                table.retain_in(start.as_slice()..end.as_slice(), |key, value| {
                    if invocations {
                        indexed.removed(layout::logical(key), value);
                    }
                    false
                })?;
            }
        }
    }
    drop(open);
    indexed.apply(txn)
}

/// The name of the table whose rows the index by scope and key follows.
const INVOCATIONS_NAME: &str = "invocations";

/// Which of `ops` still matter: every range delete, and each put or delete that no later put
/// or delete of the same key overwrites.
fn last_writes(ops: &[&Op]) -> Vec<bool> {
    let mut live = vec![true; ops.len()];
    if ops.len() < 2 {
        return live;
    }
    let mut later = std::collections::HashSet::with_capacity(ops.len());
    for (index, op) in ops.iter().enumerate().rev() {
        let (Op::Put(definition, key, _) | Op::Delete(definition, key)) = op else {
            continue;
        };
        if !later.insert((redb::TableHandle::name(definition), key.as_slice())) {
            live[index] = false;
        }
    }
    live
}

impl WriteSet {
    /// Moves the writes of `other` to the end of this set.
    pub fn append(&mut self, other: &mut WriteSet) {
        self.ops.append(&mut other.ops);
    }
}

#[cfg(test)]
mod tests {
    use redb::ReadableDatabase;

    use super::*;

    const T: BytesTable = redb::TableDefinition::new("writer_test");
    const U: BytesTable = redb::TableDefinition::new("writer_test_other");

    #[test]
    fn only_the_last_write_to_a_key_is_applied() {
        let mut set = WriteSet::default();
        set.put(T, b"k", b"1".to_vec());
        set.put(U, b"k", b"1".to_vec());
        set.delete_range(T, b"a".to_vec(), b"z".to_vec());
        set.put(T, b"k", b"2".to_vec());
        set.delete(T, b"j");
        set.put(T, b"j", b"3".to_vec());
        let ops: Vec<&Op> = set.ops.iter().collect();
        assert_eq!(
            last_writes(&ops),
            [false, true, true, true, false, true],
            "the first put of T/k and the delete of T/j are overwritten; U/k is another key"
        );
    }

    proptest::proptest! {
        /// Coalescing never changes what the tables hold: the same as every write applied one
        /// after another.
        #[test]
        fn coalesced_writes_leave_what_every_write_would(
            ops in proptest::collection::vec((0..4u8, 0..2u8, 0..6u8, 0..6u8), 0..40),
        ) {
            let mut set = WriteSet::default();
            let mut model = std::collections::BTreeMap::new();
            for (kind, table, a, b) in ops {
                let (table, name) = if table == 0 { (T, 0) } else { (U, 1) };
                let (key, end) = (vec![a], vec![b]);
                match kind {
                    0 | 1 => {
                        let value = vec![a, b];
                        model.insert((name, key.clone()), value.clone());
                        set.put(table, &key, value);
                    }
                    2 => {
                        model.remove(&(name, key.clone()));
                        set.delete(table, &key);
                    }
                    _ => {
                        model.retain(|(t, k), _| *t != name || !(key.as_slice()..end.as_slice()).contains(&k.as_slice()));
                        set.delete_range(table, key, end);
                    }
                }
            }
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            set.commit_now(&store);
            let mut stored = std::collections::BTreeMap::new();
            store
                .with_db(|db| {
                    let txn = db.begin_read().unwrap();
                    for (table, name) in [(T, 0), (U, 1)] {
                        let Ok(table) = txn.open_table(table) else { continue };
                        for row in redb::ReadableTable::iter(&table).unwrap() {
                            let (k, v) = row.unwrap();
                            stored.insert((name, k.value().to_vec()), v.value().to_vec());
                        }
                    }
                })
                .unwrap();
            proptest::prop_assert_eq!(stored, model);
        }
    }
}
