//! The meta topic: metadata tables a node changed go to every node (`storage::meta`). The
//! writer publishes after its local commit; a reader thread on every node applies each
//! snapshot in the topic's order and reloads what it keeps in memory.

use std::sync::mpsc;
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};
use tokio::sync::watch;

use super::meta_chunks::{self, Assembler};
use super::{Settings, Shared};
use sluice_core::errors::{Code, CodedError};
use sluice_store::storage::fencing::Position;
use sluice_store::storage::meta::{MetaLog, MetaSnapshot};
use sluice_store::storage::writer::WriteSet;

/// The position row of the meta topic (beside the partitions' rows).
const META_POSITION: u32 = u32::MAX;

/// How long a publish waits for the log.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

type Delivered = mpsc::SyncSender<Result<i64, String>>;

/// Hands each delivery's result back to the publish waiting for it.
struct Deliveries;

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<Delivered>;

    fn delivery(&self, result: &DeliveryResult<'_>, waiting: Self::DeliveryOpaque) {
        let _ = waiting.send(
            result
                .as_ref()
                .map(|message| message.offset())
                .map_err(|(e, _)| e.to_string()),
        );
    }
}

/// Publishes metadata snapshots to the meta topic.
pub struct KafkaMetaLog {
    producer: ThreadedProducer<Deliveries>,
    topic: String,
    max_record: usize,
    /// This node's name, which its chunked changes carry.
    node: String,
    /// Numbers this node's chunked changes; from the clock, so a restarted node's do not
    /// repeat the ones before.
    changes: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for KafkaMetaLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaMetaLog")
            .field("topic", &self.topic)
            .finish()
    }
}

impl KafkaMetaLog {
    pub(super) fn new(settings: &Settings) -> Result<Self, CodedError> {
        let producer = settings
            .client
            .clone()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.max.bytes", settings.max_record.to_string())
            .set("batch.size", super::batch_size(settings.max_record))
            .create_with_context(Deliveries)
            .map_err(|e| super::join_failed(format!("cannot create the meta producer: {e}")))?;
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Ok(Self {
            producer,
            topic: settings.meta_topic.clone(),
            max_record: settings.max_record,
            node: settings.node.clone(),
            changes: std::sync::atomic::AtomicU64::new(started),
        })
    }
}

fn not_published(why: impl std::fmt::Display) -> CodedError {
    CodedError::new(
        Code::CLU0001,
        format!(
            "the change was stored on this node but not published to the cluster: {why}; make it again"
        ),
    )
}

impl MetaLog for KafkaMetaLog {
    fn publish(&self, snapshot: &MetaSnapshot) -> Result<i64, CodedError> {
        let bytes = snapshot.encode();
        // Keyed by its tables: a compacted meta topic keeps the newest record of each group.
        let key = snapshot.key();
        let records = if bytes.len() <= self.max_record {
            vec![(key, bytes)]
        } else {
            let change = self
                .changes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            meta_chunks::split(
                &bytes,
                &key,
                &self.node,
                change,
                chunk_bytes(self.max_record),
            )
            .map_err(not_published)?
        };
        // One producer keeps the records in order: the chunks of a change are consecutive
        // among this node's records, and the change counts as stored at its last one.
        let waiting: Vec<mpsc::Receiver<Result<i64, String>>> = records
            .iter()
            .map(|(key, payload)| {
                let (done, delivered) = mpsc::sync_channel(1);
                self.producer
                    .send(
                        BaseRecord::<str, [u8], Box<Delivered>>::with_opaque_to(
                            &self.topic,
                            Box::new(done),
                        )
                        .partition(0)
                        .key(key)
                        .payload(payload),
                    )
                    .map_err(|(e, _)| not_published(e))?;
                Ok(delivered)
            })
            .collect::<Result<_, CodedError>>()?;
        let mut last = -1;
        for delivered in waiting {
            last = match delivered.recv_timeout(PUBLISH_TIMEOUT) {
                Ok(Ok(at)) => at,
                Ok(Err(e)) => return Err(not_published(e)),
                Err(_) => return Err(not_published("the meta topic did not answer")),
            };
        }
        Ok(last)
    }
}

/// The data in one chunk record: room is left for the chunk's header, the key and the
/// record's own framing within `cluster.max-record-bytes`.
fn chunk_bytes(max_record: usize) -> usize {
    max_record - max_record / 8
}

/// The largest metadata change a reader puts together.
fn max_change(max_record: usize) -> usize {
    chunk_bytes(max_record).saturating_mul(meta_chunks::MAX_CHUNKS as usize)
}

/// Whether the meta topic's records from `next` on were deleted (its first record is past
/// `next`), rather than compacted away. Compaction only drops records a newer record of the
/// same table group replaced, and the newer one is still ahead; a deleted prefix may have held
/// a group's only record. Asked when a record comes after a gap; not knowing counts as deleted.
fn deleted_before(shared: &Shared, consumer: &rdkafka::consumer::BaseConsumer, next: i64) -> bool {
    match consumer.fetch_watermarks(&shared.settings.meta_topic, 0, Duration::from_secs(10)) {
        Ok((first, _)) => next < first,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read where the meta topic starts");
            true
        }
    }
}

