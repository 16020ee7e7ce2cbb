//! The partition's loop: commands in batches, each batch one write set; effects after its
//! commit; queries between batches; wake-ups and rate tokens on time.

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::model::effect::Effect;
use super::model::events::Event;
use super::queries::Query;
use super::task::Partition;
use sluice_core::errors::{Code, CodedError};
use sluice_store::invocation::Status;
use sluice_store::storage::writer::{Commit, WriteSet};

/// Most events applied in one write set.
pub(super) const BATCH: usize = 256;

/// Write sets a partition has waiting for their commit before it stops taking events.
pub(super) const IN_FLIGHT: usize = 4;

/// Write sets applied and waiting for their commit, oldest first, each with what its commit
/// releases.
pub(super) type Pending = VecDeque<(Commit, Vec<Effect>)>;

/// One thing the partition's loop noticed. The tokio loop (`Partition::run`) and the partition
/// simulator both hand them to [`Partition::step`] one at a time, so the simulator runs the
/// loop's own code rather than a model of it; only which input comes next is theirs to pick.
pub(super) enum Input<'a> {
    /// An admin read: answered between batches.
    Query(Query),
    /// The oldest pending write set's commit answered.
    Committed(Result<(), CodedError>),
    /// A rule book was published: lowered limits hold new work back, raised ones release
    /// queued work at once.
    RulesPublished,
    /// Time passed: a queue whose rate token is due may start, and the wake-ups due (while
    /// fewer than `IN_FLIGHT` sets wait) join `batch`, which is applied as one write set.
    Tick(&'a mut Vec<Event>),
    /// Events arrived in `batch`: applied as one write set (`batch` is empty afterwards).
    Events(&'a mut Vec<Event>),
}

/// A write set failed: nothing more of this partition may be acknowledged, and its loop ends
/// (the process restarts from the store).
#[derive(Debug)]
pub(super) struct Stopped;

impl Partition {
    /// Takes `input`: the partition's whole reaction to it, up to the write sets it leaves in
    /// `pending`. Answers how many events it applied.
    pub(super) fn step(
        &mut self,
        pending: &mut Pending,
        input: Input<'_>,
    ) -> Result<usize, Stopped> {
        let applied = match input {
            Input::Query(query) => {
                self.answer_query(query);
                0
            }
            Input::Committed(committed) => {
                let (_, effects) = pending.pop_front().expect("a commit answers a pending set");
                let error = match committed {
                    Ok(()) => {
                        self.run_effects(effects);
                        // Everything applied is stored: suspended journals may rest.
                        if pending.is_empty() {
                            self.rest_journals();
                        }
                        self.adopt_detached(pending);
                        return Ok(0);
                    }
                    Err(error) => error,
                };
                // Memory now holds what the store may not: nothing more of this partition may
                // be acknowledged. Later sets fail the same way (the writer refuses everything
                // after a failure); the process restarts from the store.
                fail(effects, &error);
                for (_, effects) in pending.drain(..) {
                    fail(effects, &error);
                }
                if let Some(failure) = self.outside.store.health().failure() {
                    tracing::error!(partition = self.outside.index, error.code = ?failure.code, "partition stopped after a failed write");
                }
                return Err(Stopped);
            }
            Input::RulesPublished => {
                self.dispatch();
                0
            }
            Input::Tick(batch) => {
                if self
                    .admission
                    .scheduler
                    .next_timer()
                    .is_some_and(|at| at <= self.outside.driver.now_ms())
                {
                    self.dispatch();
                }
                if pending.len() < IN_FLIGHT {
                    self.due_wakes(batch);
                }
                self.apply_nonempty(batch, pending)
            }
            Input::Events(batch) => self.apply_nonempty(batch, pending),
        };
        self.adopt_detached(pending);
        Ok(applied)
    }

    /// Applies `batch` if it holds anything; answers how many events that was.
    fn apply_nonempty(&mut self, batch: &mut Vec<Event>, pending: &mut Pending) -> usize {
        let events = batch.len();
        if events > 0 {
            self.apply_batch(batch, pending);
        }
        events
    }

    /// Applies events until every sender is gone and every write set has committed; a new
    /// rule book applies the moment it arrives.
    pub async fn run(
        mut self,
        rx: &mut mpsc::Receiver<Event>,
        queries: &mut mpsc::Receiver<Query>,
    ) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut pending = Pending::new();
        let mut open = true;
        // A second receiver of the books, only to wake the loop when one is published with no
        // event behind it (raised limits release queued work at once); the partition's own
        // receiver is what admission reads.
        let mut wake_on_rules = self.admission.rules.clone();
        let mut asking = true;
        self.adopt_detached(&mut pending);
        while open || !pending.is_empty() || !self.starting.detached.is_empty() {
            // Reads first, between batches: an admin read never waits behind queued work.
            while let Ok(query) = queries.try_recv() {
                self.answer_query(query);
            }
            let input = tokio::select! {
                query = queries.recv(), if asking => match query {
                    Some(query) => Input::Query(query),
                    None => {
                        asking = false;
                        continue;
                    }
                },
                // Commits answer in order, so only the oldest needs watching.
                committed = async { (&mut pending.front_mut().expect("guarded").0).await },
                    if !pending.is_empty() =>
                {
                    Input::Committed(committed.unwrap_or_else(|_| {
                        Err(CodedError::new(Code::RT0006, "the store writer stopped"))
                    }))
                }
                changed = async { wake_on_rules.as_mut().expect("guarded").changed().await }, if wake_on_rules.is_some() => {
                    match changed {
                        Ok(()) => {
                            wake_on_rules.as_mut().expect("guarded").borrow_and_update();
                            Input::RulesPublished
                        }
                        Err(_) => {
                            wake_on_rules = None;
                            continue;
                        }
                    }
                }
                // A queue waiting for a rate's token: its turn comes with the time, not an event.
                () = tokio::time::sleep(self.until_scheduler_due()), if self.admission.scheduler.next_timer().is_some() => {
                    Input::Tick(&mut batch)
                }
                () = tokio::time::sleep(self.until_next_wake()), if !self.wakes.is_empty() && pending.len() < IN_FLIGHT => {
                    Input::Tick(&mut batch)
                }
                // Events from the channel and from this partition's own attempts, which its
                // loop polls (`driver.rs`): what arrived in this turn is one batch.
                closed = std::future::poll_fn(|cx| self.poll_events(cx, rx, open, &mut batch)),
                    if pending.len() < IN_FLIGHT =>
                {
                    if closed {
                        open = false;
                    }
                    if batch.is_empty() {
                        continue;
                    }
                    // A burst sent after a rules answer is received after the book's
                    // publication: `apply_batch` takes that book before admitting anything.
                    Input::Events(&mut batch)
                }
            };
            if self.step(&mut pending, input).is_err() {
                return;
            }
        }
    }

    /// Gathers the next batch into `batch`: what the partition's attempts reported, then what
    /// its channel holds (while `open`), up to [`BATCH`] events. Ready with whether the
    /// channel closed, once either gave something or it did.
    fn poll_events(
        &self,
        cx: &mut std::task::Context<'_>,
        rx: &mut mpsc::Receiver<Event>,
        open: bool,
        batch: &mut Vec<Event>,
    ) -> std::task::Poll<bool> {
        self.outside.driver.poll_attempts(cx, batch, BATCH);
        let room = BATCH.saturating_sub(batch.len());
        if open && room > 0 {
            // Zero received from a channel asked for at least one: every sender is gone.
            if let std::task::Poll::Ready(0) = rx.poll_recv_many(cx, batch, room) {
                return std::task::Poll::Ready(true);
            }
        }
        if batch.is_empty() {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(false)
        }
    }

    /// Awaits the commits attempts started since the last call made outside a batch, in the
    /// order they were made (after every set already pending: the writer keeps that order).
    pub(super) fn adopt_detached(&mut self, pending: &mut Pending) {
        pending.extend(
            self.starting
                .detached
                .drain(..)
                .map(|commit| (commit, Vec::new())),
        );
    }

    /// How long until the earliest wake-up is due.
    pub(super) fn until_next_wake(&self) -> Duration {
        self.wakes
            .peek()
            .map_or(Duration::ZERO, |Reverse((at_ms, _, _))| {
                Duration::from_millis(at_ms.saturating_sub(self.outside.driver.now_ms()))
            })
    }

    /// How long until the scheduler wants to be polled (a rate's next token).
    pub(super) fn until_scheduler_due(&self) -> Duration {
        self.admission
            .scheduler
            .next_timer()
            .map_or(Duration::ZERO, |at_ms| {
                Duration::from_millis(at_ms.saturating_sub(self.outside.driver.now_ms()))
            })
    }

    /// Moves the wake-ups due now into `batch` as events.
    pub(super) fn due_wakes(&mut self, batch: &mut Vec<Event>) {
        let now = self.outside.driver.now_ms();
        while batch.len() < BATCH
            && let Some(Reverse((at_ms, _, _))) = self.wakes.peek()
            && *at_ms <= now
        {
            let Some(Reverse((_, id, completion))) = self.wakes.pop() else {
                break;
            };
            batch.push(Event::Wake { id, completion });
        }
    }

    /// Applies `batch` as one write set and queues it for its commit.
    fn apply_batch(&mut self, batch: &mut Vec<Event>, pending: &mut Pending) {
        self.refresh_rules();
        let mut writes = WriteSet::default();
        let mut effects = Vec::new();
        let mut applied = Ok(());
        // Cluster mode: a write set is one log record, so a batch is cut into sets of at most
        // two values' worth (each event writes at most two values of at most the limit: an
        // output in the journal and in the record).
        let cut_at = self
            .outside
            .config
            .record_value_limit()
            .map(|limit| limit.saturating_mul(2));
        // The set's encoded size so far (from its 4-byte count on) and how many of its writes
        // that counts: each write is measured once, not once per event after it.
        let (mut size, mut measured) = (4, 0);
        for event in batch.drain(..) {
            if let Err(e) = self.apply(event, &mut writes, &mut effects) {
                applied = Err(e);
            }
            self.observe();
            if let Some(cut_at) = cut_at
                && applied.is_ok()
            {
                size += self.outside.writer.record_bytes(&writes, measured);
                measured = writes.len();
                if size > cut_at {
                    let full = std::mem::take(&mut writes);
                    self.charges_handed_over();
                    pending.push_back((
                        self.outside.writer.commit(full),
                        std::mem::take(&mut effects),
                    ));
                    (size, measured) = (4, 0);
                }
            }
        }
        match applied {
            // A set with nothing to write, embedded: its effects (an answer to a waiting
            // caller, say) must only not overtake this partition's earlier writes, and those
            // are all in `pending` ahead of it, which answers in order. So it takes no trip
            // through the writer's thread (nor one at all without effects).
            Ok(()) if writes.is_empty() && self.outside.writer.answers_empty_sets() => {
                self.charges_handed_over();
                if !effects.is_empty() {
                    pending.push_back((self.answered_here(), effects));
                }
            }
            // Otherwise even an empty set goes through the writer, for the same order.
            Ok(()) => {
                self.charges_handed_over();
                pending.push_back((self.outside.writer.commit(writes), effects));
            }
            Err(e) => {
                self.charges_dropped();
                fail(effects, &e);
            }
        }
        // Queues woken while applying (a nudge, a rule change) start at once;
        // attempts started now write after the batch (the writer keeps order).
        self.dispatch();
    }

    /// A commit answered at once: what the writer would answer a set with nothing to write.
    /// After a store failure nothing more is acknowledged, not even that (`writer.rs`).
    fn answered_here(&self) -> Commit {
        let (done, commit) = oneshot::channel();
        let answer = match self.outside.store.health().failure() {
            Some(failure) => Err(failure.clone()),
            None => Ok(()),
        };
        let _ = done.send(answer);
        commit
    }

    pub(super) fn run_effects(&mut self, effects: Vec<Effect>) {
        self.refresh_rules();
        for effect in effects {
            self.run_effect(effect);
            self.observe();
        }
        self.dispatch();
    }

    pub(super) fn run_effect(&mut self, effect: Effect) {
        match effect {
            Effect::Ack(reply, created) => {
                let _ = reply.send(Ok(created));
            }
            Effect::Child(child) => {
                let id = child.record.id;
                let event = Event::Submit {
                    record: Box::new(child.record),
                    input: child.input,
                    reply: None,
                    call: None,
                };
                self.outside.driver.post(id, event);
            }
            Effect::Signal(signal) => {
                let target = signal.target;
                self.outside.driver.post(
                    target,
                    Event::Signal {
                        signal,
                        reply: None,
                    },
                );
            }
            Effect::Answer(answer) => answer.send(),
            Effect::PauseQueue(key, pause) => self.pause_queue(&key, pause),
            Effect::ResetQuota(measure, pattern, reply) => {
                let reset = self.admission.scheduler.reset_uses(
                    measure,
                    &pattern,
                    self.outside.driver.now_ms(),
                );
                let _ = reply.send(reset as u64);
                self.dispatch();
            }
            Effect::Settle(id) => self.settle(id),
            Effect::UncachePromise(key) => self.uncache_promise(&key),
            Effect::Evict(id) => self.evict(id),
            Effect::Forward(id, op) => {
                // Nobody waits for this answer.
                let (reply, _) = oneshot::channel();
                self.outside
                    .driver
                    .post(id, Event::Control { id, op, reply });
            }
            Effect::CallResult(caller, outcome) => self.outside.driver.post(
                caller.id,
                Event::CallResult {
                    id: caller.id,
                    completion: caller.completion,
                    outcome,
                },
            ),
            Effect::Notify(waiters, outcome) => {
                for waiter in waiters {
                    let _ = waiter.send(outcome.clone());
                }
            }
            Effect::Attempt(id) => {
                // A delayed send whose time came went back to rest until this commit.
                self.rouse(id);
                self.enqueue(id);
            }
            Effect::Deliver(id, attempt, bytes) => self.deliver(id, attempt, bytes),
            Effect::WakeAt(id, at_ms, completion) => {
                if completion.is_none() {
                    // A delayed send waits for its time at rest, its input only in the
                    // store: it is committed by now, so it can be read back.
                    self.resting.note_queued(id);
                }
                self.wakes.push(Reverse((at_ms, id, completion)));
            }
        }
    }

    /// A queue's pause (or resume) is stored: the scheduler follows.
    fn pause_queue(&mut self, key: &sluice_flow::scheduler::QueueKey, pause: bool) {
        let now = self.outside.driver.now_ms();
        if pause {
            self.admission.scheduler.pause(key, now);
        } else {
            self.admission.scheduler.resume(key, now);
        }
        self.dispatch();
    }

    /// A completed invocation leaves memory (the store keeps it) once nobody waits on it.
    fn evict(&mut self, id: sluice_core::ids::InvocationId) {
        // Its slots and lock go back first (settling twice is harmless).
        self.settle(id);
        if let Some(live) = self.live.get(&id)
            && live.record().status == Status::Completed
            && live.waiters.is_empty()
        {
            let entry = live.entry;
            self.live.remove(&id);
            self.entries.remove(entry);
        }
    }

    /// Bytes for the open request body of attempt `attempt` of `id`, if it still runs.
    fn deliver(&mut self, id: sluice_core::ids::InvocationId, attempt: u32, bytes: bytes::Bytes) {
        if let Some(live) = self.live.get_mut(&id)
            && live.attempt == attempt
            && let Some(running) = live.attempt_mut()
            && let Some(outbound) = &running.outbound
        {
            // A closed body is fine: the entry is journaled and replayed.
            let _ = outbound.send(bytes);
        }
    }
}

/// A batch that did not become durable: its acknowledgements answer the error; nothing else of
/// it runs.
pub(super) fn fail(effects: Vec<Effect>, error: &CodedError) {
    tracing::error!(error.code = ?error.code, error = %error, "partition batch failed; nothing of it was acknowledged");
    for effect in effects {
        match effect {
            Effect::Ack(reply, _) => drop(reply.send(Err(error.clone()))),
            Effect::Answer(answer) => answer.fail(error),
            _ => {}
        }
    }
}
