//! Clusters added through the admin API and every subscription, kept in redb.

use redb::{ReadableDatabase, ReadableTable};
use serde::Serialize;
use serde::de::DeserializeOwned;

use sluice_core::errors::{Code, CodedError};
use sluice_store::storage::Store;

// `CLUSTERS`: name → JSON `super::KafkaCluster`. `SUBSCRIPTIONS`: id → JSON
// `super::Subscription`.
pub use sluice_store::schema::{KAFKA_CLUSTERS as CLUSTERS, SUBSCRIPTIONS};
use sluice_store::schema::{MetaGroup, NamedTable};

fn storage(e: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::RT0006, format!("kafka store: {e}"))
}

/// Every row of `table`.
pub fn load<T: DeserializeOwned>(store: &Store, table: NamedTable) -> Result<Vec<T>, CodedError> {
    store.with_db(|db| {
        let txn = db.begin_read().map_err(storage)?;
        let Ok(rows) = txn.open_table(table) else {
            return Ok(Vec::new());
        };
        rows.iter()
            .map_err(storage)?
            .map(|row| {
                let (_, value) = row.map_err(storage)?;
                serde_json::from_slice(value.value()).map_err(storage)
            })
            .collect()
    })?
}

/// Stores `value` under `key` (`None`: removes it).
pub fn put<T: Serialize>(
    store: &Store,
    table: NamedTable,
    key: &str,
    value: Option<&T>,
) -> Result<(), CodedError> {
    let json = value.map(serde_json::to_vec).transpose().map_err(storage)?;
    // Cluster mode: every node takes the change.
    let change = store.meta_change(MetaGroup::Kafka);
    store.with_db(|db| {
        let txn = db.begin_write().map_err(storage)?;
        {
            let mut rows = txn.open_table(table).map_err(storage)?;
            match &json {
                Some(json) => rows.insert(key, json.as_slice()).map(|_| ()),
                None => rows.remove(key).map(|_| ()),
            }
            .map_err(storage)?;
        }
        txn.commit().map_err(storage)
    })??;
    change.publish()
}
