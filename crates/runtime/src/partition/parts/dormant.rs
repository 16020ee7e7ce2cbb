//! Held invocations that never ran wait in a compact form: a queued send under a full limit
//! may wait for minutes behind thousands of others, and a full in-memory record with its
//! journal costs several times what the scheduler needs to know about it. While it waits,
//! only its scheduler entry and one allocation holding its encoded record and input stay in
//! memory; it is decoded again the moment anything touches it (its turn comes, an operator
//! asks, a repeat of its idempotency key arrives).
//!
//! Delayed sends rest the same way until their time comes, and never with their input: it is in
//! the store (entry 0 of the journal, committed before the send was acknowledged) and is read
//! back when they wake. Queued inputs stay in memory only while their sum is under
//! `worker.held-memory-budget`, shared by every partition; past it they rest on disk too.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use prost::Message as _;

use crate::partition::live::Live;
use crate::partition::model::events::QueuedEntry;
use crate::partition::model::phase::Run;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_flow::scheduler::{EntryId, QueueId};
use sluice_flow::{LimitKey, Priority, Scope};
use sluice_protocol::Frame;
use sluice_store::invocation::store;
use sluice_store::invocation::{Caller, InvocationRecord, Status, Target};
use sluice_store::storage::Store;

/// What invocations hold in memory across every partition: those at rest, their count
/// (bounded by `worker.max-held-invocations`) and the bytes of inputs kept in memory (bounded
/// by `worker.held-memory-budget`); and the bytes running attempts added to their journals
/// (bounded by `worker.running-journals-budget`).
#[derive(Debug)]
pub struct HeldMemory {
    bytes: AtomicU64,
    budget: u64,
    count: AtomicUsize,
    journals: AtomicU64,
    journals_budget: u64,
}

impl HeldMemory {
    /// Keeps at most `budget` bytes of inputs in memory; running journals are unbounded
    /// until [`Self::bounding_journals_by`].
    pub fn new(budget: u64) -> Self {
        Self {
            bytes: AtomicU64::new(0),
            budget,
            count: AtomicUsize::new(0),
            journals: AtomicU64::new(0),
            journals_budget: u64::MAX,
        }
    }

    /// Lets running attempts add at most `budget` bytes to their journals at once.
    pub fn bounding_journals_by(mut self, budget: u64) -> Self {
        self.journals_budget = budget;
        self
    }

    /// Bytes running attempts have added to their journals now.
    pub fn running_journal_bytes(&self) -> u64 {
        self.journals.load(Ordering::Relaxed)
    }

    /// Takes `len` bytes of the running journals' budget; false (nothing taken) when they do
    /// not fit.
    pub(in crate::partition) fn take_journal(&self, len: u64) -> bool {
        self.journals
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(len)
                    .filter(|&after| after <= self.journals_budget)
            })
            .is_ok()
    }

    /// Gives back `len` bytes taken with [`Self::take_journal`].
    pub(in crate::partition) fn give_back_journal(&self, len: u64) {
        self.journals.fetch_sub(len, Ordering::AcqRel);
    }

    /// Invocations at rest now.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Bytes of inputs kept in memory now.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Takes `len` bytes of the budget; false (nothing taken) when they do not fit.
    fn take(&self, len: u64) -> bool {
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(len).filter(|&after| after <= self.budget)
            })
            .is_ok()
    }

    fn give_back(&self, len: u64) {
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(len))
            });
    }
}

