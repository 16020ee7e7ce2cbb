//! Fixture tests of the command handlers: given an invocation in a state and a command, exactly
//! these effects and this next state. The narrow handlers (a call's result, a timer, object
//! state) are given a bare `Live`; the others a real partition over a scratch store, whose
//! effects are run after each commit as the run loop runs them.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::super::driver::{Driver, Started};
use super::super::live::Live;
use super::super::model::effect::Effect;
use super::super::model::events::Event;
use super::super::model::operator::{Control, Controlled};
use super::super::model::phase::{Attempt, Run, State, state_of};
use super::super::task::Partition;
use super::super::task::Shared;
use super::{call_result, object_state, wake};
use crate::discovery::manifest::Manifest;
use crate::discovery::{Discovered, HttpVersion};
use crate::invoker::Ending;
use crate::registry::{Registration, Registry};
use sluice_config::Config;
use sluice_core::ids::InvocationId;
use sluice_flow::RuleBook;
use sluice_flow::scheduler::{EntryKind, QueueKey, Scheduler};
use sluice_protocol::{Frame, Message, proto};
use sluice_store::invocation::new::{Identity, NewInvocation};
use sluice_store::invocation::store::Timer;
use sluice_store::invocation::{Failure, InvocationRecord, Outcome, Status, Target};
use sluice_store::storage::Store;
use sluice_store::storage::writer::{Flusher, WriteSet, Writer};

const NOW: u64 = 1_800_000_000_000;

