//! The snapshot topic (`docs/cluster.md`, "Snapshots"): partition *p*'s leader writes *p*'s
//! state to partition *p* of `<prefix>snapshots` every `cluster.snapshot-interval` (chunks,
//! then a manifest) and, once the manifest is stored, deletes what it covers: the log before
//! its position and the older snapshots before its first chunk. A replica whose log position
//! was deleted loads the newest complete snapshot and reads the log on from its end
//! (`reader.rs`).

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
use sluice_store::storage::snapshot::{self, Manifest, SnapshotRecord};
use sluice_store::storage::writer::{WriteSet, Writer};

/// How long loading a snapshot may take before the replica gives up on it.
const LOAD_WITHIN: Duration = Duration::from_secs(120);

fn failed(why: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::CLU0001, format!("snapshot: {why}"))
}

/// Writes partition `p`'s snapshots while `lead` holds a writer (this node leads `p`).
pub(super) async fn keep(shared: Arc<Shared>, p: u32, mut lead: watch::Receiver<Option<Writer>>) {
    // The log offset the last snapshot reaches: a partition whose log did not move since is not
    // written again.
    let mut covered = -1;
    loop {
        tokio::select! {
            () = tokio::time::sleep(shared.settings.snapshot_interval) => {}
            _ = lead.wait_for(Option::is_none) => return,
        }
        match write(&shared, p, covered).await {
            Ok(Some(next)) => covered = next,
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "cannot write a snapshot; trying again at the next interval");
            }
        }
    }
}

/// Writes one snapshot of partition `p` if its log moved past `covered`; the offset it reaches.
async fn write(shared: &Arc<Shared>, p: u32, covered: i64) -> Result<Option<i64>, CodedError> {
    let started = Instant::now();
    let exported = {
        let store = Arc::clone(&shared.store);
        let (partitions, chunk) = (shared.settings.partitions, shared.settings.max_record / 2);
        tokio::task::spawn_blocking(move || {
            store.with_db(|db| snapshot::export(db, p, partitions, chunk, covered))
        })
        .await
        .map_err(failed)???
    };
    let Some((position, chunks)) = exported else {
        return Ok(None);
    };
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
    let manifest = SnapshotRecord::Manifest(Manifest {
        id,
        chunks: count,
        rows,
        position: position.clone(),
    })
    .encode();
    let at = produce(shared, topic, p, &manifest).await?;
    // Stored: what it covers may go; what is not deleted now goes with the next snapshot.
    for (topic, before) in [
        (&shared.settings.log_topic, position.next),
        (topic, first.unwrap_or(at)),
    ] {
        if let Err(e) = super::delete_before(shared, topic, p, before).await {
            tracing::warn!(partition = p, topic, error = %e, "cannot delete what a snapshot covers");
        }
    }
    tracing::info!(
        partition = p,
        covers = position.next,
        chunks = count,
        rows,
        bytes,
        ms = started.elapsed().as_millis() as u64,
        "wrote a snapshot; deleted the log before it"
    );
    Ok(Some(position.next))
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

/// The newest complete snapshot of partition `p` in the snapshot topic: its manifest and its
/// chunks in order (`None`: there is none). Chunks of a snapshot whose manifest never came
/// (its leader died while writing it) are passed over.
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
    let mut newest = None;
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
                    newest = Some((manifest, chunks));
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
