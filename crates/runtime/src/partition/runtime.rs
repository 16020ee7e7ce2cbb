//! The partitions of this process and how invocations are routed to them.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::model::events::Event;
use super::task::Partition;
use crate::config::Config;
use crate::deployment_tls::DeploymentTls;
use crate::errors::{Code, CodedError};
use crate::flow::slots::InvokerSlots;
use crate::ids::InvocationId;
use crate::invocation::identity::partition_key;
use crate::invocation::{InvocationRecord, Outcome};
use crate::invoker::AttemptClient;
use crate::limits::Rules;
use crate::protocol::Frame;
use crate::registry::Registry;
use crate::storage::Store;
use crate::storage::view::Checkpoints;
use crate::storage::writer::Writer;

/// Events a partition's channel holds before senders wait (back-pressure on the ingress).
const CHANNEL: usize = 16 * 1024;

/// Sends work to partitions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Runtime {
    senders: Arc<Vec<mpsc::Sender<Event>>>,
    /// Each partition's reads, on a channel of their own (`super::queries`).
    queries: Arc<Vec<mpsc::Sender<super::queries::Query>>>,
    placement: Arc<super::placement::Placement>,
    /// Cluster mode: where partitions post to each other (their inboxes).
    outbox: Arc<std::sync::OnceLock<Arc<dyn super::posted::Outbox>>>,
    /// The store's health once the partitions run: a partition stopped by a failed store is
    /// reported as that failure, not as a routing error.
    health: Arc<std::sync::OnceLock<Arc<sluice_store::health::Health>>>,
    /// The tokio runtime the partitions run on, once they do (off the shards).
    home: Arc<std::sync::OnceLock<tokio::runtime::Handle>>,
    /// The shards the partitions run on, when they do (partition `p` on shard `p % shards`).
    shards: Arc<std::sync::OnceLock<Arc<crate::shards::Shards>>>,
}

/// The receiving ends, handed to [`PartitionsService`] (or tests) to run.
pub struct Receivers(Vec<(mpsc::Receiver<Event>, mpsc::Receiver<super::queries::Query>)>);

impl Runtime {
    /// A runtime of `n` partitions, not yet running.
    pub fn new(n: usize) -> (Self, Receivers) {
        Self::placed(super::placement::Placement::embedded(n.max(1)))
    }

