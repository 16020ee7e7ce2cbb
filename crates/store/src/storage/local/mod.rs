//! Embedded mode's log: segment files under `<data-dir>/log/` ([`segments`]), the
//! [`PartitionLog`] over them ([`LocalLog`]), the thread that appends to it ([`appender`]), and
//! its replay into the view when the store opens (`replay.rs`).

pub mod appender;
mod replay;
pub mod segments;

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::log::PartitionLog;
use segments::{LogFile, SegmentLog};
use sluice_core::errors::CodedError;

/// The local segment log as a [`PartitionLog`]: a record is confirmed once its segment file is
/// synced. Confirming the oldest record syncs every file appended to since the last sync, in
/// order, so one `fdatasync` confirms every record appended meanwhile (group commit).
#[derive(Debug)]
pub struct LocalLog {
    segments: SegmentLog,
    /// Records appended and not confirmed yet: their numbers and files, oldest first.
    unconfirmed: VecDeque<(u64, Arc<dyn LogFile>)>,
    /// The last record whose file was synced.
    synced: u64,
    /// Why the last append failed: it is the answer of its confirmation.
    failed: Option<CodedError>,
}

impl LocalLog {
    /// The log `segments` opened (and replayed), ready for appending.
    pub fn new(segments: SegmentLog) -> Self {
        Self {
            segments,
            unconfirmed: VecDeque::new(),
            synced: 0,
            failed: None,
        }
    }

    /// Syncs every file appended to since the last sync, in the order appended (a segment left
    /// for the next is synced before the next one's records count).
    fn sync(&mut self) -> Result<(), CodedError> {
        let mut last: Option<&Arc<dyn LogFile>> = None;
        for (_, file) in &self.unconfirmed {
            if last.is_some_and(|synced| Arc::ptr_eq(synced, file)) {
                continue;
            }
            if let Some(previous) = last {
                previous.sync_data().map_err(io_error)?;
            }
            last = Some(file);
        }
        if let Some(file) = last {
            // A failed fsync may have dropped the dirty pages: nothing after it can be
            // trusted, which the caller's failed health makes sure of.
            file.sync_data().map_err(io_error)?;
        }
        self.synced = self.unconfirmed.back().map_or(self.synced, |(lsn, _)| *lsn);
        Ok(())
    }
}

fn io_error(e: std::io::Error) -> CodedError {
    CodedError::uncoded(e.to_string())
}

impl PartitionLog for LocalLog {
    /// Writes the record into the current segment at once (no sync).
    fn append(
        &mut self,
        record: &[u8],
    ) -> impl std::future::Future<Output = Result<(), CodedError>> + Send {
        let appended = self.segments.append(record).map_err(io_error);
        let result = match appended {
            Ok(appended) => {
                self.unconfirmed.push_back((appended.lsn, appended.file));
                Ok(())
            }
            Err(e) => {
                self.failed = Some(e.clone());
                Err(e)
            }
        };
        std::future::ready(result)
    }

    /// Ready at once: the sync runs in the caller's thread.
    fn poll_confirm(&mut self, _: &mut Context<'_>) -> Poll<Result<u64, CodedError>> {
        if let Some(failed) = &self.failed {
            return Poll::Ready(Err(failed.clone()));
        }
        let Some(&(lsn, _)) = self.unconfirmed.front() else {
            return Poll::Ready(Err(CodedError::uncoded(
                "a confirmation was asked for with no record appended",
            )));
        };
        if lsn > self.synced
            && let Err(e) = self.sync()
        {
            self.failed = Some(e.clone());
            return Poll::Ready(Err(e));
        }
        self.unconfirmed.pop_front();
        Poll::Ready(Ok(lsn))
    }

    fn unconfirmed(&self) -> usize {
        self.unconfirmed.len()
    }

    fn release(&mut self, position: u64) -> Result<(), CodedError> {
        self.segments.release(position).map(drop).map_err(io_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::log::{confirm, wait};

    fn log(dir: &std::path::Path) -> LocalLog {
        let dir = Arc::new(segments::FsDir(dir.to_path_buf()));
        LocalLog::new(SegmentLog::open(dir, Default::default(), 0, |_| Ok(())).unwrap())
    }

    #[test]
    fn records_are_confirmed_in_order_by_one_sync() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = log(dir.path());
        for record in [b"a", b"b", b"c"] {
            wait(log.append(record)).unwrap();
        }
        assert_eq!(log.unconfirmed(), 3);
        assert_eq!(wait(confirm(&mut log)).unwrap(), 1);
        // The first confirmation synced the file: the next ones only say where they landed.
        assert_eq!(log.synced, 3);
        assert_eq!(wait(confirm(&mut log)).unwrap(), 2);
        assert_eq!(wait(confirm(&mut log)).unwrap(), 3);
        assert_eq!(log.unconfirmed(), 0);
        assert!(wait(confirm(&mut log)).is_err(), "nothing left to confirm");
    }
}
