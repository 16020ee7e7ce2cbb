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
use rdkafka::producer::{DeliveryFuture, FutureRecord, Producer};
use tokio::sync::watch;

use super::link::{Landing, Link, Target};
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
    let log = KafkaLog::leading(Arc::clone(&shared), p);
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

/// Partition `p` of the log topic as a [`PartitionLog`]: a record is confirmed once the brokers
/// stored it (`acks=all`), at the offset they answer. It goes out either through this shard's
/// own link to the partition's broker (`link.rs`, `cluster.log-producer = "shard"`) or through
/// librdkafka's idempotent producer; both keep the records of one partition in the order they
/// were handed over.
struct KafkaLog {
    shared: Arc<Shared>,
    partition: u32,
    /// Records go out through this thread's link to the partition's broker.
    shard_links: bool,
    /// The link this log's records go out on: kept while any record on it waits for its
    /// answer (a new link could not keep their order), renewed once none does and it ended.
    link: Option<Arc<Link>>,
    /// The answers for the records in flight, oldest first, each with when it is due
    /// (`cluster.write-timeout` after it was handed over).
    deliveries: VecDeque<(Delivery, tokio::time::Instant)>,
    /// Wakes the confirmation at the oldest record's due time: the producer's own timeout
    /// (`message.timeout.ms`) is checked about once a second and may answer late behind a
    /// queue of retries, while a caller was promised an answer by the write timeout.
    due: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// The answer a record in flight waits for.
enum Delivery {
    Librdkafka(DeliveryFuture),
    Link(tokio::sync::oneshot::Receiver<Landing>),
}

impl KafkaLog {
    /// Through librdkafka's producer (a takeover's epoch record).
    fn new(shared: Arc<Shared>, partition: u32) -> Self {
        Self {
            shared,
            partition,
            shard_links: false,
            link: None,
            deliveries: VecDeque::new(),
            due: None,
        }
    }

    /// A leader's log: through the shard's own link when the settings allow it.
    fn leading(shared: Arc<Shared>, partition: u32) -> Self {
        let shard_links = shared.settings.shard_links;
        Self {
            shard_links,
            ..Self::new(shared, partition)
        }
    }

    /// The link to send the next record on (see [`KafkaLog::link`]).
    async fn link(&mut self) -> Result<Arc<Link>, CodedError> {
        if let Some(link) = &self.link
            && (!link.is_dead() || !self.deliveries.is_empty())
        {
            return Ok(Arc::clone(link));
        }
        let settings = &self.shared.settings;
        let target = Target {
            addr: broker_of(&self.shared, self.partition).await?,
            topic: settings.log_topic.clone(),
            timeout: settings.write_timeout,
            idle: super::link::IDLE,
        };
        let link = Link::to(&target);
        self.link = Some(Arc::clone(&link));
        Ok(link)
    }
}

impl PartitionLog for KafkaLog {
    /// A full local queue is waited out (a bounded while), never skipped.
    async fn append(&mut self, record: &[u8]) -> Result<(), CodedError> {
        let deadline = tokio::time::Instant::now() + self.shared.settings.write_timeout;
        if self.shard_links {
            let link = self.link().await?;
            let answer = link.send(self.partition as i32, record);
            self.deliveries
                .push_back((Delivery::Link(answer), deadline));
            return Ok(());
        }
        let (shared, p) = (&self.shared, self.partition);
        loop {
            let to = FutureRecord::<(), [u8]>::to(&shared.settings.log_topic)
                .partition(p as i32)
                .payload(record);
            match shared.producer.send_result(to) {
                Ok(delivery) => {
                    self.deliveries
                        .push_back((Delivery::Librdkafka(delivery), deadline));
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
        let answered = match front {
            Delivery::Librdkafka(delivery) => {
                Pin::new(delivery).poll(cx).map(|done| offset_of(p, done))
            }
            Delivery::Link(answer) => Pin::new(answer).poll(cx).map(|done| {
                done.unwrap_or_else(|_| Err(lost(p, "the broker link stopped before answering")))
            }),
        };
        if let Poll::Ready(landed) = answered {
            self.deliveries.pop_front();
            if landed.is_err() {
                // Where the partition's broker is may have changed: asked again next time.
                *lock(&self.shared.routes) = None;
            }
            return Poll::Ready(landed.and_then(|at| {
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

/// The broker (`host:port`) that leads partition `p` of the log, as the brokers last said.
async fn broker_of(shared: &Arc<Shared>, p: u32) -> Result<String, CodedError> {
    let cached = lock(&shared.routes).clone();
    let routes = match cached {
        Some(routes) => routes,
        None => {
            let asking = Arc::clone(shared);
            let routes = tokio::task::spawn_blocking(move || routes_of(&asking))
                .await
                .map_err(|_| lost(p, "asking the brokers where the log is stopped"))??;
            let routes = Arc::new(routes);
            *lock(&shared.routes) = Some(Arc::clone(&routes));
            routes
        }
    };
    routes
        .get(p as usize)
        .cloned()
        .flatten()
        .ok_or_else(|| lost(p, "no broker leads its log partition now"))
}

/// Which broker leads each partition of the log (`None`: none now), from the brokers' metadata.
fn routes_of(shared: &Shared) -> Result<Vec<Option<String>>, CodedError> {
    let settings = &shared.settings;
    let timeout = settings.write_timeout.min(super::METADATA_TIMEOUT);
    let metadata = shared
        .producer
        .client()
        .fetch_metadata(Some(&settings.log_topic), timeout)
        .map_err(|e| {
            CodedError::new(
                Code::CLU0001,
                format!("cannot ask the brokers which of them leads the log's partitions: {e}"),
            )
        })?;
    let brokers: std::collections::HashMap<i32, String> = metadata
        .brokers()
        .iter()
        .map(|b| {
            let host = b.host();
            let addr = if host.contains(':') {
                format!("[{host}]:{}", b.port())
            } else {
                format!("{host}:{}", b.port())
            };
            (b.id(), addr)
        })
        .collect();
    let mut routes = vec![None; settings.partitions as usize];
    if let Some(topic) = metadata
        .topics()
        .iter()
        .find(|t| t.name() == settings.log_topic)
    {
        for part in topic.partitions() {
            if let Some(route) = usize::try_from(part.id())
                .ok()
                .and_then(|i| routes.get_mut(i))
                && part.error().is_none()
            {
                *route = brokers.get(&part.leader()).cloned();
            }
        }
    }
    Ok(routes)
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
