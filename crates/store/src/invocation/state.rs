//! Virtual object and workflow state in redb: one row per (scope, service, object key, state
//! key). Rows of one object are contiguous, so the eager state, the key listing and ClearAll
//! are range operations.

use bytes::Bytes;
use redb::ReadableDatabase;

use super::store::storage;
use crate::storage::layout;
use crate::storage::writer::WriteSet;
use sluice_core::errors::CodedError;

// Key: u32 BE length ‖ scope ‖ u32 BE length ‖ service ‖ u32 BE length ‖ object key ‖ state
// key. Value: the state value.
pub(crate) use crate::schema::STATE;

/// The object whose state is addressed.
#[derive(Debug, Clone, Copy)]
pub struct Object<'a> {
    /// Flow-control scope ("" when unscoped).
    pub scope: &'a str,
    /// Virtual object or workflow name.
    pub service: &'a str,
    /// Object key.
    pub key: &'a str,
}

impl Object<'_> {
    fn prefix(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(12 + self.scope.len() + self.service.len() + self.key.len());
        for part in [self.scope, self.service, self.key] {
            let len = u32::try_from(part.len()).expect("names are shorter than 4 GiB");
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(part.as_bytes());
        }
        out
    }

    fn row(&self, name: &[u8]) -> Vec<u8> {
        let mut out = self.prefix();
        out.extend_from_slice(name);
        out
    }

    /// `prefix..end` holds exactly this object's rows.
    fn bounds(&self) -> (Vec<u8>, Vec<u8>) {
        let prefix = self.prefix();
        let mut end = prefix.clone();
        // The smallest key greater than every key starting with the prefix. The prefix holds
        // length bytes below 0xff, so the loop always finds a byte to increment.
        while let Some(last) = end.pop() {
            if last < u8::MAX {
                end.push(last + 1);
                break;
            }
        }
        (prefix, end)
    }
}

/// One state entry, as introspection shows it.
#[derive(Debug, Clone)]
pub struct StateRow {
    /// Scope ("" when unscoped).
    pub scope: String,
    /// Virtual object or workflow.
    pub service: String,
    /// Object key.
    pub key: String,
    /// State key.
    pub name: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
}

/// Every state entry of every object.
pub fn scan(db: &redb::Database) -> Result<Vec<StateRow>, CodedError> {
    use redb::ReadableTable;
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(STATE) else {
        return Ok(Vec::new());
    };
    let mut rows = Vec::new();
    for row in table.iter().map_err(storage)? {
        let (key, value) = row.map_err(storage)?;
        let mut rest = layout::logical(key.value());
        let mut part = || -> Result<String, CodedError> {
            let len = rest
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_be_bytes)
                .ok_or_else(|| storage("malformed state key"))? as usize;
            let text = rest
                .get(4..4 + len)
                .ok_or_else(|| storage("malformed state key"))?;
            let text = String::from_utf8_lossy(text).into_owned();
            rest = &rest[4 + len..];
            Ok(text)
        };
        let (scope, service, key) = (part()?, part()?, part()?);
        rows.push(StateRow {
            scope,
            service,
            key,
            name: rest.to_vec(),
            value: value.value().to_vec(),
        });
    }
    Ok(rows)
}

// Key: as `STATE`, with the promise name last. Value: a tag byte (0 value, 1 failure), then
// the value, or the failure's code (u16 BE) and message.
pub(crate) use crate::schema::PROMISES;

/// A completed durable promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Promise {
    /// Resolved with a value.
    Value(Bytes),
    /// Rejected.
    Failure(u16, String),
}

impl Promise {
    fn encode(&self) -> Vec<u8> {
        match self {
            Self::Value(v) => [&[0u8][..], v].concat(),
            Self::Failure(code, message) => {
                [&[1u8][..], &code.to_be_bytes(), message.as_bytes()].concat()
            }
        }
    }

    fn decode(raw: &[u8]) -> Option<Self> {
        match raw.split_first()? {
            (0, value) => Some(Self::Value(Bytes::copy_from_slice(value))),
            (1, rest) if rest.len() >= 2 => Some(Self::Failure(
                u16::from_be_bytes([rest[0], rest[1]]),
                String::from_utf8_lossy(&rest[2..]).into_owned(),
            )),
            _ => None,
        }
    }
}

/// Completes the promise `name`.
pub fn set_promise(writes: &mut WriteSet, object: Object<'_>, name: &str, promise: &Promise) {
    writes.put(PROMISES, &object.row(name.as_bytes()), promise.encode());
}

/// The promise `name`, if completed.
pub fn promise(
    db: &redb::Database,
    object: Object<'_>,
    name: &str,
) -> Result<Option<Promise>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(PROMISES) else {
        return Ok(None);
    };
    let key =
        layout::stored_key(&txn, "promises", &object.row(name.as_bytes())).map_err(storage)?;
    Ok(table
        .get(key.as_slice())
        .map_err(storage)?
        .and_then(|v| Promise::decode(v.value())))
}

