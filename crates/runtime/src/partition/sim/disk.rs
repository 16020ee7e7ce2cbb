//! The simulator's disk: redb's storage in memory, with the two faults a real disk has. It
//! fails writes on command (a full disk, an I/O error — possibly in the middle of a commit), and
//! a crash loses every write since the last `sync_data`, the way a power cut loses the page
//! cache. Undoing is cheap: each write keeps the bytes it overwrote until the next sync.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

/// A write since the last sync, and how to take it back.
#[derive(Debug)]
enum Undo {
    /// Bytes at `offset` before the write.
    Bytes { offset: usize, old: Vec<u8> },
    /// The length before a resize.
    Len(usize),
}

#[derive(Debug, Default)]
struct State {
    bytes: Vec<u8>,
    undo: Vec<Undo>,
    /// Writes and syncs left before every later one fails; `None`: healthy.
    fails_after: Option<u32>,
    /// Operations that failed so far.
    failures: u64,
}

/// A simulated disk; clones share it (one is handed to redb, the simulator keeps another).
#[derive(Debug, Clone, Default)]
pub struct Disk(Arc<Mutex<State>>);

impl Disk {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every write or sync after the next `n` fails, until [`Disk::crash`].
    pub fn fail_after(&self, n: u32) {
        self.state().fails_after = Some(n);
    }

    /// Operations that failed so far.
    pub fn failures(&self) -> u64 {
        self.state().failures
    }

    /// The power goes: what was not synced is gone, and the disk works again.
    pub fn crash(&self) {
        let mut state = self.state();
        while let Some(undo) = state.undo.pop() {
            match undo {
                Undo::Bytes { offset, old } => {
                    state.bytes[offset..offset + old.len()].copy_from_slice(&old);
                }
                Undo::Len(len) => state.bytes.resize(len, 0),
            }
        }
        state.fails_after = None;
    }

    /// The power goes, but the disk had written some of what was not synced yet: the first
    /// `kept` writes since the last sync survive, and the first `torn` bytes of the one after
    /// them (a torn write); the rest is gone. The disk works again.
    pub fn crash_partly(&self, kept: usize, torn: usize) {
        let mut state = self.state();
        while state.undo.len() > kept {
            let undo = state.undo.pop().expect("longer than kept");
            let last = state.undo.len() == kept;
            match undo {
                Undo::Bytes { offset, old } => {
                    // The torn write keeps its first `torn` new bytes.
                    let from = if last { torn.min(old.len()) } else { 0 };
                    state.bytes[offset + from..offset + old.len()].copy_from_slice(&old[from..]);
                }
                Undo::Len(len) => state.bytes.resize(len, 0),
            }
        }
        state.undo.clear();
        state.fails_after = None;
    }

    /// Writes since the last sync.
    pub fn unsynced(&self) -> usize {
        self.state().undo.len()
    }

    /// The handle redb writes through.
    pub fn backend(&self) -> Backend {
        Backend(self.clone())
    }
}

/// The simulator's directory of log segments: each file a [`Disk`] of its own. Creating,
/// renaming and removing a file is durable at once (the log syncs its directory right after
/// each); what a file holds is lost or torn as a [`Disk`]'s is.
#[derive(Debug, Clone, Default)]
pub struct LogDisk(Arc<Mutex<LogFiles>>);

#[derive(Debug, Default)]
struct LogFiles {
    files: std::collections::BTreeMap<String, Disk>,
    /// Writes and syncs left before every later one fails, for files made from now on.
    fails_after: Option<u32>,
}

impl LogDisk {
    fn files(&self) -> MutexGuard<'_, LogFiles> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every write or sync to the log after the next `n` (per file) fails, until a crash.
    pub fn fail_after(&self, n: u32) {
        let mut files = self.files();
        files.fails_after = Some(n);
        for disk in files.files.values() {
            disk.fail_after(n);
        }
    }

    /// The power goes: each file keeps what was synced, and `keep(unsynced writes)` chooses,
    /// per file, how many of its later writes survive and how many bytes of the next one.
    pub fn crash(&self, mut keep: impl FnMut(usize) -> (usize, usize)) {
        let mut files = self.files();
        files.fails_after = None;
        for disk in files.files.values() {
            let (kept, torn) = keep(disk.unsynced());
            disk.crash_partly(kept, torn);
        }
    }
}

/// A file of a [`LogDisk`].
#[derive(Debug)]
struct LogFile(Disk);

