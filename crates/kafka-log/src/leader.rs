//! Leading partitions: the takeover (an epoch record, then the log read up to it) and, while a
//! partition is led here, its log writer: every group of the partition's write sets becomes
//! one record, stored only once Kafka put it right after the leader's previous record.

use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureRecord};
use tokio::sync::watch;

use super::{Shared, lock};
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_runtime::replication::leader::Leading;
use sluice_runtime::replication::replica::Wish;
use sluice_store::storage::changes::Changes;
use sluice_store::storage::log::{PartitionLog, confirm};
use sluice_store::storage::pipeline::{Pipeline, lost};
use sluice_store::storage::record::{Leader, Record};
use sluice_store::storage::writer::{Staged, Writer};

/// How often the wanted partitions are checked again (a takeover that lost a race retries).
const RECHECK: Duration = Duration::from_secs(1);

/// Keeps this node leading the partitions the group gives it, and only those.
pub(super) async fn reconcile(shared: Arc<Shared>, mut desired: watch::Receiver<BTreeSet<u32>>) {
    // Partitions given here that this node refused to lead (said once per refusal).
    let mut refused = BTreeSet::new();
    loop {
        let wanted = desired.borrow_and_update().clone();
        for p in 0..shared.settings.partitions {
            let wish = lock(&shared.partitions[p as usize]).wish(wanted.contains(&p));
            match wish {
                Wish::Nothing => {}
                Wish::Refuse => {
                    if refused.insert(p)
                        && let Some(why) = lock(&shared.partitions[p as usize]).broken()
                    {
                        tracing::error!(partition = p, error.code = ?why.code, error = %why, "the group gives this node the partition, but it will not lead it: its replica is broken");
                    }
                }
                Wish::TakeOver => {
                    tokio::spawn(take_over(Arc::clone(&shared), p, desired.clone()));
                }
                // Given to another node: stop writing before it takes over.
                Wish::StepDown => drop(shared.leads[p as usize].send(None)),
            }
        }
        tokio::select! {
            changed = desired.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(RECHECK) => {}
        }
    }
}

/// Appends `record` to partition `p` of the log and waits for it to land; its offset. The same
/// way in as the leader's records ([`KafkaLog`]).
async fn produce(shared: &Arc<Shared>, p: u32, record: &[u8]) -> Result<i64, CodedError> {
    let mut log = KafkaLog::new(Arc::clone(shared), p);
    log.append(record).await?;
    let at = confirm(&mut log).await?;
    i64::try_from(at).map_err(|_| lost(p, "the log answered an offset past i64"))
}

/// Takes partition `p` over while the group wants it here.
async fn take_over(shared: Arc<Shared>, p: u32, desired: watch::Receiver<BTreeSet<u32>>) {
    let slot = &shared.partitions[p as usize];
    while desired.borrow().contains(&p) && lock(slot).broken().is_none() {
        let epoch = lock(slot).next_epoch();
        let leader = Leader {
            epoch,
            // The random low bits of a fresh ULID.
            incarnation: InvocationId::new_uuid() as u64,
            node: shared.settings.node.clone(),
            ingress: shared.settings.ingress.clone(),
            admin: shared.settings.admin.clone(),
        };
        let at = match produce(&shared, p, &Record::Epoch(leader.clone()).encode()).await {
            Ok(at) => at,
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "cannot append an epoch record; trying again");
                tokio::time::sleep(RECHECK).await;
                continue;
            }
        };
        // The reader stores everything before the epoch record, and the record itself.
        loop {
            let progress = shared.progress.notified();
            if lock(slot).stored_past(at) {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), progress).await;
        }
        let won = {
            let _hand_over = lock(&shared.hand_over);
            lock(slot).win(&leader)
        };
        if won {
            tracing::info!(partition = p, epoch, offset = at, "took the partition over");
            let (writer, staged) = Writer::staged();
            let _ = shared.leads[p as usize].send(Some(writer));
            shared.placement.set_here(p as usize, true);
            tokio::spawn(super::epochs::announce(
                Arc::clone(&shared),
                p,
                leader.clone(),
            ));
            shared.runtime.spawn_beside(
                p as usize,
                lead(Arc::clone(&shared), p, leader, at + 1, staged),
            );
            return;
        }
        tracing::info!(
            partition = p,
            epoch,
            "another node's epoch came first; trying again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lock(slot).takeover_ended();
}

