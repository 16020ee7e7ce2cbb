//! The inbox topic: what partitions post to each other (`partition::posted`) goes to the
//! inbox partition of the partition it is for, whichever node leads that. The leader reads its
//! inbox partition, hands each event to the partition, and commits the inbox offsets only once
//! the partition stored everything before a barrier: after a failover the new leader reads
//! again from the last commit, and every posted event is harmless twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{oneshot, watch};

use super::Shared;
use sluice_core::errors::{Code, CodedError};
use sluice_runtime::partition::posted::{self, Outbox};
use sluice_runtime::partition::{Event, Runtime};
use sluice_store::storage::writer::Writer;

/// The longest pause between two tries of a post the inbox did not take.
const POST_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Most events handed over before a barrier.
const BATCH: usize = 512;

/// How often a leader deletes what its inbox partition delivered (at most).
const TRUNCATE_EVERY: Duration = Duration::from_secs(5);

/// Posts events to the inbox topic.
pub struct KafkaOutbox {
    producer: FutureProducer,
    topic: String,
    /// Posts being tried again (what `/cluster-health` and `/metrics` show).
    retrying: Arc<AtomicU64>,
}

impl std::fmt::Debug for KafkaOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaOutbox")
            .field("topic", &self.topic)
            .finish()
    }
}

impl KafkaOutbox {
    pub(super) fn new(shared: &Shared) -> Self {
        Self {
            producer: shared.producer.clone(),
            topic: shared.settings.inbox_topic.clone(),
            retrying: Arc::clone(&shared.posts_retrying),
        }
    }
}

impl Outbox for KafkaOutbox {
    fn post(&self, partition: u32, event: Vec<u8>) {
        let (done, _) = oneshot::channel();
        self.post_then(partition, event, done);
    }

    fn post_then(
        &self,
        partition: u32,
        event: Vec<u8>,
        done: oneshot::Sender<Result<bool, CodedError>>,
    ) {
        let producer = self.producer.clone();
        let topic = self.topic.clone();
        let retrying = Arc::clone(&self.retrying);
        tokio::spawn(async move {
            // Tried until the inbox takes it: an acknowledged call's child or result is never
            // given up on (a post the poster's recovery makes again is harmless twice).
            let mut attempt: u32 = 0;
            loop {
                let sent = producer
                    .send(
                        FutureRecord::<(), [u8]>::to(&topic)
                            .partition(partition as i32)
                            .payload(&event),
                        Duration::from_secs(10),
                    )
                    .await;
                match sent {
                    Ok(_) => break,
                    Err((e, _)) => {
                        attempt = attempt.saturating_add(1);
                        if attempt == 1 {
                            retrying.fetch_add(1, Ordering::Relaxed);
                        }
                        tracing::error!(partition, attempt, error = %e, "the inbox did not take a posted event; trying again");
                        let pause = Duration::from_millis(100)
                            .saturating_mul(attempt)
                            .min(POST_BACKOFF_MAX);
                        tokio::time::sleep(pause).await;
                    }
                }
            }
            if attempt > 0 {
                retrying.fetch_sub(1, Ordering::Relaxed);
            }
            let _ = done.send(Ok(true));
        });
    }
}

/// Delivers partition `p`'s inbox to it while `lead` holds a writer (this node leads `p`).
pub(super) fn deliver(
    shared: &Arc<Shared>,
    p: u32,
    runtime: &Runtime,
    lead: &watch::Receiver<Option<Writer>>,
) {
    if let Err(e) = run(shared, p, runtime, lead) {
        tracing::error!(partition = p, error = %e, "the inbox reader stopped; stepping down");
        let _ = shared.leads[p as usize].send(None);
    }
}