/// A driver that records what the partition asks of it.
#[derive(Default, Clone)]
struct Recording {
    started: Arc<Mutex<Vec<Started>>>,
    posted: Arc<Mutex<Vec<Event>>>,
    /// How far its clock has moved past `NOW`, in ms.
    moved_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl Driver for Recording {
    fn now_ms(&self) -> u64 {
        NOW + self.moved_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn start(&self, attempt: Started) {
        self.started.lock().unwrap().push(attempt);
    }

    fn post(&self, _id: InvocationId, event: Event) {
        self.posted.lock().unwrap().push(event);
    }

    fn nudge(&self, _waiting: u64, _from: u32) {}
}

fn briefs(effects: &[Effect]) -> Vec<String> {
    effects.iter().map(Effect::brief).collect()
}

fn target() -> Target {
    Target {
        service: "Svc".into(),
        handler: "run".into(),
        key: None,
    }
}

fn input() -> Frame {
    Message::Input(proto::InputCommandMessage {
        headers: Vec::new(),
        value: Some(proto::Value {
            content: Bytes::from_static(b"\"in\""),
        }),
        name: String::new(),
    })
    .to_frame(false)
}

fn new_record(seed: u128) -> InvocationRecord {
    NewInvocation::new(
        target(),
        Identity::Derived {
            uuid: seed,
            partition: Some(0),
        },
    )
    .into_record(NOW)
}

/// A real partition over a scratch store with one deployment (`Svc/run`, `Obj/add`).
struct Bench {
    _dir: tempfile::TempDir,
    /// The invoker's slots, which every partition of the node shares.
    slots: Arc<sluice_flow::slots::InvokerSlots>,
    partition: Partition,
    flusher: Flusher,
    driver: Recording,
    /// What its partition shares with others of the node (a test may add partitions).
    shared: Shared,
}

impl Bench {
    fn new() -> Self {
        Self::with(Config::default())
    }

    /// A bench whose partition runs with `config`.
    fn with(config: Config) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let registry = Arc::new(Registry::load(Arc::clone(&store)).unwrap());
        let manifest = serde_json::json!({
            "protocolMode": "REQUEST_RESPONSE", "minProtocolVersion": 5, "maxProtocolVersion": 6,
            "services": [
                {"name": "Svc", "ty": "SERVICE", "handlers": [{"name": "run"}]},
                {"name": "Obj", "ty": "VIRTUAL_OBJECT", "handlers": [{"name": "add"}]}
            ]
        });
        let found = Discovered {
            manifest: Manifest::parse(manifest.to_string().as_bytes()).unwrap(),
            manifest_version: 3,
            http_version: HttpVersion::Http2,
            sdk_version: None,
        };
        registry
            .register(found, Registration::new("http://127.0.0.1:9080/"), NOW)
            .unwrap();
        let (writer, flusher) = Writer::manual(Arc::clone(&store));
        let shared = Shared::new(store, writer, registry, Arc::new(config));
        let driver = Recording::default();
        let partition = Partition::new(0, &shared, Box::new(driver.clone()));
        Self {
            _dir: dir,
            slots: Arc::clone(&shared.slots),
            partition,
            flusher,
            driver,
            shared,
        }
    }

    /// Applies `event` as a batch of one, commits it and runs its effects (then a dispatch, as
    /// the run loop does): what the handler asked for.
    fn apply(&mut self, event: Event) -> Vec<String> {
        let batch = self.applied(event);
        let asked = briefs(&batch.1);
        self.commit(batch);
        asked
    }

    /// Applies `event` as `apply_batch` does, with its dispatch before the commit: the batch's
    /// writes and effects, not yet committed.
    fn apply_uncommitted(&mut self, event: Event) -> (WriteSet, Vec<Effect>) {
        let batch = self.applied(event);
        self.partition.dispatch();
        batch
    }

    /// Applies `event` alone: its writes and effects.
    fn applied(&mut self, event: Event) -> (WriteSet, Vec<Effect>) {
        let mut writes = WriteSet::default();
        let mut effects = Vec::new();
        self.partition
            .apply(event, &mut writes, &mut effects)
            .expect("the command applies");
        // As `apply_batch` does: every move is checked against the transition table.
        self.partition.observe();
        (writes, effects)
    }

    /// Commits a batch's writes and runs its effects (then a dispatch).
    fn commit(&mut self, (writes, effects): (WriteSet, Vec<Effect>)) {
        drop(self.partition.outside.writer.commit(writes));
        self.flusher.flush();
        self.partition.run_effects(effects);
    }

    fn state(&self, id: InvocationId) -> State {
        match (
            self.partition.live.get(&id),
            self.partition.resting.peek(&id),
        ) {
            (Some(live), _) => state_of(live.record().status, live.run()).unwrap(),
            (None, Some(_)) => State::Resting,
            (None, None) => State::Gone,
        }
    }

    fn submit(&mut self, record: InvocationRecord) -> Vec<String> {
        let (reply, _) = oneshot::channel();
        self.apply(Event::Submit {
            record: Box::new(record),
            input: input(),
            reply: Some(reply),
            call: None,
        })
    }

    fn control(&mut self, id: InvocationId, op: Control) -> Vec<String> {
        let (reply, _) = oneshot::channel();
        self.apply(Event::Control { id, op, reply })
    }

    /// The attempts started since the last look.
    fn started(&self) -> Vec<(InvocationId, u32)> {
        std::mem::take(&mut *self.driver.started.lock().unwrap())
            .into_iter()
            .map(|s| (s.id, s.attempt))
            .collect()
    }
}

/// A bare invocation with `status`, idle.
fn live(status: Status) -> Live {
    let mut record = new_record(7);
    record.status = status;
    Live::new(record, vec![input()], 1)
}

/// A bare invocation with an attempt running (bidi when `bidi`), its permit from a scheduler
/// of its own.
fn running(bidi: bool) -> Live {
    let mut live = live(Status::Running);
    let mut scheduler = Scheduler::new(Arc::new(RuleBook::new()), 1);
    let key = QueueKey {
        scope: None,
        limit_key: None,
        service: "Svc".into(),
        object_key: None,
        priority: Default::default(),
    };
    scheduler.enqueue(&key, 1, EntryKind::New, None, 0);
    let admitted = scheduler.poll_runnable(0).pop().expect("admitted");
    let mut attempt = Attempt::new(admitted.permit);
    if bidi {
        attempt.outbound = Some(tokio::sync::mpsc::unbounded_channel().0);
    }
    live.attempt = 1;
    live.set_run(Run::Running(Box::new(attempt)));
    live
}

fn value(bytes: &'static [u8]) -> Outcome {
    Outcome::Value(bytes.to_vec())
}

#[test]
fn a_call_result_wakes_a_suspended_caller() {
    let mut caller = live(Status::Suspended);
    let (mut writes, mut effects) = (WriteSet::default(), Vec::new());
    call_result::call_result(&mut caller, 3, value(b"42"), &mut writes, &mut effects);
    assert_eq!(briefs(&effects), ["attempt"]);
    assert_eq!(caller.journal.len(), 2, "the completion is journaled");
    assert_eq!(writes.len(), 1);
    // Delivered again after a failover: journaled once, nothing more happens.
    let mut effects = Vec::new();
    call_result::call_result(&mut caller, 3, value(b"42"), &mut writes, &mut effects);
    assert!(effects.is_empty());
    assert_eq!(caller.journal.len(), 2);
}

#[test]
fn a_call_result_reaches_a_running_bidi_attempt_and_no_new_attempt_starts() {
    let mut caller = running(true);
    let (mut writes, mut effects) = (WriteSet::default(), Vec::new());
    call_result::call_result(&mut caller, 3, value(b"42"), &mut writes, &mut effects);
    assert_eq!(briefs(&effects), ["deliver to attempt 1"]);
    let Run::Running(attempt) = caller.run() else {
        panic!("still running")
    };
    assert_eq!(attempt.fresh, [3], "a suspension on it is attempted again");
}

#[test]
fn a_call_result_for_a_paused_or_completed_caller_starts_nothing() {
    let mut paused = live(Status::Paused);
    let (mut writes, mut effects) = (WriteSet::default(), Vec::new());
    call_result::call_result(&mut paused, 3, value(b"1"), &mut writes, &mut effects);
    assert!(effects.is_empty());
    assert_eq!(paused.journal.len(), 2, "journaled for when it is resumed");
    let mut done = live(Status::Completed);
    call_result::call_result(&mut done, 3, value(b"1"), &mut writes, &mut effects);
    assert!(effects.is_empty());
    assert_eq!(
        done.journal.len(),
        1,
        "a completed invocation takes nothing"
    );
}

#[test]
fn a_sleep_timer_completes_its_sleep_and_wakes_the_sleeper() {
    let mut sleeper = live(Status::Suspended);
    let timer = Timer {
        at_ms: NOW,
        invocation: sleeper.record().id,
        completion: 2,
    };
    let (mut writes, mut effects) = (WriteSet::default(), Vec::new());
    wake::timer_fired(&mut sleeper, Some(timer), &mut writes, &mut effects);
    assert_eq!(briefs(&effects), ["attempt"]);
    assert_eq!(sleeper.journal.len(), 2);
    assert_eq!(
        writes.len(),
        2,
        "the timer's row goes, the completion comes"
    );
    // A delayed send's time: no completion, an attempt.
    let mut delayed = live(Status::Scheduled);
    let mut effects = Vec::new();
    wake::timer_fired(&mut delayed, None, &mut writes, &mut effects);
    assert_eq!(briefs(&effects), ["attempt"]);
}

#[test]
fn setting_object_state_is_its_writes_and_an_ack() {
    let (reply, _) = oneshot::channel();
    let mut writes = WriteSet::default();
    let state = [
        (Bytes::from_static(b"a"), Bytes::from_static(b"1")),
        (Bytes::from_static(b"b"), Bytes::from_static(b"2")),
    ];
    let effect = object_state::set_object_state("Obj", "k", &state, reply, &mut writes);
    assert_eq!(effect.brief(), "ack: created");
    assert!(writes.len() >= 2, "both values are written");
}

#[test]
fn a_submission_is_stored_then_queued_then_admitted() {
    let mut bench = Bench::new();
    let record = new_record(1);
    let id = record.id;
    assert_eq!(bench.submit(record.clone()), ["attempt", "ack: created"]);
    // After its commit it was queued and, with slots free, admitted at once.
    assert_eq!(bench.state(id), State::Running);
    assert_eq!(bench.started(), [(id, 1)]);
    // The same id again: answered from what exists, nothing else.
    assert_eq!(bench.submit(record), ["ack: exists"]);
    assert_eq!(bench.state(id), State::Running);
    assert!(bench.started().is_empty());
}

#[test]
fn an_attempts_end_moves_it_on_and_gives_its_slots_back_after_the_commit() {
    let mut bench = Bench::new();
    let record = new_record(2);
    let id = record.id;
    bench.submit(record);
    assert_eq!(bench.started(), [(id, 1)]);
    // A failure to retry: backing off, a wake-up at its back-off, the slots back.
    let failed = Event::AttemptDone {
        id,
        attempt: 1,
        result: Ok(Ending::Failed(proto::ErrorMessage {
            code: 500,
            message: "boom".into(),
            ..Default::default()
        })),
    };
    let asked = bench.apply(failed);
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert!(asked[0].starts_with("wake at "), "{asked:?}");
    assert_eq!(asked[1], "settle");
    assert_eq!(bench.state(id), State::BackingOff);
    // A stale end of the same attempt changes nothing.
    let stale = Event::AttemptDone {
        id,
        attempt: 1,
        result: Ok(Ending::End),
    };
    assert!(bench.apply(stale).is_empty());
    // Its back-off is over: queued and admitted again.
    assert_eq!(
        bench.apply(Event::Wake {
            id,
            completion: None
        }),
        ["attempt"]
    );
    assert_eq!(bench.state(id), State::Running);
    assert_eq!(bench.started(), [(id, 2)]);
    // It ends: completed; the caller-less invocation is evicted once nobody waits.
    let asked = bench.apply(Event::AttemptDone {
        id,
        attempt: 2,
        result: Ok(Ending::End),
    });
    assert_eq!(
        asked.last().map(String::as_str),
        Some("settle"),
        "{asked:?}"
    );
    assert!(asked.contains(&"evict".to_owned()), "{asked:?}");
    assert_eq!(bench.state(id), State::Gone);
}

/// The end of an attempt that could not reach its deployment.
fn unreachable(id: InvocationId, attempt: u32) -> Event {
    Event::AttemptDone {
        id,
        attempt,
        result: Err(crate::invoker::AttemptError {
            error: sluice_core::errors::CodedError::new(
                sluice_core::errors::Code::RT0010,
                "cannot reach the deployment",
            ),
            retry_after: None,
            status: None,
            unreachable: true,
        }),
    }
}

#[test]
fn answered_attempts_grow_a_paced_window_while_they_run_on() {
    let mut bench = Bench::new();
    let window = |bench: &Bench| {
        let now = bench.driver.now_ms();
        bench.partition.outside.registry.gates().snapshot(now)[0].window
    };
    let [a, b, c] = [21, 22, 23].map(|seed| {
        let record = new_record(seed);
        let id = record.id;
        bench.submit(record);
        id
    });
    assert_eq!(bench.started(), [(a, 1), (b, 1), (c, 1)]);
    // Two attempts in a row find the deployment down: it is paced, two attempts at once.
    bench.apply(unreachable(a, 1));
    bench.apply(unreachable(b, 1));
    assert_eq!(window(&bench), Some(2));
    // Their back-offs and the deployment's closed time are over: `c` still runs, so one of
    // the two fits the window.
    bench
        .driver
        .moved_ms
        .store(60_000, std::sync::atomic::Ordering::Relaxed);
    bench.apply(Event::Wake {
        id: a,
        completion: None,
    });
    bench.apply(Event::Wake {
        id: b,
        completion: None,
    });
    assert_eq!(bench.started(), [(a, 2)]);
    assert_eq!(bench.state(b), State::Queued);
    // The deployment answers the running attempts' requests, and they run on (a handler
    // awaiting an awakeable holds its slot for long): each answer is a success of the slow
    // start, so `b` starts without waiting for either to end.
    bench.apply(Event::AttemptAnswered { id: c, attempt: 1 });
    assert_eq!(window(&bench), Some(3));
    assert_eq!(bench.started(), [(b, 2)]);
    bench.apply(Event::AttemptAnswered { id: a, attempt: 2 });
    assert_eq!(window(&bench), Some(4));
    // The same answer again, or an answered attempt's end, is not counted a second time.
    bench.apply(Event::AttemptAnswered { id: a, attempt: 2 });
    bench.apply(Event::AttemptDone {
        id: a,
        attempt: 2,
        result: Ok(Ending::End),
    });
    assert_eq!(window(&bench), Some(4));
}

#[test]
fn attaching_answers_where_the_outcome_comes_and_an_unknown_id_is_dropped() {
    let mut bench = Bench::new();
    let record = new_record(31);
    let id = record.id;
    bench.submit(record);
    assert_eq!(bench.started(), [(id, 1)]);
    // Running: answered (after the commit of what came before) with where its outcome will
    // come; nothing else happens.
    let (reply, mut answer) = oneshot::channel();
    assert_eq!(
        bench.apply(Event::Await { id, reply }),
        ["answer attached (waits: true)"]
    );
    let mut outcome = answer
        .try_recv()
        .unwrap()
        .expect("a waiter within the bound");
    assert!(outcome.try_recv().is_err(), "no outcome before the end");
    bench.apply(Event::AttemptDone {
        id,
        attempt: 1,
        result: Ok(Ending::End),
    });
    // An attempt that ends without an Output command completes with an empty value.
    assert_eq!(outcome.try_recv().unwrap(), value(b""));
    // Completed and evicted: a new waiter is answered from the store.
    let (reply, mut answer) = oneshot::channel();
    assert_eq!(
        bench.apply(Event::Await { id, reply }),
        ["notify 1 waiters: value", "answer attached (waits: true)"]
    );
    let mut outcome = answer.try_recv().unwrap().unwrap();
    assert_eq!(outcome.try_recv().unwrap(), value(b""));
    // An id nobody knows: the reply is dropped, so the asker says "not found".
    let (reply, mut answer) = oneshot::channel();
    let unknown = new_record(32).id;
    assert!(bench.apply(Event::Await { id: unknown, reply }).is_empty());
    assert!(answer.try_recv().is_err());
}

#[test]
fn an_awakeable_completes_once_and_a_signal_for_nobody_says_so() {
    use super::super::model::signals::{Delivery, FIRST_AWAKEABLE_INDEX, Signal};
    use sluice_core::ids::AwakeableId;
    use sluice_protocol::proto::notification_template;
    let mut bench = Bench::new();
    let record = new_record(41);
    let id = record.id;
    bench.submit(record);
    assert_eq!(bench.started(), [(id, 1)]);
    let deliver = |bench: &mut Bench, target: InvocationId| {
        let (reply, mut answer) = oneshot::channel();
        let signal = Signal::awakeable(
            AwakeableId {
                invocation: target,
                index: FIRST_AWAKEABLE_INDEX,
            },
            notification_template::Result::Value(proto::Value {
                content: Bytes::from_static(b"\"done\""),
            }),
        );
        let asked = bench.apply(Event::Signal {
            signal,
            reply: Some(reply),
        });
        (asked, answer.try_recv().expect("answered after the commit"))
    };
    // Journaled for the running attempt; it is not bidi, so nothing is sent or started.
    let journal = |bench: &Bench| bench.partition.live[&id].journal.len();
    let before = journal(&bench);
    let (asked, delivery) = deliver(&mut bench, id);
    assert_eq!(delivery, Delivery::Delivered, "{asked:?}");
    assert_eq!(journal(&bench), before + 1);
    assert!(bench.started().is_empty());
    // The same awakeable again is refused, and the journal stays as it was.
    let (_, delivery) = deliver(&mut bench, id);
    assert!(
        matches!(&delivery, Delivery::Refused(why) if why.contains("already completed")),
        "{delivery:?}"
    );
    assert_eq!(journal(&bench), before + 1);
    // An invocation that does not exist.
    let (_, delivery) = deliver(&mut bench, new_record(42).id);
    assert_eq!(delivery, Delivery::NoInvocation);
}

#[test]
fn a_running_attempts_message_is_journaled_and_a_stale_attempts_is_dropped() {
    let mut bench = Bench::new();
    let record = new_record(51);
    let id = record.id;
    bench.submit(record);
    assert_eq!(bench.started(), [(id, 1)]);
    let output = |attempt| Event::AttemptMessage {
        id,
        attempt,
        message: Message::Output(proto::OutputCommandMessage {
            result: Some(proto::output_command_message::Result::Value(proto::Value {
                content: Bytes::from_static(b"42"),
            })),
            name: String::new(),
        }),
        ack: false,
    };
    let journal = |bench: &Bench| bench.partition.live[&id].journal.len();
    let before = journal(&bench);
    // An attempt that is not the current one says nothing.
    assert!(bench.apply(output(2)).is_empty());
    assert_eq!(journal(&bench), before);
    // The current attempt's Output is journaled; its end completes with that value.
    bench.apply(output(1));
    assert_eq!(journal(&bench), before + 1);
    let (reply, mut answer) = oneshot::channel();
    bench.apply(Event::Await { id, reply });
    let mut outcome = answer.try_recv().unwrap().unwrap();
    bench.apply(Event::AttemptDone {
        id,
        attempt: 1,
        result: Ok(Ending::End),
    });
    assert_eq!(outcome.try_recv().unwrap(), value(b"42"));
}

#[test]
fn a_restart_as_new_creates_its_invocation_once() {
    let mut bench = Bench::new();
    let record = new_record(61);
    let id = record.id;
    let restart = |bench: &mut Bench| {
        let (reply, mut answer) = oneshot::channel();
        let asked = bench.apply(Event::Restart {
            record: Box::new(record.clone()),
            journal: vec![input()],
            reply,
        });
        (asked, answer.try_recv().unwrap().unwrap())
    };
    let (asked, created) = restart(&mut bench);
    assert!(created, "{asked:?}");
    assert_eq!(bench.started(), [(id, 1)]);
    // The same id again: "not created", and nothing starts.
    let (asked, created) = restart(&mut bench);
    assert!(!created, "{asked:?}");
    assert!(bench.started().is_empty());
}

#[test]
fn a_quota_reset_stores_its_counts_then_lets_the_held_work_start() {
    use sluice_flow::{Limit, RulePattern, Scope, Upsert};
    let mut bench = Bench::new();
    // One call an hour under scope `acme`.
    let mut book = RuleBook::new();
    let mut rule = Upsert::new(RulePattern::parse("acme").unwrap(), Limit::Unlimited);
    rule.quota = Some("1/h".parse().unwrap());
    book.apply_batch(&[rule], NOW).unwrap();
    bench
        .partition
        .admission
        .scheduler
        .on_rules_changed(Arc::new(book), NOW);
    let [first, second] = [71, 72].map(|seed| {
        let mut record = new_record(seed);
        record.scope = Some(Scope::parse("acme").unwrap());
        record
    });
    assert_eq!(bench.submit(first), ["attempt", "ack: created"]);
    let held = second.id;
    bench.submit(second);
    assert_eq!(bench.started().len(), 1, "the quota lets one start");
    // Held by the used-up quota, it waits at rest.
    assert_eq!(bench.state(held), State::Resting);
    // The reset's counts are stored with its batch; only then does the scheduler follow, and
    // the held call starts.
    let (reply, mut answer) = oneshot::channel();
    let asked = bench.apply(Event::ResetQuota {
        measure: sluice_flow::Measure::Calls,
        pattern: Box::new(RulePattern::parse("acme").unwrap()),
        reply,
    });
    assert_eq!(asked, ["reset quota acme"]);
    assert_eq!(answer.try_recv().unwrap(), 1, "one counter reset");
    assert_eq!(bench.started(), [(held, 1)]);
}

#[test]
fn a_calls_cost_is_charged_to_its_budget_with_its_end_and_its_reservation_settles() {
    use sluice_flow::{Budget, Limit, Measure, RulePattern, Scope, Upsert};
    let mut bench = Bench::new();
    // 10 per hour under scope `acme`, 5 reserved per call: two may run at once.
    let mut book = RuleBook::new();
    let mut rule = Upsert::new(RulePattern::parse("acme").unwrap(), Limit::Unlimited);
    let mut budget: Budget = "10/h".parse().unwrap();
    budget.reserve = std::num::NonZeroU64::new(5);
    rule.budget = Some(budget);
    book.apply_batch(&[rule], NOW).unwrap();
    bench
        .partition
        .admission
        .scheduler
        .on_rules_changed(Arc::new(book), NOW);
    let [first, second, third] = [81, 82, 83].map(|seed| {
        let mut record = new_record(seed);
        record.scope = Some(Scope::parse("acme").unwrap());
        record
    });
    let ids = [first.id, second.id, third.id];
    for record in [first, second, third] {
        bench.submit(record);
    }
    assert_eq!(bench.started(), [(ids[0], 1), (ids[1], 1)]);
    assert_eq!(
        bench.state(ids[2]),
        State::Resting,
        "held by the reservations"
    );
    // The first ends having reported 3: charged with its end, in the same write set.
    let live = bench.partition.live.get_mut(&ids[0]).unwrap();
    live.journal
        .extend(super::super::model::cost::report(1, "3"));
    let (writes, effects) = bench.applied(Event::AttemptDone {
        id: ids[0],
        attempt: 1,
        result: Ok(Ending::End),
    });
    let alone = tempfile::tempdir().unwrap();
    let other = Store::open(alone.path()).unwrap();
    writes.commit_now(&other);
    let (record, spent) = other
        .with_db(|db| {
            (
                sluice_store::invocation::store::load_record(db, ids[0])
                    .unwrap()
                    .unwrap(),
                sluice_store::invocation::quotas::load(db, Measure::Cost, 0).unwrap(),
            )
        })
        .unwrap();
    assert_eq!((record.status, record.cost), (Status::Completed, Some(3)));
    assert_eq!(spent.len(), 1);
    assert_eq!((spent[0].0.as_str(), spent[0].1.used), ("acme", 3));
    bench.commit((writes, effects));
    // 3 spent and 5 held leave 2: the third still waits.
    assert!(bench.started().is_empty());
    // The second ends having reported nothing: its reservation goes back, the third starts.
    bench.apply(Event::AttemptDone {
        id: ids[1],
        attempt: 1,
        result: Ok(Ending::End),
    });
    assert_eq!(bench.started(), [(ids[2], 1)]);
}

/// A bench with no memory budget for held inputs and scope `acme` limited to one at a time,
/// one call of `acme` running and a second held at rest (its record and input in the store
/// alone); the held one's id.
fn holding_one_past_the_budget() -> (Bench, InvocationId) {
    let mut config = Config::default();
    config.worker.held_memory_budget = sluice_config::ByteSize(0);
    let (bench, _, held) = acme_limited_to_one(Bench::with(config));
    assert_eq!(bench.state(held), State::Resting);
    (bench, held)
}

/// `bench` with scope `acme` limited to one at a time and two of its calls submitted: the first
/// runs, the second waits; their ids.
fn acme_limited_to_one(mut bench: Bench) -> (Bench, InvocationId, InvocationId) {
    use sluice_flow::{Limit, RulePattern, Scope, Upsert};
    let mut book = RuleBook::new();
    book.apply_batch(
        &[Upsert::new(
            RulePattern::parse("acme").unwrap(),
            Limit::Concurrency(std::num::NonZeroU32::MIN),
        )],
        NOW,
    )
    .unwrap();
    bench
        .partition
        .admission
        .scheduler
        .on_rules_changed(Arc::new(book), NOW);
    let [first, second] = [81, 82].map(|seed| {
        let mut record = new_record(seed);
        record.scope = Some(Scope::parse("acme").unwrap());
        record
    });
    let ids = (first.id, second.id);
    bench.submit(first);
    bench.submit(second);
    assert_eq!(bench.started(), [(ids.0, 1)]);
    (bench, ids.0, ids.1)
}

#[test]
fn a_peek_of_a_held_invocation_whose_record_rests_in_the_store_reads_it_there_and_leaves_it_at_rest()
 {
    let (mut bench, held) = holding_one_past_the_budget();
    for output in [false, true] {
        let (reply, seen) = oneshot::channel();
        bench.apply(Event::Peek {
            id: held,
            output,
            reply,
        });
        let seen = seen.blocking_recv().unwrap().expect("known");
        assert_eq!(seen.status, Status::Pending);
        assert_eq!(seen.target.service, "Svc");
        assert_eq!(seen.scope.as_deref(), Some("acme"));
        assert_eq!(seen.outcome, None);
        assert_eq!(bench.state(held), State::Resting);
    }
}

#[test]
fn a_held_invocation_whose_input_cannot_be_read_back_stays_at_rest_when_its_turn_comes() {
    // No input stays in memory: a held invocation's input is read back from the store.
    let (mut bench, held) = holding_one_past_the_budget();
    // Shutting down: the store closes while the held call's turn comes (the limit is lifted).
    bench.partition.outside.store.close();
    bench
        .partition
        .admission
        .scheduler
        .on_rules_changed(Arc::new(RuleBook::new()), NOW);
    bench.partition.dispatch();
    // It stays at rest for the next start to queue again; nothing started, nothing panicked.
    assert_eq!(bench.state(held), State::Resting);
    assert!(bench.started().is_empty());
}

#[test]
fn an_operator_pauses_kills_and_resumes() {
    let mut bench = Bench::new();
    let record = new_record(3);
    let id = record.id;
    bench.submit(record);
    bench.started();
    // Pausing a running invocation stops its attempt (202); its slots go back after the commit.
    assert_eq!(
        bench.control(id, Control::Pause),
        [
            "settle",
            &format!("answer controlled {:?}", Controlled::Accepted)
        ]
    );
    assert_eq!(bench.state(id), State::Paused);
    assert!(matches!(bench.partition.live[&id].run(), Run::Idle { .. }));
    // Resumed: queued after the commit, admitted, a second attempt.
    assert_eq!(
        bench.control(id, Control::Resume),
        [
            "attempt",
            "settle",
            &format!("answer controlled {:?}", Controlled::Done)
        ]
    );
    assert_eq!(bench.state(id), State::Running);
    assert_eq!(bench.started(), [(id, 2)]);
    // Killed: completed with 409 at once.
    let asked = bench.control(id, Control::Kill);
    assert!(
        asked
            .iter()
            .any(|a| a.starts_with("answer controlled Done")),
        "{asked:?}"
    );
    assert_eq!(
        bench
            .partition
            .live
            .get(&id)
            .map(|l| l.record().outcome.clone()),
        None,
        "evicted once stored: {asked:?}"
    );
}

#[test]
fn peeking_and_pausing_an_unknown_queue_change_nothing() {
    let mut bench = Bench::new();
    let (reply, seen) = oneshot::channel();
    let id = new_record(9).id;
    assert_eq!(
        bench.apply(Event::Peek {
            id,
            output: true,
            reply
        }),
        ["answer peeked (known: false)"]
    );
    assert_eq!(seen.blocking_recv().unwrap(), None);
    let (reply, paused) = oneshot::channel();
    let asked = bench.apply(Event::PauseQueue {
        queue: 99,
        pause: true,
        reply,
    });
    assert_eq!(asked, ["answer queue paused (known: false)"]);
    assert!(!paused.blocking_recv().unwrap(), "no such queue");
}

#[test]
fn a_call_result_for_a_completed_caller_after_its_eviction_is_dropped() {
    let mut bench = Bench::new();
    let caller = new_record(4).id;
    let asked = bench.apply(Event::CallResult {
        id: caller,
        completion: 1,
        outcome: Outcome::Failure(Failure {
            code: 500,
            message: "x".into(),
        }),
    });
    assert!(asked.is_empty());
    assert_eq!(bench.state(caller), State::Gone);
}

#[test]
fn a_status_peek_leaves_a_completed_outputs_bytes_in_the_store() {
    let mut bench = Bench::new();
    let mut record = new_record(11);
    record.status = Status::Completed;
    record.outcome = Some(Outcome::Value(vec![7; 1 << 20]));
    let id = record.id;
    let mut writes = WriteSet::default();
    sluice_store::invocation::store::put_record(&mut writes, &record).unwrap();
    drop(bench.partition.outside.writer.commit(writes));
    bench.flusher.flush();
    let mut peek = |output: bool| {
        let (reply, seen) = oneshot::channel();
        bench.apply(Event::Peek { id, output, reply });
        seen.blocking_recv().unwrap().expect("known")
    };
    // For a status: completed with a value, none of its bytes.
    let status = peek(false);
    assert_eq!(status.status, Status::Completed);
    assert_eq!(status.outcome, Some(Outcome::Value(Vec::new())));
    // For an output: all of them.
    let output = peek(true);
    assert_eq!(output.outcome, Some(Outcome::Value(vec![7; 1 << 20])));
}

#[test]
fn freed_slots_start_the_work_that_waited_for_one_and_ask_for_nothing_else() {
    let mut bench = Bench::new();
    // Another partition holds the node's only invoker slot.
    bench.slots.set_limit(1);
    assert!(bench.slots.try_take());
    let record = new_record(1);
    let id = record.id;
    bench.submit(record);
    assert!(bench.started().is_empty(), "no slot: nothing starts");
    assert_ne!(bench.state(id), State::Running);
    // The other partition gives its slot back and tells this one.
    bench.slots.give_back();
    assert_eq!(bench.apply(Event::SlotsFree), Vec::<String>::new());
    assert_eq!(bench.started(), [(id, 1)]);
    assert_eq!(bench.state(id), State::Running);
    assert_eq!(bench.slots.used(), 1, "the started attempt holds the slot");
}

#[test]
fn a_barrier_is_answered_only_after_the_commit_of_what_came_before_it() {
    let mut bench = Bench::new();
    let record = new_record(1);
    let id = record.id;
    let (reply, mut answered) = oneshot::channel();
    let mut writes = WriteSet::default();
    let mut effects = Vec::new();
    let (submit_reply, _) = oneshot::channel();
    for event in [
        Event::Submit {
            record: Box::new(record),
            input: input(),
            reply: Some(submit_reply),
            call: None,
        },
        Event::Barrier { reply },
    ] {
        bench
            .partition
            .apply(event, &mut writes, &mut effects)
            .expect("the command applies");
    }
    assert_eq!(
        briefs(&effects),
        ["attempt", "ack: created", "answer barrier"]
    );
    assert!(answered.try_recv().is_err(), "not before the commit");
    drop(bench.partition.outside.writer.commit(writes));
    bench.flusher.flush();
    bench.partition.run_effects(effects);
    assert_eq!(answered.try_recv(), Ok(()));
    // What came before it is stored: the invocation reads back from the store.
    let stored = bench
        .partition
        .outside
        .store
        .with_db(|db| sluice_store::invocation::store::load_record(db, id))
        .unwrap()
        .unwrap();
    assert!(
        stored.is_some(),
        "the submission is stored when the barrier answers"
    );
}

#[test]
fn start_up_recovery_gives_every_partition_exactly_its_own_invocations_across_many_batches() {
    use sluice_store::invocation::store::{put_journal, put_record};
    let mut bench = Bench::new();
    // Three partitions' invocations, interleaved in the table and more than a batch each.
    let ids: Vec<InvocationId> = (0..1_000).map(InvocationId::generate).collect();
    let mut writes = WriteSet::default();
    for id in &ids {
        put_record(&mut writes, &InvocationRecord::new(*id, target(), NOW)).unwrap();
        put_journal(&mut writes, *id, &[input()]);
    }
    drop(bench.partition.outside.writer.commit(writes));
    bench.flusher.flush();
    let partitions = (0..3u32)
        .map(|index| {
            let driver = Box::new(Recording::default());
            (
                index as usize,
                Partition::new(index, &bench.shared, driver),
                (),
            )
        })
        .collect();
    let store = Arc::clone(&bench.partition.outside.store);
    let recovered =
        super::super::recovery::recover_all_in_batches(&store, 3, partitions, &[], 100).unwrap();
    assert_eq!(recovered.len(), 3);
    for (index, (partition, ())) in (0u64..).zip(&recovered) {
        let own: Vec<&InvocationId> = ids
            .iter()
            .filter(|id| id.partition_key() % 3 == index)
            .collect();
        let held = partition.live.len() + partition.resting.len();
        assert_eq!(held, own.len(), "partition {index}");
        assert!(
            own.iter()
                .all(|id| { partition.live.contains_key(id) || partition.resting.contains(id) })
        );
    }
}

#[test]
fn a_started_invocation_read_in_a_later_batch_keeps_its_objects_lock_from_a_new_one_read_first() {
    use sluice_store::invocation::store::{put_journal, put_record};
    let mut bench = Bench::new();
    let object = Target {
        service: "Obj".into(),
        handler: "add".into(),
        key: Some("k".into()),
    };
    // Two invocations of one object, the new one first in the table's key order.
    let mut ids: Vec<InvocationId> = (0..2).map(|_| InvocationId::generate(0)).collect();
    ids.sort_by_key(|id| id.to_bytes());
    let (new, started) = (ids[0], ids[1]);
    let mut writes = WriteSet::default();
    put_record(
        &mut writes,
        &InvocationRecord::new(new, object.clone(), NOW),
    )
    .unwrap();
    put_journal(&mut writes, new, &[input()]);
    let mut record = InvocationRecord::new(started, object, NOW);
    record.status = Status::Suspended;
    record.attempts = 1;
    put_record(&mut writes, &record).unwrap();
    put_journal(&mut writes, started, &[input()]);
    drop(bench.partition.outside.writer.commit(writes));
    bench.flusher.flush();
    let driver = Recording::default();
    let partitions = vec![(
        0,
        Partition::new(0, &bench.shared, Box::new(driver.clone())),
        (),
    )];
    let store = Arc::clone(&bench.partition.outside.store);
    // One record per batch: the new invocation is queued before the started one is read.
    let recovered =
        super::super::recovery::recover_all_in_batches(&store, 1, partitions, &[], 1).unwrap();
    let attempted: Vec<InvocationId> = driver
        .started
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(
        attempted,
        vec![started],
        "the object's holder runs again; the new one waits for the lock"
    );
    let (partition, ()) = &recovered[0];
    assert!(partition.live.contains_key(&started));
    assert!(partition.live.contains_key(&new) || partition.resting.contains(&new));
}

#[test]
fn an_attempt_the_deployment_ended_hands_its_slot_to_the_next_waiter_before_its_commit() {
    for ending in [
        Ending::End,
        Ending::Failed(proto::ErrorMessage {
            code: 500,
            message: "boom".into(),
            ..Default::default()
        }),
    ] {
        let (mut bench, first, second) = acme_limited_to_one(Bench::new());
        let batch = bench.apply_uncommitted(Event::AttemptDone {
            id: first,
            attempt: 1,
            result: Ok(ending),
        });
        // The batch's own dispatch started the waiter: the limit's one slot moved on.
        assert_eq!(bench.started(), [(second, 1)]);
        assert_eq!(bench.state(second), State::Running);
        bench.commit(batch);
        // The end's commit settles nothing more: still one running.
        assert!(bench.started().is_empty());
        assert_eq!(bench.state(second), State::Running);
    }
}

#[test]
fn an_attempt_sluice_gave_up_on_keeps_its_slot_until_its_end_is_committed() {
    let (mut bench, first, second) = acme_limited_to_one(Bench::new());
    // The stream broke: the handler may still run in the deployment.
    let batch = bench.apply_uncommitted(unreachable(first, 1));
    assert!(bench.started().is_empty());
    assert_ne!(bench.state(second), State::Running);
    bench.commit(batch);
    assert_eq!(bench.started(), [(second, 1)]);
}

#[test]
fn an_ended_attempt_keeps_its_objects_lock_until_its_end_is_committed() {
    let mut bench = Bench::new();
    let [first, second] = [93, 94].map(|seed| {
        let mut record = new_record(seed);
        record.target = Target {
            service: "Obj".into(),
            handler: "add".into(),
            key: Some("k".into()),
        };
        record
    });
    let ids = (first.id, second.id);
    bench.submit(first);
    bench.submit(second);
    let (first, second) = ids;
    assert_eq!(bench.started(), [(first, 1)]);
    let batch = bench.apply_uncommitted(Event::AttemptDone {
        id: first,
        attempt: 1,
        result: Ok(Ending::End),
    });
    // Its slot is free, but the next holder must read what this attempt stored.
    assert!(bench.started().is_empty());
    bench.commit(batch);
    assert_eq!(bench.started(), [(second, 1)]);
}
