//! The handle on this process's partitions: how invocations and requests are routed to them,
//! each a message on the partition's channel answered on a oneshot ([`Runtime::ask`]).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::model::events::Event;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_flow::slots::InvokerSlots;
use sluice_protocol::Frame;
use sluice_store::invocation::identity::partition_key;
use sluice_store::invocation::{InvocationRecord, Outcome};

/// Events a partition's channel holds before senders wait (back-pressure on the ingress).
const CHANNEL: usize = 16 * 1024;

/// Sends work to partitions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Runtime {
    pub(super) senders: Arc<Vec<mpsc::Sender<Event>>>,
    /// Each partition's reads, on a channel of their own (`super::queries`).
    queries: Arc<Vec<mpsc::Sender<super::queries::Query>>>,
    placement: Arc<super::placement::Placement>,
    /// Cluster mode: where partitions post to each other (their inboxes).
    outbox: Arc<std::sync::OnceLock<Arc<dyn super::posted::Outbox>>>,
    /// The store's health once the partitions run: a partition stopped by a failed store is
    /// reported as that failure, not as a routing error.
    pub(super) health: Arc<std::sync::OnceLock<Arc<sluice_store::health::Health>>>,
    /// The tokio runtime the partitions run on, once they do (off the shards).
    pub(super) home: Arc<std::sync::OnceLock<tokio::runtime::Handle>>,
    /// The shards the partitions run on, when they do (partition `p` on shard `p % shards`).
    pub(super) shards: Arc<std::sync::OnceLock<Arc<crate::shards::Shards>>>,
}

