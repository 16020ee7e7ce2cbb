//! The local log of embedded mode: the truth a group of write sets is acknowledged on, with the
//! redb file a view applied behind it (`appender.rs`, `docs/durability.md`).
//!
//! Records are appended to segment files under `<data-dir>/log/`, each named by the number of
//! its first record (`00000000000000000042.log`). A record is a 16-byte header — payload length
//! (u32), CRC-32 of the number and payload (u32), its number (u64), little endian — then the
//! payload (a write-set record of `record.rs`). Numbers follow each other without gaps across
//! segments. A length of zero ends the log; so does a record whose checksum, length or number
//! is wrong, if it is a torn tail (a write the crash cut short, never acknowledged), which
//! [`SegmentLog::open`] zeroes before anything is appended after it.
//!
//! A torn tail is only ever the last record: the writer syncs each record before it appends
//! the next (`appender.rs`), so a bad record followed by a good one (later in its segment, or
//! a later segment that starts with one) was acknowledged and then damaged (a flipped bit, a
//! zeroed sector, a deleted segment). Then opening refuses ([`Damage`]) rather than drop the
//! acknowledged records after it, unless [`Options::truncate_damage`] says to. So does a log
//! that starts after the record the view needs next (the view was deleted or replaced by an
//! older copy).
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
    /// Open a damaged log anyway, dropping every record from the damage on (the operator's
    /// choice, `worker.truncate-damaged-log`); without it, [`SegmentLog::open`] refuses.
    pub truncate_damage: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            segment_bytes: 8 * 1024 * 1024,
            max_record_bytes: 256 * 1024 * 1024,
            truncate_damage: false,
        }
    }
}

/// Why a log was not opened: acknowledged records are missing or damaged. Carried inside the
/// `io::Error` [`SegmentLog::open`] answers (kind `InvalidData`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Damage {
    /// Record `expected` at `offset` of segment file `file` is bad, yet record `found` follows
    /// it (in `found_in`): it was acknowledged, and so were the ones after it.
    Record {
        file: String,
        offset: u64,
        expected: u64,
        found: u64,
        found_in: String,
    },
    /// The log starts at record `first` (`file`), but the view needs every record after
    /// `applied`.
    Behind {
        file: String,
        first: u64,
        applied: u64,
    },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Record {
                file,
                offset,
                expected,
                found,
                found_in,
            } => write!(
                f,
                "record {expected} at byte {offset} of {file} is damaged or missing, yet record {found} follows it in {found_in}: records acknowledged before the damage would be lost"
            ),
            Damage::Behind {
                file,
                first,
                applied,
            } => write!(
                f,
                "the log starts at record {first} ({file}) but the store holds records up to {applied} only: records {} to {} are in neither (was sluice.redb deleted or replaced by an older copy?)",
                applied + 1,
                first - 1
            ),
        }
    }
}

impl std::error::Error for Damage {}

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

/// The first good record numbered `at_least` or more (and no further on than the bytes after
/// `from` could number) in `file` from `from` on: its number. Zero runs (a preallocated or
/// zeroed tail) are skipped a chunk at a time, so a clean tail costs a read of it.
fn later_record(
    file: &dyn LogFile,
    size: u64,
    from: u64,
    at_least: u64,
    options: &Options,
) -> io::Result<Option<u64>> {
    const CHUNK: u64 = 1 << 20;
    let most = at_least.saturating_add(size.saturating_sub(from) / HEADER as u64);
    let longest = size.saturating_sub(from).min(CHUNK + HEADER as u64) as usize;
    let mut chunk = vec![0u8; longest];
    let mut start = from;
    while start < size {
        let len = (size - start).min(CHUNK + HEADER as u64) as usize;
        let buf = &mut chunk[..len];
        file.read_exact_at(buf, start)?;
        let mut at = 0usize;
        // The first position not yet tried as a header in this chunk.
        let mut untried = 0usize;
        // Positions whose header begins in this chunk (the next chunk re-reads the overlap).
        let stop = len.min(CHUNK as usize);
        while at < stop {
            // A header starts with a non-zero length: skip to where one could.
            match buf[at..stop].iter().position(|b| *b != 0) {
                Some(skip) => at += skip,
                None => break,
            }
            // The non-zero byte may be any of the length's four; each position is tried once.
            for candidate in at.saturating_sub(3).max(untried)..=at {
                if candidate + HEADER > len {
                    break;
                }
                let mut raw = [0u8; HEADER];
                raw.copy_from_slice(&buf[candidate..candidate + HEADER]);
                let (_, _, lsn) = header(&raw);
                if lsn >= at_least
                    && lsn <= most
                    && read_at(file, size, start + candidate as u64, lsn, options).is_some()
                {
                    return Ok(Some(lsn));
                }
            }
            untried = at + 1;
            at += 1;
        }
        start += CHUNK;
    }
    Ok(None)
}