/// Everything a record that never ran can hold, and its input, encoded compactly (a held send
/// is some 40 bytes plus its input this way).
#[derive(Clone, PartialEq, prost::Message)]
struct Resting {
    #[prost(string, tag = "1")]
    service: String,
    #[prost(string, tag = "2")]
    handler: String,
    #[prost(string, optional, tag = "3")]
    key: Option<String>,
    /// Status `scheduled` (else `pending`).
    #[prost(bool, tag = "4")]
    scheduled: bool,
    #[prost(uint32, tag = "5")]
    attempts: u32,
    #[prost(uint32, tag = "6")]
    retry_count: u32,
    #[prost(uint64, optional, tag = "7")]
    run_at_ms: Option<u64>,
    /// Only when it is not the one derived from the id.
    #[prost(fixed64, optional, tag = "8")]
    random_seed: Option<u64>,
    #[prost(uint64, tag = "9")]
    created_at_ms: u64,
    #[prost(bytes = "vec", optional, tag = "10")]
    caller: Option<Vec<u8>>,
    #[prost(uint32, tag = "11")]
    caller_completion: u32,
    #[prost(string, optional, tag = "12")]
    scope: Option<String>,
    #[prost(string, optional, tag = "13")]
    limit_key: Option<String>,
    #[prost(string, optional, tag = "14")]
    idempotency_key: Option<String>,
    #[prost(uint64, optional, tag = "15")]
    retention_ms: Option<u64>,
    #[prost(uint32, tag = "16")]
    input_ty: u32,
    #[prost(bytes = "bytes", tag = "17")]
    input: Bytes,
    /// The input was left in the store (`input` is empty).
    #[prost(bool, tag = "18")]
    input_on_disk: bool,
    #[prost(uint32, optional, tag = "19")]
    priority: Option<u32>,
    #[prost(string, optional, tag = "20")]
    trace: Option<String>,
    #[prost(uint64, optional, tag = "21")]
    deadline_ms: Option<u64>,
    /// The burst of debounced calls it is the run of (its key and start).
    #[prost(string, optional, tag = "22")]
    debounce_key: Option<String>,
    #[prost(uint64, optional, tag = "23")]
    debounce_since_ms: Option<u64>,
}

/// A held invocation at rest.
#[derive(Debug)]
pub(in crate::partition) struct Dormant {
    entry: EntryId,
    /// `None` for a delayed send, which waits for its time rather than in a queue.
    queue: Option<QueueId>,
    kept: Kept,
}

/// What a held invocation keeps in memory beside its scheduler entry. Every invocation that
/// comes to rest is in the store already (sends are stored before their 202, and nothing is
/// queued or waits for its time before its record commits; calls that wait for their outcome
/// never rest), so the record is only packed here when it cannot simply be read back.
#[derive(Debug)]
enum Kept {
    /// Its record packed (`Resting`), with its input when the budget let it stay in memory:
    /// its turn then costs no store read.
    Packed(Box<[u8]>),
    /// Record and input in the store alone. What a listing of the queues shows without
    /// reading the store stays here: it never ran (no attempts) and waits for no time of its
    /// own (no `run_at_ms`), so its creation time is all that differs between two of them.
    /// With the id and the entry this is 16 bytes, against some 60 for a packed record.
    Stored { created_at_ms: u64 },
}
impl Dormant {
    /// Whether `live` only waits for its first attempt, with nothing but its record and input.
    pub(in crate::partition) fn fits(live: &Live) -> bool {
        let record = live.record();
        // Queued, or a delayed send idle until its time; never an attempt's leftovers.
        let queued = live.run().queue().is_some();
        let delayed = matches!(live.run(), Run::Idle { awaiting: None })
            && record.status == Status::Scheduled
            && record.run_at_ms.is_some();
        (queued || delayed)
            && matches!(record.status, Status::Pending | Status::Scheduled)
            && record.deployment.is_none()
            && record.protocol.is_none()
            && record.last_failure.is_none()
            && record.outcome.is_none()
            && matches!(live.journal.as_slice(), [input] if !input.ack)
            && live.waiters.is_empty()
            && live.callers.is_empty()
            && live.lock.is_none()
    }

