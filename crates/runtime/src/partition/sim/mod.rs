//! The partition, simulated: the real state machine and the real store (redb on a simulated
//! disk), driven by a seeded script instead of tokio, the wall clock and HTTP. The script submits
//! calls, sends, idempotent repeats and delayed sends; runs attempts as an SDK would (journal
//! replay, `ctx.run`, sleeps, calls, state writes) and fails some of them; moves time; changes the
//! rule book; kills, pauses and resumes; fails the disk in the middle of commits; and crashes —
//! all memory dropped, unsynced writes lost, the partition rebuilt from the store. Half the
//! runs are in cluster mode (`cluster.rs`): writes go through a partition log first, and
//! leadership changes hands, with the old leader running on as a zombie whose records land
//! after the new epoch; the new leader rebuilds its store from the log on a fresh disk. The
//! other half are embedded: writes go through the real local log on simulated segment files,
//! appended, synced and applied to the view at the world's pace, and a crash tears the log's
//! unsynced tail; the store replays the log as it reopens.
//!
//! Calls (a caller waiting for the outcome, with an id nobody else knows) are stored only at the
//! first point anything depends on them; once a call is answered, its outcome is in the store.
//!
//! After every step it checks what the partition promises: no acknowledged invocation is lost;
//! nothing is acknowledged as new twice; a completed invocation never runs again; a `ctx.run`
//! whose result was journaled is never executed again; object locks, invoker slots, scope
//! limits and scope rates hold; a scope's budget spent exactly what its ended calls reported,
//! each charged once; and once the faults stop, everything acknowledged completes.
//! Across leadership changes the same checks hold on the new leader's store: nothing a zombie
//! acknowledged may be missing there (acknowledging a refused record is a mutation it
//! catches).
//!
//! A failing run prints its seed; `SLUICE_SIM_SEED=<seed> cargo test -p sluice-runtime partition::sim`
//! replays it exactly (the same seed gives the same events, see
//! `a_seed_replays_the_same_run`).

mod checks;
mod cluster;
mod disk;
mod script;
mod sdk;
mod world;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::driver::{Driver, Started};
use super::model::effect::Effect;
use super::model::events::Event;
use super::model::operator::Control;
use super::run_loop::Input;
use super::task::Partition;
use crate::discovery::manifest::Manifest;
use crate::discovery::{Discovered, HttpVersion};
use crate::invoker::{AttemptError, AttemptRequest, Ending};
use crate::registry::{Registration, Registry};
use sluice_config::{Config, FriendlyDuration, OnMaxAttempts, RetryPolicy};
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_flow::rules::Upsert;
use sluice_flow::{Limit, RuleBook, RulePattern, Scope};
use sluice_protocol::proto;
use sluice_protocol::{Frame, Message, MessageType};
use sluice_store::invocation::new::{Identity, NewInvocation};
use sluice_store::invocation::store as records;
use sluice_store::invocation::{InvocationRecord, Outcome, Status, Target, state};
use sluice_store::storage::Store;
use sluice_store::storage::local::appender::LoggedFlusher;
use sluice_store::storage::view::ViewFlusher;
use sluice_store::storage::writer::{Commit, Writer};

use disk::{Disk, LogDisk};
use sluice_core::simulation::{Rng, seed};

/// Simulated time starts here (a plausible epoch milliseconds value).
const EPOCH_MS: u64 = 1_800_000_000_000;

/// Object keys of `Obj`: few, so invocations contend for their locks.
const OBJECT_KEYS: [&str; 3] = ["a", "b", "c"];

/// Idempotency keys: few, so repeats are frequent.
const IDEMPOTENCY_KEYS: u64 = 40;

/// Write sets a partition may have waiting for their commit (as in its run loop).
const IN_FLIGHT: usize = super::run_loop::IN_FLIGHT;

/// What the partition asked of the world since the simulator last looked.
#[derive(Default)]
struct Outbox {
    started: Vec<Started>,
    posted: Vec<Event>,
}

/// The simulator's driver: its clock, and a mailbox instead of tasks.
struct SimDriver {
    now: Arc<AtomicU64>,
    outbox: Arc<Mutex<Outbox>>,
}

impl Driver for SimDriver {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    fn start(&self, attempt: Started) {
        self.outbox.lock().unwrap().started.push(attempt);
    }

    fn post(&self, _id: InvocationId, event: Event) {
        // One partition: every invocation is its own.
        self.outbox.lock().unwrap().posted.push(event);
    }

    fn nudge(&self, _waiting: u64, _from: u32) {}
}

/// An attempt the deployment is running.
struct Running {
    id: InvocationId,
    attempt: u32,
    request: AttemptRequest,
}

