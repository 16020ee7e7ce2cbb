//! What a partition's leader wrote since its last snapshot (`docs/cluster.md`, "Snapshots"):
//! each key it put or deleted, with the log offset of the last record that wrote it, and the
//! ranges it deleted. An incremental snapshot reads exactly these keys, so what it writes
//! follows the rows that changed, not the state held.
//!
//! A key stays noted until a snapshot's position covers its last write: a record confirmed
//! before a snapshot's read transaction began but stored after it is in the next snapshot too.
//! Past `max_bytes` of noted keys, what was noted is dropped and the partition's snapshots are
//! whole until one covers every record whose keys were dropped; noting goes on meanwhile. A
//! leader knows nothing noted before it began: its first snapshot is whole.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Mutex;

use super::write_set::Op;
use super::writer::Group;
use crate::schema::BytesTable;

/// Bytes a noted key costs beside its own (the map's entry, the table, the offset).
const ENTRY_BYTES: usize = 64;

/// One partition's changes since its last snapshot. Shared by the leader's pipeline, which
/// notes what each confirmed record writes, and its snapshot task, which takes them.
pub struct Changes {
    max_bytes: usize,
    inner: Mutex<Noted>,
}

#[derive(Default)]
struct Noted {
    /// Table name and key: the offset of the last record that put or deleted it.
    keys: HashMap<(&'static str, Vec<u8>), (BytesTable, i64)>,
    /// Ranges deleted: table, start, end, the offset of the record.
    ranges: Vec<(BytesTable, Vec<u8>, Vec<u8>, i64)>,
    bytes: usize,
    /// Keys were dropped (past `max_bytes`, or before noting began): the offset of the newest
    /// record whose keys were. A whole snapshot whose position is past it ends that.
    overflowed: Option<i64>,
}

/// What an incremental snapshot reads: every key and range deleted that changed.
#[derive(Default)]
pub struct Changed {
    /// Each changed key and its table.
    pub keys: Vec<(BytesTable, Vec<u8>)>,
    /// Each range deleted: table, start, end.
    pub ranges: Vec<(BytesTable, Vec<u8>, Vec<u8>)>,
}

impl Changes {
    /// Noting from now on, at most `max_bytes` of keys. What came before is not known: the
    /// first snapshot taken is whole.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            inner: Mutex::new(Noted {
                overflowed: Some(-1),
                ..Noted::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Noted> {
        // A panic while noting leaves a map of keys that is still a set of keys.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes what `group`, confirmed at log offset `at`, writes.
    pub fn note(&self, at: i64, group: &Group) {
        let mut noted = self.lock();
        let Noted {
            keys,
            ranges,
            bytes,
            ..
        } = &mut *noted;
        for op in group.ops() {
            match op {
                Op::Put(table, key, _) | Op::Delete(table, key) => {
                    let Some(name) = static_name(table) else {
                        continue;
                    };
                    match keys.entry((name, key.clone())) {
                        Entry::Occupied(mut entry) => entry.get_mut().1 = at,
                        Entry::Vacant(entry) => {
                            *bytes += key.len() + ENTRY_BYTES;
                            entry.insert((*table, at));
                        }
                    }
                }
                Op::DeleteRange(table, start, end) => {
                    *bytes += start.len() + end.len() + ENTRY_BYTES;
                    ranges.push((*table, start.clone(), end.clone(), at));
                }
            }
        }
        if noted.bytes > self.max_bytes {
            *noted = Noted {
                overflowed: Some(at),
                ..Noted::default()
            };
        }
    }

    /// For a snapshot at log position `next` (it holds every record before `next`): what
    /// changed (`None`: more than could be noted; the snapshot must be whole), and forgets
    /// what `next` covers.
    pub fn take(&self, next: i64) -> Option<Changed> {
        let mut noted = self.lock();
        if noted.overflowed.is_some() {
            return None;
        }
        let changed = Changed {
            keys: noted
                .keys
                .iter()
                .map(|((_, key), (table, _))| (*table, key.clone()))
                .collect(),
            ranges: noted
                .ranges
                .iter()
                .map(|(table, start, end, _)| (*table, start.clone(), end.clone()))
                .collect(),
        };
        noted.forget_before(next);
        Some(changed)
    }

    /// A whole snapshot at log position `next` was read: forgets what it covers, and notes
    /// again if it covers every record not noted.
    pub fn covered(&self, next: i64) {
        let mut noted = self.lock();
        if noted.overflowed.is_some_and(|last| last < next) {
            noted.overflowed = None;
        }
        noted.forget_before(next);
    }
}

impl std::fmt::Debug for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let noted = self.lock();
        f.debug_struct("Changes")
            .field("keys", &noted.keys.len())
            .field("ranges", &noted.ranges.len())
            .field("overflowed", &noted.overflowed)
            .finish()
    }
}

