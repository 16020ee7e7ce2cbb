//! The snapshot topic (`docs/cluster.md`, "Snapshots"): partition *p*'s leader writes *p*'s
//! state to partition *p* of `<prefix>snapshots` every `cluster.snapshot-interval` (chunks,
//! then a manifest): whole first, then only the rows that changed since the one before, whole
//! again every `cluster.snapshot-full-every` or once the incrementals reach half the whole one.
//! Once a manifest is stored, it deletes what the chain covers: the log before its position
//! and the snapshots before the chain's whole one. A replica whose log position was deleted
//! loads the newest chain and reads the log on from its end (`reader.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use super::Shared;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_store::storage::changes::Changes;
use sluice_store::storage::snapshot::{self, Exported, Manifest, SnapshotRecord};
use sluice_store::storage::writer::{WriteSet, Writer};

/// How long loading a snapshot may take before the replica gives up on it.
const LOAD_WITHIN: Duration = Duration::from_secs(120);

fn failed(why: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::CLU0001, format!("snapshot: {why}"))
}

/// The snapshots a leader wrote since its last whole one.
struct Chain {
    /// The newest one's id: the next incremental builds on it.
    last: u64,
    /// Where the whole one begins in the snapshot topic: what is before it may go.
    whole_first: i64,
    /// The whole one's bytes.
    whole_bytes: usize,
    /// How many incrementals came after it, and their bytes.
    incrementals: u32,
    incremental_bytes: usize,
}

impl Chain {
    /// Whether the next snapshot must be whole: every `cluster.snapshot-full-every`, or once
    /// the incrementals add up to half the whole one (a node catching up reads them all).
    fn ends(&self, full_every: u32) -> bool {
        self.incrementals + 1 >= full_every || self.incremental_bytes * 2 >= self.whole_bytes
    }
}

/// Writes partition `p`'s snapshots while `lead` holds a writer (this node leads `p`): a
/// whole one first, then what `changes` noted since the last one, whole again now and then.
pub(super) async fn keep(
    shared: Arc<Shared>,
    p: u32,
    mut lead: watch::Receiver<Option<Writer>>,
    changes: Arc<Changes>,
) {
    // The log offset the last snapshot reaches: a partition whose log did not move since is not
    // written again.
    let mut covered = -1;
    // Where the log was deleted before, by this leader.
    let mut deleted = -1;
    let mut chain: Option<Chain> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(shared.settings.snapshot_interval) => {}
            _ = lead.wait_for(Option::is_none) => return,
        }
        // The log goes up to the snapshot before the newest: a standby late by less than an
        // interval reads on from the log instead of loading the whole chain (a whole snapshot
        // of a large state is megabytes). Once the log stood still for an interval, nobody is
        // reading behind the newest snapshot, and the log before it goes too.
        let delete_to = match write(&shared, p, covered, &changes, &mut chain).await {
            Ok(Some(next)) => std::mem::replace(&mut covered, next),
            Ok(None) => covered,
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "cannot write a snapshot; trying again at the next interval");
                -1
            }
        };
        if delete_to > deleted {
            match super::delete_before(&shared, &shared.settings.log_topic, p, delete_to).await {
                Ok(()) => deleted = delete_to,
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "cannot delete the log behind a snapshot; trying again at the next interval");
                }
            }
        }
    }
}

/// Writes one snapshot of partition `p` if its log moved past `covered`, incremental on
/// `chain` when it allows, and moves `chain` on: the offset it reaches. On an error the chain
/// ends (a snapshot cut off may have taken what changed from `changes`): the next is whole.
async fn write(
    shared: &Arc<Shared>,
    p: u32,
    covered: i64,
    changes: &Arc<Changes>,
    chain: &mut Option<Chain>,
) -> Result<Option<i64>, CodedError> {
    let started = Instant::now();
    let whole = chain
        .as_ref()
        .is_none_or(|chain| chain.ends(shared.settings.snapshot_full_every));
    let exported = {
        let (store, changes) = (Arc::clone(&shared.store), Arc::clone(changes));
        let (partitions, chunk) = (shared.settings.partitions, shared.settings.max_record / 2);
        tokio::task::spawn_blocking(move || {
            store.with_db(|db| snapshot::export(db, p, partitions, chunk, covered, &changes, whole))
        })
        .await
        .map_err(failed)
        .and_then(|read| read.and_then(|exported| exported))
    };
    let exported = match exported {
        Ok(Some(exported)) => exported,
        Ok(None) => return Ok(None),
        Err(e) => {
            *chain = None;
            return Err(e);
        }
    };
    // Taken: a snapshot not stored leaves no chain.
    let (next, written) = written(shared, p, exported, chain.take(), started).await?;
    *chain = Some(written);
    Ok(Some(next))
}