/// How a node's write sets reach its store.
enum Flush {
    /// Cluster mode: answered into the view's backlog once the record landed (the partition
    /// log is Kafka's, `cluster.rs`), applied at the world's pace.
    View(ViewFlusher),
    /// Embedded mode: the real local log and its view, stage by stage.
    Logged(Box<LoggedFlusher>),
}

impl Flush {
    /// Moves every set queued so far all the way to the store.
    fn flush(&mut self) {
        match self {
            Self::View(flusher) => {
                flusher.apply(usize::MAX, false);
            }
            Self::Logged(flusher) => {
                flusher.flush(false);
            }
        }
    }
}

/// One life of the process: everything a crash drops.
struct Node {
    partition: Partition,
    flusher: Flush,
    /// Cluster mode: the leader this node is, and its writes' way through the log.
    leading: Option<cluster::SimLeading>,
    store: Arc<Store>,
    pending: VecDeque<(Commit, Vec<Effect>)>,
    /// Submissions waiting for their answer.
    replies: Vec<(InvocationId, oneshot::Receiver<Result<bool, CodedError>>)>,
    /// Calls (and attaches) waiting for their outcome.
    calls: Vec<(InvocationId, oneshot::Receiver<Outcome>)>,
    /// Attaches waiting for the partition to take them.
    #[allow(clippy::type_complexity)]
    attaches: Vec<(
        InvocationId,
        oneshot::Receiver<Result<oneshot::Receiver<Outcome>, CodedError>>,
    )>,
    attempts: Vec<Running>,
}

/// What a client was told about one invocation.
struct Acked {
    /// Answers "created" it received (at most one may ever say so).
    created: u32,
    /// Answers "stored" of either kind (created, or exists already).
    acks: u32,
    target: Target,
    program: Bytes,
}

/// A submission the script may repeat (idempotency keys).
#[derive(Clone)]
struct Submission {
    record: InvocationRecord,
    input: Frame,
}

/// How a run went.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    events: u64,
    attempts: u64,
    executions: u64,
    crashes: u64,
    disk_failures: u64,
    acked: u64,
    /// Calls answered with their outcome.
    answered: u64,
    completed: u64,
    /// Cluster mode: leadership changes, and records of a zombie refused.
    takeovers: u64,
    fenced: u64,
    /// Cluster mode: records the broker refused, and the most a leader had in flight.
    refused: u64,
    most_in_flight: usize,
    /// Children of scoped callers found under their caller's scope.
    inherited: u64,
    /// What `s1`'s budget spent, checked against what its ended calls were charged.
    charged: u64,
}

/// The simulated world: one partition, its disk and its clients.
struct World {
    rng: Rng,
    disk: Disk,
    /// Embedded mode: the local log's segments (the store on `disk` is its view).
    log_disk: LogDisk,
    /// Cluster mode (half the runs): the partition log the store replicates.
    log: Option<cluster::SimLog>,
    /// The next start is another node's: a fresh disk, rebuilt from the log.
    fresh_disk: bool,
    /// The metadata tables (the deployment), as a new node gets them.
    meta: sluice_store::storage::meta::MetaSnapshot,
    now: Arc<AtomicU64>,
    outbox: Arc<Mutex<Outbox>>,
    config: Arc<Config>,
    /// The rule book as the rules API publishes it: the partition takes it on its own, as it
    /// does in the run loop (never handed to it directly).
    rules: tokio::sync::watch::Sender<Arc<RuleBook>>,
    /// The concurrency limit of scope `s1` (`None`: unlimited).
    s1_limit: Option<u32>,
    /// The rate of scope `s1`, and when invocations of `s1` took their tokens (first attempts)
    /// since the rate was set or the process restarted (a restart fills the bucket).
    s1_rate: Option<sluice_flow::RateLimit>,
    s1_admitted: VecDeque<u64>,
    /// Invocations an attempt ever started for, across restarts: the others' next start is a
    /// new admission, which takes a token (a retry or a resumption takes none).
    ever_started: std::collections::BTreeSet<InvocationId>,
    node: Option<Node>,
    /// Events on their way to the partition.
    inbox: Vec<Event>,
    acked: BTreeMap<InvocationId, Acked>,
    /// Completed invocations whose retention was up and that the purger removed.
    purged: std::collections::BTreeSet<InvocationId>,
    /// What completed invocations of scope `s1` whose purge was written were charged (their
    /// records' `cost`), by their purge, until the store says whether the purge landed.
    s1_purging: Vec<(records::DuePurge, u64)>,
    /// What purged invocations of `s1` were charged: with what the completed ones in the store
    /// were, what `s1`'s budget must have spent.
    s1_retired: u64,
    idempotent: BTreeMap<u64, Submission>,
    /// Every other submission, to hand in again.
    submitted: Vec<Submission>,
    /// Outcomes calls were answered with: each must be in the store for good.
    answered: BTreeMap<InvocationId, Outcome>,
    /// Executions of each `ctx.run`, by invocation and completion id.
    executions: BTreeMap<(InvocationId, u32), u32>,
    stats: Stats,
    /// A digest of everything that happened, to show a seed replays.
    trace: std::collections::hash_map::DefaultHasher,
}

