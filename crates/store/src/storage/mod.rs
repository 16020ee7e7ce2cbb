//! The one redb database under `data-dir`. Opening it checks who else holds it (RT0005) and its
//! format version record (RT0009/META0011, META0010); closing it is part of shutdown.
//!
//! The write path, by stage (each module uses only those above it):
//! [`write_set`] (what a partition writes) <- [`record`] (a log record's bytes) <- [`fencing`]
//! (which records of a partition's log count) <- [`log`] (the [`log::PartitionLog`] trait)
//! <- [`view`] (the redb view behind a log: backlog, applier, checkpoints) <- [`local`]
//! (embedded mode's segment log, its appender and replay) <- [`writer`] (the handle partitions
//! write through) <- [`pipeline`] (a cluster leader's records in flight).

pub mod changes;
pub mod fencing;
mod gather;
mod jobs;
pub mod key_index;
pub mod layout;
pub mod local;
pub mod log;
pub mod meta;
pub mod pipeline;
pub mod record;
pub mod snapshot;
pub mod threads;
pub mod view;
pub mod write_set;
pub mod writer;

#[cfg(test)]
mod test_support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use redb::{Database, DatabaseError, ReadableDatabase};

use crate::health::Health;
use sluice_core::errors::{Code, CodedError};

/// File name of the database inside `data-dir`.
pub const DB_FILE: &str = "sluice.redb";

/// Directory of the local log inside `data-dir` (`local/segments.rs`).
pub const LOG_DIR: &str = "log";

/// redb's page cache. Its default (1 GiB) let a large held backlog look like 2.5 KiB per
/// invocation of resident memory; reads on the hot path hit recent pages, which fit in far less.
const CACHE_BYTES: usize = 64 * 1024 * 1024;

/// The store format this build writes. Bump it with a migration when a table changes shape.
/// 2: the partition tables' rows keyed by partition first (`layout.rs`); a format-1 store is
/// converted when it opens.
/// 3: stored invocations indexed by scope and limit key (`key_index.rs`); a format-2 store
/// builds the index when it opens.
pub const FORMAT_VERSION: u32 = 3;

/// Store-wide records: the format version and the version of Sluice that created the store.
use crate::schema::META;
const FORMAT_VERSION_KEY: &str = "format_version";
const CREATED_BY_KEY: &str = "created_by";

/// The store. Shared behind an `Arc`; [`Store::close`] releases the file at shutdown.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    /// `None` once closed. A lock rather than plain ownership because shutdown closes the store
    /// while other tasks may still hold the `Arc`; transactions take the read side, which is
    /// uncontended outside of that one moment.
    db: RwLock<Option<Database>>,
    /// Turns failed when a write to this store fails (see [`crate::health`]).
    health: Arc<Health>,
    /// Cluster mode: where changed metadata tables go (see [`meta`]).
    meta_log: std::sync::OnceLock<Arc<dyn meta::MetaLog>>,
    /// What a metadata change and the applying of another's hold (`meta.rs`).
    meta_gate: std::sync::Mutex<()>,
    /// Per metadata record key, the offset of this node's last record in the cluster's meta
    /// topic (`meta.rs`).
    meta_published: std::sync::Mutex<std::collections::HashMap<String, i64>>,
    /// The local log, replayed into the view at open, until the writer takes it
    /// ([`writer::Writer::start_logged`]); the store only holds it between the two.
    log: std::sync::Mutex<Option<local::segments::SegmentLog>>,
    /// Embedded mode: answered writes not yet in the view, which every read applies first.
    backlog: view::backlog::Backlog,
}

impl Store {
    /// Opens (or creates) the store under `data_dir`, its local log with default options.
    pub fn open(data_dir: &Path) -> Result<Self, CodedError> {
        Self::open_with(data_dir, local::segments::Options::default())
    }

