//! The replica reader: one consumer assigned the partitions of the log this node keeps (those
//! it leads or stands by for; every one until the group says which), reading from this node's
//! positions, each record by the replica's rule (`sluice_runtime::replication::replica`). It
//! applies the valid writes of partitions this node does not lead, and makes a local leader
//! step down when another node's epoch is accepted after its own. The leaders of the
//! partitions it does not read come from the epochs topic (`epochs.rs`), so what a node takes
//! in from the brokers follows its share of the cluster, not the cluster's whole write rate.
//!
//! A partition led here is left out of the consumer's assignment from the takeover's win until
//! the rewind after its step-down: its records are the leader's own, stored by the leader, and fetching
//! them back cost the node a fetch, a wake of this thread and a decode of each record's header
//! per record it wrote. What the reader told such a leader, another node's epoch after its
//! own, it now learns from its next write (the record lands past that epoch, not at the offset
//! it expected: `CLU0001`, and it steps down), from the epochs topic, or from the group (which
//! gave the partition to the other node); until then it may answer reads from what it holds,
//! as a zombie could before.

use std::collections::{BTreeMap, BTreeSet};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use tokio::sync::watch;

use super::{Shared, lock};
use sluice_core::errors::{Code, CodedError};
use sluice_runtime::replication::replica::Read;
use sluice_store::storage::fencing::Position;
use sluice_store::storage::snapshot;
use sluice_store::storage::writer::WriteSet;

/// Most records applied in one store commit.
const BATCH: usize = 1024;

/// Reads until `stopping` turns true or the store fails.
pub(super) fn run(shared: &Shared, stopping: &watch::Receiver<bool>) {
    if let Err(e) = read(shared, stopping) {
        // The drain closed the store under a read in progress: the node is stopping anyway,
        // and what was read is read again at the next start.
        if shared.store.is_closed() || *stopping.borrow() {
            tracing::debug!(error = %e, "the partition log reader stopped with the store");
            return;
        }
        tracing::error!(error.code = ?e.code, error = %e, "the partition log reader stopped");
        shared.store.health().fail(e);
    }
}

fn read(shared: &Shared, stopping: &watch::Receiver<bool>) -> Result<(), CodedError> {
    let settings = &shared.settings;
    let consumer = settings.reader(
        &settings.log_topic,
        &settings.replica_group(&settings.log_topic),
    )?;
    // The partitions the consumer is assigned: those kept here and not led here.
    let mut assigned = BTreeSet::new();
    let mut writes = WriteSet::default();
    let mut dirty = BTreeSet::new();
    // Partitions whose records this node needed were deleted: (partition, the log's first
    // offset, what to give up with if no snapshot reaches it).
    let mut catch_ups = Vec::new();
    let mut ends_asked = std::time::Instant::now() - ENDS_EVERY;
    let held = shared.held.subscribe();
    while !*stopping.borrow() {
        // A copy: the membership thread may send a new set while a release commits.
        let kept = held.borrow().clone();
        if !keep_held(shared, &kept)? {
            return Ok(());
        }
        let starts = rewind(shared)?;
        follow_kept(shared, &consumer, &mut assigned, starts)?;
        let mut wait = std::time::Duration::from_millis(100);
        for _ in 0..BATCH {
            match consumer.poll(wait) {
                None => break,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "reading the partition log");
                    break;
                }
                Some(Ok(message)) => {
                    wait = std::time::Duration::ZERO;
                    let p = u32::try_from(message.partition()).unwrap_or(u32::MAX);
                    let payload = message.payload().unwrap_or_default();
                    admit(
                        shared,
                        p,
                        message.offset(),
                        payload,
                        &mut writes,
                        &mut dirty,
                        &mut catch_ups,
                    );
                }
            }
        }
        note_ends(shared, &consumer, &mut ends_asked, &mut catch_ups);
        let progressed = !dirty.is_empty() || !catch_ups.is_empty();
        if !dirty.is_empty() && !store_batch(shared, &mut writes, &mut dirty)? {
            return Ok(());
        }
        // After the batch: a snapshot replaces what the store holds of its partition, which is
        // read on from the snapshot's end.
        let mut starts = BTreeMap::new();
        for (p, from, gone) in catch_ups.drain(..) {
            // A partition the plan no longer keeps here (a node that just started reads every
            // partition until its first plan) is released at the next turn, not loaded first:
            // a snapshot of a large state takes a second or more to load.
            if !held.borrow().as_ref().is_none_or(|kept| kept.contains(&p)) {
                continue;
            }
            if let Some(next) = catch_up(shared, p, from, &gone)? {
                starts.insert(p, next);
            }
        }
        if !starts.is_empty() {
            follow_kept(shared, &consumer, &mut assigned, starts)?;
        }
        if progressed {
            shared.progress.notify_waiters();
        }
    }
    Ok(())
}