    /// `live` at rest; it must fit. Its input stays in memory if it is queued and the budget
    /// has room.
    pub(in crate::partition) fn of(live: Live, store: &Store, held: &HeldMemory) -> Self {
        // Only queued inputs may stay in memory, and only within the budget.
        let queue = live.run().queue();
        let entry = live.entry;
        let (record, journal) = live.into_record_and_journal();
        let input = journal.into_iter().next().expect("fits: one entry");
        let len = input.payload.len() as u64;
        let keep = queue.is_some() && held.take(len);
        held.count.fetch_add(1, Ordering::Relaxed);
        // A queued listing shows attempts and run time; only those without either rest with
        // nothing of their record here (a delayed send is listed by no queue while it waits).
        if !keep && record.attempts == 0 && (queue.is_none() || record.run_at_ms.is_none()) {
            check_stored(&record, &input, store);
            return Self {
                entry,
                queue,
                kept: Kept::Stored {
                    created_at_ms: record.created_at_ms,
                },
            };
        }
        let derived_seed = InvocationRecord::seed_of(record.id);
        let resting = Resting {
            service: record.target.service,
            handler: record.target.handler,
            key: record.target.key,
            scheduled: record.status == Status::Scheduled,
            attempts: record.attempts,
            retry_count: record.retry_count,
            run_at_ms: record.run_at_ms,
            random_seed: (record.random_seed != derived_seed).then_some(record.random_seed),
            created_at_ms: record.created_at_ms,
            caller: record.caller.map(|c| c.id.to_bytes().to_vec()),
            caller_completion: record.caller.map_or(0, |c| c.completion),
            scope: record.scope.map(|s| s.as_str().to_owned()),
            limit_key: record.limit_key.map(|k| k.as_str().to_owned()),
            idempotency_key: record.idempotency_key,
            retention_ms: record.retention_ms,
            priority: record.priority.map(|p| u32::from(p.get())),
            trace: record.trace,
            deadline_ms: record.deadline_ms,
            debounce_since_ms: record.debounce.as_ref().map(|d| d.since_ms),
            debounce_key: record.debounce.map(|d| d.key),
            input_ty: u32::from(input.ty),
            input: if keep { input.payload } else { Bytes::new() },
            input_on_disk: !keep,
        };
        Self {
            entry,
            queue,
            kept: Kept::Packed(resting.encode_to_vec().into_boxed_slice()),
        }
    }

    /// Its packed record, if it kept one.
    fn resting(&self) -> Option<Resting> {
        match &self.kept {
            Kept::Packed(packed) => Some(
                Resting::decode(&**packed).expect("a resting record decodes: this code encoded it"),
            ),
            Kept::Stored { .. } => None,
        }
    }

    /// Back to a live invocation (queued, or waiting for its time), reading its record or its
    /// input back from `store` if they rested there. Changes nothing when it fails: the caller
    /// keeps it at rest (a store that cannot be read fails the health; the restart recovers
    /// it).
    pub(in crate::partition) fn wake(
        &self,
        id: InvocationId,
        store: &Store,
        held: &HeldMemory,
    ) -> Result<Live, CodedError> {
        let (record, input, in_memory) = match self.resting() {
            Some(resting) => unpack(id, resting, store)?,
            None => {
                let record = read_record(id, store)?;
                (record, read_input(id, store)?, 0)
            }
        };
        let mut live = Live::new(record, vec![input], self.entry);
        live.woken();
        if let Some(queue) = self.queue {
            live.set_run(Run::Queued { queue });
        }
        held.give_back(in_memory);
        held.count.fetch_sub(1, Ordering::Relaxed);
        Ok(live)
    }

    /// Whether it waits in a scheduler queue: what [`Self::listed`] lists, without
    /// unpacking it.
    pub(in crate::partition) fn waits(&self) -> bool {
        self.queue.is_some()
    }

    /// Its line in the partition's list of queued invocations; `None` for a delayed send.
    pub(in crate::partition) fn listed(&self, id: InvocationId) -> Option<QueuedEntry> {
        let queue = self.queue?;
        let (attempts, created_at_ms, run_at_ms) = match &self.kept {
            Kept::Stored { created_at_ms } => (0, *created_at_ms, None),
            Kept::Packed(_) => {
                let resting = self.resting()?;
                (resting.attempts, resting.created_at_ms, resting.run_at_ms)
            }
        };
        Some(QueuedEntry {
            queue,
            invocation: id,
            attempts,
            created_at_ms,
            run_at_ms,
            // At rest: it never ran, so nothing pins it yet.
            deployment: None,
        })
    }