/// The schema's own name of `table` (a write names one of the schema's tables; a table the
/// schema does not know is no partition table, and no snapshot holds it).
fn static_name(table: &BytesTable) -> Option<&'static str> {
    let name = redb::TableHandle::name(table);
    crate::schema::TABLES
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.name)
}

impl Noted {
    fn forget_before(&mut self, next: i64) {
        let mut bytes = 0;
        self.keys.retain(|(_, key), (_, at)| {
            let keep = *at >= next;
            if keep {
                bytes += key.len() + ENTRY_BYTES;
            }
            keep
        });
        self.ranges.retain(|(_, start, end, at)| {
            let keep = *at >= next;
            if keep {
                bytes += start.len() + end.len() + ENTRY_BYTES;
            }
            keep
        });
        self.bytes = bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;
    use crate::storage::writer::{WriteSet, Writer};

    fn group(writes: WriteSet) -> Group {
        let (writer, mut staged) = Writer::staged();
        drop(writer.commit(writes));
        staged.try_group(usize::MAX).unwrap()
    }

    fn keys(changed: &Changed) -> Vec<Vec<u8>> {
        let mut keys: Vec<_> = changed.keys.iter().map(|(_, k)| k.clone()).collect();
        keys.sort();
        keys
    }

    #[test]
    fn a_key_stays_noted_until_a_snapshot_covers_its_last_write() {
        let changes = Changes::new(1 << 20);
        assert!(changes.take(0).is_none(), "what came before is not known");
        changes.covered(0);
        let mut a = WriteSet::default();
        a.put(schema::INVOCATIONS, b"a", b"1".to_vec());
        a.delete(schema::INVOCATIONS, b"b");
        changes.note(10, &group(a));
        let mut again = WriteSet::default();
        again.put(schema::INVOCATIONS, b"a", b"2".to_vec());
        again.delete_range(schema::JOURNAL, b"j0".to_vec(), b"j9".to_vec());
        changes.note(11, &group(again));
        // A snapshot at 11 holds record 10 only: both keys are in it, and "a" (written again at
        // 11) and the range stay for the next.
        let first = changes.take(11).unwrap();
        assert_eq!(keys(&first), vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(first.ranges.len(), 1);
        let second = changes.take(12).unwrap();
        assert_eq!(keys(&second), vec![b"a".to_vec()]);
        assert_eq!(second.ranges.len(), 1);
        let third = changes.take(12).unwrap();
        assert!(third.keys.is_empty() && third.ranges.is_empty());
    }

    #[test]
    fn past_its_bound_snapshots_are_whole_until_one_covers_what_was_dropped() {
        let changes = Changes::new(1_000);
        changes.covered(0);
        for at in 0..20 {
            let mut writes = WriteSet::default();
            writes.put(schema::INVOCATIONS, &[at as u8; 40], b"v".to_vec());
            changes.note(at, &group(writes));
        }
        assert!(changes.take(100).is_none(), "overflowed: whole");
        // Records after the drop are noted still.
        let mut writes = WriteSet::default();
        writes.put(schema::INVOCATIONS, b"k", b"v".to_vec());
        changes.note(20, &group(writes));
        // 104 bytes a key: the keys were dropped at records 9 and 19. A whole snapshot that
        // does not reach record 19 leaves the snapshots whole.
        changes.covered(19);
        assert!(changes.take(100).is_none());
        changes.covered(20);
        assert_eq!(keys(&changes.take(21).unwrap()), vec![b"k".to_vec()]);
    }
}