/// Removes every promise of the object (its workflow's retention ended).
pub fn clear_promises(writes: &mut WriteSet, object: Object<'_>) {
    let (start, end) = object.bounds();
    writes.delete_range(PROMISES, start, end);
}

/// Sets `name` to `value`.
pub fn set(writes: &mut WriteSet, object: Object<'_>, name: &[u8], value: &[u8]) {
    writes.put(STATE, &object.row(name), value.to_vec());
}

/// Removes `name`.
pub fn clear(writes: &mut WriteSet, object: Object<'_>, name: &[u8]) {
    writes.delete(STATE, &object.row(name));
}

/// Removes every entry of the object.
pub fn clear_all(writes: &mut WriteSet, object: Object<'_>) {
    let (start, end) = object.bounds();
    writes.delete_range(STATE, start, end);
}

/// One value.
pub fn get(
    db: &redb::Database,
    object: Object<'_>,
    name: &[u8],
) -> Result<Option<Bytes>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(STATE) else {
        return Ok(None);
    };
    let key = layout::stored_key(&txn, "state", &object.row(name)).map_err(storage)?;
    Ok(table
        .get(key.as_slice())
        .map_err(storage)?
        .map(|v| Bytes::copy_from_slice(v.value())))
}

/// Every entry of the object, by key, stopping before `limit` bytes of keys and values;
/// `true` when all of them fit.
pub fn entries(
    db: &redb::Database,
    object: Object<'_>,
    limit: usize,
) -> Result<(Vec<(Bytes, Bytes)>, bool), CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(STATE) else {
        return Ok((Vec::new(), true));
    };
    let (start, end) = object.bounds();
    let partitions = layout::partitions_read(&txn).map_err(storage)?;
    let (start, end) = layout::physical_range("state", &start, &end, partitions);
    let skip = start.len();
    let mut out = Vec::new();
    let mut size = 0usize;
    for row in table
        .range(start.as_slice()..end.as_slice())
        .map_err(storage)?
    {
        let (key, value) = row.map_err(storage)?;
        let (key, value) = (&key.value()[skip..], value.value());
        size += key.len() + value.len();
        if size > limit {
            return Ok((out, false));
        }
        out.push((Bytes::copy_from_slice(key), Bytes::copy_from_slice(value)));
    }
    Ok((out, true))
}

/// The object's state keys, in order.
pub fn keys(db: &redb::Database, object: Object<'_>) -> Result<Vec<Bytes>, CodedError> {
    Ok(entries(db, object, usize::MAX)?
        .0
        .into_iter()
        .map(|(k, _)| k)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Store;

    #[test]
    fn objects_keep_their_own_state_and_clear_all_is_scoped_to_one_object() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let a = Object {
            scope: "",
            service: "Counter",
            key: "a",
        };
        // A key that is a prefix of another must not share its rows.
        let ab = Object { key: "ab", ..a };
        let mut writes = WriteSet::default();
        set(&mut writes, a, b"count", b"1");
        set(&mut writes, a, b"\xff\xff", b"edge");
        set(&mut writes, ab, b"count", b"2");
        writes.commit_now(&store);
        store
            .with_db(|db| {
                assert_eq!(get(db, a, b"count").unwrap().unwrap(), "1");
                assert_eq!(get(db, ab, b"count").unwrap().unwrap(), "2");
                assert_eq!(
                    keys(db, a).unwrap(),
                    vec![Bytes::from("count"), Bytes::from(&b"\xff\xff"[..])]
                );
                let (some, complete) = entries(db, a, 8).unwrap();
                assert_eq!((some.len(), complete), (1, false));
            })
            .unwrap();
        let mut writes = WriteSet::default();
        clear_all(&mut writes, a);
        set(&mut writes, a, b"after", b"x");
        clear(&mut writes, ab, b"missing");
        set_promise(&mut writes, a, "p", &Promise::Failure(409, "no".into()));
        set_promise(&mut writes, ab, "p", &Promise::Value(Bytes::from("v")));
        writes.commit_now(&store);
        store
            .with_db(|db| {
                assert_eq!(
                    promise(db, a, "p").unwrap(),
                    Some(Promise::Failure(409, "no".into()))
                );
                assert_eq!(
                    promise(db, ab, "p").unwrap(),
                    Some(Promise::Value(Bytes::from("v")))
                );
                assert_eq!(promise(db, a, "q").unwrap(), None);
                assert_eq!(keys(db, a).unwrap(), vec![Bytes::from("after")]);
                assert_eq!(get(db, ab, b"count").unwrap().unwrap(), "2");
            })
            .unwrap();
    }
}