/// The receiving ends, handed to [`PartitionsService`] (or tests) to run.
pub struct Receivers(
    pub(super) Vec<(mpsc::Receiver<Event>, mpsc::Receiver<super::queries::Query>)>,
);

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
    pub(super) fn home_of(&self, index: usize) -> tokio::runtime::Handle {
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
    pub fn place_new(&self) -> Option<sluice_store::invocation::new::Place> {
        let index = self.placement.pick_here()?;
        Some(sluice_store::invocation::new::Place {
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
        let partition = self.partition_of(partition_key(&[service, key]));
        self.ask(partition, |reply| Event::SetObjectState {
            service: service.to_owned(),
            key: key.to_owned(),
            state,
            reply,
        })
        .await?
        .map(|_| ())
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

    /// Sends the message `make` builds (given where to answer) to `partition`'s channel (its
    /// events, or its reads, `super::queries`), and awaits the answer: every request of this
    /// handle but the posts is this one round trip.
    async fn ask<M, T>(
        &self,
        partition: &mpsc::Sender<M>,
        make: impl FnOnce(oneshot::Sender<T>) -> M,
    ) -> Result<T, CodedError> {
        let (reply, answer) = oneshot::channel();
        partition.send(make(reply)).await.map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())
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
        let partition = self.partition(record.id);
        self.ask(partition, |reply| Event::Restart {
            record: Box::new(record),
            journal,
            reply,
        })
        .await?
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
        // Answered with the receiver itself: the caller awaits the storing (or goes on).
        let (reply, answer) = oneshot::channel();
        self.partition(record.id)
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
        let partition = self.partition(signal.target);
        self.ask(partition, |reply| Event::Signal {
            signal,
            reply: Some(reply),
        })
        .await
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

    /// How many invocations wait in every partition's queues: as many as [`Self::queued`]
    /// lists, without listing them.
    pub async fn queued_count(&self) -> Result<usize, CodedError> {
        let counts = self
            .gather(|reply| super::queries::Query::QueuedCount { reply })
            .await?;
        Ok(counts.into_iter().map(|(_, n)| n).sum())
    }

    /// Every partition's held object locks, with the partition's index.
    pub async fn locks(&self) -> Result<Vec<(u64, super::model::events::HeldLock)>, CodedError> {
        self.gather(|reply| super::queries::Query::Locks { reply })
            .await
    }

    /// Every partition's scheduler queues, with the partition's index.
    pub async fn queues(
        &self,
    ) -> Result<Vec<(u64, sluice_flow::scheduler::QueueSnapshot)>, CodedError> {
        Ok(self.queue_page(sluice_flow::ReadView::ALL).await?.1)
    }

    /// Calls of `service` waiting in every partition's queues, per scope, with no queue's
    /// snapshot.
    pub async fn waiting_by_scope(
        &self,
        service: &str,
    ) -> Result<HashMap<Option<sluice_flow::Scope>, usize>, CodedError> {
        let parts = self
            .gather(|reply| super::queries::Query::Waiting {
                service: service.to_owned(),
                reply,
            })
            .await?;
        let mut all = HashMap::new();
        for (_, waiting) in parts {
            for (scope, n) in waiting {
                *all.entry(scope).or_insert(0) += n;
            }
        }
        Ok(all)
    }

    /// The queues `view` asks for, of every partition (each picks its share, and the busiest
    /// of them all stay), with how many matched.
    pub async fn queue_page(
        &self,
        view: sluice_flow::ReadView,
    ) -> Result<(usize, Vec<(u64, sluice_flow::scheduler::QueueSnapshot)>), CodedError> {
        let limit = view.limit;
        let pages = self
            .gather(|reply| super::queries::Query::Queues {
                view: view.clone(),
                reply,
            })
            .await?;
        let total = pages.iter().map(|(_, page)| page.total).sum();
        let mut queues: Vec<(u64, sluice_flow::scheduler::QueueSnapshot)> = pages
            .into_iter()
            .flat_map(|(partition, page)| page.queues.into_iter().map(move |q| (partition, q)))
            .collect();
        if let Some(limit) = limit {
            queues.sort_by(|a, b| {
                (b.1.queued, b.1.delayed)
                    .cmp(&(a.1.queued, a.1.delayed))
                    .then((a.0, a.1.id).cmp(&(b.0, b.1.id)))
            });
            queues.truncate(limit);
            queues.sort_by_key(|(partition, q)| (*partition, q.id));
        }
        Ok((total, queues))
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
        self.ask(sender, |reply| Event::PauseQueue {
            queue,
            pause,
            reply,
        })
        .await
    }

    /// Resets the quotas (or budgets) `pattern` matches on every partition led here (see
    /// [`sluice_flow::scheduler::Scheduler::reset_uses`]); answers how many counters each of
    /// those partitions reset, once it stored it.
    pub async fn reset_uses(
        &self,
        measure: sluice_flow::Measure,
        pattern: &sluice_flow::RulePattern,
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

    /// Cancels what `filter` names on every partition led here (`dry_run`: counts it), `batch`
    /// invocations per command so that other work goes on between two; what each partition
    /// named and canceled. The partitions go at once, each through its batches in turn. In
    /// cluster mode a partition that moved away while it went is left out of the answer (the
    /// caller asks its new leader).
    pub async fn bulk_cancel(
        &self,
        filter: super::model::bulk::CancelFilter,
        dry_run: bool,
        batch: usize,
    ) -> Result<std::collections::BTreeMap<u32, super::model::bulk::Cancelled>, CodedError> {
        let filter = Arc::new(filter);
        let batch = batch.max(1);
        let runs = (0..self.senders.len())
            .filter(|index| self.placement.is_here(*index))
            .map(|index| {
                let filter = Arc::clone(&filter);
                async move {
                    let done = self.bulk_cancel_on(index, filter, dry_run, batch).await;
                    (index, done)
                }
            });
        let mut answer = std::collections::BTreeMap::new();
        for (index, done) in futures_util::future::join_all(runs).await {
            let partition = u32::try_from(index).unwrap_or(u32::MAX);
            match done {
                Ok(done) => {
                    answer.insert(partition, done);
                }
                Err(_) if self.placement.is_clustered() && !self.placement.is_here(index) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(answer)
    }

    /// [`Self::bulk_cancel`] on partition `index`.
    async fn bulk_cancel_on(
        &self,
        index: usize,
        filter: Arc<super::model::bulk::CancelFilter>,
        dry_run: bool,
        batch: usize,
    ) -> Result<super::model::bulk::Cancelled, CodedError> {
        let candidates = self
            .ask(&self.queries[index], |reply| {
                super::queries::Query::CancelCandidates {
                    filter: Arc::clone(&filter),
                    reply,
                }
            })
            .await?;
        let mut total = super::model::bulk::Cancelled::default();
        for chunk in candidates.chunks(batch) {
            let done = self
                .ask(&self.senders[index], |reply| Event::CancelBatch {
                    filter: Arc::clone(&filter),
                    batch: chunk.to_vec(),
                    dry_run,
                    reply,
                })
                .await??;
            total.named += done.named;
            total.cancelled += done.cancelled;
        }
        Ok(total)
    }

    /// The counters `view` asks for, of every partition: each partition picks its share, and
    /// the busiest of them all stay.
    pub async fn counter_page(
        &self,
        view: sluice_flow::ReadView,
    ) -> Result<sluice_flow::limiter::CounterPage, CodedError> {
        let limit = view.limit;
        let pages = self
            .gather(|reply| super::queries::Query::Counters {
                view: view.clone(),
                reply,
            })
            .await?;
        Ok(sluice_flow::limiter::CounterPage::merge(
            pages.into_iter().map(|(_, page)| page),
            limit,
        ))
    }

    /// Every partition's counters summed by rule and level: what gauges and the flow history
    /// show, without a snapshot per counter.
    pub async fn flow_sums(&self) -> Result<sluice_flow::limiter::FlowSums, CodedError> {
        let sums = self
            .gather(|reply| super::queries::Query::Sums { reply })
            .await?;
        Ok(sluice_flow::limiter::FlowSums::merge(
            sums.into_iter().map(|(_, sums)| sums),
        ))
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
        let partition = &self.queries[self.index_of(id.partition_key())];
        self.ask(partition, |reply| super::queries::Query::Explain {
            id,
            reply,
        })
        .await
    }

    /// Applies an operator's control request to an invocation.
    pub async fn control(
        &self,
        id: InvocationId,
        op: super::model::operator::Control,
    ) -> Result<super::model::operator::Controlled, CodedError> {
        self.ask(self.partition(id), |reply| Event::Control { id, op, reply })
            .await?
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
        self.ask(self.partition(id), |reply| Event::Peek {
            id,
            output,
            reply,
        })
        .await
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
}

impl super::driver::Mailboxes for Runtime {
    fn post(&self, id: InvocationId, event: Event) {
        Runtime::post(self, id, event);
    }

    fn nudge(&self, waiting: u64, from: u32) {
        Runtime::nudge(self, waiting, from);
    }
}