/// The error [`SegmentLog::open`] answers for `damage`.
fn damaged(damage: Damage) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, damage)
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
        if let Some(first) = segments.first()
            && first.first > applied.saturating_add(1)
            && !options.truncate_damage
        {
            return Err(damaged(Damage::Behind {
                file: first.name.clone(),
                first: first.first,
                applied,
            }));
        }
        let mut end: Option<(usize, u64)> = None;
        for (index, segment) in segments.iter().enumerate().skip(start) {
            if segment.first != expected {
                // A gap between segments: what follows was never acknowledged in order (or
                // a segment was lost: the check below tells).
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
        if applied < expected {
            // The log ended at record `expected`: a torn tail only if no good record follows.
            let (index, offset) = end.unwrap_or((start, 0));
            if let Some(damage) =
                Self::damage_after(&*dir, &segments, index, offset, expected, &options)?
            {
                if !options.truncate_damage {
                    return Err(damaged(damage));
                }
                tracing::error!(
                    %damage,
                    "the local log is damaged: dropping every record from the damage on (worker.truncate-damaged-log)"
                );
            }
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

    /// Whether a good record numbered `expected` or more lies after `offset` of segment
    /// `index` (where the log ended), or in any later segment: what damage it shows.
    fn damage_after(
        dir: &dyn LogDir,
        segments: &[Segment],
        index: usize,
        offset: u64,
        expected: u64,
        options: &Options,
    ) -> io::Result<Option<Damage>> {
        let Some(ended) = segments.get(index) else {
            return Ok(None);
        };
        let shown = |segment: &Segment| segment.name.clone();
        for (at, segment) in segments.iter().enumerate().skip(index) {
            let file = dir.open(&segment.name, false)?;
            let size = file.size()?;
            let from = if at == index { offset } else { 0 };
            if let Some(found) = later_record(&*file, size, from, expected, options)? {
                return Ok(Some(Damage::Record {
                    file: shown(ended),
                    offset,
                    expected,
                    found,
                    found_in: shown(segment),
                }));
            }
        }
        Ok(None)
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
            truncate_damage: false,
        }
    }

    fn open_with(
        dir: &std::path::Path,
        applied: u64,
        options: Options,
    ) -> io::Result<(SegmentLog, Vec<Read>)> {
        let mut seen = Vec::new();
        let fs: Arc<dyn LogDir> = Arc::new(FsDir(dir.to_path_buf()));
        let log = SegmentLog::open(fs, options, applied, |read| {
            seen.push(read);
            Ok(())
        })?;
        Ok((log, seen))
    }

    fn reopen(dir: &std::path::Path, applied: u64) -> (SegmentLog, Vec<Read>) {
        open_with(dir, applied, small()).unwrap()
    }

    /// Opens the log, which must refuse for its damage; answers the damage.
    fn refused(dir: &std::path::Path, applied: u64) -> Damage {
        let err = open_with(dir, applied, small()).expect_err("a damaged log opened");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        err.get_ref()
            .and_then(|e| e.downcast_ref::<Damage>())
            .cloned()
            .unwrap_or_else(|| panic!("not a damage: {err}"))
    }

    fn truncating() -> Options {
        Options {
            truncate_damage: true,
            ..small()
        }
    }

    /// Appends records 1..=n; answers where each starts: (segment file, offset).
    fn written(dir: &std::path::Path, n: u64) -> Vec<(PathBuf, u64)> {
        let (mut log, _) = reopen(dir, 0);
        let mut at = Vec::new();
        for i in 1..=n {
            let before = (log.segments.last().map(|s| s.name.clone()), log.offset);
            log.append(&payload(i)).unwrap();
            let name = log.segments.last().unwrap().name.clone();
            // A record that rolled to a new segment starts at its beginning.
            let offset = if before.0.as_deref() == Some(name.as_str()) {
                before.1
            } else {
                0
            };
            at.push((dir.join(name), offset));
        }
        at
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
        // Record 4's payload is damaged while 5 is whole: damage, refused; the operator's
        // truncation drops 4 and 5.
        let f = OpenOptions::new().write(true).open(&file).unwrap();
        FileExt::write_all_at(&f, b"!", torn_at + HEADER as u64 + 3).unwrap();
        drop(f);
        assert!(matches!(
            refused(dir.path(), 0),
            Damage::Record {
                expected: 4,
                found: 5,
                ..
            }
        ));
        let (mut log, seen) = open_with(dir.path(), 0, truncating()).unwrap();
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

    #[test]
    fn only_the_last_record_may_be_torn() {
        let dir = tempfile::tempdir().unwrap();
        let at = written(dir.path(), 5);
        let (file, offset) = &at[4];
        // The last record's payload torn: a crash's tail, cut quietly.
        let f = OpenOptions::new().write(true).open(file).unwrap();
        FileExt::write_all_at(&f, b"!", offset + HEADER as u64 + 1).unwrap();
        drop(f);
        let (log, seen) = reopen(dir.path(), 0);
        assert_eq!((seen.len(), log.next_lsn()), (4, 5));
    }

    #[test]
    fn a_bad_record_before_good_ones_refuses_to_open_naming_file_and_offset() {
        // One flipped bit in record 15 of 30.
        let dir = tempfile::tempdir().unwrap();
        let at = written(dir.path(), 30);
        let (file, offset) = &at[14];
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(file)
            .unwrap();
        let mut byte = [0u8];
        FileExt::read_exact_at(&f, &mut byte, offset + HEADER as u64 + 2).unwrap();
        FileExt::write_all_at(&f, &[byte[0] ^ 0x10], offset + HEADER as u64 + 2).unwrap();
        drop(f);
        let damage = refused(dir.path(), 0);
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        match &damage {
            Damage::Record {
                file,
                offset: at_offset,
                expected,
                found,
                ..
            } => {
                assert_eq!((file, at_offset, *expected), (&name, offset, 15));
                assert!(*found > 15, "{damage}");
            }
            other => panic!("{other}"),
        }
        assert!(damage.to_string().contains(&name), "{damage}");
        // Still refused on the next try: nothing was cut.
        refused(dir.path(), 0);
        // The operator's choice: records from 15 on are dropped, the rest kept.
        let (log, seen) = open_with(dir.path(), 0, truncating()).unwrap();
        assert_eq!((seen.len(), log.next_lsn()), (14, 15));
    }

    #[test]
    fn a_zeroed_sector_or_a_lost_segment_refuses_to_open() {
        // 512 zeroed bytes from the start of record 12 of 30.
        let dir = tempfile::tempdir().unwrap();
        let at = written(dir.path(), 30);
        let (file, offset) = &at[11];
        let f = OpenOptions::new().write(true).open(file).unwrap();
        FileExt::write_all_at(&f, &[0u8; 512], *offset).unwrap();
        drop(f);
        assert!(matches!(
            refused(dir.path(), 0),
            Damage::Record { expected: 12, .. }
        ));

        // A segment in the middle deleted.
        let dir = tempfile::tempdir().unwrap();
        let at = written(dir.path(), 40);
        let mut files: Vec<&PathBuf> = at.iter().map(|(f, _)| f).collect();
        files.dedup();
        assert!(files.len() >= 3, "{} segments", files.len());
        std::fs::remove_file(files[1]).unwrap();
        assert!(matches!(refused(dir.path(), 0), Damage::Record { .. }));
    }

    #[test]
    fn a_log_that_starts_after_what_the_view_needs_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = reopen(dir.path(), 0);
        for i in 1..=60 {
            log.append(&payload(i)).unwrap();
        }
        // The view held 50 durably: the segments behind it were recycled.
        log.release(50).unwrap();
        drop(log);
        reopen(dir.path(), 50);
        // The view is gone (applied 0): records 1.. are in neither.
        match refused(dir.path(), 0) {
            Damage::Behind { first, applied, .. } => {
                assert!(first > 1 && first <= 51, "{first}");
                assert_eq!(applied, 0);
            }
            other => panic!("{other}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any damage to a log's bytes is refused or loses at most the records from the damage
        /// on: what is read back is always a prefix of what was written, never garbage and
        /// never a panic.
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
            // Damage before a good record refuses to open; opened anyway (the operator's
            // choice) or torn at the tail, what is read back is a prefix.
            let (mut log, seen) = match open_with(dir.path(), 0, small()) {
                Ok(opened) => opened,
                Err(e) => {
                    prop_assert!(
                        e.get_ref().is_some_and(|e| e.downcast_ref::<Damage>().is_some()),
                        "{}", e
                    );
                    open_with(dir.path(), 0, truncating()).unwrap()
                }
            };
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