    /// Opens (or creates) the store under `data_dir`; its local log (`<data-dir>/log/`) is
    /// replayed into it, and new segments get `log`'s size.
    pub fn open_with(data_dir: &Path, log: local::segments::Options) -> Result<Self, CodedError> {
        Self::open_keyed(data_dir, log, 1)
    }

    /// [`Store::open_with`], converting a format-1 store straight to rows keyed by
    /// `partitions` (the node's count; [`Store::use_partitions`] then finds nothing to move).
    pub fn open_keyed(
        data_dir: &Path,
        log: local::segments::Options,
        partitions: u32,
    ) -> Result<Self, CodedError> {
        std::fs::create_dir_all(data_dir).map_err(|e| {
            CodedError::uncoded(format!(
                "cannot create data dir {}: {e}; choose another --data-dir",
                data_dir.display()
            ))
        })?;
        let path = data_dir.join(DB_FILE);
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(&path)
            .map_err(|e| open_error(&path, e));
        let store = Self::checked(path, db?, partitions)?;
        let dir = data_dir.join(LOG_DIR);
        store.replay_log(
            Arc::new(local::segments::FsDir(dir.clone())),
            log,
            &dir.display(),
        )?;
        Ok(store)
    }

    /// Takes the local log for the writer (once).
    pub(crate) fn take_log(&self) -> Option<local::segments::SegmentLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The store on `db`, once its format version is one this build reads.
    fn checked(path: PathBuf, db: Database, partitions: u32) -> Result<Self, CodedError> {
        check_format(&db, &path, partitions)?;
        Ok(Self {
            path,
            db: RwLock::new(Some(db)),
            health: Arc::default(),
            meta_log: std::sync::OnceLock::new(),
            meta_gate: std::sync::Mutex::new(()),
            meta_published: std::sync::Mutex::default(),
            log: std::sync::Mutex::new(None),
            backlog: view::backlog::Backlog::default(),
        })
    }

    /// Opens (or creates) a store on `backend` instead of a file: the partition simulator's
    /// disk, which fails and loses unsynced writes on command.
    #[cfg(any(test, feature = "testing"))]
    pub fn open_backend(backend: impl redb::StorageBackend) -> Result<Self, CodedError> {
        let path = PathBuf::from("simulated");
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(backend)
            .map_err(|e| open_error(&path, e));
        Self::checked(path, db?, 1)
    }

    /// Opens a store on `backend` whose local log is in `log` (the partition simulator's disks),
    /// replaying the log as [`Store::open`] does.
    #[cfg(any(test, feature = "testing"))]
    pub fn open_backend_logged(
        backend: impl redb::StorageBackend,
        log: Arc<dyn local::segments::LogDir>,
    ) -> Result<Self, CodedError> {
        let store = Self::open_backend(backend)?;
        store.replay_log(
            log,
            local::segments::Options::default(),
            &"the simulated log",
        )?;
        Ok(store)
    }

    /// The health of the process that writes this store.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` with the open database, once it holds every write answered so far (the read
    /// rule, `docs/durability.md`: whatever waits in the backlog is applied first).
    pub fn with_db<R>(&self, f: impl FnOnce(&Database) -> R) -> Result<R, CodedError> {
        self.backlog.catch_up(self)?;
        self.with_view(f)
    }

    /// Whether [`Store::close`] has run (shutting down): a read failing then is no fault.
    pub fn is_closed(&self) -> bool {
        self.db.read().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Embedded mode: what waits between the log and the view.
    pub(crate) fn backlog(&self) -> &view::backlog::Backlog {
        &self.backlog
    }

    /// Runs `f` with the view as it is, without catching up (the applier's own access).
    pub(crate) fn with_view<R>(&self, f: impl FnOnce(&Database) -> R) -> Result<R, CodedError> {
        let guard = self.db.read().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(db) => Ok(f(db)),
            None => Err(CodedError::new(
                Code::RT0006,
                format!("store {} is closed (shutting down)", self.path.display()),
            )),
        }
    }

