//! Durable invocation state in redb: records, journals (opaque `(type, bytes)` entries in order)
//! and timers. Writes go into a [`WriteSet`] so the writer can commit the writes of many events,
//! from every partition, together.

use bytes::Bytes;
use redb::{ReadableDatabase, ReadableTable};

use super::record::InvocationRecord;
use crate::storage::layout;
use crate::storage::writer::WriteSet;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_protocol::Frame;

// The tables and their key layouts are listed in `crate::schema`.
pub(crate) use crate::schema::{INVOCATIONS, JOURNAL, PURGES, TIMERS};

/// What a purge row removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purge {
    /// The journal only (`journal-retention`); the record and its outcome stay.
    Journal,
    /// The record and its journal (`completion-retention`).
    Invocation,
}

/// A purge that is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuePurge {
    key: [u8; 33],
    /// The completed invocation.
    pub invocation: InvocationId,
    /// What goes.
    pub what: Purge,
}

/// A redb failure on invocation state (RT0006).
pub(crate) fn storage(e: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::RT0006, format!("invocation store: {e}"))
}

/// A row that cannot be decoded (STO0002), named by table and key so it can be found.
fn corrupt(table: &str, key: &[u8], what: impl std::fmt::Display) -> CodedError {
    CodedError::new(
        Code::STO0002,
        format!(
            "corrupt row in store table '{table}', key {}: {what}; restore the data dir from a backup or remove this row with sluice stopped",
            hex(key)
        ),
    )
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

fn journal_key(id: InvocationId, index: u32) -> [u8; 28] {
    let mut key = [0u8; 28];
    key[..24].copy_from_slice(&id.to_bytes());
    key[24..].copy_from_slice(&index.to_be_bytes());
    key
}

fn timer_key(at_ms: u64, id: InvocationId, completion: u32) -> [u8; 36] {
    let mut key = [0u8; 36];
    key[..8].copy_from_slice(&at_ms.to_be_bytes());
    key[8..32].copy_from_slice(&id.to_bytes());
    key[32..].copy_from_slice(&completion.to_be_bytes());
    key
}

/// A durable timer: wake `invocation` at `at_ms` with completion `completion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timer {
    /// Milliseconds since the epoch.
    pub at_ms: u64,
    /// The sleeping invocation.
    pub invocation: InvocationId,
    /// The Sleep command's completion id.
    pub completion: u32,
}

/// Writes (inserts or replaces) a record.
pub fn put_record(writes: &mut WriteSet, record: &InvocationRecord) -> Result<(), CodedError> {
    writes.put(INVOCATIONS, &record.id.to_bytes(), record.encode());
    Ok(())
}

/// Appends a journal entry at `index`.
pub fn put_entry(writes: &mut WriteSet, id: InvocationId, index: u32, frame: &Frame) {
    let mut value = Vec::with_capacity(2 + frame.payload.len());
    value.extend_from_slice(&frame.ty.to_be_bytes());
    value.extend_from_slice(&frame.payload);
    writes.put(JOURNAL, &journal_key(id, index), value);
}

/// Writes a whole journal, entry 0 first.
pub fn put_journal(writes: &mut WriteSet, id: InvocationId, journal: &[Frame]) {
    for (index, frame) in (0u32..).zip(journal) {
        put_entry(writes, id, index, frame);
    }
}

/// Removes a record and its journal.
pub fn delete_invocation(writes: &mut WriteSet, id: InvocationId) {
    writes.delete(INVOCATIONS, &id.to_bytes());
    delete_journal(writes, id);
}

fn purge_key(at_ms: u64, id: InvocationId, what: Purge) -> [u8; 33] {
    let mut key = [0u8; 33];
    key[..8].copy_from_slice(&at_ms.to_be_bytes());
    key[8..32].copy_from_slice(&id.to_bytes());
    key[32] = match what {
        Purge::Journal => 0,
        Purge::Invocation => 1,
    };
    key
}

/// Schedules `what` of the completed `id` to be removed at `at_ms`.
pub fn put_purge(writes: &mut WriteSet, at_ms: u64, id: InvocationId, what: Purge) {
    writes.put(PURGES, &purge_key(at_ms, id, what), Vec::new());
}

/// Removes what `due` names, and the purge row itself.
pub fn apply_purge(writes: &mut WriteSet, due: &DuePurge) {
    match due.what {
        Purge::Invocation => delete_invocation(writes, due.invocation),
        Purge::Journal => delete_journal(writes, due.invocation),
    }
    writes.delete(PURGES, &due.key);
}

