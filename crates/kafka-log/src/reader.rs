//! The replica reader: one consumer assigned every partition of the log, reading from this
//! node's positions. It applies the valid writes of partitions this node does not lead, tracks
//! every partition's leader, and makes a local leader step down when another node's epoch is
//! accepted after its own.

use std::collections::BTreeSet;

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use tokio::sync::watch;

use super::{Shared, lock};
use sluice_core::errors::{Code, CodedError};
use sluice_runtime::replication::follow::{Followed, follow};
use sluice_store::storage::fencing::{Position, Verdict};
use sluice_store::storage::record::Record;
use sluice_store::storage::writer::WriteSet;

/// Most records applied in one store commit.
const BATCH: usize = 1024;

/// Reads until `stopping` turns true or the store fails.
pub(super) fn run(shared: &Shared, stopping: &watch::Receiver<bool>) {
    if let Err(e) = read(shared, stopping) {
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
    let mut assignment = TopicPartitionList::new();
    for p in 0..settings.partitions {
        let next = lock(&shared.partitions[p as usize]).stored;
        assignment
            .add_partition_offset(&settings.log_topic, p as i32, super::from_offset(next))
            .map_err(|e| failed(format!("cannot assign the log: {e}")))?;
    }
    consumer
        .assign(&assignment)
        .map_err(|e| failed(format!("cannot assign the log: {e}")))?;
    let mut writes = WriteSet::default();
    let mut dirty = BTreeSet::new();
    let mut ends_asked = std::time::Instant::now() - ENDS_EVERY;
    while !*stopping.borrow() {
        rewind(shared, &consumer)?;
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
                    );
                }
            }
        }
        note_ends(shared, &consumer, &mut ends_asked);
        if dirty.is_empty() {
            continue;
        }
        let committed = {
            let _hand_over = lock(&shared.hand_over);
            let mut stored = Vec::new();
            for &p in &dirty {
                let state = lock(&shared.partitions[p as usize]);
                // A partition led here stores its own position.
                if state.leading.is_none() {
                    state.seen.save(p, &mut writes);
                    stored.push((p, state.seen.next));
                }
            }
            (shared.writer.commit(std::mem::take(&mut writes)), stored)
        };
        dirty.clear();
        let (answer, stored) = committed;
        match answer.blocking_recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()),
        }
        for (p, next) in stored {
            let mut state = lock(&shared.partitions[p as usize]);
            state.stored = state.stored.max(next);
        }
        shared.progress.notify_waiters();
    }
    Ok(())
}

/// Reads the record at `offset` of partition `p` ([`follow`]): its writes go into `writes` when
/// they count and this node does not lead `p`. A gap before it or a damaged record stops
/// following `p`.
fn admit(
    shared: &Shared,
    p: u32,
    offset: i64,
    payload: &[u8],
    writes: &mut WriteSet,
    dirty: &mut BTreeSet<u32>,
) {
    let Some(slot) = shared.partitions.get(p as usize) else {
        return;
    };
    let mut state = lock(slot);
    if state.broken.is_some() {
        // Given up on.
        return;
    }
    let (verdict, record) = match follow(
        &mut state.seen,
        p,
        offset,
        payload,
        shared.settings.max_record,
    ) {
        Followed::Before => return,
        Followed::Broken(why) => {
            break_partition(shared, p, &mut state, why);
            return;
        }
        Followed::Read(verdict, record) => (verdict, record),
    };
    if verdict == Verdict::Accepted {
        let leader = &state.seen.leader;
        shared
            .placement
            .set_leader(p as usize, leader.ingress.clone(), leader.admin.clone());
    }
    match state.leading {
        Some(incarnation) => {
            if verdict == Verdict::Accepted && state.seen.leader.incarnation != incarnation {
                tracing::warn!(partition = p, node = %state.seen.leader.node, epoch = state.seen.leader.epoch, "another node took the partition over; stepping down");
                let _ = shared.leads[p as usize].send(None);
            }
        }
        None => {
            if let (
                Verdict::Apply,
                Record::Writes {
                    writes: mut set, ..
                },
            ) = (verdict, record)
            {
                writes.append(&mut set);
            }
            dirty.insert(p);
        }
    }
}

/// Stops following partition `p` for good (until the node restarts): it is never applied nor
/// led here again, and `/health` answers `why`. A leader here steps down.
pub(super) fn break_partition(
    shared: &Shared,
    p: u32,
    state: &mut super::PartitionState,
    why: CodedError,
) {
    tracing::error!(partition = p, error.code = ?why.code, error = %why, "stopped following the partition; this node will not lead it");
    if state.leading.is_some() {
        let _ = shared.leads[p as usize].send(None);
    }
    state.broken = Some(why);
}

/// How often the log's ends are asked for (what `/cluster-health` shows as lag).
const ENDS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Records where each partition's log ends, at most every [`ENDS_EVERY`].
fn note_ends(shared: &Shared, consumer: &BaseConsumer, last: &mut std::time::Instant) {
    if last.elapsed() < ENDS_EVERY {
        return;
    }
    *last = std::time::Instant::now();
    for p in 0..shared.settings.partitions {
        let asked = consumer.fetch_watermarks(
            &shared.settings.log_topic,
            p as i32,
            std::time::Duration::from_secs(1),
        );
        if let Ok((_, high)) = asked {
            lock(&shared.partitions[p as usize]).end = high;
        }
    }
}

/// Partitions whose leader stopped are read again from the store's position.
fn rewind(shared: &Shared, consumer: &BaseConsumer) -> Result<(), CodedError> {
    let partitions = std::mem::take(&mut *lock(&shared.rewinds));
    if partitions.is_empty() {
        return Ok(());
    }
    let positions = shared.store.with_db(Position::load_all)??;
    for p in partitions {
        let position = positions.get(&p).cloned().unwrap_or_default();
        let next = position.next;
        {
            let mut state = lock(&shared.partitions[p as usize]);
            state.seen = position;
            state.stored = next;
            state.leading = None;
        }
        consumer
            .seek(
                &shared.settings.log_topic,
                p as i32,
                super::from_offset(next),
                std::time::Duration::from_secs(10),
            )
            .map_err(|e| failed(format!("cannot read partition {p} again from {next}: {e}")))?;
        tracing::info!(partition = p, from = next, "following the partition again");
    }
    shared.progress.notify_waiters();
    Ok(())
}

fn failed(message: String) -> CodedError {
    CodedError::new(Code::CLU0002, message)
}
