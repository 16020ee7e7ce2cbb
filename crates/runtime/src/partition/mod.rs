//! A partition: one task that owns the state machine of its invocations. Events arrive on a
//! channel; each batch of events becomes one write set for the store's writer (which commits the
//! sets of every partition together), and acknowledgements, attempts and timers are released
//! only after that commit. The partition keeps applying new events while earlier sets commit.

pub mod admission;
mod answer;
mod attempts;
mod calls;
mod commands;
pub mod control;
pub mod dormant;
pub mod driver;
mod effect;
mod ending;
mod events;
mod journal;
pub mod phase;
pub mod placement;
pub mod posted;
mod promises;
mod purge;
mod queries;
pub mod restart;
pub mod runtime;
pub mod signals;
#[cfg(test)]
mod sim;
mod suspended;

use effect::Effect;
pub use events::{Event, HeldLock, PartitionMetrics, QueuedEntry, StateMemory};
pub use queries::Query;
pub use runtime::{Receivers, Runtime};

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::config::Config;
use crate::errors::{Code, CodedError};
use crate::flow::scheduler::{EntryId, LockId, Scheduler};
use crate::flow::slots::InvokerSlots;
use crate::flow::{RuleBook, Scope};
use crate::ids::InvocationId;
use crate::invocation::store::{self, Timer};
use crate::invocation::{Caller, InvocationRecord, Outcome, Status};
use crate::protocol::message::Kind;
use crate::protocol::{Frame, MessageType};
use crate::registry::Registry;
use crate::storage::Store;
use crate::storage::writer::{Commit, WriteSet, Writer};

/// Most events applied in one write set.
const BATCH: usize = 256;

/// Write sets a partition has waiting for their commit before it stops taking events.
const IN_FLIGHT: usize = 4;

/// An invocation the partition is driving.
#[derive(Debug)]
struct Live {
    record: InvocationRecord,
    journal: Vec<Frame>,
    waiters: Vec<oneshot::Sender<Outcome>>,
    /// Where it stands: idle, queued, running (with its attempt) or ending (`phase.rs`).
    run: phase::Run,
    /// Number of the current (or last) attempt of this process.
    attempt: u32,
    /// Commands in the journal (the next command's `command_index`).
    commands: u32,
    /// Its id in the scheduler.
    entry: EntryId,
    /// The object lock it holds from its first admission until it completes, across
    /// suspensions and back-offs (so not part of `run`).
    lock: Option<LockId>,
    /// Entries at the start of its journal that rest in the store only (`suspended.rs`);
    /// `journal` holds those after them.
    rested: u32,
    /// Callers that reached it through an idempotency key after the first one.
    callers: Vec<Caller>,
    /// Not in the store yet, nor any of its journal: a call stored at the first point anything
    /// depends on it ([`journal::save`]).
    unsaved: bool,
}

impl Live {
    /// Bytes it holds in memory: itself, its record, its journal (client bytes: the input,
    /// outputs, state values, completions), its waits and its run phase. Each state's share
    /// is known (`sluice_invocation_memory_bytes{state}`).
    fn footprint(&self) -> u64 {
        use std::mem::size_of;
        let journal: usize = self
            .journal
            .iter()
            .map(|f| size_of::<Frame>() + f.payload.len())
            .sum();
        let bytes = size_of::<Self>()
            + self.record.heap_bytes()
            + journal
            + self.waiters.capacity() * size_of::<oneshot::Sender<Outcome>>()
            + self.callers.capacity() * size_of::<Caller>()
            + self.run.heap_bytes();
        bytes as u64
    }

    fn running(&self) -> bool {
        self.run.is_running()
    }

    /// Its running attempt if that is attempt `attempt` and it broke no rule: the one whose
    /// messages count.
    fn current(&mut self, attempt: u32) -> Option<&mut phase::Attempt> {
        let number = self.attempt;
        self.run
            .attempt()
            .filter(|running| number == attempt && running.violation.is_none())
    }