    /// Bytes it holds in memory: itself and its packed record (with its input, if kept).
    pub(in crate::partition) fn footprint(&self) -> u64 {
        let packed = match &self.kept {
            Kept::Packed(packed) => packed.len(),
            Kept::Stored { .. } => 0,
        };
        (std::mem::size_of::<Self>() + packed) as u64
    }

    /// Its scheduler queue; `None` for a delayed send.
    pub(in crate::partition) fn queue(&self) -> Option<QueueId> {
        self.queue
    }

    /// Its scheduler entry.
    pub(in crate::partition) fn entry(&self) -> EntryId {
        self.entry
    }

    /// What a peek sees of it: where it goes, in which scope, and where it is (waiting for its
    /// time, or for its turn); it never ran, so it has no outcome. `None` when its record rests
    /// in the store alone: the peek reads it there, as it reads any record not in memory.
    pub(in crate::partition) fn peek(&self) -> Option<crate::partition::model::answer::Peek> {
        let resting = self.resting()?;
        Some(crate::partition::model::answer::Peek {
            status: if resting.scheduled {
                Status::Scheduled
            } else {
                Status::Pending
            },
            scope: resting.scope,
            target: Target {
                service: resting.service,
                handler: resting.handler,
                key: resting.key,
            },
            outcome: None,
        })
    }
}

/// The record, input and bytes of input kept in memory of a packed invocation, its input read
/// from `store` if it rested there.
fn unpack(
    id: InvocationId,
    resting: Resting,
    store: &Store,
) -> Result<(InvocationRecord, Frame, u64), CodedError> {
    let input_ty = u16::try_from(resting.input_ty).map_err(|_| {
        CodedError::new(
            Code::STO0002,
            format!("invocation {id} rested with a bad input type"),
        )
    })?;
    let (input, in_memory) = if resting.input_on_disk {
        (read_input(id, store)?, 0)
    } else {
        let len = resting.input.len() as u64;
        let input = Frame {
            ty: input_ty,
            ack: false,
            payload: resting.input,
        };
        (input, len)
    };
    let target = Target {
        service: resting.service,
        handler: resting.handler,
        key: resting.key,
    };
    let mut record = InvocationRecord::new(id, target, resting.created_at_ms);
    if resting.scheduled {
        record.status = Status::Scheduled;
    }
    record.attempts = resting.attempts;
    record.retry_count = resting.retry_count;
    record.run_at_ms = resting.run_at_ms;
    if let Some(seed) = resting.random_seed {
        record.random_seed = seed;
    }
    record.caller = resting.caller.and_then(|bytes| {
        Some(Caller {
            id: InvocationId::from_bytes(bytes.try_into().ok()?),
            completion: resting.caller_completion,
        })
    });
    // They were valid when the invocation came to rest; a bad one is a bug, not a guess.
    let rested =
        |e: CodedError| CodedError::new(Code::STO0002, format!("invocation {id} rested with {e}"));
    record.scope = parse_rested(resting.scope.as_deref(), Scope::parse).map_err(rested)?;
    record.limit_key =
        parse_rested(resting.limit_key.as_deref(), LimitKey::parse).map_err(rested)?;
    record.idempotency_key = resting.idempotency_key;
    record.retention_ms = resting.retention_ms;
    record.priority = resting
        .priority
        .map(|p| {
            u8::try_from(p)
                .ok()
                .and_then(|p| Priority::try_from(p).ok())
                .ok_or_else(|| rested(CodedError::new(Code::STO0002, format!("priority {p}"))))
        })
        .transpose()?;
    record.trace = resting.trace;
    record.deadline_ms = resting.deadline_ms;
    record.debounce = resting.debounce_key.map(|key| {
        Box::new(sluice_store::invocation::Debounced {
            key,
            since_ms: resting.debounce_since_ms.unwrap_or_default(),
        })
    });
    Ok((record, input, in_memory))
}

