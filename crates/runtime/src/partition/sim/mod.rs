//! The partition, simulated: the real state machine and the real store (redb on a simulated
//! disk), driven by a seeded script instead of tokio, the wall clock and HTTP. The script submits
//! calls, sends, idempotent repeats and delayed sends; runs attempts as an SDK would (journal
//! replay, `ctx.run`, sleeps, calls, state writes) and fails some of them; moves time; changes the
//! rule book; kills, pauses and resumes; fails the disk in the middle of commits; and crashes —
//! all memory dropped, unsynced writes lost, the partition rebuilt from the store.
//!
//! After every step it checks what the partition promises: no acknowledged invocation is lost;
//! nothing is acknowledged as new twice; a completed invocation never runs again; a `ctx.run`
//! whose result was journaled is never executed again; object locks, invoker slots and scope
//! limits hold; and once the faults stop, everything acknowledged completes.
//!
//! A failing run prints its seed; `SLUICE_SIM_SEED=<seed> cargo test -p sluice partition::sim`
//! replays it exactly (the same seed gives the same events, see
//! `a_seed_replays_the_same_run`).

mod disk;
mod sdk;

use std::collections::{BTreeMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::driver::{Driver, Started};
use super::{Effect, Event, Partition, control::Control, fail};
use crate::config::{Config, FriendlyDuration, OnMaxAttempts, RetryPolicy};
use crate::discovery::manifest::Manifest;
use crate::discovery::{Discovered, HttpVersion};
use crate::errors::{Code, CodedError};
use crate::flow::rules::Upsert;
use crate::flow::{Limit, RuleBook, RulePattern, Scope};
use crate::ids::InvocationId;
use crate::invocation::new::{Identity, NewInvocation};
use crate::invocation::store as records;
use crate::invocation::{InvocationRecord, Outcome, Status, Target, state};
use crate::invoker::{AttemptError, AttemptRequest, Ending};
use crate::protocol::proto;
use crate::protocol::{Frame, Message, MessageType};
use crate::registry::{Registration, Registry};
use crate::storage::Store;
use crate::storage::writer::{Commit, Flusher, Writer};

use crate::simulation::{Rng, seed};
use disk::Disk;

/// Simulated time starts here (a plausible epoch milliseconds value).
const EPOCH_MS: u64 = 1_800_000_000_000;

/// Object keys of `Obj`: few, so invocations contend for their locks.
const OBJECT_KEYS: [&str; 3] = ["a", "b", "c"];

/// Idempotency keys: few, so repeats are frequent.
const IDEMPOTENCY_KEYS: u64 = 40;

/// Write sets a partition may have waiting for their commit (as in its run loop).
const IN_FLIGHT: usize = super::IN_FLIGHT;

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

/// One life of the process: everything a crash drops.
struct Node {
    partition: Partition,
    flusher: Flusher,
    store: Arc<Store>,
    pending: VecDeque<(Commit, Vec<Effect>)>,
    /// Submissions waiting for their answer.
    replies: Vec<(InvocationId, oneshot::Receiver<Result<bool, CodedError>>)>,
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
    completed: u64,
}

/// The simulated world: one partition, its disk and its clients.
struct World {
    rng: Rng,
    disk: Disk,
    now: Arc<AtomicU64>,
    outbox: Arc<Mutex<Outbox>>,
    config: Arc<Config>,
    book: Arc<RuleBook>,
    /// The concurrency limit of scope `s1` (`None`: unlimited).
    s1_limit: Option<u32>,
    node: Option<Node>,
    /// Events on their way to the partition.
    inbox: Vec<Event>,
    acked: BTreeMap<InvocationId, Acked>,
    /// Completed invocations whose retention was up and that the purger removed.
    purged: std::collections::BTreeSet<InvocationId>,
    idempotent: BTreeMap<u64, Submission>,
    /// Every other submission, to hand in again.
    submitted: Vec<Submission>,
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

impl World {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let mut config = Config {
            experimental_enable_protocol_v7: true,
            experimental_enable_vqueues: true,
            ..Config::default()
        };
        // Completed invocations leave the store soon, so the purger works while faults happen
        // (and restarts stay quick).
        config.worker.completion_retention = FriendlyDuration::from_secs(20);
        let invoker = &mut config.worker.invoker;
        invoker.concurrent_invocations_limit = NonZeroU32::new(2 + rng.below(8) as u32).unwrap();
        invoker.retry_policy = RetryPolicy {
            initial_interval: FriendlyDuration::from_millis(10),
            exponentiation_factor: 2.0,
            max_interval: FriendlyDuration::from_secs(2),
            max_attempts: NonZeroU32::new(6).unwrap(),
            on_max_attempts: OnMaxAttempts::Pause,
        };
        let disk = Disk::default();
        let mut world = Self {
            rng,
            disk,
            now: Arc::new(AtomicU64::new(EPOCH_MS)),
            outbox: Arc::default(),
            config: Arc::new(config),
            book: Arc::new(RuleBook::new()),
            s1_limit: None,
            node: None,
            inbox: Vec::new(),
            acked: BTreeMap::new(),
            purged: std::collections::BTreeSet::new(),
            idempotent: BTreeMap::new(),
            submitted: Vec::new(),
            executions: BTreeMap::new(),
            stats: Stats::default(),
            trace: std::collections::hash_map::DefaultHasher::new(),
        };
        // The deployment is registered once, before the first start.
        let store = Arc::new(Store::open_backend(world.disk.backend()).expect("a fresh store"));
        let registry = Registry::load(Arc::clone(&store)).expect("the registry");
        let found = Discovered {
            manifest: manifest(),
            manifest_version: 3,
            http_version: HttpVersion::Http2,
            sdk_version: None,
        };
        registry
            .register(found, Registration::new("http://127.0.0.1:9080/"), EPOCH_MS)
            .expect("the deployment registers");
        store.close();
        world.start();
        world
    }

    fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    fn node(&mut self) -> &mut Node {
        self.node.as_mut().expect("the node runs")
    }

    /// Starts the process on what the disk holds: the partition recovers from the store.
    fn start(&mut self) {
        *self.outbox.lock().unwrap() = Outbox::default();
        let store = Arc::new(Store::open_backend(self.disk.backend()).expect("the store reopens"));
        let registry = Arc::new(Registry::load(Arc::clone(&store)).expect("the registry loads"));
        let (writer, flusher) = Writer::manual(Arc::clone(&store));
        let shared = super::Shared::new(
            Arc::clone(&store),
            writer,
            registry,
            Arc::clone(&self.config),
        );
        let driver = SimDriver {
            now: Arc::clone(&self.now),
            outbox: Arc::clone(&self.outbox),
        };
        let mut partition = Partition::new(0, &shared, Box::new(driver));
        partition.follow_rules(Arc::clone(&self.book));
        partition
            .recover(|_| true)
            .expect("the partition recovers from what was committed");
        self.node = Some(Node {
            partition,
            flusher,
            store,
            pending: VecDeque::new(),
            replies: Vec::new(),
            attempts: Vec::new(),
        });
        // Nothing acknowledged is missing from the store.
        self.check_acked_are_stored();
        self.collect();
    }

    /// The process dies: memory is gone, and so is every write not yet synced.
    fn crash(&mut self) {
        self.stats.crashes += 1;
        self.trace.write_u8(b'X');
        // Whatever redb would write while closing never reaches the disk.
        self.disk.fail_after(0);
        if let Some(node) = self.node.take() {
            node.store.close();
            drop(node);
        }
        self.disk.crash();
        // Requests in flight die with their connections.
        self.inbox.clear();
        self.start();
    }

    fn check_acked_are_stored(&mut self) {
        let store = &self.node.as_ref().expect("the node runs").store;
        let purged = &self.purged;
        for (id, _) in self
            .acked
            .iter()
            .filter(|(id, a)| a.acks > 0 && !purged.contains(id))
        {
            let stored = store
                .with_db(|db| records::load_record(db, *id))
                .expect("the store is open")
                .expect("records read back");
            assert!(
                stored.is_some(),
                "invocation {id} was acknowledged but is not in the store after a restart"
            );
        }
    }

    /// Hands `events` to the partition. They wait in its channel with others a while (so batches
    /// hold several, as under load) unless `now`.
    fn deliver(&mut self, events: Vec<Event>, now: bool) {
        self.inbox.extend(events);
        if now || self.rng.chance(35) {
            self.pump();
        }
    }

    /// Applies what waits and whatever it leads to until the partition is idle; a failed commit
    /// stops the process, which then restarts from the store.
    fn pump(&mut self) {
        loop {
            let mut batch = std::mem::take(&mut self.inbox);
            batch.append(&mut std::mem::take(&mut self.outbox.lock().unwrap().posted));
            self.node().partition.due_wakes(&mut batch);
            let idle = batch.is_empty();
            if idle && self.node().pending.is_empty() {
                return;
            }
            if !idle {
                self.stats.events += batch.len() as u64;
                for event in &batch {
                    std::mem::discriminant(event).hash(&mut self.trace);
                }
                let node = self.node();
                node.partition.apply_batch(&mut batch, &mut node.pending);
            }
            // Sets wait for their commit a while, as they do behind a slow fsync.
            let hold = !idle && self.node().pending.len() < IN_FLIGHT && self.rng.chance(40);
            if !hold && !self.commit() {
                self.crash();
                return;
            }
            self.collect();
        }
    }

    /// Commits what is queued and runs what the commits release; false when a commit failed.
    fn commit(&mut self) -> bool {
        let node = self.node();
        node.flusher.flush();
        while let Some((commit, effects)) = node.pending.pop_front() {
            let mut commit = commit;
            match commit.try_recv() {
                Ok(Ok(())) => node.partition.run_effects(effects),
                Ok(Err(e)) => {
                    fail(effects, &e);
                    for (_, effects) in node.pending.drain(..) {
                        fail(effects, &e);
                    }
                    return false;
                }
                Err(_) => panic!("a flushed write set has no answer"),
            }
        }
        true
    }

    /// Takes in the partition's new attempts and the answers its clients got.
    fn collect(&mut self) {
        let started = std::mem::take(&mut self.outbox.lock().unwrap().started);
        for attempt in started {
            self.attempt_started(attempt);
        }
        let replies = std::mem::take(&mut self.node().replies);
        let mut waiting = Vec::new();
        for (id, mut reply) in replies {
            match reply.try_recv() {
                Ok(Ok(created)) => self.acknowledged(id, created),
                Ok(Err(_)) | Err(oneshot::error::TryRecvError::Closed) => {}
                Err(oneshot::error::TryRecvError::Empty) => waiting.push((id, reply)),
            }
        }
        self.node().replies = waiting;
    }

    fn acknowledged(&mut self, id: InvocationId, created: bool) {
        self.stats.acked += u64::from(created);
        id.hash(&mut self.trace);
        let acked = self.acked.get_mut(&id).expect("submissions are noted");
        // Purged once its retention was up, an id may be created anew.
        if created && self.purged.remove(&id) {
            acked.created = 0;
        }
        acked.created += u32::from(created);
        acked.acks += 1;
        assert!(
            acked.created <= 1,
            "invocation {id} was acknowledged as created {} times",
            acked.created
        );
    }

    /// Whether attempt `attempt` of `id` is the one the partition runs.
    fn current(&self, id: InvocationId, attempt: u32) -> bool {
        let node = self.node.as_ref().expect("the node runs");
        node.partition
            .live
            .get(&id)
            .is_some_and(|live| live.running && live.attempt == attempt)
    }

    fn attempt_started(&mut self, started: Started) {
        self.stats.attempts += 1;
        let Started {
            id,
            attempt,
            request,
            ..
        } = started;
        (id, attempt).hash(&mut self.trace);
        let request = match request {
            Ok(request) => request,
            Err(e) => panic!("attempt of {id} has no deployment: {e}"),
        };
        let node = self.node.as_ref().expect("the node runs");
        let stored = node
            .store
            .with_db(|db| records::load_record(db, id))
            .expect("the store is open")
            .expect("records read back");
        assert!(
            stored.is_none_or(|r| r.status != Status::Completed),
            "completed invocation {id} runs again"
        );
        // Drop attempts the partition gave up on (paused, killed, superseded).
        let mut attempts = std::mem::take(&mut self.node().attempts);
        attempts.retain(|a| self.current(a.id, a.attempt));
        let target = &request;
        if target.service == "Obj" {
            let other = attempts
                .iter()
                .find(|a| a.request.service == "Obj" && a.request.key == target.key);
            assert!(
                other.is_none(),
                "object {:?} runs {id} while {} holds its lock",
                target.key,
                other.map(|a| a.id).unwrap()
            );
        }
        let limit = self
            .config
            .worker
            .invoker
            .concurrent_invocations_limit
            .get();
        assert!(
            attempts.len() < limit as usize,
            "{} attempts run at once, the invoker allows {limit}",
            attempts.len() + 1
        );
        if let (Some("s1"), Some(limit)) = (target.scope.as_deref(), self.s1_limit) {
            let in_scope = attempts
                .iter()
                .filter(|a| a.request.scope.as_deref() == Some("s1"))
                .count();
            assert!(
                in_scope < limit as usize,
                "{} attempts run in scope s1, its rule allows {limit}",
                in_scope + 1
            );
        }
        attempts.push(Running {
            id,
            attempt,
            request,
        });
        self.node().attempts = attempts;
    }

    /// A `ctx.run` executes its side effect: never again once its result is journaled.
    fn execute(&mut self, id: InvocationId, completion: u32) -> Bytes {
        self.stats.executions += 1;
        let journal = self
            .node()
            .store
            .with_db(|db| records::load_journal(db, id))
            .expect("the store is open")
            .expect("journals read back");
        let journaled = journal.iter().any(|frame| {
            frame.ty == MessageType::RunCompletion.id()
                && super::journal::has_completion(std::slice::from_ref(frame), completion)
        });
        assert!(
            !journaled,
            "ctx.run {completion} of {id} executes again after its result was journaled"
        );
        let count = self.executions.entry((id, completion)).or_default();
        *count += 1;
        Bytes::from(format!("{id}.{completion}.{count}"))
    }

    /// The deployment runs one attempt to its end, or until a failure cuts it short.
    fn progress(&mut self, faults: bool) {
        let running = self.node().attempts.len() as u64;
        if running == 0 {
            return;
        }
        let pick = self.rng.below(running) as usize;
        let running = self.node().attempts.swap_remove(pick);
        if !self.current(running.id, running.attempt) {
            return;
        }
        let (id, attempt) = (running.id, running.attempt);
        let now = self.now();
        let mut executed = Vec::new();
        let turn = sdk::play(&running.request, now, |completion| {
            executed.push(completion);
            Bytes::new()
        })
        .unwrap_or_else(|e| panic!("attempt {attempt} of {id} cannot replay its journal: {e}"));
        // Side effects run (and are checked) in order, as the handler reaches them.
        let mut values = executed
            .iter()
            .map(|&c| self.execute(id, c))
            .collect::<Vec<_>>()
            .into_iter();
        let messages: Vec<Message> = turn
            .messages
            .into_iter()
            .map(|message| match message {
                Message::ProposeRunCompletion(mut proposal) => {
                    proposal.result = Some(proto::propose_run_completion_message::Result::Value(
                        values.next().expect("one value per execution"),
                    ));
                    Message::ProposeRunCompletion(proposal)
                }
                other => other,
            })
            .collect();
        let failure = if faults { self.rng.below(100) } else { 100 };
        let cut = if failure < 22 {
            self.rng.below(messages.len() as u64 + 1) as usize
        } else {
            messages.len()
        };
        let mut inbox: Vec<Event> = messages
            .into_iter()
            .take(cut)
            .map(|message| Event::AttemptMessage {
                id,
                attempt,
                message,
                ack: false,
            })
            .collect();
        let result = match failure {
            0..10 => Err(AttemptError {
                error: CodedError::new(Code::RT0010, "simulated connection reset"),
                retry_after: self
                    .rng
                    .chance(30)
                    .then(|| std::time::Duration::from_millis(self.rng.below(3_000))),
            }),
            10..20 => Ok(Ending::Failed(proto::ErrorMessage {
                code: 500,
                message: "simulated handler error".into(),
                next_retry_delay: self.rng.chance(30).then(|| self.rng.below(3_000)),
                ..proto::ErrorMessage::default()
            })),
            // The deployment stops answering in the middle: the attempt's end never comes
            // (a crash or a kill takes it away).
            20..22 => return self.deliver(inbox, false),
            _ => Ok(turn.ending),
        };
        inbox.push(Event::AttemptDone {
            id,
            attempt,
            result,
        });
        self.deliver(inbox, false);
    }

    /// A client submits a new invocation, repeats one with an idempotency key, or hands in
    /// again one it submitted before (a Kafka record delivered again after a restart: same id).
    fn submit(&mut self) {
        let now = self.now();
        let kind = self.rng.below(10);
        if kind == 0
            && let Some((_, repeat)) = self
                .idempotent
                .iter()
                .nth(self.rng.below(self.idempotent.len() as u64) as usize)
        {
            let repeat = repeat.clone();
            return self.hand_in(repeat);
        }
        if kind == 1 && !self.submitted.is_empty() {
            let again = self.submitted[self.rng.index(self.submitted.len())].clone();
            return self.hand_in(again);
        }
        let (target, scope) = match kind {
            0..=4 => {
                let scope = match self.rng.below(3) {
                    0 => None,
                    1 => Some("s1"),
                    _ => Some("s2"),
                };
                (target("Svc", "run", None), scope)
            }
            5..=7 => {
                let key = OBJECT_KEYS[self.rng.below(OBJECT_KEYS.len() as u64) as usize];
                (target("Obj", "add", Some(key)), None)
            }
            _ => (target("Svc", "run", None), Some("s1")),
        };
        let steps = 1 + self.rng.below(4);
        let mut program = Vec::new();
        for _ in 0..steps {
            let step = match self.rng.below(10) {
                0..=4 => b'r',
                5..=6 => b's',
                7 => b'c',
                _ if target.key.is_some() => b'w',
                _ => b'r',
            };
            program.push(step);
        }
        let idempotency = (kind == 9).then(|| self.rng.below(IDEMPOTENCY_KEYS));
        // Born through the same front door as the ingress's, handlers' and Kafka's invocations;
        // ids that are not idempotent come from the seed (a fresh id would not replay).
        let identity = match idempotency {
            Some(k) => Identity::Idempotent(format!("ik-{k}")),
            None => {
                let partition = self.rng.next_u64();
                let uuid = u128::from(self.rng.next_u64());
                Identity::Derived {
                    uuid,
                    partition: Some(partition),
                }
            }
        };
        let scope = scope.map(|s| Scope::parse(s).expect("the simulator's scopes are valid"));
        let mut new = NewInvocation::new(target, identity).in_scope(scope, None);
        if idempotency.is_some() {
            new.retention = Some(std::time::Duration::from_secs(24 * 60 * 60));
        }
        // Some sends are delayed.
        if self.rng.chance(15) {
            new.run_at_ms = Some(now + self.rng.below(5_000));
        }
        let record = new.into_record(now);
        let input = Message::Input(proto::InputCommandMessage {
            headers: Vec::new(),
            value: Some(proto::Value {
                content: Bytes::from(program),
            }),
            name: String::new(),
        })
        .to_frame(false);
        let submission = Submission { record, input };
        if idempotency.is_none() {
            self.submitted.push(submission.clone());
        }
        if let Some(k) = idempotency {
            // The first submission of a key stands for it; later ones repeat it.
            if let Some(first) = self.idempotent.get(&k) {
                return self.hand_in(first.clone());
            }
            self.idempotent.insert(k, submission.clone());
        }
        self.hand_in(submission);
    }

    fn hand_in(&mut self, submission: Submission) {
        let Submission { record, input } = submission;
        let id = record.id;
        let program = input_program(&input);
        self.acked.entry(id).or_insert_with(|| Acked {
            created: 0,
            acks: 0,
            target: record.target.clone(),
            program,
        });
        let (reply, answer) = oneshot::channel();
        self.node().replies.push((id, answer));
        self.deliver(
            vec![Event::Submit {
                record: Box::new(record),
                input,
                reply: Some(reply),
            }],
            false,
        );
    }

    /// An operator kills, pauses or resumes an invocation.
    fn control(&mut self) {
        let Some(id) = self
            .acked
            .keys()
            .nth(self.rng.below(self.acked.len() as u64) as usize)
            .copied()
        else {
            return;
        };
        let op = match self.rng.below(10) {
            0 => Control::Kill,
            1..=4 => Control::Pause,
            _ => Control::Resume,
        };
        let (reply, _) = oneshot::channel();
        self.deliver(vec![Event::Control { id, op, reply }], false);
    }

    /// The operator changes the limit of scope `s1`.
    fn change_rules(&mut self) {
        let limit = match self.rng.below(4) {
            0 => None,
            n => Some(n as u32),
        };
        self.s1_limit = limit;
        let mut book = RuleBook::new();
        let rule = limit_of(limit);
        book.apply_batch(
            &[Upsert::new(RulePattern::parse("s1").unwrap(), rule)],
            self.now(),
        )
        .expect("a valid rule");
        self.book = Arc::new(book);
        let now = self.now();
        let book = Arc::clone(&self.book);
        let partition = &mut self.node().partition;
        partition.scheduler.on_rules_changed(book, now);
        partition.dispatch();
        self.collect();
        self.pump();
    }

    /// The purger removes what completed invocations left, once their retention is up.
    fn purge(&mut self) {
        let now = self.now();
        let node = self.node();
        let due = node
            .store
            .with_db(|db| records::due_purges(db, now, 1_000))
            .expect("the store is open")
            .expect("purges read back");
        let mut writes = crate::storage::writer::WriteSet::default();
        for purge in &due {
            let record = node
                .store
                .with_db(|db| records::load_record(db, purge.invocation))
                .expect("the store is open")
                .expect("records read back");
            assert!(
                record.is_none_or(|r| r.status == Status::Completed),
                "the purger removes {} before it completed",
                purge.invocation
            );
            records::apply_purge(&mut writes, purge);
        }
        drop(node.partition.writer.commit(writes));
        for purge in due {
            if purge.what == records::Purge::Invocation {
                self.purged.insert(purge.invocation);
            }
        }
        if !self.commit() {
            return self.crash();
        }
        self.pump();
    }

    fn advance(&mut self, ms: u64) {
        self.now.fetch_add(ms, Ordering::Relaxed);
        self.pump();
    }

    /// One step of the script.
    fn step(&mut self) {
        match self.rng.below(1000) {
            0..150 => self.submit(),
            150..700 => self.progress(true),
            700..880 => {
                let ms = self.rng.below(1_500);
                self.advance(ms);
            }
            880..925 => self.control(),
            925..955 => self.change_rules(),
            955..965 => self.purge(),
            965..967 => self.crash(),
            967..969 => {
                // The disk fails somewhere in the next commits (a full disk, an I/O error).
                let after = self.rng.below(40) as u32;
                self.disk.fail_after(after);
                self.stats.disk_failures += 1;
            }
            _ => self.pump(),
        }
    }

    /// The faults stop: every acknowledged invocation must now complete.
    fn settle(&mut self) {
        // A restart first: it ends attempts the deployment stopped answering (as their
        // timeouts would) and a disk failure still counting down.
        self.crash();
        for round in 0..20_000 {
            let mut paused: Vec<InvocationId> = self
                .node()
                .partition
                .live
                .iter()
                .filter(|(_, live)| live.record.status == Status::Paused)
                .map(|(id, _)| *id)
                .collect();
            // In id order: a hash map's order differs between processes.
            paused.sort_unstable();
            for id in paused {
                let (reply, _) = oneshot::channel();
                self.deliver(
                    vec![Event::Control {
                        id,
                        op: Control::Resume,
                        reply,
                    }],
                    true,
                );
            }
            if !self.node().attempts.is_empty() {
                // Every attempt runs to its end; their events go in together.
                for _ in 0..self.node().attempts.len() {
                    self.progress(false);
                }
                self.pump();
                continue;
            }
            let node = self.node();
            let unfinished = node
                .partition
                .live
                .values()
                .any(|l| l.record.status != Status::Completed)
                || !node.partition.dormant.is_empty();
            if !unfinished {
                return self.check_completed();
            }
            let next = node
                .partition
                .wakes
                .peek()
                .map(|std::cmp::Reverse((at, _, _))| *at);
            let now = self.now();
            let wait = next.map_or(1_000, |at| at.saturating_sub(now).max(1));
            self.advance(wait);
            if round == 19_999 {
                panic!(
                    "acknowledged invocations never complete:\n{}",
                    self.unfinished()
                );
            }
        }
    }

    /// What is not done, for a failure's message.
    fn unfinished(&mut self) -> String {
        let partition = &self.node().partition;
        let mut out = String::new();
        for (id, live) in partition
            .live
            .iter()
            .filter(|(_, l)| l.record.status != Status::Completed)
            .take(8)
        {
            out += &format!(
                "{id} {:?} status {:?} running {} queued {} attempts {} journal {} waiting {:?}\n",
                live.record.target,
                live.record.status,
                live.running,
                live.queued,
                live.record.attempts,
                live.journal.len(),
                partition.waiting(*id)
            );
        }
        for (lock, entry) in partition.scheduler.held_locks() {
            let holder = partition.entries.get(&entry);
            let live = holder.and_then(|id| partition.live.get(id));
            out += &format!(
                "lock {:?} held by {holder:?}: {:?}\n",
                lock.object_key,
                live.map(|l| (
                    l.record.status,
                    l.running,
                    l.queued,
                    l.record.attempts,
                    l.lock.is_some()
                ))
            );
        }
        out += &format!(
            "{} at rest, {} wake-ups",
            partition.dormant.len(),
            partition.wakes.len()
        );
        out
    }

    /// Every acknowledged invocation completed, with its state writes.
    fn check_completed(&mut self) {
        let store = Arc::clone(&self.node().store);
        let purged = &self.purged;
        for (id, acked) in self
            .acked
            .iter()
            .filter(|(id, a)| a.acks > 0 && !purged.contains(id))
        {
            let record = store
                .with_db(|db| records::load_record(db, *id))
                .expect("the store is open")
                .expect("records read back")
                .unwrap_or_else(|| panic!("acknowledged invocation {id} is lost"));
            assert_eq!(
                record.status,
                Status::Completed,
                "acknowledged invocation {id} never completed"
            );
            self.stats.completed += 1;
            let killed = matches!(&record.outcome, Some(Outcome::Failure(f)) if f.code == 409);
            if acked.program.contains(&b'w') && !killed {
                let key = acked
                    .target
                    .key
                    .as_deref()
                    .expect("state writes are on objects");
                let object = state::Object {
                    scope: "",
                    service: &acked.target.service,
                    key,
                };
                let value = store
                    .with_db(|db| state::get(db, object, &sdk::state_key(*id)))
                    .expect("the store is open")
                    .expect("state reads back");
                assert!(
                    value.is_some(),
                    "invocation {id} completed without its state write"
                );
            }
        }
    }
}

fn target(service: &str, handler: &str, key: Option<&str>) -> Target {
    Target {
        service: service.into(),
        handler: handler.into(),
        key: key.map(str::to_owned),
    }
}

fn input_program(input: &Frame) -> Bytes {
    match Message::decode(input, crate::protocol::ProtocolVersion::V7) {
        Ok(Message::Input(input)) => input.value.unwrap_or_default().content,
        _ => Bytes::new(),
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
        total.crashes += stats.crashes;
        total.disk_failures += stats.disk_failures;
        total.acked += stats.acked;
        total.completed += stats.completed;
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
    let wanted = crate::simulation::events(DEFAULT_EVENTS);
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
        "partition simulator: {} events in {} runs on {threads} threads ({:?}): {} acknowledged, {} completed, {} attempts, {} ctx.run executions, {} crashes, {} disk failures",
        total.events,
        runs.started,
        started.elapsed(),
        total.acked,
        total.completed,
        total.attempts,
        total.executions,
        total.crashes,
        total.disk_failures,
    );
    assert!(total.events >= wanted);
    assert!(total.crashes > 0 && total.disk_failures > 0 && total.completed > 0);
}

#[test]
fn a_seed_replays_the_same_run() {
    let seed = seed();
    let first = run(seed, 1_500);
    let again = run(seed, 1_500);
    assert_eq!(first.1, again.1, "seed {seed} gave two different runs");
    assert_eq!(first.0.events, again.0.events);
}