    /// Its running attempt broke a rule: it fails with `error` when it ends, and nothing more
    /// of it is journaled or sent to it.
    fn violate(&mut self, error: CodedError) {
        if let Some(running) = self.run.attempt() {
            running.violation = Some(error);
            running.outbound = None;
        }
    }

    /// Adds a wait for the outcome, first pruning waits whose requester left; past `max`
    /// live ones the wait is refused (SEC0008).
    fn wait(&mut self, waiter: oneshot::Sender<Outcome>, max: usize) -> Result<(), CodedError> {
        // Pruned now and then, not on every push: a closed wait costs a few bytes until then.
        if self.waiters.len() >= max || self.waiters.len() % 64 == 63 {
            self.waiters.retain(|w| !w.is_closed());
        }
        if self.waiters.len() >= max {
            return Err(CodedError::new(
                Code::SEC0008,
                format!(
                    "{} requests already wait for invocation {}, the most worker.max-waiters-per-invocation allows",
                    self.waiters.len(),
                    self.record.id
                ),
            )
            .retry_after(1));
        }
        self.waiters.push(waiter);
        Ok(())
    }
}

/// One partition's state.
pub struct Partition {
    index: u32,
    store: Arc<Store>,
    writer: Writer,
    registry: Arc<Registry>,
    config: Arc<Config>,
    /// The clock, the deployments and the other partitions.
    driver: Box<dyn driver::Driver>,
    /// Boxed: a held backlog keeps the map's spare capacity at pointer size, not `Live` size.
    live: HashMap<InvocationId, Box<Live>>,
    /// Held invocations that never ran, at rest in a compact form.
    dormant: HashMap<InvocationId, dormant::Dormant>,
    /// Invocations queued (or delayed) since the last dispatch: those still waiting after it
    /// go to rest.
    just_queued: Vec<InvocationId>,
    /// Invocations at rest in all partitions, and the memory their inputs take.
    held: Arc<dormant::HeldMemory>,
    /// Invocations at rest per scope (every invocation of a scope lives on its partition).
    held_in_scope: HashMap<Scope, usize>,
    /// Waits for the outcome of invocations at rest, handed to them when they wake.
    waiting_at_rest: HashMap<InvocationId, Vec<oneshot::Sender<Outcome>>>,
    /// Invocations that suspended (or whose journal was read back while suspended) since
    /// their journals last went to rest.
    suspending: Vec<InvocationId>,
    scheduler: Scheduler,
    /// The rule book as published (the rules API publishes before it answers): looked at
    /// before anything is admitted, so a book published before an event was sent is the book
    /// that event is admitted under, whatever the run loop's select picked first.
    rules: Option<tokio::sync::watch::Receiver<Arc<RuleBook>>>,
    promises: promises::Promises,
    entries: HashMap<EntryId, InvocationId>,
    next_entry: EntryId,
    /// Wake-ups (delays, back-offs, timers) in time order: one heap entry each, not a task
    /// each, so 100,000 delayed sends cost a few MB.
    wakes: BinaryHeap<Reverse<(u64, InvocationId, Option<Timer>)>>,
    /// Commits of what started attempts write (their pinned deployment and status), made
    /// outside a batch: the run loop awaits them with the batches' (`adopt_detached`), so a
    /// failed one stops the partition like any other.
    detached: Vec<Commit>,
    /// Test builds: the states last seen, to check every move against the transition table.
    #[cfg(test)]
    watch: phase::Watch,
}

/// What the partitions of one process share: the store and its writer, the registry, the
/// configuration, the invoker's slots and the memory budget of held invocations.
#[derive(Debug, Clone)]
pub struct Shared {
    store: Arc<Store>,
    writer: Writer,
    registry: Arc<Registry>,
    config: Arc<Config>,
    slots: Arc<InvokerSlots>,
    held: Arc<dormant::HeldMemory>,
}