/// The stored record of an invocation at rest.
fn read_record(id: InvocationId, store: &Store) -> Result<InvocationRecord, CodedError> {
    store
        .with_db(|db| store::load_record(db, id))??
        .ok_or_else(|| {
            CodedError::new(
                Code::STO0002,
                format!("the record of held invocation {id} is missing from the store"),
            )
        })
}

/// The stored input (journal entry 0) of an invocation at rest.
fn read_input(id: InvocationId, store: &Store) -> Result<Frame, CodedError> {
    store
        .with_db(|db| store::load_entry(db, id, 0))??
        .ok_or_else(|| {
            CodedError::new(
                Code::STO0002,
                format!("the input of invocation {id} is missing from the store's journal"),
            )
        })
}

/// Debug builds (every test and simulator run): an invocation that rests with nothing of its
/// record in memory must read back exactly as it was, or waking it would change it.
#[cfg(debug_assertions)]
fn check_stored(record: &InvocationRecord, input: &Frame, store: &Store) {
    if store.is_closed() {
        return;
    }
    let id = record.id;
    // A read that fails is the store's fault, which the wake reports; this checks content.
    let stored = store.with_db(|db| {
        Ok::<_, CodedError>((store::load_record(db, id)?, store::load_entry(db, id, 0)?))
    });
    match stored {
        Ok(Ok((Some(stored), Some(stored_input)))) => {
            assert_eq!(
                &stored, record,
                "invocation {id} rests as its stored record"
            );
            assert_eq!(
                (stored_input.ty, &stored_input.payload),
                (input.ty, &input.payload),
                "invocation {id} rests with its stored input"
            );
        }
        Ok(Ok((record, input))) => panic!(
            "invocation {id} comes to rest without its record ({}) or input ({}) stored",
            record.is_some(),
            input.is_some()
        ),
        _ => {}
    }
}

#[cfg(not(debug_assertions))]
fn check_stored(_: &InvocationRecord, _: &Frame, _: &Store) {}