/// Removes the journal of `id`.
pub fn delete_journal(writes: &mut WriteSet, id: InvocationId) {
    let start = journal_key(id, 0).to_vec();
    // One byte longer than any journal key of `id`, and above all of them.
    let mut end = journal_key(id, u32::MAX).to_vec();
    end.push(0xff);
    writes.delete_range(JOURNAL, start, end);
}

impl DuePurge {
    /// When its retention was up, ms.
    pub fn due_at_ms(&self) -> u64 {
        let (at, _) = self
            .key
            .split_first_chunk::<8>()
            .expect("a purge key starts with its time");
        u64::from_be_bytes(*at)
    }
}

/// Up to `limit` purges due at `now_ms`, earliest first.
pub fn due_purges(
    db: &redb::Database,
    now_ms: u64,
    limit: usize,
    owns: impl Fn(InvocationId) -> bool,
) -> Result<Vec<DuePurge>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(PURGES) else {
        return Ok(Vec::new());
    };
    // Each partition's purges are a range in time order: the earliest `limit` of each, then
    // the earliest `limit` of those.
    let partitions = layout::partitions_read(&txn).map_err(storage)?;
    let end = now_ms.saturating_add(1).to_be_bytes();
    let mut due = Vec::new();
    for p in 0..partitions {
        let (start, _) = layout::range_of(p);
        let end = layout::prefixed(p, &end);
        let mut taken = 0;
        for row in table
            .range(start.as_slice()..end.as_slice())
            .map_err(storage)?
        {
            if taken >= limit {
                break;
            }
            let (key, _) = row.map_err(storage)?;
            let purge = decode_purge(layout::logical(key.value()))?;
            if owns(purge.invocation) {
                due.push(purge);
                taken += 1;
            }
        }
    }
    due.sort_by_key(|purge| purge.key);
    due.truncate(limit);
    Ok(due)
}

fn decode_purge(k: &[u8]) -> Result<DuePurge, CodedError> {
    let bad = || corrupt("purges", k, "not a purge time, an invocation id and a kind");
    let key: [u8; 33] = k.try_into().map_err(|_| bad())?;
    let (_, rest) = key.split_first_chunk::<8>().ok_or_else(bad)?;
    let (id, kind) = rest.split_first_chunk::<24>().ok_or_else(bad)?;
    let what = match kind {
        [0] => Purge::Journal,
        [1] => Purge::Invocation,
        _ => return Err(bad()),
    };
    Ok(DuePurge {
        key,
        invocation: InvocationId::from_bytes(*id),
        what,
    })
}

/// Adds a timer.
pub fn put_timer(writes: &mut WriteSet, timer: Timer) {
    let key = timer_key(timer.at_ms, timer.invocation, timer.completion);
    writes.put(TIMERS, &key, Vec::new());
}

/// Removes a fired timer.
pub fn delete_timer(writes: &mut WriteSet, timer: Timer) {
    let key = timer_key(timer.at_ms, timer.invocation, timer.completion);
    writes.delete(TIMERS, &key);
}

/// Every record (recovery scans them at start-up).
pub fn load_records(db: &redb::Database) -> Result<Vec<InvocationRecord>, CodedError> {
    load_records_of(db, |_| true)
}

/// The records of the invocations `keep` selects by id. Only those are decoded: a partition
/// recovering reads every row's key but decodes its own records alone, not every partition's.
pub fn load_records_of(
    db: &redb::Database,
    keep: impl Fn(InvocationId) -> bool,
) -> Result<Vec<InvocationRecord>, CodedError> {
    let mut records = Vec::new();
    let mut failed = None;
    scan_records(db, |id, raw| {
        if keep(id) {
            match decode_record(id, raw) {
                Ok(record) => records.push(record),
                Err(e) => failed = Some(e),
            }
        }
        failed.is_none()
    })?;
    failed.map_or(Ok(records), Err)
}

/// Hands every stored record's id and encoded bytes to `each`, in key order, until it returns
/// `false`, from one read of the table: recovery at start-up reads the table once for all
/// partitions and decodes each record on its partition's thread ([`decode_record`]).
pub fn scan_records(
    db: &redb::Database,
    mut each: impl FnMut(InvocationId, &[u8]) -> bool,
) -> Result<(), CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(INVOCATIONS) else {
        return Ok(());
    };
    for row in table.iter().map_err(storage)? {
        let (key, value) = row.map_err(storage)?;
        let key = layout::logical(key.value());
        let id = <[u8; 24]>::try_from(key)
            .map(InvocationId::from_bytes)
            .map_err(|_| corrupt("invocations", key, "a key that is not an invocation id"))?;
        if !each(id, value.value()) {
            break;
        }
    }
    Ok(())
}