/// Assigns the consumer the partitions to read here, when they or where one starts changed:
/// those this node keeps and does not lead (a leader does not read its own records back; see
/// the module's documentation). A partition in `starts` is read from its offset there; one
/// that joins otherwise from what the store holds of it (nothing after a release: the newest
/// snapshot and the tail); the others from where the reader is. Each change is a whole new
/// assignment, never a seek: librdkafka refuses to seek a partition whose fetch has not
/// started yet ("Erroneous state"), which a partition assigned a moment before may be.
fn follow_kept(
    shared: &Shared,
    consumer: &BaseConsumer,
    assigned: &mut BTreeSet<u32>,
    mut starts: BTreeMap<u32, i64>,
) -> Result<(), CodedError> {
    let want: BTreeSet<u32> = (0..shared.settings.partitions)
        .filter(|p| {
            let replica = lock(&shared.partitions[*p as usize]);
            replica.held() && !replica.leads()
        })
        .collect();
    if want == *assigned && starts.is_empty() {
        return Ok(());
    }
    let joining: Vec<u32> = want
        .difference(assigned)
        .filter(|p| !starts.contains_key(p))
        .copied()
        .collect();
    if !joining.is_empty() {
        let mut positions = shared.store.with_db(Position::load_all)??;
        for p in &joining {
            let position = positions.remove(p).unwrap_or_default();
            starts.insert(*p, position.next);
            lock(&shared.partitions[*p as usize]).rewind(position);
        }
    }
    let topic = &shared.settings.log_topic;
    let mut list = TopicPartitionList::new();
    for &p in &want {
        let next = match starts.get(&p) {
            Some(next) => *next,
            None => lock(&shared.partitions[p as usize]).read_next(),
        };
        list.add_partition_offset(topic, p as i32, super::from_offset(next))
            .map_err(|e| failed(format!("cannot assign the log: {e}")))?;
    }
    consumer
        .assign(&list)
        .map_err(|e| failed(format!("cannot assign the log: {e}")))?;
    let left: Vec<u32> = assigned.difference(&want).copied().collect();
    tracing::debug!(reading = ?want, from = ?starts, left = ?left, "the log's partitions read here changed");
    *assigned = want;
    Ok(())
}

/// Follows `held`, the partitions this node keeps (`None`: all): one it keeps again is read
/// from what the store holds (when the reader assigns it); one it no longer keeps, neither led
/// nor being taken over here, leaves the store (its rows and position) and is no longer read.
/// False when the writer is gone (the node stops).
fn keep_held(shared: &Shared, held: &Option<BTreeSet<u32>>) -> Result<bool, CodedError> {
    let partitions = shared.settings.partitions;
    for p in 0..partitions {
        let slot = &shared.partitions[p as usize];
        if held.as_ref().is_none_or(|held| held.contains(&p)) {
            if lock(slot).hold() {
                tracing::info!(partition = p, "kept here again: reading it from the store");
            }
            continue;
        }
        if !lock(slot).release() {
            continue;
        }
        if !replace(shared, p, Vec::new(), &Position::default())? {
            return Ok(false);
        }
        tracing::info!(
            partition = p,
            "no longer kept here: its rows left the store"
        );
    }
    Ok(true)
}

/// Replaces what the store holds of partition `p` with `chunks` (a snapshot's rows; none: the
/// partition leaves the store) at `position`; false when the writer is gone (the node stops).
fn replace(
    shared: &Shared,
    p: u32,
    chunks: Vec<WriteSet>,
    position: &Position,
) -> Result<bool, CodedError> {
    let writes = shared
        .store
        .with_db(|db| snapshot::replacing(db, p, shared.settings.partitions, chunks, position))??;
    let answer = {
        let _hand_over = lock(&shared.hand_over);
        shared.writer.commit(writes)
    };
    match answer.blocking_recv() {
        Ok(Ok(())) => Ok(true),
        Ok(Err(e)) => Err(e),
        Err(_) => Ok(false),
    }
}

/// Stores `writes` with the positions of the partitions in `dirty` (a partition led here
/// stores its own); false when the writer is gone (the node stops).
fn store_batch(
    shared: &Shared,
    writes: &mut WriteSet,
    dirty: &mut BTreeSet<u32>,
) -> Result<bool, CodedError> {
    let (answer, stored) = {
        let _hand_over = lock(&shared.hand_over);
        let mut stored = Vec::new();
        for &p in dirty.iter() {
            if let Some(next) = lock(&shared.partitions[p as usize]).save(p, writes) {
                stored.push((p, next));
            }
        }
        (shared.writer.commit(std::mem::take(writes)), stored)
    };
    dirty.clear();
    match answer.blocking_recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => return Ok(false),
    }
    for (p, next) in stored {
        lock(&shared.partitions[p as usize]).stored_up_to(next);
    }
    Ok(true)
}

