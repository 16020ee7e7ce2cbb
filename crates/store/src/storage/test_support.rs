//! What the write path's unit tests share: a partition table and a read of one of its values.

use redb::ReadableDatabase;

use super::Store;

/// A partition table (only those go through a partition's writer and its log).
pub(super) const T: crate::schema::BytesTable = crate::schema::INVOCATIONS;

/// The value of `key` in [`T`], read as any reader would (after the backlog).
pub(super) fn get(store: &Store, key: &[u8]) -> Option<Vec<u8>> {
    store
        .with_db(|db| {
            let txn = db.begin_read().unwrap();
            let table = txn.open_table(T).unwrap();
            let partitions = super::layout::partitions_read(&txn).unwrap();
            let key = super::layout::physical("invocations", key, partitions);
            table
                .get(key.as_slice())
                .unwrap()
                .map(|v| v.value().to_vec())
        })
        .unwrap()
}