/// The record of `id` from its stored bytes, or why they are not one (naming the row).
pub fn decode_record(id: InvocationId, raw: &[u8]) -> Result<InvocationRecord, CodedError> {
    InvocationRecord::decode(raw).map_err(|e| corrupt("invocations", &id.to_bytes(), e))
}

/// The newest `limit` records `keep` selects, newest first, without their outputs: a list reads
/// every record once but holds only `limit` of them, and never an output's bytes.
pub fn load_listed(
    db: &redb::Database,
    keep: impl Fn(&super::ListedRecord) -> bool,
    limit: usize,
) -> Result<Vec<super::ListedRecord>, CodedError> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    if limit == 0 {
        return Ok(Vec::new());
    }
    let mut listed = Vec::new();
    if limit == usize::MAX {
        // Every one is kept: no heap to hold the newest.
        each_listed(db, |record| {
            if keep(&record) {
                listed.push(record);
            }
        })?;
    } else {
        // The oldest kept record on top, to be replaced by a newer one.
        let mut newest: BinaryHeap<Reverse<(u64, [u8; 24])>> = BinaryHeap::new();
        let mut kept = std::collections::HashMap::new();
        each_listed(db, |record| {
            if !keep(&record) {
                return;
            }
            let rank = newness(&record);
            if newest.len() == limit {
                match newest.peek() {
                    Some(Reverse(oldest)) if *oldest < rank => {
                        let Reverse(out) = newest.pop().expect("peeked");
                        kept.remove(&out.1);
                    }
                    _ => return,
                }
            }
            newest.push(Reverse(rank));
            kept.insert(rank.1, record);
        })?;
        listed.extend(kept.into_values());
    }
    listed.sort_unstable_by_key(|r| Reverse(newness(r)));
    Ok(listed)
}

/// How lists order records: by creation, then id (newest first, reversed).
fn newness(record: &super::ListedRecord) -> (u64, [u8; 24]) {
    (record.created_at_ms, record.id.to_bytes())
}

/// The records of `scope` and of `limit_key` (at least one named; a key without a scope is that
/// key under every scope), newest first, without their outputs: read through the index by scope
/// and key, so only those records are read.
pub fn load_named(
    db: &redb::Database,
    scope: Option<&str>,
    limit_key: Option<&str>,
) -> Result<Vec<super::ListedRecord>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(INVOCATIONS) else {
        return Ok(Vec::new());
    };
    // The partition count read once for every record the index names.
    let mut keys = layout::Keys::new(layout::partitions_read(&txn).map_err(storage)?);
    let mut listed = Vec::new();
    each_named(&txn, scope, limit_key, |id| {
        // An index row whose record went in the same read cannot be: both change in one
        // transaction. Skipped all the same rather than failing the read.
        if let Some(value) = table.get(keys.of("invocations", &id)).map_err(storage)? {
            let record = super::ListedRecord::decode(value.value())
                .map_err(|e| corrupt("invocations", &id, e))?;
            listed.push(record);
        }
        Ok(())
    })?;
    listed.sort_unstable_by_key(|r| std::cmp::Reverse(newness(r)));
    Ok(listed)
}

/// How many records [`load_named`] would list: a count of index rows, reading no record.
pub fn count_named(
    db: &redb::Database,
    scope: Option<&str>,
    limit_key: Option<&str>,
) -> Result<usize, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let mut counted = 0;
    each_named(&txn, scope, limit_key, |_| {
        counted += 1;
        Ok(())
    })?;
    Ok(counted)
}

/// Hands `each` the id of every invocation the index lists under `scope` and `limit_key`. A key
/// without a scope is looked up under each scope in turn: one seek per scope the index holds.
fn each_named(
    txn: &redb::ReadTransaction,
    scope: Option<&str>,
    limit_key: Option<&str>,
    mut each: impl FnMut([u8; 24]) -> Result<(), CodedError>,
) -> Result<(), CodedError> {
    use crate::storage::key_index;
    let Ok(index) = txn.open_table(crate::schema::INVOCATION_KEYS) else {
        return Ok(());
    };
    let mut rows_under = |prefix: &[u8]| -> Result<(), CodedError> {
        for row in index.range(prefix..).map_err(storage)? {
            let (key, _) = row.map_err(storage)?;
            let key = key.value();
            if !key.starts_with(prefix) {
                break;
            }
            let id = key_index::id_of(key)
                .ok_or_else(|| corrupt("invocation_keys", key, "a row shorter than an id"))?;
            each(id)?;
        }
        Ok(())
    };
    let (scope, key) = match (scope, limit_key) {
        (Some(scope), key) => (scope, key),
        (None, None) => return Ok(()),
        (None, Some(key)) => {
            // A key under every scope: from each scope's first row to the next scope.
            let mut from = Vec::new();
            loop {
                let next = index.range(from.as_slice()..).map_err(storage)?.next();
                let Some(row) = next else { return Ok(()) };
                let (row, _) = row.map_err(storage)?;
                let row = row.value();
                let part = key_index::scope_part(row)
                    .ok_or_else(|| corrupt("invocation_keys", row, "a row without its scope"))?;
                let scope = std::str::from_utf8(&part[4..])
                    .map_err(|e| corrupt("invocation_keys", row, e))?;
                rows_under(&key_index::prefix(scope, Some(key)))?;
                match key_index::past(part) {
                    Some(past) => from = past,
                    None => return Ok(()),
                }
            }
        }
    };
    rows_under(&key_index::prefix(scope, key))
}