fn manifest() -> Manifest {
    let json = serde_json::json!({
        "protocolMode": "REQUEST_RESPONSE", "minProtocolVersion": 7, "maxProtocolVersion": 7,
        "services": [
            {"name": "Svc", "ty": "SERVICE", "handlers": [{"name": "run"}]},
            {"name": sdk::LEAF, "ty": "SERVICE", "handlers": [{"name": "run"}]},
            {"name": "Obj", "ty": "VIRTUAL_OBJECT", "handlers": [{"name": "add"}]}
        ]
    });
    Manifest::parse(json.to_string().as_bytes()).expect("the simulator's manifest")
}

fn target(service: &str, handler: &str, key: Option<&str>) -> Target {
    Target {
        service: service.into(),
        handler: handler.into(),
        key: key.map(str::to_owned),
    }
}

fn input_program(input: &Frame) -> Bytes {
    match Message::decode(input, sluice_protocol::ProtocolVersion::V7) {
        Ok(Message::Input(input)) => input.value.unwrap_or_default().content,
        _ => Bytes::new(),
    }
}

/// Scope `s1`'s rule without limits: a budget too large to hold anything (its checks are that
/// each ended call is charged exactly once, up to what one call may charge), with a
/// reservation per call, over the month the simulation runs in.
fn s1_rule() -> Upsert {
    let mut rule = Upsert::new(RulePattern::parse("s1").unwrap(), Limit::Unlimited);
    rule.budget = Some(sluice_flow::Budget {
        limit: sluice_flow::Quota {
            amount: std::num::NonZeroU64::new(1 << 60).expect("not zero"),
            window: sluice_flow::QuotaWindow::Month,
            reject: false,
        },
        reserve: std::num::NonZeroU64::new(S1_RESERVE),
    });
    rule
}

/// What one call reserves of `s1`'s budget, and so the most one call may charge to it: the
/// simulated handlers report 7 × their step's completion id, some under it and some over.
const S1_RESERVE: u64 = 20;

/// The book the simulation starts with: `s1`'s rule.
fn first_book() -> RuleBook {
    let mut book = RuleBook::new();
    book.apply_batch(&[s1_rule()], EPOCH_MS)
        .expect("a valid rule");
    book
}

/// What a completed invocation of scope `s1` was charged (0 for any other).
fn s1_cost(record: &InvocationRecord) -> u64 {
    if record.status == Status::Completed
        && record.scope.as_ref().is_some_and(|s| s.as_str() == "s1")
    {
        record.cost.unwrap_or(0).min(S1_RESERVE)
    } else {
        0
    }
}

fn limit_of(limit: Option<u32>) -> Limit {
    limit
        .and_then(NonZeroU32::new)
        .map_or(Limit::Unlimited, Limit::Concurrency)
}

/// Runs `steps` steps from `seed`, then settles; how it went and the digest of its events.
fn run(seed: u64, steps: u64) -> (Stats, u64) {
    let mut world = World::new(seed);
    for _ in 0..steps {
        world.step();
    }
    world.settle();
    if let Some(log) = &world.log {
        world.stats.takeovers = log.takeovers;
        world.stats.fenced = log.fenced;
        world.stats.refused = log.refused;
        world.stats.most_in_flight = log.most_in_flight;
    }
    (world.stats, world.trace.finish())
}

/// Partition events per `cargo test` run unless `SLUICE_SIM_EVENTS` says otherwise. Each goes
/// through real redb commits and JSON records, about 40 µs of wall time per event in a debug
/// build on the 2-core box with both cores at work (this crate is optimised even in debug
/// builds, see the workspace's Cargo.toml), so this takes about 40 s there; see
/// docs/durability.md.
const DEFAULT_EVENTS: u64 = 1_000_000;

/// Steps of one run: a few thousand events, then it settles.
const RUN_STEPS: u64 = 2_000;

/// What the workers of one test share: the next run's seed, and how far they got.
struct Runs {
    seeds: Rng,
    started: u64,
    total: Stats,
    failed: bool,
}

