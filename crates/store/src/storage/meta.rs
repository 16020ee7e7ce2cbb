//! Cluster-wide metadata in cluster mode (`docs/cluster.md`): deployments, services and the
//! rule book live in tables of their own, written by whichever node's admin API changed them.
//! After its local commit a node publishes the whole of each table it changed (a
//! [`MetaSnapshot`]) to the meta topic; every node, the writer included, applies the snapshots
//! in the topic's order and reloads what it keeps in memory, so all converge on the same
//! tables.

use std::sync::Arc;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::Store;
use crate::schema::{self, MetaGroup};
use sluice_core::errors::{Code, CodedError};

const VERSION: u8 = 1;

/// A table's rows: key, value.
pub type Rows = Vec<(String, Vec<u8>)>;

/// Whole tables, by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetaSnapshot {
    /// Each table with all its rows.
    pub tables: Vec<(&'static str, Rows)>,
}

/// Publishes snapshots to every node (the cluster's meta topic).
pub trait MetaLog: Send + Sync + std::fmt::Debug {
    /// Appends `snapshot`; returns once the log took it, with its offset there.
    fn publish(&self, snapshot: &MetaSnapshot) -> Result<i64, CodedError>;
}

fn bad(why: impl std::fmt::Display) -> CodedError {
    CodedError::new(
        Code::CLU0003,
        format!("a metadata record cannot be read: {why}"),
    )
}

/// A metadata table's name as the schema spells it (a snapshot names only those).
fn known(name: &str) -> Option<&'static str> {
    schema::meta_table(name).map(|(name, _)| name)
}

fn storage(e: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::RT0009, format!("metadata tables: {e}"))
}

impl MetaSnapshot {
    /// What names its group of tables in the meta topic: their names, in order. A compacted
    /// topic keeps the newest record of each key, which replaces every older one of the group.
    pub fn key(&self) -> String {
        self.tables
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The tables named `names`, read whole from `db`.
    pub fn read(db: &redb::Database, names: &[&str]) -> Result<Self, CodedError> {
        let txn = db.begin_read().map_err(storage)?;
        let mut tables = Vec::new();
        for name in names {
            let name = known(name).ok_or_else(|| bad(format!("{name} is not a metadata table")))?;
            let definition: TableDefinition<&str, &[u8]> = TableDefinition::new(name);
            let mut rows = Vec::new();
            match txn.open_table(definition) {
                Ok(table) => {
                    for row in table.iter().map_err(storage)? {
                        let (key, value) = row.map_err(storage)?;
                        rows.push((key.value().to_owned(), value.value().to_vec()));
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(storage(e)),
            }
            tables.push((name, rows));
        }
        Ok(Self { tables })
    }

    /// Replaces each table's rows with the snapshot's, inside `txn`.
    pub fn apply(&self, txn: &redb::WriteTransaction) -> Result<(), CodedError> {
        for (name, rows) in &self.tables {
            let definition: TableDefinition<&str, &[u8]> = TableDefinition::new(name);
            let mut table = txn.open_table(definition).map_err(storage)?;
            table.retain(|_, _| false).map_err(storage)?;
            for (key, value) in rows {
                table
                    .insert(key.as_str(), value.as_slice())
                    .map_err(storage)?;
            }
        }
        Ok(())
    }

    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes();
        out.extend_from_slice(&len(self.tables.len()));
        for (name, rows) in &self.tables {
            out.extend_from_slice(&len(name.len()));
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&len(rows.len()));
            for (key, value) in rows {
                out.extend_from_slice(&len(key.len()));
                out.extend_from_slice(key.as_bytes());
                out.extend_from_slice(&len(value.len()));
                out.extend_from_slice(value);
            }
        }
        out
    }

    /// Reads a record of at most `max` bytes.
    pub fn decode(bytes: &[u8], max: usize) -> Result<Self, CodedError> {
        if bytes.len() > max {
            return Err(bad(format!("{} bytes, more than {max}", bytes.len())));
        }
        let mut rest = bytes;
        let mut take = |n: usize| -> Result<&[u8], CodedError> {
            if rest.len() < n {
                return Err(bad("it ends early"));
            }
            let (head, tail) = rest.split_at(n);
            rest = tail;
            Ok(head)
        };
        if take(1)?[0] != VERSION {
            return Err(bad(
                "another format version (run one Sluice version on every node)",
            ));
        }
        fn count(raw: &[u8]) -> usize {
            u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize
        }
        let tables = count(take(4)?);
        if tables > schema::meta_table_count() {
            return Err(bad(format!("{tables} tables")));
        }
        let mut snapshot = Self::default();
        for _ in 0..tables {
            let n = count(take(4)?);
            let name =
                std::str::from_utf8(take(n)?).map_err(|_| bad("a table name that is not UTF-8"))?;
            let name = known(name).ok_or_else(|| bad(format!("unknown table {name}")))?;
            let rows = count(take(4)?);
            if rows > bytes.len() / 8 {
                return Err(bad(format!("{rows} rows in {} bytes", bytes.len())));
            }
            let mut all = Vec::with_capacity(rows);
            for _ in 0..rows {
                let n = count(take(4)?);
                let key = std::str::from_utf8(take(n)?)
                    .map_err(|_| bad("a key that is not UTF-8"))?
                    .to_owned();
                let n = count(take(4)?);
                all.push((key, take(n)?.to_vec()));
            }
            snapshot.tables.push((name, all));
        }
        if !rest.is_empty() {
            return Err(bad("bytes after its end"));
        }
        Ok(snapshot)
    }
}

impl Store {
    /// Cluster mode: where changed metadata tables are published.
    pub fn set_meta_log(&self, log: Arc<dyn MetaLog>) {
        let _ = self.meta_log.set(log);
    }