/// How many records the store holds, from the table's own count: no record read.
pub fn count_all(db: &redb::Database) -> Result<usize, CodedError> {
    use redb::ReadableTableMetadata;
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(INVOCATIONS) else {
        return Ok(0);
    };
    Ok(usize::try_from(table.len().map_err(storage)?).unwrap_or(usize::MAX))
}

/// How many records `keep` selects: a read of every record, holding none.
pub fn count_listed(
    db: &redb::Database,
    keep: impl Fn(&super::ListedRecord) -> bool,
) -> Result<usize, CodedError> {
    let mut counted = 0;
    each_listed(db, |record| counted += usize::from(keep(&record)))?;
    Ok(counted)
}

/// Hands `each` every record, without its output, in the store's order.
fn each_listed(
    db: &redb::Database,
    mut each: impl FnMut(super::ListedRecord),
) -> Result<(), CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(INVOCATIONS) else {
        return Ok(());
    };
    for row in table.iter().map_err(storage)? {
        let (key, value) = row.map_err(storage)?;
        let record = super::ListedRecord::decode(value.value())
            .map_err(|e| corrupt("invocations", layout::logical(key.value()), e))?;
        each(record);
    }
    Ok(())
}

/// Unfinished invocations pinned to `deployment` (deleting it would strand them).
pub fn pinned_in_flight(
    db: &redb::Database,
    deployment: sluice_core::ids::DeploymentId,
) -> Result<Vec<InvocationId>, CodedError> {
    let pinned = |r: &super::ListedRecord| {
        r.deployment == Some(deployment) && r.status != super::Status::Completed
    };
    Ok(load_listed(db, pinned, usize::MAX)?
        .into_iter()
        .map(|r| r.id)
        .collect())
}

/// Every deployment an unfinished invocation is pinned to.
pub fn pinned_deployments_in_flight(
    db: &redb::Database,
) -> Result<std::collections::HashSet<sluice_core::ids::DeploymentId>, CodedError> {
    let pinned =
        |r: &super::ListedRecord| r.deployment.is_some() && r.status != super::Status::Completed;
    Ok(load_listed(db, pinned, usize::MAX)?
        .into_iter()
        .filter_map(|r| r.deployment)
        .collect())
}

/// One record, without its output.
pub fn load_listed_one(
    db: &redb::Database,
    id: InvocationId,
) -> Result<Option<super::ListedRecord>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(INVOCATIONS) else {
        return Ok(None);
    };
    let key = layout::stored_key(&txn, "invocations", &id.to_bytes()).map_err(storage)?;
    let Some(value) = table.get(key.as_slice()).map_err(storage)? else {
        return Ok(None);
    };
    super::ListedRecord::decode(value.value())
        .map(Some)
        .map_err(|e| corrupt("invocations", &id.to_bytes(), e))
}

/// One record.
pub fn load_record(
    db: &redb::Database,
    id: InvocationId,
) -> Result<Option<InvocationRecord>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(INVOCATIONS) else {
        return Ok(None);
    };
    let key = layout::stored_key(&txn, "invocations", &id.to_bytes()).map_err(storage)?;
    let Some(value) = table.get(key.as_slice()).map_err(storage)? else {
        return Ok(None);
    };
    decode_record(id, value.value()).map(Some)
}

/// Entry `index` of the journal of `id` (entry 0 is the input), if stored.
pub fn load_entry(
    db: &redb::Database,
    id: InvocationId,
    index: u32,
) -> Result<Option<Frame>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(JOURNAL) else {
        return Ok(None);
    };
    let key = layout::stored_key(&txn, "journal", &journal_key(id, index)).map_err(storage)?;
    let Some(value) = table.get(key.as_slice()).map_err(storage)? else {
        return Ok(None);
    };
    decode_entry(value.value()).map(Some)
}