/// Applies the meta topic to the store until `stopping` turns true.
pub(super) fn read(shared: &Shared, stopping: &watch::Receiver<bool>) {
    if let Err(e) = follow(shared, stopping) {
        // As the log reader: a store closed by the drain stops it quietly.
        if shared.store.is_closed() || *stopping.borrow() {
            tracing::debug!(error = %e, "the meta topic reader stopped with the store");
            return;
        }
        tracing::error!(error.code = ?e.code, error = %e, "the meta topic reader stopped");
        shared.store.health().fail(e);
    }
}

fn follow(shared: &Shared, stopping: &watch::Receiver<bool>) -> Result<(), CodedError> {
    let settings = &shared.settings;
    let consumer = settings.reader(
        &settings.meta_topic,
        &settings.replica_group(&settings.meta_topic),
    )?;
    let mut position = shared
        .store
        .with_db(Position::load_all)??
        .remove(&META_POSITION)
        .unwrap_or_default();
    // `position` is what is stored: where a restart reads from. This is the next record to
    // read, ahead of it while a chunked change is coming in.
    let mut next = position.next;
    let mut chunks = Assembler::new(max_change(settings.max_record));
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(&settings.meta_topic, 0, super::from_offset(position.next))
        .map_err(|e| super::join_failed(format!("cannot assign the meta topic: {e}")))?;
    consumer
        .assign(&assignment)
        .map_err(|e| super::join_failed(format!("cannot assign the meta topic: {e}")))?;
    while !*stopping.borrow() {
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = match message {
            Ok(message) => message,
            Err(e) => {
                tracing::warn!(error = %e, "reading the meta topic");
                continue;
            }
        };
        if message.offset() < next {
            continue;
        }
        if message.offset() > next && deleted_before(shared, &consumer, next) {
            // A table changed only in the deleted records would stay stale here for good.
            return Err(CodedError::new(
                Code::CLU0004,
                format!(
                    "the meta topic goes on at offset {} but this node's store needs offset {}: metadata it never read was deleted (topic retention?)",
                    message.offset(),
                    next
                ),
            ));
        }
        next = message.offset().saturating_add(1);
        let payload = message.payload().unwrap_or_default();
        let mut snapshot = match meta_chunks::parse(payload)? {
            None => MetaSnapshot::decode(payload, settings.max_record)?,
            Some(chunk) => match chunks.take(message.offset(), &chunk) {
                Some(whole) => MetaSnapshot::decode(&whole, max_change(settings.max_record))?,
                None => continue,
            },
        };
        position.next = chunks.resume_from().map_or(next, |first| first.min(next));
        let mut saved = WriteSet::default();
        position.save(META_POSITION, &mut saved);
        let started = std::time::Instant::now();
        let gate = shared.store.meta_gate();
        // This node published these tables after this record: its store holds the later
        // ones, which every node applies last. Applied, the record would take this node
        // back to older tables until its own came round (and a change made meanwhile would
        // build on them). Only the position moves on.
        if shared
            .store
            .meta_published_after(&snapshot.key(), message.offset())
        {
            snapshot.tables.clear();
        }
        store_meta(shared, &snapshot, &saved)?;
        drop(gate);
        let tables: Vec<&str> = snapshot.tables.iter().map(|(name, _)| *name).collect();
        if !tables.is_empty()
            && let Some(reload) = shared.on_meta.get()
        {
            reload(&tables);
        }
        tracing::debug!(
            offset = message.offset(),
            ?tables,
            apply_ms = started.elapsed().as_millis(),
            "applied metadata from the cluster"
        );
    }
    Ok(())
}

/// Applies `snapshot` (tables of metadata) and `saved` (the meta topic's position) to the
/// store in one transaction.
fn store_meta(
    shared: &Shared,
    snapshot: &MetaSnapshot,
    saved: &WriteSet,
) -> Result<(), CodedError> {
    shared.store.with_db(|db| -> Result<(), CodedError> {
        let failed =
            |e: redb::Error| CodedError::new(Code::RT0009, format!("applying metadata: {e}"));
        let mut txn = db.begin_write().map_err(|e| failed(e.into()))?;
        // Not made durable here: the view writer's next checkpoint makes it so, as it does
        // the replicas' writes. A durable commit flushed everything the view wrote since
        // its last checkpoint first: under load that held a change back for over a second.
        // After a crash the store opens at a checkpoint whose meta position is read again
        // from, so nothing applied is lost.
        txn.set_durability(redb::Durability::None)
            .map_err(|e| failed(e.into()))?;
        snapshot.apply(&txn)?;
        saved.apply(&txn).map_err(failed)?;
        txn.commit().map_err(|e| failed(e.into()))
    })?
}
