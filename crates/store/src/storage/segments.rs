//! The local log of embedded mode: the truth a group of write sets is acknowledged on, with the
//! redb file a view applied behind it (`logged.rs`, `docs/durability.md`).
//!
//! Records are appended to segment files under `<data-dir>/log/`, each named by the number of
//! its first record (`00000000000000000042.log`). A record is a 16-byte header — payload length
//! (u32), CRC-32 of the number and payload (u32), its number (u64), little endian — then the
//! payload (a write-set record of `log.rs`). Numbers follow each other without gaps across
//! segments. A length of zero ends the log; so does a record whose checksum, length or number
//! is wrong: that is a torn tail (a write the crash cut short, never acknowledged), which
//! [`SegmentLog::open`] zeroes before anything is appended after it.
//!
//! Segments are preallocated, and segments the view's durable checkpoint covers are recycled
//! (renamed, their old records left in place: their numbers are lower than any new one, so they
//! end the log where they start) rather than deleted, so a sync seldom has to change a file's
//! size or extents.
//!
//! The files are reached through [`LogDir`] and [`LogFile`]: the filesystem ([`FsDir`]) in the
//! server, the simulator's disk in the partition simulator, which crashes between an append and
//! its sync and tears the tail.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

/// Bytes in a record's header.
pub const HEADER: usize = 16;

/// Segments kept for reuse once the checkpoint covers them.
const SPARES: usize = 2;

/// One file of a log directory.
pub trait LogFile: Send + Sync + std::fmt::Debug {
    /// Fills `buf` from `offset` (an error if the file ends first).
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, growing the file if needed.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Its size.
    fn size(&self) -> io::Result<u64>;
    /// Makes every write so far durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
}

/// A directory of segment files.
pub trait LogDir: Send + Sync + std::fmt::Debug {
    /// The names of its files.
    fn names(&self) -> io::Result<Vec<String>>;
    /// Opens file `name`, creating it (empty) if `create` and it does not exist.
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn LogFile>>;
    /// Renames `from` to `to`.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Removes `name`.
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes the names it holds durable (files created, renamed, removed).
    fn sync(&self) -> io::Result<()>;
}

impl LogFile for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
}

/// A log directory on the filesystem.
#[derive(Debug, Clone)]
pub struct FsDir(pub PathBuf);

impl LogDir for FsDir {
    fn names(&self) -> io::Result<Vec<String>> {
        std::fs::create_dir_all(&self.0)?;
        std::fs::read_dir(&self.0)?
            .map(|entry| Ok(entry?.file_name().to_string_lossy().into_owned()))
            .collect()
    }
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn LogFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(self.0.join(name))?;
        Ok(Arc::new(file))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.0.join(from), self.0.join(to))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.0.join(name))
    }
    fn sync(&self) -> io::Result<()> {
        File::open(&self.0)?.sync_all()
    }
}

/// What a log directory is opened with.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Bytes a new segment is preallocated to (a record larger than that gets a segment to
    /// itself, grown to fit).
    pub segment_bytes: u64,
    /// Largest payload a record may have; a header claiming more is a torn tail.
    pub max_record_bytes: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            segment_bytes: 8 * 1024 * 1024,
            max_record_bytes: 256 * 1024 * 1024,
        }
    }
}

/// A record read back.
#[derive(Debug, PartialEq, Eq)]
pub struct Read {
    pub lsn: u64,
    pub payload: Vec<u8>,
}

/// One segment file.
#[derive(Debug)]
struct Segment {
    first: u64,
    name: String,
}

/// The log, open for appending.
#[derive(Debug)]
pub struct SegmentLog {
    dir: Arc<dyn LogDir>,
    options: Options,
    /// Every segment, oldest first; the last is the one appended to.
    segments: Vec<Segment>,
    /// The current segment (`None` until the first record of an empty log).
    file: Option<Arc<dyn LogFile>>,
    /// Where the next record goes in the current segment.
    offset: u64,
    /// Its size on disk (preallocated, or grown by a large record).
    capacity: u64,
    /// The next record's number.
    next: u64,
    spares: Vec<String>,
}

/// What was appended: the record's number and the file to sync for it.
#[derive(Debug, Clone)]
pub struct Appended {
    pub lsn: u64,
    pub file: Arc<dyn LogFile>,
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.log")
}

fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".log")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The header and payload of record `lsn` as they go on disk.
pub fn frame(lsn: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    let len = u32::try_from(payload.len()).expect("records are bounded far below 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&checksum(lsn, payload).to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn checksum(lsn: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&lsn.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// A header read from disk: the payload's length and checksum, the record's number.
fn header(bytes: &[u8; HEADER]) -> (u32, u32, u64) {
    let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let mut lsn = [0; 8];
    lsn.copy_from_slice(&bytes[8..]);
    (len, crc, u64::from_le_bytes(lsn))
}

/// Reads the record at `offset` of `file` (of `size` bytes) if it is record `expected`: `None`
/// at the end of the log (zeros, a torn or foreign record, the end of the file).
fn read_at(
    file: &dyn LogFile,
    size: u64,
    offset: u64,
    expected: u64,
    options: &Options,
) -> Option<Read> {
    let end = offset.checked_add(HEADER as u64)?;
    if end > size {
        return None;
    }
    let mut raw = [0; HEADER];
    file.read_exact_at(&mut raw, offset).ok()?;
    let (len, crc, lsn) = header(&raw);
    if len == 0 || len > options.max_record_bytes || lsn != expected {
        return None;
    }
    if end.checked_add(u64::from(len))? > size {
        return None;
    }
    let mut payload = vec![0; len as usize];
    file.read_exact_at(&mut payload, end).ok()?;
    (checksum(lsn, &payload) == crc).then_some(Read { lsn, payload })
}

/// Gives `file` `bytes` of real blocks, written with zeros from its current end (so a later
/// sync of a write into them changes neither the file's size nor its extents: `fdatasync` then
/// flushes data only). Once per new segment; reused segments have their blocks already.
fn preallocate(file: &dyn LogFile, bytes: u64) -> io::Result<()> {
    let from = file.size()?;
    zero_from(file, from, bytes)
}

impl SegmentLog {
    /// Opens the log in `dir` (created if missing) and hands every record after `applied` to
    /// `replay`, in order; zeroes a torn tail and drops any segment after it, then positions the
    /// log for appending right after the last good record. `replay` failing stops the open.
    pub fn open(
        dir: Arc<dyn LogDir>,
        options: Options,
        applied: u64,
        mut replay: impl FnMut(Read) -> io::Result<()>,
    ) -> io::Result<Self> {
        let mut segments = Vec::new();
        let mut spares = Vec::new();
        for name in dir.names()? {
            if let Some(first) = parse_name(&name) {
                segments.push(Segment { first, name });
            } else if name.starts_with("spare-") {
                spares.push(name);
            }
        }
        spares.sort();
        segments.sort_by_key(|segment| segment.first);
        // Segments wholly behind the checkpoint are not read: the next one starts at or before
        // the first record to replay.
        let start = segments
            .iter()
            .rposition(|segment| segment.first <= applied.saturating_add(1))
            .unwrap_or(0);
        let mut expected = segments
            .get(start)
            .map_or(applied.saturating_add(1), |segment| segment.first);
        let mut end: Option<(usize, u64)> = None;
        for (index, segment) in segments.iter().enumerate().skip(start) {
            if segment.first != expected {
                // A gap between segments: what follows was never acknowledged in order.
                break;
            }
            let file = dir.open(&segment.name, false)?;
            let size = file.size()?;
            let mut offset = 0;
            while let Some(read) = read_at(&*file, size, offset, expected, &options) {
                offset += (HEADER + read.payload.len()) as u64;
                expected += 1;
                if read.lsn > applied {
                    replay(read)?;
                }
            }
            end = Some((index, offset));
            // Did this segment end because it was full (the next record went to the next
            // segment) or because its tail was torn? The next segment says: it must start with
            // the record this one lacks, which the loop checks.
        }
        if applied >= expected {
            // The view is ahead of what the log still holds (its segments were recycled after
            // a checkpoint): append after the checkpoint.
            expected = applied + 1;
            end = None;
        }
        let (keep, offset) = match end {
            Some((index, offset)) => (index + 1, offset),
            None => (0, 0),
        };
        // Segments after the end hold nothing acknowledged.
        for later in segments.drain(keep.min(segments.len())..) {
            dir.remove(&later.name)?;
        }
        // Segments before the one replay started at are wholly behind the checkpoint.
        let behind: Vec<Segment> = segments.drain(..start.min(segments.len())).collect();
        let mut log = Self {
            dir,
            options,
            segments,
            file: None,
            offset,
            capacity: 0,
            next: expected,
            spares,
        };
        for segment in behind {
            log.retire(segment)?;
        }
        // An empty log gets its first segment with its first record (a store that never
        // writes through it, in cluster mode or a test, writes no segment).
        if let Some(last) = log.segments.last() {
            let file = log.dir.open(&last.name, false)?;
            let size = file.size()?;
            // What lies after the last good record was never acknowledged: zeroed, so that a
            // later record appended over part of it is never followed by a stale one.
            zero_from(&*file, offset, size)?;
            file.sync_data()?;
            log.capacity = size;
            log.file = Some(file);
        }
        log.dir.sync()?;
        Ok(log)
    }

    /// The number the next record gets.
    pub fn next_lsn(&self) -> u64 {
        self.next
    }

    fn current(&self) -> &Arc<dyn LogFile> {
        self.file
            .as_ref()
            .expect("a log open for appending has a segment")
    }

    /// Appends `payload` as the next record (not synced: [`Appended::file`] is what to sync,
    /// after every earlier append's file). A record that does not fit the current segment
    /// starts a new one.
    pub fn append(&mut self, payload: &[u8]) -> io::Result<Appended> {
        let lsn = self.next;
        let bytes = frame(lsn, payload);
        let needed = bytes.len() as u64;
        if self.file.is_none() || (self.offset > 0 && self.offset + needed > self.capacity) {
            // The file being left must be synced before the records in the next one count:
            // whoever syncs an append syncs its file, and appends are synced in order.
            self.roll()?;
        }
        if self.offset + needed > self.capacity {
            // A record larger than a segment: its segment grows to hold it.
            preallocate(&**self.current(), self.offset + needed)?;
            self.capacity = self.offset + needed;
        }
        self.current().write_all_at(&bytes, self.offset)?;
        self.offset += needed;
        self.next += 1;
        Ok(Appended {
            lsn,
            file: Arc::clone(self.current()),
        })
    }

    /// Starts a new segment for the next record: a spare one reused, or a new one preallocated.
    fn roll(&mut self) -> io::Result<()> {
        let name = segment_name(self.next);
        let file = match self.spares.pop() {
            Some(spare) => {
                self.dir.rename(&spare, &name)?;
                self.dir.open(&name, false)?
            }
            None => self.dir.open(&name, true)?,
        };
        if file.size()? < self.options.segment_bytes {
            preallocate(&*file, self.options.segment_bytes)?;
        }
        // A reused segment starts with old records: the first header must end the log until
        // the first append overwrites it (their numbers are lower, so they would anyway; the
        // zeros make that plain to a reader).
        file.write_all_at(&[0; HEADER], 0)?;
        file.sync_data()?;
        self.dir.sync()?;
        self.capacity = file.size()?;
        self.offset = 0;
        self.file = Some(file);
        self.segments.push(Segment {
            first: self.next,
            name,
        });
        Ok(())
    }

    /// Gives up every segment whose records are all at or before `checkpoint` (the view holds
    /// them durably); the current segment stays. How many went.
    pub fn release(&mut self, checkpoint: u64) -> io::Result<usize> {
        let mut released = 0;
        while self.segments.len() > 1 && self.segments[1].first <= checkpoint.saturating_add(1) {
            let segment = self.segments.remove(0);
            self.retire(segment)?;
            released += 1;
        }
        if released > 0 {
            self.dir.sync()?;
        }
        Ok(released)
    }

    /// Keeps a segment the checkpoint covers as a spare, or removes it.
    fn retire(&mut self, segment: Segment) -> io::Result<()> {
        if self.spares.len() < SPARES {
            let spare = format!("spare-{}", segment.name);
            self.dir.rename(&segment.name, &spare)?;
            self.spares.push(spare);
        } else {
            self.dir.remove(&segment.name)?;
        }
        Ok(())
    }

    /// How many segment files hold records (the current one included).
    pub fn segments(&self) -> usize {
        self.segments.len()
    }
}

/// Writes zeros over `file` from `offset` to `size`.
fn zero_from(file: &dyn LogFile, offset: u64, size: u64) -> io::Result<()> {
    const CHUNK: usize = 1 << 20;
    let zeros = vec![0u8; CHUNK];
    let mut at = offset;
    while at < size {
        let n = usize::try_from(size - at).unwrap_or(CHUNK).min(CHUNK);
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn small() -> Options {
        Options {
            segment_bytes: 4096,
            max_record_bytes: 1 << 20,
        }
    }

    fn reopen(dir: &std::path::Path, applied: u64) -> (SegmentLog, Vec<Read>) {
        let mut seen = Vec::new();
        let fs: Arc<dyn LogDir> = Arc::new(FsDir(dir.to_path_buf()));
        let log = SegmentLog::open(fs, small(), applied, |read| {
            seen.push(read);
            Ok(())
        })
        .unwrap();
        (log, seen)
    }

    fn payload(i: u64) -> Vec<u8> {
        format!("record {i} {}", "x".repeat((i as usize * 37) % 900)).into_bytes()
    }

    #[test]
    fn records_come_back_in_order_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, seen) = reopen(dir.path(), 0);
        assert!(seen.is_empty());
        for i in 1..=40 {
            assert_eq!(log.append(&payload(i)).unwrap().lsn, i);
        }
        assert!(log.segments() > 3, "{} segments", log.segments());
        drop(log);
        let (log, seen) = reopen(dir.path(), 0);
        assert_eq!(seen.len(), 40);
        for (i, read) in (1..).zip(&seen) {
            assert_eq!(read.lsn, i);
            assert_eq!(read.payload, payload(i));
        }
        assert_eq!(log.next_lsn(), 41);
        // After a checkpoint only the records behind it are replayed.
        drop(log);
        let (_, seen) = reopen(dir.path(), 25);
        assert_eq!(seen.first().map(|r| r.lsn), Some(26));
        assert_eq!(seen.len(), 15);
    }

    #[test]
    fn a_torn_tail_is_cut_and_overwritten_records_never_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = reopen(dir.path(), 0);
        for i in 1..=3 {
            log.append(&payload(i)).unwrap();
        }
        let file = dir.path().join(&log.segments.last().unwrap().name);
        let torn_at = log.offset;
        log.append(&payload(4)).unwrap();
        log.append(&payload(5)).unwrap();
        drop(log);
        // Record 4's payload is damaged: 4 and 5 are gone (never acknowledged: the sync that
        // would have covered them did not finish).
        let f = OpenOptions::new().write(true).open(&file).unwrap();
        FileExt::write_all_at(&f, b"!", torn_at + HEADER as u64 + 3).unwrap();
        drop(f);
        let (mut log, seen) = reopen(dir.path(), 0);
        assert_eq!(seen.len(), 3);
        assert_eq!(log.next_lsn(), 4);
        // A shorter record 4 now; the old record 5 was zeroed and does not follow it.
        log.append(b"new four").unwrap();
        drop(log);
        let (_, seen) = reopen(dir.path(), 0);
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[3].payload, b"new four");
    }

    #[test]
    fn released_segments_are_reused_and_their_old_records_end_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = reopen(dir.path(), 0);
        for i in 1..=60 {
            log.append(&payload(i)).unwrap();
        }
        let before = log.segments();
        let released = log.release(50).unwrap();
        assert!(released > 0 && log.segments() < before);
        assert_eq!(log.spares.len(), SPARES);
        for i in 61..=120 {
            log.append(&payload(i)).unwrap();
        }
        drop(log);
        let (log, seen) = reopen(dir.path(), 50);
        assert_eq!(seen.first().map(|r| r.lsn), Some(51));
        assert_eq!(seen.last().map(|r| r.lsn), Some(120));
        assert_eq!(seen.len(), 70);
        assert_eq!(log.next_lsn(), 121);
    }

    #[test]
    fn a_checkpoint_past_the_log_appends_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = reopen(dir.path(), 0);
        log.append(b"one").unwrap();
        drop(log);
        // The view says 9 records were applied and durable (their segments were recycled).
        let (log, seen) = reopen(dir.path(), 9);
        assert!(seen.is_empty());
        assert_eq!(log.next_lsn(), 10);
    }

    #[test]
    fn a_large_record_gets_a_segment_grown_to_fit() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = reopen(dir.path(), 0);
        log.append(b"small").unwrap();
        let big = vec![7u8; 20_000];
        log.append(&big).unwrap();
        log.append(b"after").unwrap();
        drop(log);
        let (_, seen) = reopen(dir.path(), 0);
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[1].payload, big);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any damage to a log's bytes loses at most the records from the damage on: what is
        /// read back is always a prefix of what was written, never garbage and never a panic.
        #[test]
        fn damage_only_shortens_the_log(
            sizes in proptest::collection::vec(1usize..600, 1..30),
            flips in proptest::collection::vec((any::<u64>(), any::<u8>()), 0..4),
            cut in proptest::option::of(any::<u64>()),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let (mut log, _) = reopen(dir.path(), 0);
            let written: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, n)| vec![i as u8; *n]).collect();
            for record in &written {
                log.append(record).unwrap();
            }
            let files: Vec<PathBuf> = log.segments.iter().map(|s| dir.path().join(&s.name)).collect();
            drop(log);
            for (at, byte) in flips {
                let path = &files[(at as usize) % files.len()];
                let f = OpenOptions::new().write(true).open(path).unwrap();
                let size = f.metadata().unwrap().len();
                FileExt::write_all_at(&f, &[byte], (at >> 8) % size).unwrap();
            }
            if let Some(cut) = cut {
                let path = files.last().unwrap();
                let f = OpenOptions::new().write(true).open(path).unwrap();
                let size = f.metadata().unwrap().len();
                f.set_len(cut % size).unwrap();
            }
            let (mut log, seen) = reopen(dir.path(), 0);
            prop_assert!(seen.len() <= written.len());
            for (read, record) in seen.iter().zip(&written) {
                prop_assert_eq!(&read.payload, record);
            }
            // It can be appended to and read back again.
            log.append(b"next").unwrap();
            let n = seen.len();
            drop(log);
            let (_, again) = reopen(dir.path(), 0);
            prop_assert_eq!(again.len(), n + 1);
            prop_assert_eq!(&again[n].payload, b"next");
        }
    }
}