fn decode_entry(raw: &[u8]) -> Result<Frame, CodedError> {
    let ty = raw.get(..2).ok_or_else(|| storage("short journal entry"))?;
    Ok(Frame {
        ty: u16::from_be_bytes([ty[0], ty[1]]),
        ack: false,
        payload: Bytes::copy_from_slice(&raw[2..]),
    })
}

/// The journal of `id`, in order.
pub fn load_journal(db: &redb::Database, id: InvocationId) -> Result<Vec<Frame>, CodedError> {
    load_journal_through(db, id, u32::MAX)
}

/// The whole journals of `ids`, in their order, read in one transaction: recovery reads a
/// journal per unfinished invocation, and a transaction and a table lookup each (as
/// [`load_journal`] takes) cost more than the range read itself.
pub fn load_journals(
    db: &redb::Database,
    ids: &[InvocationId],
) -> Result<Vec<Vec<Frame>>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(JOURNAL) else {
        return Ok(ids.iter().map(|_| Vec::new()).collect());
    };
    let partitions = layout::partitions_read(&txn).map_err(storage)?;
    ids.iter()
        .map(|&id| read_journal_through(&table, partitions, id, u32::MAX))
        .collect()
}

/// The first `count` entries of `id`'s journal (fewer when the store has fewer).
pub fn load_journal_prefix(
    db: &redb::Database,
    id: InvocationId,
    count: u32,
) -> Result<Vec<Frame>, CodedError> {
    match count.checked_sub(1) {
        Some(last) => load_journal_through(db, id, last),
        None => Ok(Vec::new()),
    }
}

/// The entries of `id`'s journal from index 0 through `last`, in order.
fn load_journal_through(
    db: &redb::Database,
    id: InvocationId,
    last: u32,
) -> Result<Vec<Frame>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(JOURNAL) else {
        return Ok(Vec::new());
    };
    let partitions = layout::partitions_read(&txn).map_err(storage)?;
    read_journal_through(&table, partitions, id, last)
}

/// The entries of `id`'s journal from index 0 through `last` in an open journal table of a
/// store keyed by `partitions`.
fn read_journal_through(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    partitions: u32,
    id: InvocationId,
    last: u32,
) -> Result<Vec<Frame>, CodedError> {
    let start = layout::physical("journal", &journal_key(id, 0), partitions);
    let end = layout::physical("journal", &journal_key(id, last), partitions);
    table
        .range(start.as_slice()..=end.as_slice())
        .map_err(storage)?
        .map(|row| {
            let (_, value) = row.map_err(storage)?;
            decode_entry(value.value())
        })
        .collect()
}

/// Every journal entry of every invocation: id, index, message type id, payload length.
pub fn scan_journal(
    db: &redb::Database,
) -> Result<Vec<(InvocationId, u32, u16, usize)>, CodedError> {
    scan_journal_with(db, |id, index, ty, payload| (id, index, ty, payload.len()))
}

/// What `look` makes of every journal entry of every invocation (its id, index, message type
/// id and payload), in key order: an invocation's entries together, by index. The payload is
/// lent, not copied: `look` keeps what it needs of it.
pub fn scan_journal_with<T>(
    db: &redb::Database,
    mut look: impl FnMut(InvocationId, u32, u16, &[u8]) -> T,
) -> Result<Vec<T>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(JOURNAL) else {
        return Ok(Vec::new());
    };
    table
        .iter()
        .map_err(storage)?
        .map(|row| {
            let (key, value) = row.map_err(storage)?;
            let (k, raw) = (layout::logical(key.value()), value.value());
            let bad = || storage("malformed journal row");
            let id: [u8; 24] = k
                .get(..24)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(bad)?;
            let index: [u8; 4] = k
                .get(24..28)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(bad)?;
            let ty: [u8; 2] = raw
                .get(..2)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(bad)?;
            Ok(look(
                InvocationId::from_bytes(id),
                u32::from_be_bytes(index),
                u16::from_be_bytes(ty),
                &raw[2..],
            ))
        })
        .collect()
}