impl Shared {
    /// The parts over `store` (written through `writer`), with the invoker's slots and the
    /// held-memory budget `config` sets.
    pub fn new(
        store: Arc<Store>,
        writer: Writer,
        registry: Arc<Registry>,
        config: Arc<Config>,
    ) -> Self {
        let slots = Arc::new(InvokerSlots::new(
            config.worker.invoker.concurrent_invocations_limit.get(),
        ));
        let held = Arc::new(dormant::HeldMemory::new(config.worker.held_memory_budget.0));
        Self {
            store,
            writer,
            registry,
            config,
            slots,
            held,
        }
    }
}

impl Shared {
    /// The same parts, written through `writer` (cluster mode: a partition's log).
    pub fn with_writer(&self, writer: Writer) -> Self {
        Self {
            writer,
            ..self.clone()
        }
    }
}

impl Partition {
    /// Partition `index` over the parts every partition `shared`, running attempts through
    /// `driver`.
    pub fn new(index: u32, shared: &Shared, driver: Box<dyn driver::Driver>) -> Self {
        Self {
            index,
            store: Arc::clone(&shared.store),
            writer: shared.writer.clone(),
            registry: Arc::clone(&shared.registry),
            config: Arc::clone(&shared.config),
            driver,
            live: HashMap::new(),
            dormant: HashMap::new(),
            just_queued: Vec::new(),
            held: Arc::clone(&shared.held),
            held_in_scope: HashMap::new(),
            waiting_at_rest: HashMap::new(),
            suspending: Vec::new(),
            scheduler: Scheduler::sharing(
                Arc::new(RuleBook::new()),
                Arc::clone(&shared.slots),
                index,
            ),
            rules: None,
            promises: promises::Promises::default(),
            entries: HashMap::new(),
            next_entry: 0,
            wakes: BinaryHeap::new(),
            detached: Vec::new(),
            #[cfg(test)]
            watch: phase::Watch::default(),
        }
    }

    /// Test builds: checks the moves since the last look against the transition table.
    #[cfg(test)]
    fn observe(&mut self) {
        let live = self
            .live
            .iter()
            .map(|(id, live)| (*id, phase::state_of(live.record.status, &live.run)));
        let resting = self
            .dormant
            .keys()
            .map(|id| (*id, Ok(phase::State::Resting)));
        let mut watch = std::mem::take(&mut self.watch);
        watch.look(live.chain(resting));
        self.watch = watch;
    }

    #[cfg(not(test))]
    fn observe(&mut self) {}

    /// Loads the unfinished invocations `owns` selects and continues them: attempts again,
    /// re-arms timers. Nothing acknowledged is lost.
    pub fn recover(&mut self, owns: impl Fn(InvocationId) -> bool) -> Result<(), CodedError> {
        let (records, timers, paused) = self.store.with_db(|db| {
            Ok::<_, CodedError>((
                store::load_records(db)?,
                store::load_timers(db)?,
                crate::invocation::paused::load(db, self.index)?,
            ))
        })??;
        // Before anything queues: a paused queue keeps its entries from the start.
        for key in &paused {
            self.scheduler.pause(key, self.driver.now_ms());
        }
        let mut effects = Vec::new();
        for record in records.into_iter().filter(|r| owns(r.id)) {
            let id = record.id;
            if record.status == Status::Completed {
                // Its caller may not have the result yet; callers ignore repeats.
                if let (Some(caller), Some(outcome)) = (record.caller, record.outcome.clone()) {
                    effects.push(Effect::CallResult(caller, outcome));
                }
                // Completed invocations stay in the store, retained results too.
                continue;
            }
            let journal = self.store.with_db(|db| store::load_journal(db, id))??;
            // A child may have been lost between this journal's commit and its hand-over.
            let flow_control = self.config.flow_control_enabled();
            let now = self.driver.now_ms();
            for child in calls::children_in(&self.registry, flow_control, &record, &journal, now) {
                effects.push(Effect::Child(Box::new(child)));
            }
            match (record.status, record.run_at_ms) {
                (Status::Scheduled | Status::BackingOff, Some(at)) => {
                    effects.push(Effect::WakeAt(id, at, None))
                }
                (Status::Paused, _) => {}
                _ => effects.push(Effect::Attempt(id)),
            }
            let protocol = record.protocol;
            if record.status == Status::Suspended {
                // Its journal rests again once recovery is stored.
                self.suspending.push(id);
            }
            self.rewait_promises_after_track(record, journal, protocol);
            self.reclaim_lock(id);
        }
        for timer in timers.into_iter().filter(|t| owns(t.invocation)) {
            effects.push(Effect::WakeAt(timer.invocation, timer.at_ms, Some(timer)));
        }
        tracing::info!(
            invocations = self.live.len() + self.dormant.len(),
            "partition recovered"
        );
        self.observe();
        self.run_effects(effects);
        Ok(())
    }