impl sluice_store::storage::local::segments::LogFile for LogFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        redb::StorageBackend::read(&Backend(self.0.clone()), offset, buf)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let backend = Backend(self.0.clone());
        let end = offset
            .checked_add(buf.len() as u64)
            .ok_or_else(out_of_range)?;
        if end > redb::StorageBackend::len(&backend)? {
            redb::StorageBackend::set_len(&backend, end)?;
        }
        redb::StorageBackend::write(&backend, offset, buf)
    }
    fn size(&self) -> io::Result<u64> {
        redb::StorageBackend::len(&Backend(self.0.clone()))
    }
    fn sync_data(&self) -> io::Result<()> {
        redb::StorageBackend::sync_data(&Backend(self.0.clone()))
    }
}

impl sluice_store::storage::local::segments::LogDir for LogDisk {
    fn names(&self) -> io::Result<Vec<String>> {
        Ok(self.files().files.keys().cloned().collect())
    }
    fn open(
        &self,
        name: &str,
        create: bool,
    ) -> io::Result<Arc<dyn sluice_store::storage::local::segments::LogFile>> {
        let mut files = self.files();
        let fails_after = files.fails_after;
        let disk = match files.files.get(name) {
            Some(disk) => disk.clone(),
            None if create => {
                let disk = Disk::default();
                if let Some(n) = fails_after {
                    disk.fail_after(n);
                }
                files.files.insert(name.to_owned(), disk.clone());
                disk
            }
            None => return Err(io::Error::new(io::ErrorKind::NotFound, name.to_owned())),
        };
        Ok(Arc::new(LogFile(disk)))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut files = self.files();
        let disk = files
            .files
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, from.to_owned()))?;
        files.files.insert(to.to_owned(), disk);
        Ok(())
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        self.files().files.remove(name);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

impl State {
    /// Counts down to the failure; an error once it is reached.
    fn check(&mut self) -> io::Result<()> {
        match &mut self.fails_after {
            None => Ok(()),
            Some(0) => {
                self.failures += 1;
                Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    "simulated disk failure",
                ))
            }
            Some(n) => {
                *n -= 1;
                Ok(())
            }
        }
    }
}

fn out_of_range() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "out of range")
}

/// redb's view of a [`Disk`].
#[derive(Debug)]
pub struct Backend(Disk);

impl redb::StorageBackend for Backend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.state().bytes.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let state = self.0.state();
        let offset = usize::try_from(offset).map_err(|_| out_of_range())?;
        let end = offset.checked_add(out.len()).ok_or_else(out_of_range)?;
        out.copy_from_slice(state.bytes.get(offset..end).ok_or_else(out_of_range)?);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.0.state();
        state.check()?;
        let len = usize::try_from(len).map_err(|_| out_of_range())?;
        let old = state.bytes.len();
        if len < old {
            // Shrinking loses bytes: keep them to restore.
            // Undoing runs backwards: the length comes back first, then the bytes.
            let kept = state.bytes[len..].to_vec();
            state.undo.push(Undo::Bytes {
                offset: len,
                old: kept,
            });
            state.undo.push(Undo::Len(old));
        } else {
            state.undo.push(Undo::Len(old));
        }
        state.bytes.resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut state = self.0.state();
        state.check()?;
        state.undo.clear();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut state = self.0.state();
        state.check()?;
        let offset = usize::try_from(offset).map_err(|_| out_of_range())?;
        let end = offset.checked_add(data.len()).ok_or_else(out_of_range)?;
        let old = state
            .bytes
            .get(offset..end)
            .ok_or_else(out_of_range)?
            .to_vec();
        state.undo.push(Undo::Bytes { offset, old });
        state.bytes[offset..end].copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use redb::StorageBackend as _;

    use super::*;

    #[test]
    fn a_crash_keeps_what_was_synced_and_loses_the_rest() {
        let disk = Disk::default();
        let backend = disk.backend();
        backend.set_len(8).unwrap();
        backend.write(0, b"abcd").unwrap();
        backend.sync_data().unwrap();
        backend.write(2, b"XY").unwrap();
        backend.set_len(16).unwrap();
        backend.write(12, b"zz").unwrap();
        backend.set_len(3).unwrap();
        disk.crash();
        let mut out = vec![0; 8];
        backend.read(0, &mut out).unwrap();
        assert_eq!(&out, b"abcd\0\0\0\0");
        assert_eq!(backend.len().unwrap(), 8);
    }

    #[test]
    fn writes_fail_after_the_countdown_until_the_crash() {
        let disk = Disk::default();
        let backend = disk.backend();
        backend.set_len(4).unwrap();
        backend.sync_data().unwrap();
        disk.fail_after(1);
        backend.write(0, b"a").unwrap();
        assert!(backend.write(1, b"b").is_err());
        assert!(backend.sync_data().is_err());
        assert_eq!(disk.failures(), 2);
        disk.crash();
        backend.write(1, b"b").unwrap();
        let mut out = vec![0; 4];
        backend.read(0, &mut out).unwrap();
        assert_eq!(&out, b"\0b\0\0");
    }
}