/// Assigns `consumer` partition `p` of the inbox `topic` from where the previous leader
/// stopped (its committed offset; nothing committed: the topic's first record); that offset.
/// Every record from there is read in turn: a jump means posted events were deleted unread.
fn resume(consumer: &BaseConsumer, topic: &str, p: u32) -> Result<i64, String> {
    let mut asked = TopicPartitionList::new();
    asked
        .add_partition(topic, p as i32)
        .set_offset(Offset::Stored)
        .map_err(|e| e.to_string())?;
    let committed = consumer
        .committed_offsets(asked, Duration::from_secs(10))
        .map_err(|e| format!("cannot read the inbox's committed offset: {e}"))?;
    let expected = match committed
        .find_partition(topic, p as i32)
        .map(|found| found.offset())
    {
        Some(Offset::Offset(at)) if at > 0 => at,
        _ => 0,
    };
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, p as i32, super::from_offset(expected))
        .map_err(|e| e.to_string())?;
    consumer.assign(&assignment).map_err(|e| e.to_string())?;
    Ok(expected)
}

fn run(
    shared: &Arc<Shared>,
    p: u32,
    runtime: &Runtime,
    lead: &watch::Receiver<Option<Writer>>,
) -> Result<(), String> {
    let settings = &shared.settings;
    // One group for every node: the offsets it commits are where the next leader goes on.
    let consumer = settings
        .reader(&settings.inbox_topic, &settings.inbox_topic)
        .map_err(|e| e.message)?;
    let mut expected = resume(&consumer, &settings.inbox_topic, p)?;
    let handle = tokio::runtime::Handle::current();
    let mut truncated = std::time::Instant::now();
    while lead.borrow().is_some() {
        let mut next = None;
        let mut wait = Duration::from_millis(100);
        for _ in 0..BATCH {
            let Some(message) = consumer.poll(wait) else {
                break;
            };
            wait = Duration::ZERO;
            // A broker out of reach is the client's to reconnect to (as the log's reader
            // does): the partition goes on leading, and its records, not its inbox, say
            // whether the log takes writes.
            let message = match message {
                Ok(message) => message,
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "reading the inbox");
                    break;
                }
            };
            if message.offset() != expected {
                let gap = CodedError::new(
                    Code::CLU0004,
                    format!(
                        "partition {p}: its inbox goes on at offset {} but the next event to deliver is at offset {expected}: posted events were deleted before they were delivered (topic retention?)",
                        message.offset()
                    ),
                );
                let why = gap.message.clone();
                let stop_leading = super::lock(&shared.partitions[p as usize]).give_up(gap.clone());
                super::reader::gave_up(shared, p, &gap, stop_leading);
                return Err(why);
            }
            expected = message.offset() + 1;
            next = Some(expected);
            let event = match posted::decode(
                message.payload().unwrap_or_default(),
                settings.max_record,
            ) {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!(partition = p, offset = message.offset(), error = %e, "skipped an inbox record");
                    continue;
                }
            };
            if !handle.block_on(runtime.deliver(p as usize, event)) {
                return Err("the partition stopped".into());
            }
        }
        let Some(next) = next else { continue };
        // Everything handed over is stored once the barrier is answered.
        let (reply, stored) = oneshot::channel();
        if !handle.block_on(runtime.deliver(p as usize, Event::Barrier { reply }))
            || stored.blocking_recv().is_err()
        {
            // The partition stopped (stepped down): the next leader reads them again.
            return Ok(());
        }
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(&settings.inbox_topic, p as i32, Offset::Offset(next))
            .map_err(|e| e.to_string())?;
        // A commit the brokers did not take is made good by the next one; a failover before
        // it delivers the events again, which is harmless.
        if let Err(e) = consumer.commit(&offsets, CommitMode::Sync) {
            tracing::warn!(partition = p, error = %e, "cannot commit the inbox offset; the next commit covers it");
        } else if truncated.elapsed() >= TRUNCATE_EVERY {
            truncated = std::time::Instant::now();
            // The partition stored every event before `next` (the barrier answered) and the
            // committed offset, where a next leader starts, is past them. What is not deleted
            // now goes the next time.
            let deleted = super::delete_before(shared, &settings.inbox_topic, p, next);
            if let Err(e) = handle.block_on(deleted) {
                tracing::warn!(partition = p, error = %e, "cannot delete delivered inbox records");
            }
        }
    }
    Ok(())
}