    /// Follows the books `changes` publishes, starting from its current one (before recovery,
    /// so recovered invocations queue under it). Taking the first book from the receiver
    /// itself leaves no gap between reading the book and subscribing to its changes.
    pub fn follow_rules(&mut self, mut changes: tokio::sync::watch::Receiver<Arc<RuleBook>>) {
        let book = Arc::clone(&changes.borrow_and_update());
        self.scheduler.on_rules_changed(book, self.driver.now_ms());
        self.rules = Some(changes);
    }

    /// Takes a book published since the last look. Called before every admission decision
    /// (applying a batch, running committed effects, dispatching), so the invariant does not
    /// depend on the order the run loop notices things in. Cheap: one atomic load when
    /// nothing changed.
    fn refresh_rules(&mut self) {
        if let Some(changes) = self.rules.as_mut()
            && changes.has_changed().unwrap_or(false)
        {
            let book = Arc::clone(&changes.borrow_and_update());
            self.scheduler.on_rules_changed(book, self.driver.now_ms());
        }
    }

    /// Applies events until every sender is gone and every write set has committed; a new
    /// rule book applies the moment it arrives.
    pub async fn run(
        mut self,
        rx: &mut mpsc::Receiver<Event>,
        queries: &mut mpsc::Receiver<Query>,
    ) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut pending: VecDeque<(Commit, Vec<Effect>)> = VecDeque::new();
        let mut open = true;
        // A second receiver of the books, only to wake the loop when one is published with no
        // event behind it (raised limits release queued work at once); the partition's own
        // receiver is what admission reads.
        let mut wake_on_rules = self.rules.clone();
        let mut asking = true;
        while open || !pending.is_empty() || !self.detached.is_empty() {
            self.adopt_detached(&mut pending);
            // Reads first, between batches: an admin read never waits behind queued work.
            while let Ok(query) = queries.try_recv() {
                self.answer_query(query);
            }
            tokio::select! {
                query = queries.recv(), if asking => match query {
                    Some(query) => self.answer_query(query),
                    None => asking = false,
                },
                // Commits answer in order, so only the oldest needs watching.
                committed = async { (&mut pending.front_mut().expect("guarded").0).await },
                    if !pending.is_empty() =>
                {
                    let (_, effects) = pending.pop_front().expect("guarded");
                    let error = match committed {
                        Ok(Ok(())) => {
                            self.run_effects(effects);
                            // Everything applied is stored: suspended journals may rest.
                            if pending.is_empty() {
                                self.rest_suspended();
                            }
                            continue;
                        }
                        Ok(Err(e)) => e,
                        Err(_) => CodedError::new(Code::RT0006, "the store writer stopped"),
                    };
                    // Memory now holds what the store may not: nothing more of this partition
                    // may be acknowledged. Later sets fail the same way (the writer refuses
                    // everything after a failure); the process restarts from the store.
                    fail(effects, &error);
                    for (_, effects) in pending.drain(..) {
                        fail(effects, &error);
                    }
                    if let Some(failure) = self.store.health().failure() {
                        tracing::error!(partition = self.index, error.code = ?failure.code, "partition stopped after a failed write");
                    }
                    return;
                }
                changed = async { wake_on_rules.as_mut().expect("guarded").changed().await }, if wake_on_rules.is_some() => {
                    match changed {
                        Ok(()) => {
                            wake_on_rules.as_mut().expect("guarded").borrow_and_update();
                            // Lowered limits hold new work back; running work finishes.
                            self.dispatch();
                        }
                        Err(_) => wake_on_rules = None,
                    }
                }
                // A queue waiting for a rate's token: its turn comes with the time, not an event.
                () = tokio::time::sleep(self.until_scheduler_due()), if self.scheduler.next_timer().is_some() => {
                    self.dispatch();
                }
                () = tokio::time::sleep(self.until_next_wake()), if !self.wakes.is_empty() && pending.len() < IN_FLIGHT => {
                    self.due_wakes(&mut batch);
                    if batch.is_empty() {
                        continue;
                    }
                    self.apply_batch(&mut batch, &mut pending);
                }
                received = rx.recv_many(&mut batch, BATCH), if open && pending.len() < IN_FLIGHT => {
                    if received == 0 {
                        open = false;
                        continue;
                    }
                    // A burst sent after a rules answer is received after the book's
                    // publication: `apply_batch` takes that book before admitting anything.
                    self.apply_batch(&mut batch, &mut pending);
                }
            }
        }
    }

    /// Awaits the commits attempts started since the last call made outside a batch, in the
    /// order they were made (after every set already pending: the writer keeps that order).
    fn adopt_detached(&mut self, pending: &mut VecDeque<(Commit, Vec<Effect>)>) {
        pending.extend(self.detached.drain(..).map(|commit| (commit, Vec::new())));
    }

    /// How long until the earliest wake-up is due.
    fn until_next_wake(&self) -> Duration {
        self.wakes
            .peek()
            .map_or(Duration::ZERO, |Reverse((at_ms, _, _))| {
                Duration::from_millis(at_ms.saturating_sub(self.driver.now_ms()))
            })
    }

    /// How long until the scheduler wants to be polled (a rate's next token).
    fn until_scheduler_due(&self) -> Duration {
        self.scheduler.next_timer().map_or(Duration::ZERO, |at_ms| {
            Duration::from_millis(at_ms.saturating_sub(self.driver.now_ms()))
        })
    }

    /// Moves the wake-ups due now into `batch` as events.
    fn due_wakes(&mut self, batch: &mut Vec<Event>) {
        let now = self.driver.now_ms();
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
    fn apply_batch(
        &mut self,
        batch: &mut Vec<Event>,
        pending: &mut VecDeque<(Commit, Vec<Effect>)>,
    ) {
        self.refresh_rules();
        let mut writes = WriteSet::default();
        let mut effects = Vec::new();
        let mut applied = Ok(());
        // Cluster mode: a write set is one log record, so a batch is cut into sets of at most
        // two values' worth (each event writes at most two values of at most the limit: an
        // output in the journal and in the record).
        let cut_at = self
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
                size += crate::storage::log::encoded_len_after(&writes, measured);
                measured = writes.len();
                if size > cut_at {
                    let full = std::mem::take(&mut writes);
                    pending.push_back((self.writer.commit(full), std::mem::take(&mut effects)));
                    (size, measured) = (4, 0);
                }
            }
        }
        match applied {
            // Even an empty set goes through the writer: its effects (an answer
            // to a waiting caller, say) must not overtake earlier writes.
            Ok(()) => pending.push_back((self.writer.commit(writes), effects)),
            Err(e) => fail(effects, &e),
        }
        // Queues woken while applying (a nudge, a rule change) start at once;
        // attempts started now write after the batch (the writer keeps order).
        self.dispatch();
    }

    fn run_effects(&mut self, effects: Vec<Effect>) {
        self.refresh_rules();
        for effect in effects {
            self.run_effect(effect);
            self.observe();
        }
        self.dispatch();
    }

    fn run_effect(&mut self, effect: Effect) {
        {
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
                    self.driver.post(id, event);
                }
                Effect::Signal(signal) => {
                    let target = signal.target;
                    self.driver.post(
                        target,
                        Event::Signal {
                            signal,
                            reply: None,
                        },
                    );
                }
                Effect::Answer(answer) => answer.send(),
                Effect::PauseQueue(key, pause) => {
                    let now = self.driver.now_ms();
                    if pause {
                        self.scheduler.pause(&key, now);
                    } else {
                        self.scheduler.resume(&key, now);
                    }
                    self.dispatch();
                }
                Effect::Settle(id) => self.settle(id),
                Effect::UncachePromise(key) => self.uncache_promise(&key),
                Effect::Evict(id) => {
                    // Its slots and lock go back first (settling twice is harmless).
                    self.settle(id);
                    if let Some(live) = self.live.get(&id)
                        && live.record.status == Status::Completed
                        && live.waiters.is_empty()
                    {
                        let entry = live.entry;
                        self.live.remove(&id);
                        self.entries.remove(&entry);
                    }
                }
                Effect::Forward(id, op) => {
                    // Nobody waits for this answer.
                    let (reply, _) = oneshot::channel();
                    self.driver.post(id, Event::Control { id, op, reply });
                }
                Effect::CallResult(caller, outcome) => self.driver.post(
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
                Effect::Deliver(id, attempt, bytes) => {
                    if let Some(live) = self.live.get_mut(&id)
                        && live.attempt == attempt
                        && let Some(running) = live.run.attempt()
                        && let Some(outbound) = &running.outbound
                    {
                        // A closed body is fine: the entry is journaled and replayed.
                        let _ = outbound.send(bytes);
                    }
                }
                Effect::WakeAt(id, at_ms, completion) => {
                    if completion.is_none() {
                        // A delayed send waits for its time at rest, its input only in the
                        // store: it is committed by now, so it can be read back.
                        self.just_queued.push(id);
                    }
                    self.wakes.push(Reverse((at_ms, id, completion)));
                }
            }
        }
    }
}

