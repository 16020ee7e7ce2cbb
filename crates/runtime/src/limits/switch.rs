//! The fresh-store rule: flow control may only be switched on for a store with nothing in
//! flight (work recorded while it was off would bypass the queues), and only switched off when
//! no scoped invocation is in flight. Once on, the store records it.

use redb::ReadableDatabase;

use crate::errors::CodedError;
use crate::invocation::{Status, store};
use crate::storage::Store;

// Key: "enabled". Value: one byte, 1 once flow control ran on this store.
use crate::schema::FLOW_CONTROL;

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

/// Checks the configured switch against the store; records a first switch-on.
pub fn check(store: &Store, enabled: bool) -> Result<(), CodedError> {
    let was = recorded(store)?;
    if enabled == was {
        return Ok(());
    }
    let records = store.with_db(store::load_records)??;
    let in_flight = records.iter().filter(|r| r.status != Status::Completed);
    if enabled {
        let count = in_flight.count();
        if count > 0 {
            return Err(CodedError::uncoded(format!(
                "flow control cannot be enabled on {}: it holds {count} in-flight invocation(s) recorded while flow control was off; start once with experimental-enable-vqueues = false and let them complete (see `sluice invocations list`), or use a fresh --data-dir",
                store.path().display()
            )));
        }
        return record(store);
    }
    let scoped = in_flight.filter(|r| r.scope.is_some()).count();
    if scoped > 0 {
        return Err(CodedError::uncoded(format!(
            "flow control cannot be disabled on {}: {scoped} scoped invocation(s) are queued or running; start with flow control enabled until they complete (see `sluice invocations list`), or cancel them",
            store.path().display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::InvocationId;
    use crate::invocation::{InvocationRecord, Target};
    use crate::storage::writer::WriteSet;

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
        r.scope = scope.map(|s| crate::flow::Scope::parse(s).unwrap());
        r.status = status;
        r
    }

    #[test]
    fn switching_on_needs_an_empty_store_and_off_needs_no_scoped_work() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        put(&store, &record_of(None, Status::Pending));
        let refused = check(&store, true).unwrap_err();
        assert!(
            refused.message.contains("1 in-flight"),
            "{}",
            refused.message
        );
        assert!(check(&store, false).is_ok());

        let fresh = tempfile::tempdir().unwrap();
        let store = Store::open(fresh.path()).unwrap();
        put(&store, &record_of(None, Status::Completed));
        check(&store, true).unwrap();
        put(&store, &record_of(Some("acme"), Status::Suspended));
        let refused = check(&store, false).unwrap_err();
        assert!(refused.message.contains("1 scoped"), "{}", refused.message);
        // Still on: nothing to check.
        check(&store, true).unwrap();
    }
}
