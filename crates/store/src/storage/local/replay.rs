//! Opening the local log replays it into the view: every record after the view's durable
//! checkpoint is applied before anything reads the store (`docs/durability.md`).

use std::sync::Arc;

use redb::ReadableDatabase;

use crate::storage::Store;
use sluice_core::errors::{Code, CodedError};

impl Store {
    /// Applies every record of the local log in `dir` after the view's durable checkpoint to
    /// the view, makes that durable, and keeps the log, ready for appending, for the writer.
    pub(in crate::storage) fn replay_log(
        &self,
        dir: Arc<dyn super::segments::LogDir>,
        options: super::segments::Options,
        shown: &dyn std::fmt::Display,
    ) -> Result<(), CodedError> {
        let failed = |e: &dyn std::fmt::Display| {
            CodedError::new(
                Code::STO0002,
                format!(
                    "the local log in {shown} cannot be replayed into the store: {e}; restore the data dir from a backup"
                ),
            )
        };
        self.with_db(|db| -> Result<(), CodedError> {
            let applied = db
                .begin_read()
                .map_err(redb::Error::from)
                .and_then(|txn| crate::storage::view::applied(&txn))
                .map_err(|e| super::super::storage_error(&self.path, e))?;
            let mut last = applied;
            let mut txn: Option<redb::WriteTransaction> = None;
            let mut pending = 0usize;
            let mut apply = |read: super::segments::Read| -> Result<(), CodedError> {
                let record =
                    crate::storage::record::Record::decode(&read.payload, usize::MAX).map_err(|e| failed(&e))?;
                let crate::storage::record::Record::Writes { writes, .. } = record else {
                    return Err(failed(&format!("record {} is not a write set", read.lsn)));
                };
                if txn.is_none() {
                    let mut fresh = db.begin_write().map_err(|e| super::super::storage_error(&self.path, e))?;
                    fresh
                        .set_durability(redb::Durability::None)
                        .map_err(|e| super::super::storage_error(&self.path, e))?;
                    txn = Some(fresh);
                }
                let open = txn.as_ref().expect("just made");
                writes
                    .apply(open)
                    .map_err(|e| super::super::storage_error(&self.path, e))?;
                last = read.lsn;
                pending += read.payload.len();
                // Large replays commit as they go (not durably: the last one is).
                if pending > 64 * 1024 * 1024 {
                    let done = txn.take().expect("open");
                    crate::storage::view::set_applied(&done, last).map_err(|e| super::super::storage_error(&self.path, e))?;
                    done.commit().map_err(|e| super::super::storage_error(&self.path, e))?;
                    pending = 0;
                }
                Ok(())
            };
            let mut replay_error = None;
            let opened = super::segments::SegmentLog::open(dir, options, applied, |read| {
                apply(read).map_err(|e| {
                    let message = e.to_string();
                    replay_error = Some(e);
                    std::io::Error::other(message)
                })
            });
            let log = match (opened, replay_error) {
                (_, Some(error)) => return Err(error),
                (Err(e), None) => {
                    if let Some(damage) = e
                        .get_ref()
                        .and_then(|inner| inner.downcast_ref::<super::segments::Damage>())
                    {
                        return Err(CodedError::new(
                            Code::STO0003,
                            format!(
                                "the local log in {shown} is damaged: {damage}; restore the data dir from a backup, or set worker.truncate-damaged-log = true to start without those records"
                            ),
                        ));
                    }
                    return Err(failed(&e));
                }
                (Ok(log), None) => log,
            };
            // Nothing replayed: the view is as durable as it was, and a start pays no sync.
            if last > applied {
                let done = match txn {
                    Some(txn) => txn,
                    None => db.begin_write().map_err(|e| super::super::storage_error(&self.path, e))?,
                };
                crate::storage::view::set_applied(&done, last).map_err(|e| super::super::storage_error(&self.path, e))?;
                done.commit().map_err(|e| super::super::storage_error(&self.path, e))?;
                tracing::info!(
                    from = applied + 1,
                    to = last,
                    "replayed the local log into the store"
                );
            }
            *self.log.lock().unwrap_or_else(|e| e.into_inner()) = Some(log);
            Ok(())
        })?
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::storage::local::segments::{FsDir, SegmentLog};
    use crate::storage::writer::WriteSet;

    use crate::storage::test_support::{T, get};

    /// A fresh store in `dir`, and its log opened as the appender would find it.
    fn store_and_its_log(dir: &std::path::Path) -> SegmentLog {
        drop(Store::open(dir).unwrap());
        let log_dir = dir.join(crate::storage::LOG_DIR);
        SegmentLog::open(Arc::new(FsDir(log_dir)), Default::default(), 0, |_| Ok(())).unwrap()
    }

    #[test]
    fn opening_the_store_replays_what_the_view_lacks() {
        let dir = tempfile::tempdir().unwrap();
        // Records appended and synced, never applied: a crash right after their sync.
        let mut log = store_and_its_log(dir.path());
        for i in 0..3u8 {
            let mut set = WriteSet::default();
            set.put(T, &[b'k', i], vec![i]);
            log.append(&crate::storage::record::encode_writes(0, 0, [&set]))
                .unwrap();
        }
        drop(log);
        let store = Store::open(dir.path()).unwrap();
        for i in 0..3u8 {
            assert_eq!(get(&store, &[b'k', i]), Some(vec![i]));
        }
        let applied = store
            .with_db(|db| crate::storage::view::applied(&db.begin_read().unwrap()).unwrap())
            .unwrap();
        assert_eq!(applied, 3);
        // The next record continues the numbering.
        assert_eq!(store.take_log().unwrap().next_lsn(), 4);
        drop(store);
        // A second open replays nothing new.
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.take_log().unwrap().next_lsn(), 4);
    }

    #[test]
    fn a_record_that_checks_out_but_is_not_a_write_set_fails_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = store_and_its_log(dir.path());
        log.append(b"not a record").unwrap();
        drop(log);
        let error = Store::open(dir.path()).unwrap_err();
        assert_eq!(
            error.code,
            Some(sluice_core::errors::Code::STO0002),
            "{error}"
        );
    }
}