/// A batch that did not become durable: its acknowledgements answer the error; nothing else of
/// it runs.
fn fail(effects: Vec<Effect>, error: &CodedError) {
    tracing::error!(error.code = ?error.code, error = %error, "partition batch failed; nothing of it was acknowledged");
    for effect in effects {
        match effect {
            Effect::Ack(reply, _) => drop(reply.send(Err(error.clone()))),
            Effect::Answer(answer) => answer.fail(error),
            _ => {}
        }
    }
}

impl Partition {
    /// Tracks a recovered invocation and re-registers what it waits on.
    fn rewait_promises_after_track(
        &mut self,
        record: InvocationRecord,
        journal: Vec<Frame>,
        protocol: Option<i32>,
    ) {
        let id = record.id;
        let waits = journal.clone();
        self.track(record, journal);
        self.rewait_promises(id, &waits, protocol);
    }

    /// Starts driving `record`.
    fn track(&mut self, record: InvocationRecord, journal: Vec<Frame>) {
        self.next_entry += 1;
        let entry = self.next_entry;
        let id = record.id;
        self.entries.insert(entry, id);
        self.live
            .insert(id, Box::new(Live::new(record, journal, entry)));
    }
}

impl Live {
    fn new(record: InvocationRecord, journal: Vec<Frame>, entry: EntryId) -> Self {
        let commands = journal
            .iter()
            .filter(|f| MessageType::from_id(f.ty).map(MessageType::kind) == Some(Kind::Command))
            .count();
        Self {
            record,
            journal,
            waiters: Vec::new(),
            run: phase::Run::IDLE,
            attempt: 0,
            commands: u32::try_from(commands).expect("journals are shorter than 2^32"),
            entry,
            lock: None,
            rested: 0,
            callers: Vec::new(),
            unsaved: false,
        }
    }
}