/// Stores `exported` in the snapshot topic on `chain`, then deletes what it covers.
async fn written(
    shared: &Arc<Shared>,
    p: u32,
    exported: Exported,
    chain: Option<Chain>,
    started: Instant,
) -> Result<(i64, Chain), CodedError> {
    let Exported {
        position,
        chunks,
        whole,
    } = exported;
    let id = InvocationId::new_uuid() as u64;
    let topic = &shared.settings.snapshot_topic;
    let count = u32::try_from(chunks.len()).map_err(failed)?;
    let rows = chunks.iter().map(WriteSet::len).sum::<usize>() as u64;
    let (mut first, mut bytes) = (None, 0);
    for (seq, rows) in chunks.into_iter().enumerate() {
        let seq = u32::try_from(seq).map_err(failed)?;
        let record = SnapshotRecord::Chunk { id, seq, rows }.encode();
        bytes += record.len();
        let at = produce(shared, topic, p, &record).await?;
        first.get_or_insert(at);
    }
    let base = match (&chain, whole) {
        (Some(chain), false) => Some(chain.last),
        _ => None,
    };
    let manifest = SnapshotRecord::Manifest(Manifest {
        id,
        chunks: count,
        rows,
        position: position.clone(),
        base,
    })
    .encode();
    let at = produce(shared, topic, p, &manifest).await?;
    let chain = match chain {
        Some(chain) if base.is_some() => Chain {
            last: id,
            incrementals: chain.incrementals + 1,
            incremental_bytes: chain.incremental_bytes + bytes,
            ..chain
        },
        _ => Chain {
            last: id,
            whole_first: first.unwrap_or(at),
            whole_bytes: bytes,
            incrementals: 0,
            incremental_bytes: 0,
        },
    };
    // Stored: the snapshots before the whole one it builds on may go (what is not deleted now
    // goes with the next snapshot); the log it covers goes one interval later (`keep`).
    if let Err(e) = super::delete_before(shared, topic, p, chain.whole_first).await {
        tracing::warn!(partition = p, topic, error = %e, "cannot delete what a snapshot covers");
    }
    let kind = if base.is_some() {
        "incremental"
    } else {
        "whole"
    };
    metrics::counter!(sluice_core::metrics::CLUSTER_SNAPSHOT_BYTES, "kind" => kind)
        .increment(bytes as u64);
    metrics::counter!(sluice_core::metrics::CLUSTER_SNAPSHOT_ROWS, "kind" => kind).increment(rows);
    tracing::info!(
        partition = p,
        covers = position.next,
        whole,
        chunks = count,
        rows,
        bytes,
        ms = started.elapsed().as_millis() as u64,
        "wrote a snapshot"
    );
    Ok((position.next, chain))
}

async fn produce(shared: &Shared, topic: &str, p: u32, bytes: &[u8]) -> Result<i64, CodedError> {
    shared
        .producer
        .send(
            FutureRecord::<(), [u8]>::to(topic)
                .partition(p as i32)
                .payload(bytes),
            Duration::from_secs(10),
        )
        .await
        .map(|delivered| delivered.offset)
        .map_err(|(e, _)| {
            failed(format!(
                "partition {p}: the topic did not take a record: {e}"
            ))
        })
}

/// The newest state of partition `p` the snapshot topic holds: the manifest of the last
/// snapshot of the newest chain (a whole snapshot and the incrementals after it that build on
/// it, each on the one before), and the chain's chunks in order (`None`: there is none).
/// Chunks of a snapshot whose manifest never came (its leader died while writing it) are
/// passed over, and so is a snapshot that builds on one that is not the chain's last, or a
/// whole one older than the chain's end (written by a leader already replaced).
pub(super) fn newest(
    shared: &Shared,
    p: u32,
) -> Result<Option<(Manifest, Vec<WriteSet>)>, CodedError> {
    let settings = &shared.settings;
    let topic = &settings.snapshot_topic;
    let consumer = settings.reader(topic, &settings.replica_group(topic))?;
    let (start, end) = consumer
        .fetch_watermarks(topic, p as i32, Duration::from_secs(10))
        .map_err(|e| {
            failed(format!(
                "cannot read where partition {p}'s snapshots are: {e}"
            ))
        })?;
    if end <= start {
        return Ok(None);
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, p as i32, Offset::Offset(start))
        .map_err(failed)?;
    consumer.assign(&assignment).map_err(failed)?;
    let started = Instant::now();
    let mut building: Option<(u64, Vec<WriteSet>)> = None;
    let mut newest: Option<(Manifest, Vec<WriteSet>)> = None;
    let mut next = start;
    while next < end {
        if started.elapsed() > LOAD_WITHIN {
            return Err(failed(format!(
                "partition {p}: read {next} of {end} snapshot records in {} s",
                LOAD_WITHIN.as_secs()
            )));
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = match message {
            Ok(message) => message,
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "reading the snapshot topic");
                continue;
            }
        };
        next = message.offset() + 1;
        match SnapshotRecord::decode(message.payload().unwrap_or_default(), settings.max_record) {
            Ok(SnapshotRecord::Chunk { id, seq, rows }) => match &mut building {
                Some((building_id, chunks))
                    if *building_id == id && chunks.len() == seq as usize =>
                {
                    chunks.push(rows);
                }
                _ if seq == 0 => building = Some((id, vec![rows])),
                _ => building = None,
            },
            Ok(SnapshotRecord::Manifest(manifest)) => {
                if let Some((id, chunks)) = building.take()
                    && id == manifest.id
                    && chunks.len() == manifest.chunks as usize
                {
                    chain(&mut newest, manifest, chunks);
                }
            }
            Err(e) => {
                tracing::warn!(partition = p, offset = message.offset(), error = %e, "skipped a snapshot record");
                building = None;
            }
        }
    }
    Ok(newest)
}