    /// Begins a change of the metadata tables of `group`: from before its local commit until
    /// [`MetaChange::publish`] returns, the cluster's meta reader applies nothing (it holds
    /// [`Store::meta_gate`] while it applies a record). A record read meanwhile cannot land
    /// between the change and what it publishes, which would publish the record's older
    /// tables as the change.
    pub fn meta_change(&self, group: MetaGroup) -> MetaChange<'_> {
        MetaChange {
            store: self,
            group,
            _gate: self.meta_gate(),
        }
    }

    /// What a metadata change holds ([`Store::meta_change`]), and the cluster's meta reader
    /// while it applies a record.
    pub fn meta_gate(&self) -> std::sync::MutexGuard<'_, ()> {
        self.meta_gate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this node published the tables of record key `key` after offset `at` of the
    /// meta topic: a record there (its own echo, or another node's change that came first) is
    /// older than what its store holds, and every node ends with the later record.
    pub fn meta_published_after(&self, key: &str, at: i64) -> bool {
        self.meta_published
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .is_some_and(|published| *published > at)
    }
}

/// A change of one group's metadata tables under way ([`Store::meta_change`]).
pub struct MetaChange<'a> {
    store: &'a Store,
    group: MetaGroup,
    _gate: std::sync::MutexGuard<'a, ()>,
}

impl MetaChange<'_> {
    /// After the change's local commit: in cluster mode, publishes the group's tables whole
    /// to every node and returns once the log took them; embedded, nothing.
    pub fn publish(self) -> Result<(), CodedError> {
        let store = self.store;
        let Some(log) = store.meta_log.get() else {
            return Ok(());
        };
        let names = schema::meta_tables(self.group);
        let snapshot = store.with_db(|db| MetaSnapshot::read(db, &names))??;
        let at = log.publish(&snapshot)?;
        store
            .meta_published
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(snapshot.key(), at);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_snapshot_replaces_its_tables() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let rules: TableDefinition<&str, &[u8]> = TableDefinition::new("rules");
        store
            .with_db(|db| {
                let txn = db.begin_write().unwrap();
                txn.open_table(rules)
                    .unwrap()
                    .insert("old", b"1".as_slice())
                    .unwrap();
                txn.commit().unwrap();
            })
            .unwrap();
        let snapshot = MetaSnapshot {
            tables: vec![("rules", vec![("new".into(), b"2".to_vec())])],
        };
        let back = MetaSnapshot::decode(&snapshot.encode(), usize::MAX).unwrap();
        assert_eq!(back, snapshot);
        store
            .with_db(|db| {
                let txn = db.begin_write().unwrap();
                back.apply(&txn).unwrap();
                txn.commit().unwrap();
            })
            .unwrap();
        let read = store
            .with_db(|db| MetaSnapshot::read(db, &["rules"]))
            .unwrap()
            .unwrap();
        assert_eq!(read, snapshot);
    }

    /// A meta topic in memory: each record at the next offset.
    #[derive(Debug, Default)]
    struct Topic(std::sync::Mutex<Vec<MetaSnapshot>>);

    impl MetaLog for Topic {
        fn publish(&self, snapshot: &MetaSnapshot) -> Result<i64, CodedError> {
            let mut records = self.0.lock().unwrap();
            records.push(snapshot.clone());
            Ok(records.len() as i64 - 1)
        }
    }

    #[test]
    fn records_before_this_nodes_own_last_one_of_their_tables_are_older_than_its_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let topic = Arc::new(Topic::default());
        store.set_meta_log(Arc::clone(&topic) as Arc<dyn MetaLog>);
        for _ in 0..3 {
            store.meta_change(MetaGroup::Rules).publish().unwrap();
        }
        let key = topic.0.lock().unwrap()[2].key();
        assert!(store.meta_published_after(&key, 0));
        assert!(store.meta_published_after(&key, 1));
        assert!(!store.meta_published_after(&key, 2), "its own last record");
        assert!(
            !store.meta_published_after(&key, 3),
            "a later one from another node"
        );
        assert!(
            !store.meta_published_after("deployments", 0),
            "tables it never published"
        );
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(snapshot) = MetaSnapshot::decode(&bytes, 1 << 20) {
                prop_assert_eq!(snapshot.encode(), bytes);
            }
        }
    }
}