    /// A runtime of as many partitions as `placement` has, each run where it says.
    pub fn placed(placement: super::placement::Placement) -> (Self, Receivers) {
        let n = placement.len().max(1);
        let (senders, events): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel(CHANNEL)).unzip();
        let (queries, asked): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel(CHANNEL)).unzip();
        let receivers = events.into_iter().zip(asked).collect();
        (
            Self {
                senders: Arc::new(senders),
                queries: Arc::new(queries),
                placement: Arc::new(placement),
                outbox: Arc::default(),
                health: Arc::default(),
                home: Arc::default(),
                shards: Arc::default(),
            },
            Receivers(receivers),
        )
    }

    /// Runs the partitions on `shards` once they start ([`Self::spawn_with_rules`]), each on
    /// shard `index % shards`, and places new invocations that may live on any on the calling
    /// shard's partitions.
    pub fn run_on(&self, shards: Arc<crate::shards::Shards>) {
        self.placement.run_on_shards(shards.len());
        let _ = self.shards.set(shards);
    }

    /// The runtime partition `index` runs on: its shard's, else the one the partitions were
    /// started on, else (before they run) the current one.
    fn home_of(&self, index: usize) -> tokio::runtime::Handle {
        match (self.shards.get(), self.home.get()) {
            (Some(shards), _) => shards.of_partition(index).clone(),
            (None, Some(home)) => home.clone(),
            (None, None) => tokio::runtime::Handle::current(),
        }
    }

    /// Spawns `task` on the runtime partition `index` runs on. Cluster mode runs a leader's log
    /// writer there, beside its partition: each group the partition hands it, and each answer
    /// back, then wakes no thread of another runtime.
    pub fn spawn_beside<F>(&self, index: usize, task: F) -> tokio::task::JoinHandle<()>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.home_of(index).spawn(task)
    }

    /// Where each partition runs.
    pub fn placement(&self) -> &Arc<super::placement::Placement> {
        &self.placement
    }

    /// Cluster mode: partitions post to each other through `outbox` from now on.
    pub fn set_outbox(&self, outbox: Arc<dyn super::posted::Outbox>) {
        let _ = self.outbox.set(outbox);
    }

    /// Hands `event` to partition `index` here (the inbox delivering what was posted to it);
    /// false when that partition is not running.
    pub async fn deliver(&self, index: usize, event: Event) -> bool {
        match self.senders.get(index) {
            Some(sender) => sender.send(event).await.is_ok(),
            None => false,
        }
    }

    /// Where the partition of `id` runs.
    pub fn route(&self, id: InvocationId) -> super::placement::Route {
        self.placement.route(self.index_of(id.partition_key()))
    }

    /// Where a new invocation that may live on any partition goes: cluster mode, one this node
    /// leads, so it needs no forwarding (`None`: anywhere, by its id).
    pub fn place_new(&self) -> Option<crate::invocation::new::Place> {
        let index = self.placement.pick_here()?;
        Some(crate::invocation::new::Place {
            index: u32::try_from(index).ok()?,
            partitions: u32::try_from(self.senders.len()).ok()?,
        })
    }

    /// How many partitions there are.
    pub fn partition_count(&self) -> usize {
        self.senders.len()
    }

    /// The index of the partition partition key `key` belongs to.
    fn index_of(&self, key: u64) -> usize {
        (key % self.senders.len() as u64) as usize
    }

    fn partition(&self, id: InvocationId) -> &mpsc::Sender<Event> {
        self.partition_of(id.partition_key())
    }

    fn partition_of(&self, key: u64) -> &mpsc::Sender<Event> {
        &self.senders[self.index_of(key)]
    }

    /// Replaces the whole state of object `key` of `service`, once durable.
    pub async fn set_object_state(
        &self,
        service: &str,
        key: &str,
        state: Vec<(Bytes, Bytes)>,
    ) -> Result<(), CodedError> {
        let (reply, answer) = oneshot::channel();
        self.partition_of(partition_key(&[service, key]))
            .send(Event::SetObjectState {
                service: service.to_owned(),
                key: key.to_owned(),
                state,
                reply,
            })
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())?.map(|_| ())
    }

    /// A partition that no longer takes events: stopped by a failed store (its failure, 503
    /// with the store's code), stepped down in cluster mode, or shutting down.
    fn gone(&self) -> CodedError {
        if let Some(failure) = self.health.get().and_then(|health| health.failure()) {
            return failure.clone();
        }
        if self.outbox.get().is_some() {
            return CodedError::new(
                Code::CLU0001,
                "the partition's leader on this node stepped down while the call was in flight (the log did not take its records, or another node took it over); it is being taken over again",
            );
        }
        CodedError::new(
            Code::RT0006,
            "the partition is not running (shutting down?)",
        )
    }

    /// Stores a new invocation; returns once it is durable: true when created, false when an
    /// invocation with its id exists already (an idempotent repeat).
    pub async fn submit(&self, record: InvocationRecord, input: Frame) -> Result<bool, CodedError> {
        let answer = self.hand_over(record, input).await?;
        answer.await.map_err(|_| self.gone())?
    }

    /// Stores a new invocation that starts with `journal` (a restart from a journal prefix);
    /// returns once it is durable.
    pub async fn restart(
        &self,
        record: InvocationRecord,
        journal: Vec<Frame>,
    ) -> Result<bool, CodedError> {
        let (reply, answer) = oneshot::channel();
        let id = record.id;
        self.partition(id)
            .send(Event::Restart {
                record: Box::new(record),
                journal,
                reply,
            })
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())?
    }

    /// Hands a new invocation to its partition and answers at once with the receiver of
    /// [`Runtime::submit`]'s answer: invocations handed over in order are stored in order,
    /// while the caller goes on (a Kafka consumer keeps many records in flight this way).
    /// In cluster mode, an invocation for a partition another node leads goes to that
    /// partition's inbox, and the answer (always "created") comes once the inbox has it.
    pub async fn hand_over(
        &self,
        record: InvocationRecord,
        input: Frame,
    ) -> Result<oneshot::Receiver<Result<bool, CodedError>>, CodedError> {
        let index = self.index_of(record.id.partition_key());
        if let Some(outbox) = self.outbox.get()
            && !self.placement.is_here(index)
        {
            let event = Event::Submit {
                record: Box::new(record),
                input,
                reply: None,
                call: None,
            };
            let bytes = super::posted::encode(&event).ok_or_else(|| self.gone())?;
            let (reply, answer) = oneshot::channel();
            outbox.post_then(index as u32, bytes, reply);
            return Ok(answer);
        }
        self.hand_over_call(record, input, None).await
    }

    /// [`Runtime::hand_over`], with the caller waiting for the outcome on `call`.
    async fn hand_over_call(
        &self,
        record: InvocationRecord,
        input: Frame,
        call: Option<oneshot::Sender<Outcome>>,
    ) -> Result<oneshot::Receiver<Result<bool, CodedError>>, CodedError> {
        let (reply, answer) = oneshot::channel();
        let id = record.id;
        self.partition(id)
            .send(Event::Submit {
                record: Box::new(record),
                input,
                reply: Some(reply),
                call,
            })
            .await
            .map_err(|_| self.gone())?;
        Ok(answer)
    }

    /// Starts a call: a new invocation whose caller waits for its outcome. Answers once the
    /// partition took it (true: created; false: it exists already, an idempotent repeat or a
    /// workflow run), with the receiver of its outcome. A call with a fresh id is stored with
    /// its first write that anything depends on, at the latest with its outcome, which is
    /// answered only once durable.
    pub async fn call(
        &self,
        record: InvocationRecord,
        input: Frame,
    ) -> Result<(bool, oneshot::Receiver<Outcome>), CodedError> {
        let (call, outcome) = oneshot::channel();
        let answer = self.hand_over_call(record, input, Some(call)).await?;
        let created = answer.await.map_err(|_| self.gone())??;
        Ok((created, outcome))
    }

    /// Hands `event` to the partition of `id` without waiting (partitions use this to reach
    /// each other: waiting there could deadlock two partitions on each other's channels).
    pub(super) fn post(&self, id: InvocationId, event: Event) {
        // Cluster mode: even a partition led here may move before it stores the event, so
        // everything goes through the inbox, which keeps it until it is stored.
        if let Some(outbox) = self.outbox.get()
            && let Some(bytes) = super::posted::encode(&event)
        {
            outbox.post(self.index_of(id.partition_key()) as u32, bytes);
            return;
        }
        let sender = self.partition(id).clone();
        tokio::spawn(async move {
            let _ = sender.send(event).await;
        });
    }

    /// Tells every partition to look at its queues again (the deployments changed, so a
    /// gate they wait at may have room). Never waits.
    pub fn nudge_all(&self) {
        self.nudge(u64::MAX, u32::MAX);
    }

    /// Tells the partitions `waiting` names (bits from [`InvokerSlots::give_back`]), except
    /// `from`, that invoker slots are free. Never waits: a partition with a full channel polls
    /// after its next batch anyway.
    pub(super) fn nudge(&self, waiting: u64, from: u32) {
        for (index, sender) in self.senders.iter().enumerate() {
            let index = index as u32;
            if index != from && InvokerSlots::names(waiting, index) {
                let _ = sender.try_send(Event::SlotsFree);
            }
        }
    }

    /// Delivers a signal once durable; false when its invocation does not exist.
    pub async fn signal(
        &self,
        signal: super::model::signals::Signal,
    ) -> Result<super::model::signals::Delivery, CodedError> {
        let (reply, answer) = oneshot::channel();
        self.partition(signal.target)
            .send(Event::Signal {
                signal,
                reply: Some(reply),
            })
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())
    }

    /// Asks every partition with the event `ask` makes, in partition order; answers each
    /// item of each answer with its partition's index.
    async fn gather<T>(
        &self,
        ask: impl Fn(oneshot::Sender<Vec<T>>) -> super::queries::Query,
    ) -> Result<Vec<(u64, T)>, CodedError> {
        let mut all = Vec::new();
        for (index, sender) in self.queries.iter().enumerate() {
            // Cluster mode: another node answers for the partitions it leads.
            if !self.placement.is_here(index) {
                continue;
            }
            let (reply, answer) = oneshot::channel();
            sender.send(ask(reply)).await.map_err(|_| self.gone())?;
            let items = match answer.await {
                Ok(items) => items,
                // It moved to another node as it was asked.
                Err(_) if self.placement.is_clustered() => continue,
                Err(_) => return Err(self.gone()),
            };
            all.extend(items.into_iter().map(|item| (index as u64, item)));
        }
        Ok(all)
    }

    /// Every partition's queued invocations, with the partition's index.
    pub async fn queued(
        &self,
    ) -> Result<Vec<(u64, super::model::events::QueuedEntry)>, CodedError> {
        self.gather(|reply| super::queries::Query::Queued { reply })
            .await
    }

    /// Every partition's held object locks, with the partition's index.
    pub async fn locks(&self) -> Result<Vec<(u64, super::model::events::HeldLock)>, CodedError> {
        self.gather(|reply| super::queries::Query::Locks { reply })
            .await
    }

    /// Every partition's scheduler queues, with the partition's index.
    pub async fn queues(
        &self,
    ) -> Result<Vec<(u64, crate::flow::scheduler::QueueSnapshot)>, CodedError> {
        self.gather(|reply| super::queries::Query::Queues { reply })
            .await
    }

    /// Pauses (or resumes) queue `queue` of partition `partition`, durably; `false` when no
    /// such queue lives.
    pub async fn pause_queue(
        &self,
        partition: u64,
        queue: u32,
        pause: bool,
    ) -> Result<bool, CodedError> {
        let Some(sender) = usize::try_from(partition)
            .ok()
            .and_then(|p| self.senders.get(p))
        else {
            return Ok(false);
        };
        let (reply, answer) = oneshot::channel();
        sender
            .send(Event::PauseQueue {
                queue,
                pause,
                reply,
            })
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())
    }

    /// Resets the quotas (or budgets) `pattern` matches on every partition led here (see
    /// [`crate::flow::scheduler::Scheduler::reset_uses`]); answers how many counters each of
    /// those partitions reset, once it stored it.
    pub async fn reset_uses(
        &self,
        measure: crate::flow::Measure,
        pattern: &crate::flow::RulePattern,
    ) -> Result<std::collections::BTreeMap<u32, u64>, CodedError> {
        let mut answers = Vec::with_capacity(self.senders.len());
        for (index, sender) in self.senders.iter().enumerate() {
            // Cluster mode: the node leading a partition resets its counters.
            if !self.placement.is_here(index) {
                continue;
            }
            let (reply, answer) = oneshot::channel();
            sender
                .send(Event::ResetQuota {
                    measure,
                    pattern: Box::new(pattern.clone()),
                    reply,
                })
                .await
                .map_err(|_| self.gone())?;
            answers.push((index, answer));
        }
        let mut reset = std::collections::BTreeMap::new();
        for (index, answer) in answers {
            let partition = u32::try_from(index).unwrap_or(u32::MAX);
            reset.insert(partition, answer.await.map_err(|_| self.gone())?);
        }
        Ok(reset)
    }

    /// Every partition's flow-control counters (a scope's counters live on its partition).
    pub async fn counters(&self) -> Result<Vec<crate::flow::limiter::CounterSnapshot>, CodedError> {
        let all = self
            .gather(|reply| super::queries::Query::Counters { reply })
            .await?;
        Ok(all.into_iter().map(|(_, counter)| counter).collect())
    }

    /// What `GET /metrics` reads of every partition.
    pub async fn metrics(&self) -> Result<Vec<super::model::events::PartitionMetrics>, CodedError> {
        let all = self
            .gather(|reply| super::queries::Query::Metrics { reply })
            .await?;
        Ok(all.into_iter().map(|(_, m)| m).collect())
    }

    /// Why a queued invocation waits; `None` when it is not queued.
    pub async fn explain(
        &self,
        id: InvocationId,
    ) -> Result<Option<super::admission::Waiting>, CodedError> {
        let (reply, answer) = oneshot::channel();
        self.queries[self.index_of(id.partition_key())]
            .send(super::queries::Query::Explain { id, reply })
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())
    }

    /// Applies an operator's control request to an invocation.
    pub async fn control(
        &self,
        id: InvocationId,
        op: super::model::control::Control,
    ) -> Result<super::model::control::Controlled, CodedError> {
        let (reply, answer) = oneshot::channel();
        self.partition(id)
            .send(Event::Control { id, op, reply })
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())?
    }

    /// An invocation's target and outcome (`None` while it runs), without waiting; `None`
    /// when it does not exist.
    pub async fn peek(
        &self,
        id: InvocationId,
    ) -> Result<Option<super::model::answer::Peek>, CodedError> {
        self.peek_with(id, true).await
    }

    /// Like [`Runtime::peek`], but a completed value comes without its bytes (empty): what a
    /// status needs, neither read from the store nor copied however large the output.
    pub async fn peek_status(
        &self,
        id: InvocationId,
    ) -> Result<Option<super::model::answer::Peek>, CodedError> {
        self.peek_with(id, false).await
    }

    async fn peek_with(
        &self,
        id: InvocationId,
        output: bool,
    ) -> Result<Option<super::model::answer::Peek>, CodedError> {
        let (reply, answer) = oneshot::channel();
        self.partition(id)
            .send(Event::Peek { id, output, reply })
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())
    }

    /// Waits for the outcome of an invocation.
    pub async fn outcome(&self, id: InvocationId) -> Result<Outcome, CodedError> {
        let (reply, answer) = oneshot::channel();
        self.partition(id)
            .send(Event::Await { id, reply })
            .await
            .map_err(|_| self.gone())?;
        let unknown = || {
            CodedError::uncoded(format!(
                "invocation {id} is unknown or its partition stopped"
            ))
        };
        let outcome = answer.await.map_err(|_| unknown())??;
        outcome.await.map_err(|_| unknown())
    }

    /// Recovers and runs every partition on the current tokio runtime, with an empty rule book,
    /// and the purger; its task is the last of the handles.
    pub fn spawn(
        &self,
        receivers: Receivers,
        store: &Arc<Store>,
        registry: &Arc<Registry>,
        config: &Arc<Config>,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>, CodedError> {
        let tls = DeploymentTls::load(config.deployment_ca_file.as_deref())?;
        let how = How {
            rules: None,
            tls: &tls,
            leads: None,
        };
        self.spawn_with_rules(receivers, store, registry, config, how)
    }

    /// [`Runtime::spawn`], following the rule book `how.rules` and reaching `https://` deployments
    /// with what `how.tls` trusts. With `how.leads` (cluster mode), partition `i` runs only while
    /// `leads[i]` holds the writer of its log (`docs/cluster.md`), and is recovered from the
    /// store each time it is taken over; events for it meanwhile are dropped (their senders see
    /// the partition gone).
    pub fn spawn_with_rules(
        &self,
        receivers: Receivers,
        store: &Arc<Store>,
        registry: &Arc<Registry>,
        config: &Arc<Config>,
        how: How<'_>,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>, CodedError> {
        let How { rules, tls, leads } = how;
        let _ = self.health.set(Arc::clone(store.health()));
        let _ = self.home.set(tokio::runtime::Handle::current());
        let n = self.senders.len() as u64;
        // One client per shard: a deployment connection's task runs on the shard that opened
        // it, and only that shard's attempts use it.
        let shards = self.shards.get().map_or(1, |shards| shards.len());
        let idle = config.worker.invoker.connection_idle_timeout.0;
        let clients: Vec<AttemptClient> =
            (0..shards).map(|_| AttemptClient::new(tls, idle)).collect();
        // Embedded, the local log is the truth and the store a view behind it; in cluster
        // mode each partition's Kafka log is, and this writer only applies what landed there.
        let writer = match leads {
            None => Writer::start_logged(Arc::clone(store), checkpoints(config)),
            Some(_) => Writer::start_view(Arc::clone(store), checkpoints(config)),
        };
        let shared = super::task::Shared::new(
            Arc::clone(store),
            writer.clone(),
            Arc::clone(registry),
            Arc::clone(config),
        );
        // Each shard's partitions share one gathering writer: what they queue in one turn of
        // the shard's loop reaches the writer's thread as one set (`gather.rs` in the store).
        let gathered: Vec<Writer> = (0..shards).map(|_| writer.gathering()).collect();
        let worker = &config.worker;
        let purging = Purging {
            store: Arc::clone(store),
            interval: worker.purge_interval.0,
            batch: usize::try_from(worker.purge_batch_size.get()).unwrap_or(usize::MAX),
            in_flight: usize::try_from(worker.cleanup_max_in_flight.get()).unwrap_or(usize::MAX),
        };
        let mut handles = Vec::new();
        let mut recovering = Vec::new();
        let mut leads = leads.map(Vec::into_iter);
        for (index, (rx, queries)) in receivers.0.into_iter().enumerate() {
            let driver = {
                let (runtime, client) = (self.clone(), clients[index % shards].clone());
                move || -> Box<dyn super::driver::Driver> {
                    Box::new(super::driver::TokioDriver::new(
                        runtime.clone(),
                        client.clone(),
                    ))
                }
            };
            let owns = move |id: InvocationId| (id.partition_key() % n) as usize == index;
            if let Some(lead) = leads.as_mut().and_then(Iterator::next) {
                let hosted = Hosted {
                    index: index as u32,
                    own: self.senders[index].clone(),
                    shared: shared.clone(),
                    rules: rules.cloned(),
                    purging: purging.clone(),
                };
                handles.push(self.home_of(index).spawn(hosted.run(
                    (rx, queries),
                    lead,
                    driver,
                    owns,
                )));
                continue;
            }
            let mut partition = Partition::new(
                index as u32,
                &shared.with_writer(gathered[index % shards].clone()),
                driver(),
            );
            if let Some(rules) = rules {
                partition.follow_rules(rules.subscribe());
            }
            recovering.push((index, partition, (rx, queries)));
        }
        let homes: Vec<tokio::runtime::Handle> = self
            .shards
            .get()
            .map(|shards| shards.handles().to_vec())
            .unwrap_or_default();
        for (partition, (rx, queries)) in
            super::recovery::recover_all(store, self.senders.len(), recovering, &homes)?
        {
            let index = partition.index as usize;
            handles.push(self.home_of(index).spawn(async move {
                let (mut rx, mut queries) = (rx, queries);
                partition.run(&mut rx, &mut queries).await;
            }));
        }
        if leads.is_none() {
            handles.push(tokio::spawn(purging.run(writer, |_| true)));
        }
        Ok(handles)
    }
}