/// Parses an optional text that was written from a valid value.
fn parse_rested<T>(
    text: Option<&str>,
    parse: fn(&str) -> Result<T, CodedError>,
) -> Result<Option<T>, CodedError> {
    text.map(parse).transpose()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use sluice_flow::RuleBook;
    use sluice_flow::scheduler::{EntryKind, QueueKey, Scheduler};
    use sluice_protocol::{Message, proto};

    fn held(record: InvocationRecord) -> Live {
        let mut scheduler = Scheduler::new(Arc::new(RuleBook::new()), 1);
        let key = QueueKey {
            scope: None,
            limit_key: None,
            service: "Greeter".into(),
            object_key: None,
            priority: Default::default(),
        };
        let input = Message::Input(proto::InputCommandMessage {
            headers: vec![proto::Header {
                key: "x-restate-ingress-path".into(),
                value: "/service/scope/acme/send/Greeter/greet".into(),
            }],
            value: Some(proto::Value {
                content: Bytes::from_static(b"\"guest\""),
            }),
            name: String::new(),
        })
        .to_frame(false);
        let mut live = Live::new(record, vec![input], 7);
        live.set_run(Run::Queued {
            queue: scheduler.enqueue(&key, 7, EntryKind::New, None, 0),
        });
        live
    }

    /// `live` with an attempt running (its permit from a scheduler of its own).
    fn running(mut live: Live) -> Live {
        let mut scheduler = Scheduler::new(Arc::new(RuleBook::new()), 1);
        let key = QueueKey {
            scope: None,
            limit_key: None,
            service: "Greeter".into(),
            object_key: None,
            priority: Default::default(),
        };
        scheduler.enqueue(&key, 7, EntryKind::New, None, 0);
        let admitted = scheduler.poll_runnable(0).pop().expect("admitted");
        live.set_run(Run::Running(Box::new(
            crate::partition::model::phase::Attempt::new(admitted.permit),
        )));
        live
    }

    fn unbounded() -> HeldMemory {
        HeldMemory::new(u64::MAX)
    }

    #[test]
    fn running_journals_take_their_budget_and_give_it_back_when_their_attempts_end() {
        use crate::partition::model::phase::Journaled;
        let held = std::sync::Arc::new(HeldMemory::new(0).bounding_journals_by(100));
        let mut first = Journaled::new(1_000, std::sync::Arc::clone(&held));
        assert!(first.add(60));
        assert_eq!(first.bytes, 1_060, "the whole journal's bytes");
        let mut second = Journaled::new(0, std::sync::Arc::clone(&held));
        assert!(!second.add(41), "past the budget: nothing taken");
        assert_eq!(second.bytes, 0);
        assert!(second.add(40));
        assert_eq!(held.running_journal_bytes(), 100);
        drop(first);
        assert_eq!(
            held.running_journal_bytes(),
            40,
            "an ended attempt gives its share back"
        );
        drop(second);
        assert_eq!(held.running_journal_bytes(), 0);
    }

    fn scratch_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        (dir, store)
    }

    fn target() -> Target {
        Target {
            service: "Greeter".into(),
            handler: "greet".into(),
            key: Some("k".into()),
        }
    }

    #[test]
    fn every_field_of_a_waiting_record_survives_rest() {
        let id = InvocationId::new(42, 7);
        let mut record = InvocationRecord::new(id, target(), 1_795_000_000_000);
        record.status = Status::Scheduled;
        record.attempts = 2;
        record.retry_count = 1;
        record.run_at_ms = Some(1_795_000_005_000);
        record.random_seed = 99;
        record.caller = Some(Caller {
            id: InvocationId::new(43, 8),
            completion: 3,
        });
        record.scope = Some(Scope::parse("acme").unwrap());
        record.limit_key = Some(LimitKey::parse("eu/gold").unwrap());
        record.idempotency_key = Some("k-1".into());
        record.retention_ms = Some(60_000);
        record.priority = Some(sluice_flow::Priority::HIGH);
        record.trace = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
        let live = held(record.clone());
        let (journal, queue) = (live.journal.clone(), live.run().queue());
        assert!(Dormant::fits(&live));
        let (_dir, store) = scratch_store();
        let woken = Dormant::of(live, &store, &unbounded())
            .wake(id, &store, &unbounded())
            .unwrap();
        assert_eq!(woken.record(), &record);
        assert_eq!(woken.journal, journal);
        assert!(queue.is_some());
        assert_eq!((woken.run().queue(), woken.entry), (queue, 7));
    }

    #[test]
    fn a_held_send_rests_in_a_few_dozen_bytes_beside_its_input() {
        let id = InvocationId::new(42, 7);
        let mut record = InvocationRecord::new(id, target(), 1_795_000_000_000);
        record.target.key = None;
        record.scope = Some(Scope::parse("acme").unwrap());
        let live = held(record.clone());
        let input = live.journal[0].payload.len();
        let held = unbounded();
        let (_dir, store) = scratch_store();
        let dormant = Dormant::of(live, &store, &held);
        // docs/perf.md says "about 40 bytes plus the input": this record packs into 36.
        assert!(
            packed_len(&dormant) <= input + 40,
            "{} bytes for {input} bytes of input",
            packed_len(&dormant)
        );
        assert_eq!((held.count(), held.bytes()), (1, input as u64));
        assert_eq!(dormant.wake(id, &store, &held).unwrap().record(), &record);
        assert_eq!((held.count(), held.bytes()), (0, 0));
    }

    #[test]
    fn only_invocations_that_just_wait_rest() {
        let id = InvocationId::new(42, 7);
        let record = InvocationRecord::new(id, target(), 0);
        let running = running(held(record.clone()));
        let mut started = held(record.clone());
        started.set_status(Status::Suspended);
        let mut awaited = held(record.clone());
        awaited.waiters.push(tokio::sync::oneshot::channel().0);
        let mut journaled = held(record.clone());
        journaled.journal.push(journaled.journal[0].clone());
        let mut unqueued = held(record);
        unqueued.set_run(Run::IDLE);
        for live in [running, started, awaited, journaled, unqueued] {
            assert!(!Dormant::fits(&live), "{:?}", live.record().status);
        }
    }

    #[test]
    fn past_the_budget_inputs_rest_in_the_store_and_are_read_back() {
        let id = InvocationId::new(42, 7);
        let record = InvocationRecord::new(id, target(), 0);
        let live = held(record.clone());
        let journal = live.journal.clone();
        let (_dir, store) = scratch_store();
        store_as_submitted(&store, &record, &journal[0]);
        let held_memory = HeldMemory::new(4);
        let dormant = Dormant::of(live, &store, &held_memory);
        assert_eq!(held_memory.bytes(), 0, "over the budget: nothing kept");
        // Without its input, nothing of its record stays in memory either: the store has it.
        assert!(matches!(dormant.kept, Kept::Stored { created_at_ms: 0 }));
        assert_eq!(dormant.footprint(), 32);
        let listed = dormant.listed(id).unwrap();
        assert_eq!(
            (listed.attempts, listed.created_at_ms, listed.run_at_ms),
            (0, 0, None)
        );
        assert!(
            dormant.peek().is_none(),
            "its record is read from the store"
        );
        let woken = dormant.wake(id, &store, &held_memory).unwrap();
        assert_eq!(woken.journal, journal);
        assert_eq!(woken.record(), &record);
        assert_eq!(held_memory.count(), 0);
        // A delayed send never keeps its input, whatever the budget.
        let mut delayed = held(record);
        delayed.set_run(Run::IDLE);
        delayed.set_status(Status::Scheduled);
        delayed.set_run_at(Some(5));
        store_as_submitted(&store, delayed.record(), &journal[0]);
        let delayed_record = delayed.record().clone();
        assert!(Dormant::fits(&delayed));
        let unbounded = unbounded();
        let dormant = Dormant::of(delayed, &store, &unbounded);
        assert_eq!(unbounded.bytes(), 0);
        assert!(matches!(dormant.kept, Kept::Stored { .. }));
        assert!(
            dormant.listed(id).is_none(),
            "waits for its time, in no queue"
        );
        let woken = dormant.wake(id, &store, &unbounded).unwrap();
        assert!(woken.run().queue().is_none());
        assert_eq!(woken.journal, journal);
        assert_eq!(woken.record(), &delayed_record);
    }

    #[test]
    fn a_queued_invocation_with_attempts_or_a_run_time_keeps_its_record_packed_past_the_budget() {
        let id = InvocationId::new(42, 7);
        let mut record = InvocationRecord::new(id, target(), 0);
        record.run_at_ms = Some(5);
        let live = held(record.clone());
        let journal = live.journal.clone();
        let (_dir, store) = scratch_store();
        store_as_submitted(&store, &record, &journal[0]);
        let held_memory = HeldMemory::new(0);
        let dormant = Dormant::of(live, &store, &held_memory);
        // Listed with its run time without a store read: the record stays, without its input.
        assert!(packed_len(&dormant) <= 40, "{} bytes", packed_len(&dormant));
        assert_eq!(dormant.listed(id).unwrap().run_at_ms, Some(5));
        let woken = dormant.wake(id, &store, &held_memory).unwrap();
        assert_eq!((woken.record(), &woken.journal), (&record, &journal));
    }

    #[test]
    fn a_held_invocation_at_rest_is_32_bytes_beside_its_24_byte_id() {
        assert_eq!(std::mem::size_of::<Dormant>(), 32);
        assert_eq!(std::mem::size_of::<InvocationId>(), 24);
    }

    /// What a send's submission stores: its record and its input.
    fn store_as_submitted(store: &Store, record: &InvocationRecord, input: &Frame) {
        let mut writes = sluice_store::storage::writer::WriteSet::default();
        store::put_record(&mut writes, record).unwrap();
        store::put_entry(&mut writes, record.id, 0, input);
        writes.commit_now(store);
    }

    fn packed_len(dormant: &Dormant) -> usize {
        match &dormant.kept {
            Kept::Packed(packed) => packed.len(),
            Kept::Stored { .. } => panic!("nothing packed"),
        }
    }
}
