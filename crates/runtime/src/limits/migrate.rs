//! The flow-control migration: flow control is always on, and a store written while it was a
//! switch (off by default) gains its flow-control record at the first start. Nothing in such a
//! store needs rewriting: with flow control off every invocation was unscoped, and unscoped
//! work never touches a queue's limits, so what was in flight runs on as it was. The record
//! says the store was migrated, so the start that migrates it is logged once.

use redb::ReadableDatabase;

use sluice_core::errors::CodedError;
use sluice_store::invocation::{Status, store};
use sluice_store::storage::Store;

// Key: "enabled". Value: one byte, 1 once flow control ran on this store.
use sluice_store::schema::FLOW_CONTROL;

fn storage(e: impl std::fmt::Display) -> CodedError {
    CodedError::uncoded(format!(
        "cannot read the flow-control record of the store: {e}"
    ))
}

fn recorded(store: &Store) -> Result<bool, CodedError> {
    store.with_db(|db| -> Result<bool, CodedError> {
        let txn = db.begin_read().map_err(storage)?;
        let Ok(table) = txn.open_table(FLOW_CONTROL) else {
            return Ok(false);
        };
        Ok(table
            .get("enabled")
            .map_err(storage)?
            .is_some_and(|v| v.value() == [1]))
    })?
}

fn record(store: &Store) -> Result<(), CodedError> {
    store.with_db(|db| -> Result<(), CodedError> {
        let txn = db.begin_write().map_err(storage)?;
        txn.open_table(FLOW_CONTROL)
            .map_err(storage)?
            .insert("enabled", [1u8].as_slice())
            .map_err(storage)?;
        txn.commit().map_err(storage)
    })?
}

/// What the migration found: `None` when the store already had flow control.
#[derive(Debug, PartialEq, Eq)]
pub struct Migrated {
    /// Invocations that were not completed when the store gained flow control; they run on.
    pub in_flight: usize,
}

/// Gives a store written without flow control its flow-control record; `None` when it had it.
pub fn migrate(store: &Store) -> Result<Option<Migrated>, CodedError> {
    if recorded(store)? {
        return Ok(None);
    }
    // Listed records (no inputs or outputs): only their status is counted.
    let in_flight = store
        .with_db(|db| store::load_listed(db, |r| r.status != Status::Completed, usize::MAX))??
        .len();
    record(store)?;
    Ok(Some(Migrated { in_flight }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::ids::InvocationId;
    use sluice_store::invocation::{InvocationRecord, Target};
    use sluice_store::storage::writer::WriteSet;

    fn put(store: &Store, record: &InvocationRecord) {
        let mut writes = WriteSet::default();
        store::put_record(&mut writes, record).unwrap();
        writes.commit_now(store);
    }

    fn record_of(scope: Option<&str>, status: Status) -> InvocationRecord {
        let target = Target {
            service: "S".into(),
            handler: "h".into(),
            key: None,
        };
        let mut r = InvocationRecord::new(InvocationId::generate(1), target, 0);
        r.scope = scope.map(|s| sluice_flow::Scope::parse(s).unwrap());
        r.status = status;
        r
    }

    #[test]
    fn a_store_without_flow_control_gains_it_once_and_keeps_its_work() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        put(&store, &record_of(None, Status::Pending));
        put(&store, &record_of(None, Status::Suspended));
        put(&store, &record_of(None, Status::Completed));
        assert_eq!(migrate(&store).unwrap(), Some(Migrated { in_flight: 2 }));
        assert!(recorded(&store).unwrap());
        // Migrated: later starts find the record, and scoped work is kept like any other.
        put(&store, &record_of(Some("acme"), Status::Suspended));
        assert_eq!(migrate(&store).unwrap(), None);
        let records = store.with_db(store::load_records).unwrap().unwrap();
        assert_eq!(records.len(), 4);
    }

    #[test]
    fn a_fresh_store_migrates_with_nothing_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(migrate(&store).unwrap(), Some(Migrated { in_flight: 0 }));
        assert_eq!(migrate(&store).unwrap(), None);
    }
}