/// Loads the newest snapshot of partition `p` into the store, when it reaches `from` (the
/// log's first offset): the offset its log is read on from. Otherwise gives `p` up with `gone`.
fn catch_up(
    shared: &Shared,
    p: u32,
    from: i64,
    gone: &CodedError,
) -> Result<Option<i64>, CodedError> {
    let newest = match super::snapshots::newest(shared, p) {
        Ok(newest) => newest,
        Err(e) => {
            tracing::error!(partition = p, error = %e, "cannot load the partition's snapshot");
            None
        }
    };
    let Some((manifest, chunks)) = newest.filter(|(m, _)| m.position.next >= from) else {
        let stop_leading = lock(&shared.partitions[p as usize]).give_up(gone.clone());
        gave_up(shared, p, gone, stop_leading);
        return Ok(None);
    };
    let position = manifest.position;
    if !replace(shared, p, chunks, &position)? {
        return Ok(None);
    }
    lock(&shared.partitions[p as usize]).caught_up(position.clone());
    if position.leader.epoch > 0 {
        shared.placement.set_leader(
            p as usize,
            position.leader.ingress.clone(),
            position.leader.admin.clone(),
        );
    }
    tracing::info!(
        partition = p,
        from = position.next,
        rows = manifest.rows,
        incremental = manifest.base.is_some(),
        "caught up from a snapshot"
    );
    Ok(Some(position.next))
}

/// Reads the record at `offset` of partition `p` by the replica's rule (`Replica::read`):
/// its writes go into `writes` when they count and this node does not lead `p`; a new leader
/// moves the placement, and a leader here that another node's epoch fenced steps down. A gap
/// before it asks for a snapshot (`catch_ups`); a damaged record gives `p` up.
fn admit(
    shared: &Shared,
    p: u32,
    offset: i64,
    payload: &[u8],
    writes: &mut WriteSet,
    dirty: &mut BTreeSet<u32>,
    catch_ups: &mut Vec<(u32, i64, CodedError)>,
) {
    let Some(slot) = shared.partitions.get(p as usize) else {
        return;
    };
    let mut replica = lock(slot);
    match replica.read(p, offset, payload, shared.settings.max_record, writes) {
        Read::Nothing => {}
        Read::GaveUp { why, stop_leading } => gave_up(shared, p, &why, stop_leading),
        Read::CatchUp { from, gone } => catch_ups.push((p, from, gone)),
        Read::Read {
            new_leader,
            stop_leading,
            store_position,
        } => {
            if let Some(leader) = new_leader {
                shared.placement.set_leader(
                    p as usize,
                    leader.ingress.clone(),
                    leader.admin.clone(),
                );
            }
            if stop_leading {
                let leader = replica.leader();
                tracing::warn!(partition = p, node = %leader.node, epoch = leader.epoch, "another node took the partition over; stepping down");
                let _ = shared.leads[p as usize].send(None);
            }
            if store_position {
                dirty.insert(p);
            }
        }
    }
}

/// Partition `p` was given up on (`why`): it is never applied nor led here again until the
/// node restarts, and `/health` answers `why`. A leader here steps down.
pub(super) fn gave_up(shared: &Shared, p: u32, why: &CodedError, stop_leading: bool) {
    tracing::error!(partition = p, error.code = ?why.code, error = %why, "stopped following the partition; this node will not lead it");
    if stop_leading {
        let _ = shared.leads[p as usize].send(None);
    }
}

/// How often the log's ends are asked for (what `/cluster-health` shows as lag).
const ENDS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Records where the log of each partition kept here ends, at most every [`ENDS_EVERY`]; a
/// partition whose log now starts past what this node read joins `catch_ups`.
fn note_ends(
    shared: &Shared,
    consumer: &BaseConsumer,
    last: &mut std::time::Instant,
    catch_ups: &mut Vec<(u32, i64, CodedError)>,
) {
    if last.elapsed() < ENDS_EVERY {
        return;
    }
    *last = std::time::Instant::now();
    for p in 0..shared.settings.partitions {
        if !lock(&shared.partitions[p as usize]).held() {
            continue;
        }
        let asked = consumer.fetch_watermarks(
            &shared.settings.log_topic,
            p as i32,
            std::time::Duration::from_secs(1),
        );
        if let Ok((low, high)) = asked {
            let mut replica = lock(&shared.partitions[p as usize]);
            replica.note_end(high);
            if let Some(Read::CatchUp { from, gone }) = replica.note_start(p, low) {
                catch_ups.push((p, from, gone));
            }
        }
    }
}

/// Partitions whose leader here stopped: each is read again from the store's position (the
/// offsets, for the next assignment).
fn rewind(shared: &Shared) -> Result<BTreeMap<u32, i64>, CodedError> {
    let partitions = std::mem::take(&mut *lock(&shared.rewinds));
    let mut starts = BTreeMap::new();
    if partitions.is_empty() {
        return Ok(starts);
    }
    let positions = shared.store.with_db(Position::load_all)??;
    for p in partitions {
        let position = positions.get(&p).cloned().unwrap_or_default();
        tracing::info!(
            partition = p,
            from = position.next,
            "following the partition again"
        );
        starts.insert(p, position.next);
        lock(&shared.partitions[p as usize]).rewind(position);
    }
    shared.progress.notify_waiters();
    Ok(starts)
}

fn failed(message: String) -> CodedError {
    CodedError::new(Code::CLU0002, message)
}
