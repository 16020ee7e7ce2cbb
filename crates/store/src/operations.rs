//! What operators did in bulk, kept as a record: each bulk cancel (`POST
//! /invocations/bulk-cancel`) with its filter, where it stands and what it canceled. The
//! records are metadata (in cluster mode every node has them, `MetaGroup::Operations`); the
//! newest [`MAX_BULK_CANCELS`] are kept.

use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};
use serde::{Deserialize, Serialize};

use crate::schema::{BULK_CANCELS, MetaGroup};
use crate::storage::Store;
use sluice_core::errors::{Code, CodedError};

/// How many bulk-cancel records are kept; storing one more drops the oldest.
pub const MAX_BULK_CANCELS: usize = 1_000;

/// Where a bulk cancel stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BulkCancelState {
    /// Its node is canceling.
    Running,
    /// Every partition went through it.
    Done,
    /// It stopped on an error (`error` says which); what it canceled stays canceled.
    Failed,
    /// Its node stopped while it ran (found so at the node's next start); what it canceled
    /// stays canceled, and the same filter run again cancels the rest.
    Interrupted,
}

impl BulkCancelState {
    /// Its name as the API and SQL show it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Interrupted => "interrupted",
        }
    }
}

/// One bulk cancel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BulkCancelRecord {
    /// `bc_` and a ULID: records sort by when they started.
    pub id: String,
    /// The node that ran it.
    pub node: String,
    /// Its filter, as the request gave it (JSON).
    pub filter: serde_json::Value,
    /// Where it stands.
    pub state: BulkCancelState,
    /// When it started, ms since the epoch.
    pub started_at_ms: u64,
    /// When it ended, ms since the epoch.
    pub finished_at_ms: Option<u64>,
    /// Invocations its filter named.
    pub named: u64,
    /// Of those, how many it canceled.
    pub cancelled: u64,
    /// Why it failed.
    pub error: Option<String>,
}

fn storage(e: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::RT0006, format!("bulk-cancel records: {e}"))
}

/// Stores `record` (replacing one with its id), drops the oldest past [`MAX_BULK_CANCELS`],
/// and in cluster mode hands the records to every node.
pub fn put_bulk_cancel(store: &Store, record: &BulkCancelRecord) -> Result<(), CodedError> {
    let change = store.meta_change(MetaGroup::Operations);
    let value = serde_json::to_vec(record).map_err(storage)?;
    store.with_db(|db| -> Result<(), CodedError> {
        let txn = db.begin_write().map_err(storage)?;
        {
            let mut table = txn.open_table(BULK_CANCELS).map_err(storage)?;
            table
                .insert(record.id.as_str(), value.as_slice())
                .map_err(storage)?;
            let over = (table.len().map_err(storage)? as usize).saturating_sub(MAX_BULK_CANCELS);
            for _ in 0..over {
                table.pop_first().map_err(storage)?;
            }
        }
        txn.commit().map_err(storage)
    })??;
    change.publish()
}

/// Every kept record, oldest first. A row that does not decode (damage) is passed over.
pub fn bulk_cancels(store: &Store) -> Result<Vec<BulkCancelRecord>, CodedError> {
    store.with_db(|db| -> Result<Vec<BulkCancelRecord>, CodedError> {
        let txn = db.begin_read().map_err(storage)?;
        let Ok(table) = txn.open_table(BULK_CANCELS) else {
            return Ok(Vec::new());
        };
        let mut records = Vec::new();
        for row in table.iter().map_err(storage)? {
            let (_, value) = row.map_err(storage)?;
            if let Ok(record) = serde_json::from_slice(value.value()) {
                records.push(record);
            }
        }
        Ok(records)
    })?
}

/// Marks `node`'s records still `running` as `interrupted` (the node starts again, so none of
/// them runs); how many.
pub fn interrupt_bulk_cancels(store: &Store, node: &str, now_ms: u64) -> Result<usize, CodedError> {
    let stale: Vec<BulkCancelRecord> = bulk_cancels(store)?
        .into_iter()
        .filter(|r| r.state == BulkCancelState::Running && r.node == node)
        .collect();
    for mut record in stale.iter().cloned() {
        record.state = BulkCancelState::Interrupted;
        record.finished_at_ms = Some(now_ms);
        put_bulk_cancel(store, &record)?;
    }
    Ok(stale.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: usize, state: BulkCancelState) -> BulkCancelRecord {
        BulkCancelRecord {
            id: format!("bc_{n:08}"),
            node: "n1".into(),
            filter: serde_json::json!({"scope": "acme"}),
            state,
            started_at_ms: n as u64,
            finished_at_ms: None,
            named: 0,
            cancelled: 0,
            error: None,
        }
    }

    #[test]
    fn records_are_kept_newest_up_to_the_bound_and_running_ones_become_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for n in 0..MAX_BULK_CANCELS + 3 {
            put_bulk_cancel(&store, &record(n, BulkCancelState::Done)).unwrap();
        }
        let kept = bulk_cancels(&store).unwrap();
        assert_eq!(kept.len(), MAX_BULK_CANCELS);
        assert_eq!(kept[0].id, "bc_00000003", "the oldest three went");
        let mut other = record(MAX_BULK_CANCELS + 10, BulkCancelState::Running);
        other.node = "n2".into();
        put_bulk_cancel(&store, &other).unwrap();
        put_bulk_cancel(
            &store,
            &record(MAX_BULK_CANCELS + 11, BulkCancelState::Running),
        )
        .unwrap();
        assert_eq!(interrupt_bulk_cancels(&store, "n1", 99).unwrap(), 1);
        let states: Vec<_> = bulk_cancels(&store)
            .unwrap()
            .into_iter()
            .rev()
            .take(2)
            .map(|r| (r.node, r.state, r.finished_at_ms))
            .collect();
        assert_eq!(
            states,
            vec![
                ("n1".to_owned(), BulkCancelState::Interrupted, Some(99)),
                ("n2".to_owned(), BulkCancelState::Running, None),
            ]
        );
    }
}
