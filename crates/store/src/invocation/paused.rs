//! Queues an operator paused (`POST /vqueues/{id}/pause`), per partition, so a pause outlives
//! a restart. A queue is named by what it is for (its scheduler key), never by its index, which
//! is only stable while the queue lives.

use redb::ReadableDatabase;
use serde::{Deserialize, Serialize};

use super::store::storage;
use crate::storage::writer::WriteSet;
use sluice_core::errors::{Code, CodedError};
use sluice_flow::scheduler::QueueKey;
use sluice_flow::{LimitKey, Priority, Scope};

/// Key: partition index (u32 BE) ‖ the queue key as JSON. Value: empty.
pub(crate) use crate::schema::PAUSED_QUEUES as PAUSED;

/// A queue key as stored.
#[derive(Serialize, Deserialize)]
struct Stored {
    scope: Option<String>,
    limit_key: Option<String>,
    service: String,
    object_key: Option<String>,
    priority: u8,
}

fn row(partition: u32, key: &QueueKey) -> Vec<u8> {
    let stored = Stored {
        scope: key.scope.as_ref().map(|s| s.as_str().to_owned()),
        limit_key: key.limit_key.as_ref().map(|k| k.as_str().to_owned()),
        service: key.service.to_string(),
        object_key: key.object_key.as_deref().map(str::to_owned),
        priority: key.priority.get(),
    };
    let mut out = partition.to_be_bytes().to_vec();
    out.extend(serde_json::to_vec(&stored).expect("plain strings encode"));
    out
}

fn decode(raw: &[u8]) -> Result<QueueKey, String> {
    let stored: Stored = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
    Ok(QueueKey {
        scope: stored
            .scope
            .as_deref()
            .map(Scope::parse)
            .transpose()
            .map_err(|e| e.message)?,
        limit_key: stored
            .limit_key
            .as_deref()
            .map(LimitKey::parse)
            .transpose()
            .map_err(|e| e.message)?,
        service: stored.service.into(),
        object_key: stored.object_key.map(Into::into),
        priority: Priority::try_from(stored.priority).map_err(|e| e.to_string())?,
    })
}

/// Records that `key` is paused on `partition`.
pub fn pause(writes: &mut WriteSet, partition: u32, key: &QueueKey) {
    writes.put(PAUSED, &row(partition, key), Vec::new());
}

/// Records that `key` runs again on `partition`.
pub fn resume(writes: &mut WriteSet, partition: u32, key: &QueueKey) {
    writes.delete(PAUSED, &row(partition, key));
}

/// The queues paused on `partition`.
pub fn load(db: &redb::Database, partition: u32) -> Result<Vec<QueueKey>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(PAUSED) else {
        return Ok(Vec::new());
    };
    let start = partition.to_be_bytes();
    let mut keys = Vec::new();
    for row in table.range(start.as_slice()..).map_err(storage)? {
        let (key, _) = row.map_err(storage)?;
        let raw = key.value();
        if raw[..4.min(raw.len())] != start {
            break;
        }
        let queue = decode(&raw[4..]).map_err(|e| {
            CodedError::new(
                Code::STO0002,
                format!("a stored paused queue of partition {partition} does not decode: {e}"),
            )
        })?;
        keys.push(queue);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_key_round_trips() {
        let key = QueueKey {
            scope: Some(Scope::parse("acme").unwrap()),
            limit_key: Some(LimitKey::parse("eu/gold").unwrap()),
            service: "Greeter".into(),
            object_key: Some("k".into()),
            priority: Priority::HIGH,
        };
        let raw = row(3, &key);
        assert_eq!(&raw[..4], &3u32.to_be_bytes());
        assert_eq!(decode(&raw[4..]).unwrap(), key);
        assert!(decode(b"{\"service\": 1}").is_err());
    }
}