/// Writes partition `p`'s groups to its log, from offset `next`, until it steps down: up to
/// `cluster.records-in-flight` records at once, each group stored once its record landed where
/// it was meant to (`storage::pipeline`).
async fn lead(shared: Arc<Shared>, p: u32, leader: Leader, next: i64, staged: Staged) {
    let mut lead = shared.leads[p as usize].subscribe();
    let inbox = {
        let (shared, lead) = (Arc::clone(&shared), lead.clone());
        tokio::task::spawn_blocking(move || {
            super::inbox::deliver(&shared, p, &shared.runtime, &lead);
        })
    };
    let changes = Arc::new(Changes::new(shared.settings.snapshot_changes_max));
    let pipeline = Pipeline::new(
        p,
        leader,
        next,
        shared.settings.records_in_flight,
        shared.writer.clone(),
    )
    .noting(Arc::clone(&changes));
    let snapshots = tokio::spawn(super::snapshots::keep(
        Arc::clone(&shared),
        p,
        lead.clone(),
        changes,
    ));
    let log = KafkaLog::new(Arc::clone(&shared), p);
    let mut leading = Leading::new(p, pipeline, staged, log, shared.settings.max_record / 2);
    let mut stores = tokio::task::JoinSet::new();
    let stepped_down = async { drop(lead.wait_for(Option::is_none).await) };
    let why = leading.run(stepped_down, &mut stores).await;
    tracing::warn!(partition = p, why, "stopped leading the partition");
    shared
        .placement
        .step_down(p as usize, &shared.settings.ingress);
    let _ = shared.leads[p as usize].send(None);
    for stored in leading.step_down(&lost(p, &why)) {
        stores.spawn(stored);
    }
    while stores.join_next().await.is_some() {}
    let _ = inbox.await;
    // A snapshot cut off before its manifest is passed over by every reader.
    snapshots.abort();
    // The reader takes the partition back from what the store holds.
    lock(&shared.rewinds).push(p);
}

/// Partition `p` of the log topic as a [`PartitionLog`]: a record is confirmed once Kafka's
/// idempotent producer (`acks=all`) stored it, at the offset Kafka answers. The producer keeps
/// the records of one partition in the order they were handed to it.
struct KafkaLog {
    shared: Arc<Shared>,
    partition: u32,
    /// The producer's answers for the records in flight, oldest first, each with when it is
    /// due (`cluster.write-timeout` after it was handed over).
    deliveries: VecDeque<(DeliveryFuture, tokio::time::Instant)>,
    /// Wakes the confirmation at the oldest record's due time: the producer's own timeout
    /// (`message.timeout.ms`) is checked about once a second and may answer late behind a
    /// queue of retries, while a caller was promised an answer by the write timeout.
    due: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl KafkaLog {
    fn new(shared: Arc<Shared>, partition: u32) -> Self {
        Self {
            shared,
            partition,
            deliveries: VecDeque::new(),
            due: None,
        }
    }
}

impl PartitionLog for KafkaLog {
    /// A full local queue is waited out (a bounded while), never skipped.
    async fn append(&mut self, record: &[u8]) -> Result<(), CodedError> {
        let (shared, p) = (&self.shared, self.partition);
        let deadline = tokio::time::Instant::now() + shared.settings.write_timeout;
        loop {
            let to = FutureRecord::<(), [u8]>::to(&shared.settings.log_topic)
                .partition(p as i32)
                .payload(record);
            match shared.producer.send_result(to) {
                Ok(delivery) => {
                    self.deliveries.push_back((delivery, deadline));
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(not_taken(p, e)),
            }
        }
    }

    fn poll_confirm(&mut self, cx: &mut Context<'_>) -> Poll<Result<u64, CodedError>> {
        let p = self.partition;
        let Some((front, due)) = self.deliveries.front_mut() else {
            return Poll::Ready(Err(lost(
                p,
                "a confirmation was asked for with no record in flight",
            )));
        };
        let due = *due;
        if let Poll::Ready(delivered) = Pin::new(front).poll(cx) {
            self.deliveries.pop_front();
            return Poll::Ready(offset_of(p, delivered).and_then(|at| {
                u64::try_from(at).map_err(|_| lost(p, "the log answered a negative offset"))
            }));
        }
        // Not confirmed yet: by its due time, the partition steps down as after a refused
        // write (whether the record landed is settled by the next leader's takeover), and its
        // callers get their 503 within the write timeout.
        let timer = self
            .due
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if timer.deadline() != due {
            timer.as_mut().reset(due);
        }
        std::task::ready!(timer.as_mut().poll(cx));
        Poll::Ready(Err(CodedError::new(
            Code::CLU0001,
            format!(
                "partition {p}: the brokers did not confirm a record within cluster.write-timeout ({:?})",
                self.shared.settings.write_timeout
            ),
        )))
    }

    fn unconfirmed(&self) -> usize {
        self.deliveries.len()
    }

    /// Kafka keeps the topic by its own retention.
    fn release(&mut self, _: u64) -> Result<(), CodedError> {
        Ok(())
    }
}

/// Where a delivered record landed, or why it did not.
fn offset_of(
    p: u32,
    delivered: <DeliveryFuture as std::future::Future>::Output,
) -> Result<i64, CodedError> {
    match delivered {
        Ok(Ok(delivery)) => Ok(delivery.offset),
        Ok(Err((e, _))) => Err(not_taken(p, e)),
        Err(_) => Err(CodedError::new(
            Code::CLU0001,
            format!("partition {p}: the log producer stopped before answering"),
        )),
    }
}

fn not_taken(p: u32, e: KafkaError) -> CodedError {
    CodedError::new(
        Code::CLU0001,
        format!("partition {p}: the log did not take a record: {e}"),
    )
}