/// Takes runs from `runs` until they hold `wanted` events (or one failed): each run's seed is
/// the next of one sequence, so the same test seed gives the same runs on any number of threads.
fn work(runs: &Mutex<Runs>, wanted: u64, seed: u64) {
    loop {
        let (index, run_seed) = {
            let mut runs = runs.lock().unwrap();
            if runs.failed || runs.total.events >= wanted {
                return;
            }
            runs.started += 1;
            (runs.started - 1, runs.seeds.next_u64())
        };
        let stats = match std::panic::catch_unwind(|| run(run_seed, RUN_STEPS)) {
            Ok((stats, _)) => stats,
            Err(panic) => {
                runs.lock().unwrap_or_else(|p| p.into_inner()).failed = true;
                eprintln!(
                    "partition simulator failed in run {index}: SLUICE_SIM_SEED={seed} replays the whole test, SLUICE_SIM_RUN={run_seed} this run alone"
                );
                std::panic::resume_unwind(panic);
            }
        };
        let mut runs = runs.lock().unwrap();
        let total = &mut runs.total;
        total.events += stats.events;
        total.attempts += stats.attempts;
        total.executions += stats.executions;
        total.answered += stats.answered;
        total.crashes += stats.crashes;
        total.disk_failures += stats.disk_failures;
        total.acked += stats.acked;
        total.completed += stats.completed;
        total.takeovers += stats.takeovers;
        total.fenced += stats.fenced;
        total.refused += stats.refused;
        total.most_in_flight = total.most_in_flight.max(stats.most_in_flight);
        total.inherited += stats.inherited;
        total.charged += stats.charged;
    }
}

/// Runs of a few thousand steps each, from seeds derived from one, on every core; a failure
/// names the seed that replays it (`SLUICE_SIM_RUN` replays one run alone).
#[test]
fn simulator_partition_events() {
    if let Some(run_seed) = std::env::var("SLUICE_SIM_RUN")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        let (stats, _) = run(run_seed, RUN_STEPS);
        println!("partition simulator run {run_seed}: {stats:?}");
        return;
    }
    let seed = seed();
    println!("partition simulator seed: {seed} (SLUICE_SIM_SEED={seed} replays it)");
    let wanted = sluice_core::simulation::events(DEFAULT_EVENTS);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let started = std::time::Instant::now();
    let runs = Mutex::new(Runs {
        seeds: Rng(seed),
        started: 0,
        total: Stats::default(),
        failed: false,
    });
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| scope.spawn(|| work(&runs, wanted, seed)))
            .collect();
        for worker in workers {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    let runs = runs.into_inner().unwrap();
    let total = runs.total;
    println!(
        "partition simulator: {} events in {} runs on {threads} threads ({:?}): {} acknowledged, {} calls answered, {} completed, {} attempts, {} ctx.run executions, {} crashes, {} disk failures, {} leadership changes, {} zombie records refused, {} records the broker refused, up to {} records in flight, {} calls under their caller's scope, {} charged to a budget",
        total.events,
        runs.started,
        started.elapsed(),
        total.acked,
        total.answered,
        total.completed,
        total.attempts,
        total.executions,
        total.crashes,
        total.disk_failures,
        total.takeovers,
        total.fenced,
        total.refused,
        total.most_in_flight,
        total.inherited,
        total.charged,
    );
    // A million events walk every move of the transition table (the rarest, an admitted
    // invocation whose resting journal a failed store cannot give back, about ten times): each
    // is a move the partition really makes.
    if total.events >= DEFAULT_EVENTS {
        let walked = super::model::phase::WALKED.lock().unwrap();
        for &(from, to, _) in super::model::phase::TRANSITIONS {
            assert!(
                walked.contains_key(&(from, to)),
                "the simulator never moved an invocation from {} to {}",
                from.name(),
                to.name()
            );
        }
    }
    if std::env::var_os("SLUICE_PHASE_LEARN").is_some() {
        let walked = super::model::phase::WALKED.lock().unwrap();
        for (&(from, to), times) in walked.iter() {
            let listed = if super::model::phase::allowed(from, to) {
                ""
            } else {
                " (not in the table)"
            };
            println!(
                "walked {times} times: {} -> {}{listed}",
                from.name(),
                to.name()
            );
        }
        for &(from, to, _) in super::model::phase::TRANSITIONS {
            if !walked.contains_key(&(from, to)) {
                println!("not walked: {} -> {}", from.name(), to.name());
            }
        }
    }
    assert!(total.events >= wanted);
    assert!(total.crashes > 0 && total.disk_failures > 0 && total.completed > 0);
    assert!(total.takeovers > 0, "no run changed leaders");
    assert!(total.refused > 0, "the broker never refused a record");
    assert!(
        total.most_in_flight > 1,
        "no leader had several records in flight"
    );
    assert!(total.inherited > 0, "no scoped handler made a call");
    assert!(total.charged > 0, "no call reported a cost to a budget");
}

#[test]
fn a_seed_replays_the_same_run() {
    let seed = seed();
    let first = run(seed, 1_500);
    let again = run(seed, 1_500);
    assert_eq!(first.1, again.1, "seed {seed} gave two different runs");
    assert_eq!(first.0.events, again.0.events);
}