    /// The format version recorded in the store.
    pub fn format_version(&self) -> Result<u32, CodedError> {
        self.with_db(read_format)?
            .map_err(|e| storage_error(&self.path, e))?
            .ok_or_else(|| CodedError::new(Code::RT0009, "format version record vanished"))
    }

    /// Keys the partition tables' rows by `partitions` (the node's `worker.partitions`),
    /// moving every row once if the store was keyed by another count; what moved, if anything.
    /// Reads and writes stay right meanwhile: each transaction reads the count it works by.
    pub fn use_partitions(&self, partitions: u32) -> Result<Option<layout::Moved>, CodedError> {
        let started = std::time::Instant::now();
        let moved = self.with_db(|db| -> Result<Option<layout::Moved>, redb::Error> {
            let txn = db.begin_write()?;
            let before = layout::partitions_written(&txn)?;
            if before == partitions.max(1) {
                return Ok(None);
            }
            let moved = layout::rekey(&txn, layout::Before::Keyed, partitions)?;
            txn.commit()?;
            tracing::info!(
                from = before,
                to = partitions,
                rows = moved.rows,
                bytes = moved.bytes,
                took_ms = started.elapsed().as_millis() as u64,
                "the store's rows were keyed by a new partition count"
            );
            Ok(Some(moved))
        })?;
        moved.map_err(|e| view::fail_store(self, "keying the store's rows by partition", e))
    }

    /// Closes the database file; later calls to [`Store::with_db`] fail. Idempotent.
    pub fn close(&self) {
        let db = self.db.write().unwrap_or_else(|e| e.into_inner()).take();
        if db.is_some() {
            drop(db);
            tracing::info!(path = %self.path.display(), "store closed");
        }
    }
}

fn open_error(path: &Path, err: DatabaseError) -> CodedError {
    match err {
        DatabaseError::DatabaseAlreadyOpen | DatabaseError::LockProtocolMismatch => {
            CodedError::new(
                Code::RT0005,
                format!(
                    "store {} is locked by another process: stop the other sluice using this data dir, or start this one with its own --data-dir",
                    path.display()
                ),
            )
        }
        other => CodedError::new(
            Code::RT0009,
            format!(
                "cannot open {} as a Sluice store: {other}; point --data-dir at a fresh directory or restore a backup",
                path.display()
            ),
        ),
    }
}

fn storage_error(path: &Path, err: impl std::fmt::Display) -> CodedError {
    CodedError::new(
        Code::RT0009,
        format!("cannot read the store {}: {err}", path.display()),
    )
}

/// `Ok(None)` when the store has no version record.
fn read_format(db: &Database) -> Result<Option<u32>, redb::Error> {
    let txn = db.begin_read()?;
    let table = match txn.open_table(META) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let Some(raw) = table.get(FORMAT_VERSION_KEY)? else {
        return Ok(None);
    };
    let bytes: [u8; 4] = raw
        .value()
        .try_into()
        .map_err(|_| redb::Error::Corrupted("format version record is not 4 bytes".into()))?;
    Ok(Some(u32::from_be_bytes(bytes)))
}

fn check_format(db: &Database, path: &Path, partitions: u32) -> Result<(), CodedError> {
    match read_format(db).map_err(|e| storage_error(path, e))? {
        Some(version) if version == FORMAT_VERSION => Ok(()),
        Some(version) if version > FORMAT_VERSION => Err(CodedError::new(
            Code::META0010,
            format!(
                "store {} has format version {version}, newer than this build supports ({FORMAT_VERSION}): run a newer sluice, or point --data-dir elsewhere",
                path.display()
            ),
        )),
        Some(version @ (1 | 2)) => {
            convert(db, version, partitions).map_err(|e| storage_error(path, e))
        }
        Some(version) => Err(CodedError::new(
            Code::META0010,
            format!(
                "store {} has format version {version}, which this build cannot migrate (it writes {FORMAT_VERSION})",
                path.display()
            ),
        )),
        None if is_empty(db).map_err(|e| storage_error(path, e))? => {
            write_format(db).map_err(|e| storage_error(path, e))
        }
        None => Err(CodedError::new(
            Code::RT0009,
            format!(
                "store {} holds data but no format version record (META0011): it was not written by sluice or is damaged; point --data-dir at a fresh directory or restore a backup",
                path.display()
            ),
        )),
    }
}

