//! One partition's state (`Partition`), what partitions of a process share (`Shared`), and
//! recovery: loading the unfinished invocations from the store and continuing them.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use super::live::Live;
#[cfg(test)]
use super::model::phase;
use super::{driver, parts};
use crate::registry::Registry;
use sluice_config::Config;
use sluice_core::ids::InvocationId;
use sluice_flow::RuleBook;
use sluice_flow::scheduler::Scheduler;
use sluice_flow::slots::InvokerSlots;
use sluice_protocol::Frame;
use sluice_store::invocation::InvocationRecord;
use sluice_store::invocation::store::Timer;
use sluice_store::storage::Store;
use sluice_store::storage::writer::{Commit, WriteSet, Writer};

/// One partition's state.
pub struct Partition {
    /// What the partition runs among: its number, the store and its writer, the registry,
    /// the configuration, and the driver (the clock, the deployments, the other partitions).
    pub(super) outside: Outside,
    /// Boxed: a held backlog keeps the map's spare capacity at pointer size, not `Live` size.
    pub(super) live: HashMap<InvocationId, Box<Live>>,
    /// Held invocations at rest in a compact form, and what follows them.
    pub(super) resting: parts::resting::Resting,
    /// Invocations that suspended (or whose journal was read back while suspended) since
    /// their journals last went to rest.
    pub(super) journals_to_rest: Vec<InvocationId>,
    /// The scheduler and what admission keeps beside it.
    pub(super) admission: Admission,
    pub(super) promises: parts::promises::Promises,
    /// Which invocation holds each of the scheduler's entries.
    pub(super) entries: parts::entries::Entries,
    /// Wake-ups (delays, back-offs, timers) in time order: one heap entry each, not a task
    /// each, so 100,000 delayed sends cost a few MB.
    pub(super) wakes: BinaryHeap<Reverse<(u64, InvocationId, Option<Timer>)>>,
    /// What the attempts being started write, and its commits made outside a batch.
    pub(super) starting: Starting,
    /// Test builds: the states last seen, to check every move against the transition table.
    #[cfg(test)]
    pub(super) watch: phase::Watch,
}

/// What a partition runs among.
pub(super) struct Outside {
    pub(super) index: u32,
    pub(super) store: Arc<Store>,
    pub(super) writer: Writer,
    pub(super) registry: Arc<Registry>,
    pub(super) config: Arc<Config>,
    /// The clock, the deployments and the other partitions.
    pub(super) driver: Box<dyn driver::Driver>,
}

/// The scheduler, the rule book it follows, and what admission keeps between batches.
pub(super) struct Admission {
    pub(super) scheduler: Scheduler,
    /// The rule book as published (the rules API publishes before it answers): looked at
    /// before anything is admitted, so a book published before an event was sent is the book
    /// that event is admitted under, whatever the run loop's select picked first.
    pub(super) rules: Option<tokio::sync::watch::Receiver<Arc<RuleBook>>>,
    /// Invocations the scheduler dropped past their deadline, until their failure is
    /// written (a wake-up of the next batch).
    pub(super) missed_deadlines: HashMap<InvocationId, sluice_flow::scheduler::Deadline>,
    /// Invocations a rule's `on_full` named, until a wake-up of the next batch ends them
    /// (`crowds.rs`).
    pub(super) crowded: HashMap<InvocationId, super::crowds::Crowded>,
    /// The run of each burst of debounced calls waiting for its time, by the burst's key
    /// (`debounce.rs`); taken again at recovery from the records.
    pub(super) debounced: HashMap<String, InvocationId>,
    /// Budget charges of the write set being built (`charges.rs`): taken back if it is
    /// dropped.
    pub(super) unstored_charges: Vec<(sluice_flow::scheduler::QueueKey, u64)>,
}

/// What the attempts being started write (their pinned deployment and status).
#[derive(Default)]
pub(super) struct Starting {
    /// The deployment must be durable before the journal grows on it, and the status is what
    /// the admin API shows. Committed as one set at the end of the dispatch that starts them;
    /// the writer keeps this partition's sets in order, so later batches commit after it.
    pub(super) pins: WriteSet,
    /// Commits of those sets made outside a batch: the run loop awaits them with the batches'
    /// (`adopt_detached`), so a failed one stops the partition like any other.
    pub(super) detached: Vec<Commit>,
}

