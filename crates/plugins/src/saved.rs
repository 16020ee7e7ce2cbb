//! Plugins loaded through the admin API survive restarts: their spec and bytes live in redb.

use redb::{ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};

use super::PluginSpec;
use sluice_core::errors::{Code, CodedError};
use sluice_store::storage::Store;

// `SPECS`: name → JSON `SavedSpec`. `BYTES`: name → component bytes.
use sluice_store::schema::{MetaGroup, PLUGIN_BYTES as BYTES, PLUGIN_SPECS as SPECS};

/// A stored plugin's settings and its place in the load order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedSpec {
    /// Load order: plugins run in the order they were first loaded.
    pub order: u64,
    /// Its settings.
    pub spec: PluginSpec,
}

/// A stored plugin.
pub struct Saved {
    /// Its name.
    pub name: String,
    /// Its settings and order.
    pub saved: SavedSpec,
    /// Its component.
    pub bytes: Vec<u8>,
}

fn storage(e: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::RT0006, format!("plugin store: {e}"))
}

/// Every stored plugin, in load order.
pub fn load_all(store: &Store) -> Result<Vec<Saved>, CodedError> {
    store.with_db(|db| {
        let txn = db.begin_read().map_err(storage)?;
        let (Ok(specs), Ok(bytes)) = (txn.open_table(SPECS), txn.open_table(BYTES)) else {
            return Ok(Vec::new());
        };
        let mut all = Vec::new();
        for row in specs.iter().map_err(storage)? {
            let (name, spec) = row.map_err(storage)?;
            let name = name.value().to_owned();
            let saved: SavedSpec = serde_json::from_slice(spec.value()).map_err(storage)?;
            let Some(code) = bytes.get(name.as_str()).map_err(storage)? else {
                continue;
            };
            all.push(Saved {
                name,
                saved,
                bytes: code.value().to_vec(),
            });
        }
        all.sort_by_key(|s| s.saved.order);
        Ok(all)
    })?
}

/// Stores (or replaces) plugin `name`.
pub fn put(store: &Store, name: &str, saved: &SavedSpec, bytes: &[u8]) -> Result<(), CodedError> {
    let json = serde_json::to_vec(saved).map_err(storage)?;
    let change = store.meta_change(MetaGroup::Plugins);
    store.with_db(|db| {
        let txn = db.begin_write().map_err(storage)?;
        {
            txn.open_table(SPECS)
                .map_err(storage)?
                .insert(name, json.as_slice())
                .map_err(storage)?;
            txn.open_table(BYTES)
                .map_err(storage)?
                .insert(name, bytes)
                .map_err(storage)?;
        }
        txn.commit().map_err(storage)
    })??;
    change.publish()
}

/// Forgets plugin `name`.
pub fn remove(store: &Store, name: &str) -> Result<(), CodedError> {
    let change = store.meta_change(MetaGroup::Plugins);
    store.with_db(|db| {
        let txn = db.begin_write().map_err(storage)?;
        {
            txn.open_table(SPECS)
                .map_err(storage)?
                .remove(name)
                .map_err(storage)?;
            txn.open_table(BYTES)
                .map_err(storage)?
                .remove(name)
                .map_err(storage)?;
        }
        txn.commit().map_err(storage)
    })??;
    change.publish()
}