/// Converts a store of format `from` in one transaction with the new format record: a format-1
/// store's partition tables' rows, keyed by their logical keys alone, each move under its
/// partition by `partitions`; then the index of invocations by scope and key is built.
fn convert(db: &Database, from: u32, partitions: u32) -> Result<(), redb::Error> {
    let started = std::time::Instant::now();
    let txn = db.begin_write()?;
    let moved = match from {
        1 => layout::rekey(&txn, layout::Before::Unkeyed, partitions)?,
        _ => layout::Moved::default(),
    };
    let indexed = key_index::rebuild(&txn)?;
    txn.open_table(META)?
        .insert(FORMAT_VERSION_KEY, FORMAT_VERSION.to_be_bytes().as_slice())?;
    txn.commit()?;
    tracing::info!(
        rows = moved.rows,
        bytes = moved.bytes,
        indexed,
        took_ms = started.elapsed().as_millis() as u64,
        partitions,
        "the store was converted (store format {from} to {FORMAT_VERSION}): rows keyed by partition, invocations indexed by scope and key"
    );
    Ok(())
}

fn is_empty(db: &Database) -> Result<bool, redb::Error> {
    let txn = db.begin_read()?;
    Ok(txn.list_tables()?.next().is_none() && txn.list_multimap_tables()?.next().is_none())
}

fn write_format(db: &Database) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(META)?;
        table.insert(FORMAT_VERSION_KEY, FORMAT_VERSION.to_be_bytes().as_slice())?;
        table.insert(CREATED_BY_KEY, env!("CARGO_PKG_VERSION").as_bytes())?;
    }
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_store_records_its_format() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.format_version().unwrap(), FORMAT_VERSION);
        store.close();
        // Reopening finds the record and accepts it.
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.format_version().unwrap(), FORMAT_VERSION);
    }

    #[test]
    fn a_second_open_is_rt0005() {
        let dir = tempfile::tempdir().unwrap();
        let _held = Store::open(dir.path()).unwrap();
        let err = Store::open(dir.path()).unwrap_err();
        assert_eq!(err.code, Some(Code::RT0005));
        assert!(err.message.contains("locked by another process"), "{err}");
    }

    #[test]
    fn closing_releases_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.close();
        store.close();
        assert!(store.with_db(|_| ()).is_err());
        Store::open(dir.path()).unwrap();
    }

    #[test]
    fn data_without_version_is_rt0009() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Database::create(dir.path().join(DB_FILE)).unwrap();
            let txn = db.begin_write().unwrap();
            let table: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("foreign");
            txn.open_table(table).unwrap().insert(1, 2).unwrap();
            txn.commit().unwrap();
        }
        let err = Store::open(dir.path()).unwrap_err();
        assert_eq!(err.code, Some(Code::RT0009));
        assert!(err.message.contains("META0011"), "{err}");
    }

    #[test]
    fn a_newer_format_is_meta0010() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Database::create(dir.path().join(DB_FILE)).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(FORMAT_VERSION_KEY, 99u32.to_be_bytes().as_slice())
                .unwrap();
            txn.commit().unwrap();
        }
        let err = Store::open(dir.path()).unwrap_err();
        assert_eq!(err.code, Some(Code::META0010));
        assert!(err.message.contains("format version 99"), "{err}");
    }

    #[test]
    fn a_file_that_is_not_redb_is_rt0009() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DB_FILE), b"definitely not a database file").unwrap();
        let err = Store::open(dir.path()).unwrap_err();
        assert_eq!(err.code, Some(Code::RT0009));
    }
}