/// Every pending timer, earliest first.
pub fn load_timers(db: &redb::Database) -> Result<Vec<Timer>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(TIMERS) else {
        return Ok(Vec::new());
    };
    // In time order within each partition's range; merged here.
    let mut timers = table
        .iter()
        .map_err(storage)?
        .map(|row| {
            let (key, _) = row.map_err(storage)?;
            decode_timer(layout::logical(key.value()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    timers.sort_unstable();
    Ok(timers)
}

/// A timer from its key (the layout of [`timer_key`]).
fn decode_timer(k: &[u8]) -> Result<Timer, CodedError> {
    let bad = || corrupt("timers", k, format_args!("{} bytes, not 36", k.len()));
    if k.len() != 36 {
        return Err(bad());
    }
    let (at, rest) = k.split_first_chunk::<8>().ok_or_else(bad)?;
    let (id, rest) = rest.split_first_chunk::<24>().ok_or_else(bad)?;
    let completion = rest.first_chunk::<4>().ok_or_else(bad)?;
    Ok(Timer {
        at_ms: u64::from_be_bytes(*at),
        invocation: InvocationId::from_bytes(*id),
        completion: u32::from_be_bytes(*completion),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invocation::record::{Status, Target};
    use crate::storage::Store;

    #[test]
    fn lists_keep_the_newest_matching_records_without_their_outputs() {
        use crate::invocation::record::{Failure, Outcome, OutcomeKind};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut writes = WriteSet::default();
        for n in 0..50u64 {
            let mut record = InvocationRecord::new(
                InvocationId::generate(n),
                Target {
                    service: if n % 2 == 0 { "Even" } else { "Odd" }.into(),
                    handler: "h".into(),
                    key: None,
                },
                1_000 + n,
            );
            record.status = Status::Completed;
            record.outcome = Some(if n == 48 {
                Outcome::Failure(Failure {
                    code: 500,
                    message: "no".into(),
                })
            } else {
                Outcome::Value(vec![7; 100_000])
            });
            put_record(&mut writes, &record).unwrap();
        }
        store
            .with_db(|db| {
                let txn = db.begin_write().unwrap();
                writes.apply(&txn).unwrap();
                txn.commit().unwrap();
                let listed = load_listed(db, |r| r.target.service == "Even", 3).unwrap();
                let created: Vec<u64> = listed.iter().map(|r| r.created_at_ms).collect();
                assert_eq!(created, [1_048, 1_046, 1_044]);
                assert_eq!(
                    listed[0].outcome,
                    Some(OutcomeKind::Failure(Failure {
                        code: 500,
                        message: "no".into()
                    }))
                );
                assert!(matches!(listed[1].outcome, Some(OutcomeKind::Value(_))));
                assert_eq!(load_listed(db, |_| true, 0).unwrap().len(), 0);
                assert_eq!(load_listed(db, |_| true, 500).unwrap().len(), 50);
                let every = load_listed(db, |r| r.target.service == "Odd", usize::MAX).unwrap();
                let created: Vec<u64> = every.iter().map(|r| r.created_at_ms).collect();
                let newest_first: Vec<u64> = (0..25).rev().map(|n| 1_001 + 2 * n).collect();
                assert_eq!(created, newest_first, "every one, newest first");
                assert_eq!(count_listed(db, |r| r.target.service == "Odd").unwrap(), 25);
                assert_eq!(count_all(db).unwrap(), 50);
            })
            .unwrap();
    }

    /// A record of `n` created at `n`, under `scope` and `key` when given.
    fn scoped(n: u64, scope: Option<&str>, key: Option<&str>) -> InvocationRecord {
        let mut record = InvocationRecord::new(
            InvocationId::generate(n),
            Target {
                service: "S".into(),
                handler: "h".into(),
                key: None,
            },
            n,
        );
        record.scope = scope.map(|s| sluice_flow::Scope::parse(s).unwrap());
        record.limit_key = key.map(|k| sluice_flow::LimitKey::parse(k).unwrap());
        record
    }

    /// (count, the created times listed newest first) of `scope` and `key` through the index.
    fn named(store: &Store, scope: Option<&str>, key: Option<&str>) -> (usize, Vec<u64>) {
        store
            .with_db(|db| {
                let listed = load_named(db, scope, key).unwrap();
                let count = count_named(db, scope, key).unwrap();
                (count, listed.iter().map(|r| r.created_at_ms).collect())
            })
            .unwrap()
    }

    #[test]
    fn the_index_by_scope_and_key_follows_puts_updates_deletes_and_a_store_that_had_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut writes = WriteSet::default();
        let records = [
            scoped(1, Some("a"), Some("k")),
            scoped(2, Some("a"), Some("k")),
            scoped(3, Some("a"), Some("k7")),
            scoped(4, Some("a"), None),
            scoped(5, Some("ab"), Some("k")),
            scoped(6, None, None),
        ];
        for record in &records {
            put_record(&mut writes, record).unwrap();
        }
        writes.commit_now(&store);
        assert_eq!(named(&store, Some("a"), Some("k")), (2, vec![2, 1]));
        assert_eq!(
            named(&store, Some("a"), None),
            (4, vec![4, 3, 2, 1]),
            "not ab's"
        );
        assert_eq!(named(&store, Some("a"), Some("k7")), (1, vec![3]));
        assert_eq!(named(&store, Some("b"), None), (0, vec![]));
        // A key under every scope: a's and ab's.
        assert_eq!(named(&store, None, Some("k")), (3, vec![5, 2, 1]));
        assert_eq!(named(&store, None, Some("k7")), (1, vec![3]));
        assert_eq!(named(&store, None, Some("none")), (0, vec![]));
        // An update adds no row; a delete removes its row.
        let mut writes = WriteSet::default();
        let mut updated = records[0].clone();
        updated.status = Status::Completed;
        put_record(&mut writes, &updated).unwrap();
        delete_invocation(&mut writes, records[1].id);
        writes.commit_now(&store);
        assert_eq!(named(&store, Some("a"), Some("k")), (1, vec![1]));
        let listed = store
            .with_db(|db| load_named(db, Some("a"), Some("k")))
            .unwrap()
            .unwrap();
        assert_eq!(listed[0].status, Status::Completed);
        // A range delete of invocations removes the rows of those it deletes.
        let mut writes = WriteSet::default();
        writes.delete_range(INVOCATIONS, vec![0; 24], vec![0xff; 24]);
        writes.commit_now(&store);
        assert_eq!(named(&store, Some("a"), None), (0, vec![]));
        assert_eq!(named(&store, Some("ab"), None), (0, vec![]));

        // A store written before the index (format 2) builds it when it opens.
        let mut writes = WriteSet::default();
        for record in &records {
            put_record(&mut writes, record).unwrap();
        }
        writes.commit_now(&store);
        store
            .with_db(|db| {
                let txn = db.begin_write().unwrap();
                txn.delete_table(crate::schema::INVOCATION_KEYS).unwrap();
                txn.open_table(crate::schema::META)
                    .unwrap()
                    .insert("format_version", 2u32.to_be_bytes().as_slice())
                    .unwrap();
                txn.commit().unwrap();
            })
            .unwrap();
        assert_eq!(named(&store, Some("a"), None), (0, vec![]), "no index");
        store.close();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store.format_version().unwrap(),
            crate::storage::FORMAT_VERSION
        );
        assert_eq!(named(&store, Some("a"), None), (4, vec![4, 3, 2, 1]));
        assert_eq!(named(&store, Some("ab"), Some("k")), (1, vec![5]));
    }

    #[test]
    fn records_journals_and_timers_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let a = InvocationId::generate(1);
        let b = InvocationId::generate(2);
        let record = InvocationRecord::new(
            a,
            Target {
                service: "Greeter".into(),
                handler: "greet".into(),
                key: None,
            },
            1,
        );
        let frame = |n: u8| Frame {
            ty: 0x0400 + u16::from(n),
            ack: false,
            payload: Bytes::from(vec![n; 3]),
        };
        store
            .with_db(|db| {
                let mut writes = WriteSet::default();
                put_record(&mut writes, &record).unwrap();
                for i in 0..3u8 {
                    put_entry(&mut writes, a, u32::from(i), &frame(i));
                }
                put_entry(&mut writes, b, 0, &frame(9));
                put_timer(
                    &mut writes,
                    Timer {
                        at_ms: 20,
                        invocation: a,
                        completion: 1,
                    },
                );
                put_timer(
                    &mut writes,
                    Timer {
                        at_ms: 10,
                        invocation: b,
                        completion: 2,
                    },
                );
                let txn = db.begin_write().unwrap();
                writes.apply(&txn).unwrap();
                txn.commit().unwrap();
            })
            .unwrap();
        store
            .with_db(|db| {
                let records = load_records(db).unwrap();
                assert_eq!(records.len(), 1);
                assert_eq!(records[0].status, Status::Pending);
                let journal = load_journal(db, a).unwrap();
                assert_eq!(journal, (0..3).map(frame).collect::<Vec<_>>());
                assert_eq!(load_journal(db, b).unwrap(), vec![frame(9)]);
                // In one transaction, in the order asked, an id without entries empty.
                let c = InvocationId::generate(3);
                assert_eq!(
                    load_journals(db, &[b, c, a]).unwrap(),
                    vec![vec![frame(9)], Vec::new(), (0..3).map(frame).collect()]
                );
                let timers = load_timers(db).unwrap();
                assert_eq!(
                    timers.iter().map(|t| t.at_ms).collect::<Vec<_>>(),
                    vec![10, 20]
                );
                let mut writes = WriteSet::default();
                delete_timer(&mut writes, timers[0]);
                let txn = db.begin_write().unwrap();
                writes.apply(&txn).unwrap();
                txn.commit().unwrap();
                assert_eq!(load_timers(db).unwrap().len(), 1);
            })
            .unwrap();
    }

    #[test]
    fn a_scan_hands_over_every_record_in_key_order_and_stops_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut ids: Vec<InvocationId> = (0..40).map(InvocationId::generate).collect();
        let mut writes = WriteSet::default();
        for (n, id) in (0u64..).zip(&ids) {
            let target = Target {
                service: "Greeter".into(),
                handler: "greet".into(),
                key: None,
            };
            put_record(&mut writes, &InvocationRecord::new(*id, target, n)).unwrap();
        }
        writes.commit_now(&store);
        ids.sort_by_key(InvocationId::to_bytes);
        store
            .with_db(|db| {
                let mut seen = Vec::new();
                scan_records(db, |id, raw| {
                    let record = decode_record(id, raw).unwrap();
                    assert_eq!(record.id, id);
                    seen.push(id);
                    true
                })
                .unwrap();
                assert_eq!(seen, ids);
                let mut first = Vec::new();
                scan_records(db, |id, _| {
                    first.push(id);
                    first.len() < 5
                })
                .unwrap();
                assert_eq!(first, ids[..5]);
                let bad = decode_record(ids[0], b"{not a record").unwrap_err();
                assert_eq!(bad.code, Some(Code::STO0002));
                assert!(bad.message.contains(&hex(&ids[0].to_bytes())), "{bad}");
            })
            .unwrap();
    }

    #[test]
    fn corrupt_rows_are_rt0028_naming_table_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut writes = WriteSet::default();
        writes.put(TIMERS, b"short", Vec::new());
        writes.put(INVOCATIONS, b"\x01\x02", b"{not json".to_vec());
        writes.commit_now(&store);
        store
            .with_db(|db| {
                let timers = load_timers(db).unwrap_err();
                assert_eq!(timers.code, Some(Code::STO0002));
                assert!(
                    timers.message.contains("'timers', key 73686f7274"),
                    "{timers}"
                );
                let records = load_records(db).unwrap_err();
                assert_eq!(records.code, Some(Code::STO0002));
                assert!(
                    records.message.contains("'invocations', key 0102"),
                    "{records}"
                );
                let scan = scan_records(db, |_, _| true).unwrap_err();
                assert_eq!(scan.code, Some(Code::STO0002));
                assert!(scan.message.contains("'invocations', key 0102"), "{scan}");
            })
            .unwrap();
    }

    #[test]
    fn purges_come_due_in_time_order_and_remove_what_they_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (a, b) = (InvocationId::generate(1), InvocationId::generate(2));
        let target = Target {
            service: "Greeter".into(),
            handler: "greet".into(),
            key: None,
        };
        let mut writes = WriteSet::default();
        for id in [a, b] {
            put_record(&mut writes, &InvocationRecord::new(id, target.clone(), 1)).unwrap();
            let input = Frame {
                ty: 1,
                ack: false,
                payload: Bytes::from_static(b"in"),
            };
            put_entry(&mut writes, id, 0, &input);
        }
        put_purge(&mut writes, 20, a, Purge::Invocation);
        put_purge(&mut writes, 10, a, Purge::Journal);
        put_purge(&mut writes, 30, b, Purge::Journal);
        writes.commit_now(&store);
        let due = store
            .with_db(|db| due_purges(db, 20, 10, |_| true))
            .unwrap()
            .unwrap();
        assert_eq!(
            due.iter()
                .map(|d| (d.invocation, d.what))
                .collect::<Vec<_>>(),
            vec![(a, Purge::Journal), (a, Purge::Invocation)]
        );
        let limited = store
            .with_db(|db| due_purges(db, 20, 1, |_| true))
            .unwrap()
            .unwrap();
        assert_eq!(limited.len(), 1);
        let mut writes = WriteSet::default();
        for purge in &due {
            apply_purge(&mut writes, purge);
        }
        writes.commit_now(&store);
        store
            .with_db(|db| {
                assert!(load_record(db, a).unwrap().is_none());
                assert!(load_journal(db, a).unwrap().is_empty());
                assert!(load_record(db, b).unwrap().is_some());
                assert_eq!(load_journal(db, b).unwrap().len(), 1);
                assert!(due_purges(db, 20, 10, |_| true).unwrap().is_empty());
                assert_eq!(due_purges(db, u64::MAX, 10, |_| true).unwrap().len(), 1);
            })
            .unwrap();
    }
}