/// When the view behind the log is applied and made durable, as `config` says.
pub fn checkpoints(config: &Config) -> Checkpoints {
    Checkpoints {
        interval: config.worker.log_checkpoint_interval.0,
        bytes: config.worker.log_segment_size.0.saturating_mul(8),
        apply_delay: config.worker.log_apply_delay.0,
    }
}

/// How [`Runtime::spawn_with_rules`] runs the partitions.
pub struct How<'a> {
    /// The rule book to follow (none: an empty one).
    pub rules: Option<&'a Arc<Rules>>,
    /// What `https://` deployments are trusted with.
    pub tls: &'a DeploymentTls,
    /// Cluster mode: which partitions this node leads.
    pub leads: Option<Vec<Lead>>,
}

/// Cluster mode: the writer of a partition's log while this node leads it, `None` otherwise.
pub type Lead = tokio::sync::watch::Receiver<Option<Writer>>;

/// What the purger needs.
#[derive(Clone)]
struct Purging {
    store: Arc<Store>,
    interval: std::time::Duration,
    batch: usize,
    in_flight: usize,
}

impl Purging {
    fn run(
        self,
        writer: Writer,
        owns: impl Fn(InvocationId) -> bool + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let pace = super::purge::Pace {
            interval: self.interval,
            batch: self.batch,
            in_flight: self.in_flight,
        };
        super::purge::run(self.store, writer, pace, owns)
    }
}

