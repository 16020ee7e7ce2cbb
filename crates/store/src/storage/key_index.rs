//! Stored invocations by scope and limit key (`invocation_keys`): one row per scoped invocation,
//! so a query naming a scope (and a key) reads that range and those records, not every record
//! the store holds.
//!
//! The view's applier keeps it as it applies write sets ([`super::write_set`]): a put that adds
//! an `invocations` row adds its index row (redb's insert answers the row it replaced, so an
//! update, which cannot change an invocation's scope or key, costs nothing more), and a delete
//! that removes one removes it (the removed value names the scope and key). Neither the
//! partition's write sets nor its log carry it, so replicas, snapshot loads and logs written by
//! earlier releases index alike. Rows are keyed by logical invocation id, not by partition, so
//! a change of the partition count does not touch it. A store of format 2 builds it when it
//! opens ([`rebuild`]).
//!
//! Key: scope length (u32 BE) ‖ scope ‖ limit key length (u32 BE, 0 without one) ‖ limit key ‖
//! invocation id (24 bytes). Value: empty.

use redb::{ReadableTable, WriteTransaction};

use crate::schema::{INVOCATION_KEYS, INVOCATIONS};

/// The two fields of a stored record the index needs (MessagePack with named fields: the others
/// are skipped without being built).
#[derive(serde::Deserialize)]
struct Named {
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    limit_key: Option<String>,
}

/// The start of the rows of `scope`, and of its `limit_key` when one is named.
pub fn prefix(scope: &str, limit_key: Option<&str>) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + scope.len() + limit_key.map_or(0, str::len));
    out.extend_from_slice(&(scope.len() as u32).to_be_bytes());
    out.extend_from_slice(scope.as_bytes());
    if let Some(key) = limit_key {
        out.extend_from_slice(&(key.len() as u32).to_be_bytes());
        out.extend_from_slice(key.as_bytes());
    }
    out
}

/// The index row of the invocation whose logical key is `id` and stored record `record`; `None`
/// for an unscoped one (or a record that does not decode: reading it reports that elsewhere).
pub(crate) fn entry(id: &[u8], record: &[u8]) -> Option<Vec<u8>> {
    let named: Named = crate::encoding::decode(record).ok()?;
    let scope = named.scope?;
    let key = named.limit_key.unwrap_or_default();
    let mut out = prefix(&scope, Some(&key));
    out.extend_from_slice(id);
    Some(out)
}

/// The start of an index row that names its scope: the scope's length and the scope.
pub fn scope_part(row: &[u8]) -> Option<&[u8]> {
    let (len, rest) = row.split_first_chunk::<4>()?;
    let len = u32::from_be_bytes(*len) as usize;
    rest.get(..len)?;
    row.get(..4 + len)
}

/// The least key past every key that starts with `prefix` (`None`: nothing is past them).
pub fn past(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut next = prefix.to_vec();
    while let Some(last) = next.pop() {
        if last < u8::MAX {
            next.push(last + 1);
            return Some(next);
        }
    }
    None
}

/// The invocation id an index row names (its last 24 bytes).
pub fn id_of(row: &[u8]) -> Option<[u8; 24]> {
    row.len()
        .checked_sub(24)
        .and_then(|at| row[at..].try_into().ok())
}

/// Adds and removes index rows, once the view's writes of a group are applied.
#[derive(Default)]
pub(crate) struct Changes {
    added: Vec<Vec<u8>>,
    removed: Vec<Vec<u8>>,
}

impl Changes {
    /// An `invocations` row `id` was added with `record`.
    pub(crate) fn added(&mut self, id: &[u8], record: &[u8]) {
        self.added.extend(entry(id, record));
    }

    /// An `invocations` row `id` holding `record` was removed.
    pub(crate) fn removed(&mut self, id: &[u8], record: &[u8]) {
        self.removed.extend(entry(id, record));
    }

    /// Writes them into `txn`: removals first, so a row removed and added again in one group
    /// (a delete and a put of the same key are coalesced, so it cannot be) stays.
    pub(crate) fn apply(self, txn: &WriteTransaction) -> Result<(), redb::Error> {
        if self.added.is_empty() && self.removed.is_empty() {
            return Ok(());
        }
        let mut table = txn.open_table(INVOCATION_KEYS)?;
        for row in &self.removed {
            table.remove(row.as_slice())?;
        }
        for row in &self.added {
            table.insert(row.as_slice(), [].as_slice())?;
        }
        Ok(())
    }
}

/// Builds the index from every stored invocation (a store that had none opening): how many rows.
pub(crate) fn rebuild(txn: &WriteTransaction) -> Result<u64, redb::Error> {
    txn.delete_table(INVOCATION_KEYS)?;
    let read = match txn.open_table(INVOCATIONS) {
        Ok(read) => read,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut index = txn.open_table(INVOCATION_KEYS)?;
    let mut rows = 0;
    for row in read.iter()? {
        let (key, value) = row?;
        if let Some(entry) = entry(super::layout::logical(key.value()), value.value()) {
            index.insert(entry.as_slice(), [].as_slice())?;
            rows += 1;
        }
    }
    Ok(rows)
}