/// Adds the complete snapshot `manifest` with its `chunks` to the chain in `newest`.
fn chain(
    newest: &mut Option<(Manifest, Vec<WriteSet>)>,
    manifest: Manifest,
    chunks: Vec<WriteSet>,
) {
    match (manifest.base, newest) {
        (None, newest) => {
            if newest
                .as_ref()
                .is_none_or(|(end, _)| end.position.next <= manifest.position.next)
            {
                *newest = Some((manifest, chunks));
            }
        }
        (Some(base), Some((end, sets))) if end.id == base => {
            sets.extend(chunks);
            *end = manifest;
        }
        (Some(_), _) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_store::schema;
    use sluice_store::storage::fencing::Position;

    fn snapshot(id: u64, next: i64, base: Option<u64>) -> (Manifest, Vec<WriteSet>) {
        let mut rows = WriteSet::default();
        rows.put(schema::INVOCATIONS, &id.to_be_bytes(), vec![]);
        let manifest = Manifest {
            id,
            chunks: 1,
            rows: 1,
            position: Position {
                next,
                ..Position::default()
            },
            base,
        };
        (manifest, vec![rows])
    }

    fn read(order: &[(u64, i64, Option<u64>)]) -> Option<(u64, i64, usize)> {
        let mut newest = None;
        for &(id, next, base) in order {
            let (manifest, chunks) = snapshot(id, next, base);
            chain(&mut newest, manifest, chunks);
        }
        newest.map(|(end, sets)| (end.id, end.position.next, sets.len()))
    }

    #[test]
    fn a_chain_is_a_whole_snapshot_and_the_incrementals_that_build_on_it_each_on_the_last() {
        // Whole 1, then 2 on 1 and 3 on 2: the chain ends at 3 with three snapshots' chunks.
        assert_eq!(
            read(&[(1, 10, None), (2, 20, Some(1)), (3, 30, Some(2))]),
            Some((3, 30, 3))
        );
        // An incremental with no whole one before it (deleted, or cut off) is passed over.
        assert_eq!(read(&[(2, 20, Some(1))]), None);
        // One that builds on another than the chain's last (a replaced leader's) too.
        assert_eq!(
            read(&[(1, 10, None), (2, 20, Some(1)), (9, 25, Some(1))]),
            Some((2, 20, 2))
        );
        // A newer whole one starts the chain again; an older one (a replaced leader's, written
        // late) does not.
        assert_eq!(
            read(&[
                (1, 10, None),
                (2, 20, Some(1)),
                (4, 40, None),
                (5, 50, Some(4))
            ]),
            Some((5, 50, 2))
        );
        assert_eq!(
            read(&[(4, 40, None), (1, 10, None), (5, 50, Some(4))]),
            Some((5, 50, 2))
        );
    }

    #[test]
    fn a_chain_ends_every_so_many_snapshots_or_at_half_the_whole_ones_bytes() {
        let chain = |incrementals, incremental_bytes| Chain {
            last: 1,
            whole_first: 0,
            whole_bytes: 1_000,
            incrementals,
            incremental_bytes,
        };
        assert!(!chain(0, 0).ends(10));
        assert!(!chain(8, 400).ends(10));
        assert!(chain(9, 400).ends(10), "the tenth is whole");
        assert!(chain(1, 500).ends(10), "half the whole one's bytes");
        assert!(chain(0, 0).ends(1), "every one whole");
    }
}