/// A partition of cluster mode: runs while led, recovered from the store at each takeover.
struct Hosted {
    index: u32,
    /// Its own channel: an event that arrives as it is taken over goes back in.
    own: mpsc::Sender<Event>,
    shared: super::task::Shared,
    rules: Option<Arc<Rules>>,
    purging: Purging,
}

impl Hosted {
    async fn run(
        self,
        (mut rx, mut queries): (mpsc::Receiver<Event>, mpsc::Receiver<super::queries::Query>),
        mut lead: Lead,
        driver: impl Fn() -> Box<dyn super::driver::Driver>,
        owns: impl Fn(InvocationId) -> bool + Clone + Send + Sync + 'static,
    ) {
        loop {
            let writer = loop {
                if let Some(writer) = lead.borrow_and_update().clone() {
                    break writer;
                }
                tokio::select! {
                    biased;
                    changed = lead.changed() => if changed.is_err() { return },
                    // Not led here: a read is answered by the leader (its sender sees the
                    // reply dropped and asks no further).
                    query = queries.recv() => if query.is_none() { return },
                    event = rx.recv() => match event {
                        None => return,
                        // Led from this very moment: it is the partition's.
                        Some(event) if lead.borrow().is_some() => {
                            let _ = self.own.try_send(event);
                        }
                        // Not led here: nobody answers it (the doors forward to the leader).
                        Some(_) => {}
                    },
                }
            };
            let mut partition = Partition::new(
                self.index,
                &self.shared.with_writer(writer.clone()),
                driver(),
            );
            if let Some(rules) = &self.rules {
                partition.follow_rules(rules.subscribe());
            }
            if let Err(e) = partition.recover(owns.clone()) {
                tracing::error!(partition = self.index, error.code = ?e.code, error = %e, "a partition taken over failed to recover");
                self.shared.store.health().fail(e);
                return;
            }
            tracing::info!(partition = self.index, "leading the partition");
            let purger = tokio::spawn(self.purging.clone().run(writer, owns.clone()));
            let stopped = tokio::select! {
                () = partition.run(&mut rx, &mut queries) => true,
                _ = lead.wait_for(Option::is_none) => false,
            };
            purger.abort();
            if stopped {
                if self.shared.store.health().failure().is_some() {
                    return;
                }
                // A write failed without failing the store: the log refused it (another node
                // took the partition over, CLU0001). That is a step-down, not a failure; the
                // log's writer says so once it has stopped.
                if lead.wait_for(Option::is_none).await.is_err() {
                    return;
                }
            }
            tracing::info!(partition = self.index, "stepped down from the partition");
        }
    }
}

/// Resolves when the first of `handles` ends, with its index and result.
pub(crate) async fn first_to_end(
    handles: Vec<tokio::task::JoinHandle<()>>,
) -> (usize, Result<(), tokio::task::JoinError>) {
    if handles.is_empty() {
        return std::future::pending().await;
    }
    let (ended, index, _) = futures_util::future::select_all(handles).await;
    (index, ended)
}

/// A partition task (or the purger) that ended while the process serves: its invocations would
/// sit behind a healthy `/health` forever, so the process stops and restarts from the store.
pub(crate) fn stopped_task(task: &str, ended: Result<(), tokio::task::JoinError>) -> CodedError {
    let why = match ended {
        Ok(()) => "it stopped after a failed write".to_owned(),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            format!("it panicked: {message}")
        }
        Err(e) => format!("it was cancelled: {e}"),
    };
    CodedError::new(
        Code::STO0001,
        format!("{task} stopped ({why}); sluice restarts from the store"),
    )
}

impl super::driver::Mailboxes for Runtime {
    fn post(&self, id: InvocationId, event: Event) {
        Runtime::post(self, id, event);
    }

    fn nudge(&self, waiting: u64, from: u32) {
        Runtime::nudge(self, waiting, from);
    }
}