/// What the partitions of one process share: the store and its writer, the registry, the
/// configuration, the invoker's slots and the memory budget of held invocations.
#[derive(Debug, Clone)]
pub struct Shared {
    pub(super) store: Arc<Store>,
    pub(super) writer: Writer,
    pub(super) registry: Arc<Registry>,
    pub(super) config: Arc<Config>,
    pub(super) slots: Arc<InvokerSlots>,
    pub(super) held: Arc<parts::dormant::HeldMemory>,
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
        let held = Arc::new(
            parts::dormant::HeldMemory::new(config.worker.held_memory_budget.0)
                .bounding_journals_by(config.worker.running_journals_budget.0),
        );
        let drain = &config.worker.invoker.drain;
        registry.configure_pacing(sluice_flow::pacing::PacingConfig {
            enabled: drain.enabled,
            initial_window: drain.initial_window.get(),
            open_window: drain.open_window.get(),
            max_closed_ms: u64::try_from(drain.max_closed.0.as_millis()).unwrap_or(u64::MAX),
            max_probe_ms: u64::try_from(drain.max_probe_interval.0.as_millis()).unwrap_or(u64::MAX),
        });
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
            outside: Outside {
                index,
                store: Arc::clone(&shared.store),
                writer: shared.writer.clone(),
                registry: Arc::clone(&shared.registry),
                config: Arc::clone(&shared.config),
                driver,
            },
            live: HashMap::new(),
            resting: parts::resting::Resting::new(Arc::clone(&shared.held)),
            journals_to_rest: Vec::new(),
            admission: Admission {
                scheduler: Scheduler::sharing(
                    Arc::new(RuleBook::new()),
                    Arc::clone(&shared.slots),
                    index,
                )
                .with_gates(Arc::clone(shared.registry.gates()))
                .with_deadline_horizon(
                    u64::try_from(shared.config.flow.deadline_horizon.0.as_millis())
                        .unwrap_or(u64::MAX),
                )
                .with_idle_quota_cap(
                    shared.config.flow.max_idle_quota_counters,
                    shared.config.flow.max_idle_quota_counters_per_scope,
                ),
                rules: None,
                missed_deadlines: HashMap::new(),
                crowded: HashMap::new(),
                debounced: HashMap::new(),
                unstored_charges: Vec::new(),
            },
            promises: parts::promises::Promises::default(),
            entries: parts::entries::Entries::default(),
            wakes: BinaryHeap::new(),
            starting: Starting::default(),
            #[cfg(test)]
            watch: phase::Watch::default(),
        }
    }

    /// Every debug build: checks the invocations that moved since the last look against the
    /// transition table (`live::check_moves`). Test builds also watch every invocation,
    /// resting and gone ones too, and count the moves made.
    pub(super) fn observe(&mut self) {
        super::live::check_moves(&mut self.live);
        #[cfg(test)]
        self.watch_all();
    }

    #[cfg(test)]
    fn watch_all(&mut self) {
        self.resting.assert_consistent();
        let live = self
            .live
            .iter()
            .map(|(id, live)| (*id, phase::state_of(live.record().status, live.run())));
        let resting = self
            .resting
            .iter()
            .map(|(id, _)| (*id, Ok(phase::State::Resting)));
        let mut watch = std::mem::take(&mut self.watch);
        watch.look(live.chain(resting));
        self.watch = watch;
    }

    /// Follows the books `changes` publishes, starting from its current one (before recovery,
    /// so recovered invocations queue under it). Taking the first book from the receiver
    /// itself leaves no gap between reading the book and subscribing to its changes.
    pub fn follow_rules(&mut self, mut changes: tokio::sync::watch::Receiver<Arc<RuleBook>>) {
        let book = Arc::clone(&changes.borrow_and_update());
        self.admission
            .scheduler
            .on_rules_changed(book, self.outside.driver.now_ms());
        self.admission.rules = Some(changes);
    }

    /// Takes a book published since the last look. Called before every admission decision
    /// (applying a batch, running committed effects, dispatching), so the invariant does not
    /// depend on the order the run loop notices things in. Cheap: one atomic load when
    /// nothing changed.
    pub(super) fn refresh_rules(&mut self) {
        if let Some(changes) = self.admission.rules.as_mut()
            && changes.has_changed().unwrap_or(false)
        {
            let book = Arc::clone(&changes.borrow_and_update());
            self.admission
                .scheduler
                .on_rules_changed(book, self.outside.driver.now_ms());
        }
    }
}

impl Partition {
    /// Tracks a recovered invocation and re-registers what it waits on.
    pub(super) fn track_recovered(
        &mut self,
        record: InvocationRecord,
        journal: Vec<Frame>,
        protocol: Option<i32>,
    ) {
        self.rewait_promises(record.id, &record.target, &journal, protocol);
        self.track(record, journal);
    }

    /// Starts driving `record`.
    pub(super) fn track(&mut self, record: InvocationRecord, journal: Vec<Frame>) {
        let id = record.id;
        let entry = self.entries.issue(id);
        self.live
            .insert(id, Box::new(Live::new(record, journal, entry)));
    }
}
