//! Cluster mode in the simulator (`docs/cluster.md`): half the runs write through a partition
//! log first. The log is kept whole (Kafka's `acks=all` keeps what it acknowledged); a node's
//! store is a replica of it. The leader's write path is the server's own
//! (`replication::leader::Leading` over `storage::pipeline::Pipeline`, its log a simulated
//! broker's client), and a replica reads the log by the server's rule (`replication::replica`):
//! up to `records-in-flight` records (drawn per run) handed to a simulated broker, each stored, and its sets acknowledged, only once it landed where it was
//! meant to. The broker keeps their order but answers when it likes (records stay in flight
//! across commits), refuses some (a refused record may have landed all the same, like a
//! timeout, and the records behind it land or not), and fences: another node appends its
//! epoch, the old leader runs on as a zombie whose records land after that epoch (they must
//! count nowhere and acknowledge nothing), and the new leader rebuilds its store from the log
//! on a fresh disk. A crash restarts the node on its own disk, caught up from the log, under a
//! new epoch; what it had in flight lands or not, in order.

use futures_util::FutureExt as _;

use super::*;
use crate::replication::leader::Leading;
use crate::replication::replica::{Read, Replica};
use sluice_store::storage::fencing::{Position, Verdict};
use sluice_store::storage::log::{PartitionLog, confirm};
use sluice_store::storage::pipeline::{MAX_RECORDS_IN_FLIGHT, Pipeline};
use sluice_store::storage::record::{Leader, Record};
use sluice_store::storage::writer::WriteSet;

/// The one partition's log, and the broker in front of it.
pub(super) struct SimLog {
    records: Vec<Vec<u8>>,
    /// Records the running node handed to the broker and has no answer for yet, in order.
    queued: VecDeque<Vec<u8>>,
    /// How many records a leader may have in flight in this run.
    records_in_flight: usize,
    /// Leadership changes so far.
    pub(super) takeovers: u64,
    /// Records of a fenced leader (each must have been refused).
    pub(super) fenced: u64,
    /// Records the broker refused.
    pub(super) refused: u64,
    /// The most records a leader had in flight at once.
    pub(super) most_in_flight: usize,
    /// Digests of the records each leader (by incarnation) handed to the broker, in order.
    sent: std::collections::HashMap<u64, Vec<u64>>,
}

/// A leader's client of the simulated broker: the records the leader handed it, which the
/// world carries to the broker, and the broker's answers, which the world carries back.
#[derive(Default)]
pub(super) struct BrokerClient {
    handed: VecDeque<Vec<u8>>,
    answers: VecDeque<Result<u64, CodedError>>,
    unconfirmed: usize,
}

impl PartitionLog for BrokerClient {
    fn append(&mut self, record: &[u8]) -> impl Future<Output = Result<(), CodedError>> + Send {
        self.handed.push_back(record.to_vec());
        self.unconfirmed += 1;
        std::future::ready(Ok(()))
    }

    fn poll_confirm(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<u64, CodedError>> {
        match self.answers.pop_front() {
            Some(answer) => {
                self.unconfirmed -= 1;
                std::task::Poll::Ready(answer)
            }
            None => std::task::Poll::Pending,
        }
    }

    fn unconfirmed(&self) -> usize {
        self.unconfirmed
    }

    fn release(&mut self, _: u64) -> Result<(), CodedError> {
        Ok(())
    }
}

/// A node's part in the log: its records on their way, and the sets waiting to go.
pub(super) type SimLeading = Leading<BrokerClient>;

impl SimLog {
    pub(super) fn new(rng: &mut Rng) -> Self {
        Self {
            records: Vec::new(),
            queued: VecDeque::new(),
            records_in_flight: 1 + rng.below(MAX_RECORDS_IN_FLIGHT as u64) as usize,
            takeovers: 0,
            fenced: 0,
            refused: 0,
            most_in_flight: 0,
            sent: Default::default(),
        }
    }

    /// Hands a leader's `record` to the broker.
    fn send(&mut self, record: Vec<u8>) {
        if let Ok(Record::Writes { incarnation, .. }) = Record::decode(&record, usize::MAX) {
            self.sent
                .entry(incarnation)
                .or_default()
                .push(digest(&record));
        }
        self.queued.push_back(record);
    }

    /// What the fencing rule applies of each leader is a prefix of what it sent, in order: a
    /// store holding a later record without an earlier one would be one no run of the
    /// partition wrote.
    fn check_prefixes(&self) {
        let mut position = Position::default();
        let mut applied: std::collections::HashMap<u64, usize> = Default::default();
        for (offset, bytes) in self.records.iter().enumerate() {
            let record = Record::decode(bytes, usize::MAX).expect("the log holds records");
            if position.admit(offset as i64, &record) != Verdict::Apply {
                continue;
            }
            let Record::Writes { incarnation, .. } = record else {
                unreachable!("only write sets are applied")
            };
            let n = applied.entry(incarnation).or_default();
            let sent = self.sent.get(&incarnation).and_then(|sent| sent.get(*n));
            assert_eq!(
                sent,
                Some(&digest(bytes)),
                "the record at offset {offset} counts, but it is not record {n} its leader sent: a record before it was lost"
            );
            *n += 1;
        }
    }

    /// The node died: what it had handed to the broker lands, in order, up to a point
    /// (acknowledged by Kafka or not, its leader never heard); the rest is gone.
    pub(super) fn crash(&mut self, rng: &mut Rng) {
        let landed = rng.below(self.queued.len() as u64 + 1) as usize;
        let queued = std::mem::take(&mut self.queued);
        self.records.extend(queued.into_iter().take(landed));
    }

    fn highest_epoch(&self) -> u64 {
        self.records
            .iter()
            .filter_map(|bytes| match Record::decode(bytes, usize::MAX) {
                Ok(Record::Epoch(leader)) => Some(leader.epoch),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    fn append_epoch(&mut self, incarnation: u64) -> Leader {
        let leader = Leader {
            epoch: self.highest_epoch() + 1,
            incarnation,
            node: format!("node-{incarnation:x}"),
            ..Leader::default()
        };
        self.records.push(Record::Epoch(leader.clone()).encode());
        leader
    }

    /// Applies what `store` has not read yet, by the replica's rule (`Replica::read`, as the
    /// server's replica reader does).
    fn catch_up(&self, store: &Store) {
        let position = store
            .with_db(Position::load_all)
            .expect("the store is open")
            .expect("positions read back")
            .remove(&0)
            .unwrap_or_default();
        let from = usize::try_from(position.next).unwrap_or(0);
        let mut replica = Replica::at(position);
        let mut writes = WriteSet::default();
        for (offset, bytes) in self.records.iter().enumerate().skip(from) {
            match replica.read(0, offset as i64, bytes, usize::MAX, &mut writes) {
                Read::Read {
                    stop_leading: false,
                    store_position: true,
                    ..
                } => {}
                other => panic!("a replica reading the whole log from its position: {other:?}"),
            }
        }
        let stored = replica.save(0, &mut writes);
        assert_eq!(
            stored,
            Some(self.records.len() as i64),
            "read to the log's end"
        );
        writes.commit_now(store);
        self.check_prefixes();
    }
}

fn digest(bytes: &[u8]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

impl World {
    /// The store of a node taking the partition over: caught up with the log, under a new
    /// epoch of its own; its partition writes through the answer.
    pub(super) fn take_over(
        &mut self,
        store: &Arc<Store>,
        redb: Writer,
    ) -> Option<(Writer, SimLeading)> {
        let incarnation = self.rng.next_u64();
        let log = self.log.as_mut()?;
        let leader = log.append_epoch(incarnation);
        log.catch_up(store);
        let next = log.records.len() as i64;
        let (writer, staged) = Writer::staged();
        let pipeline = Pipeline::new(0, leader, next, log.records_in_flight, redb);
        let leading = Leading::new(0, pipeline, staged, BrokerClient::default(), usize::MAX);
        Some((writer, leading))
    }

    /// Moves the partition's waiting sets into the leader's pipeline and their records to the
    /// broker, then lets the broker answer some of what it holds; stores what landed. False
    /// when this node no longer leads (a refused record, or one that landed after another's
    /// epoch: this node is a zombie, nothing of it counts).
    pub(super) fn through_log(&mut self) -> bool {
        let node = self.node.as_mut().expect("the node runs");
        let log = self.log.as_mut().expect("cluster mode");
        let rng = &mut self.rng;
        let Some(leading) = node.leading.as_mut() else {
            node.flusher.flush();
            return true;
        };
        leading
            .send_waiting()
            .now_or_never()
            .expect("the simulated broker's client takes a record at once")
            .expect("the simulated broker's client refuses nothing");
        for record in leading.log().handed.drain(..) {
            log.send(record);
        }
        log.most_in_flight = log.most_in_flight.max(leading.in_flight());
        // The broker answers in order; a delay leaves the rest in flight for later commits.
        let answering = match rng.below(10) {
            0..4 => log.queued.len(),
            4..7 => 0,
            _ => rng.below(log.queued.len() as u64 + 1) as usize,
        };
        let mut leads = true;
        let mut stored = Vec::new();
        for _ in 0..answering {
            let record = log.queued.pop_front().expect("counted");
            let result = if rng.below(400) == 0 {
                log.refused += 1;
                if rng.chance(50) {
                    // A timeout: it landed, but the leader heard otherwise.
                    log.records.push(record);
                }
                Err(CodedError::new(
                    Code::CLU0001,
                    "the broker refused the record",
                ))
            } else {
                log.records.push(record);
                Ok(log.records.len() as u64 - 1)
            };
            let fenced = result.is_ok();
            leading.log().answers.push_back(result);
            let confirmed = confirm(leading.log())
                .now_or_never()
                .expect("an answer waits");
            if let Err(e) = leading.landed(confirmed) {
                if fenced {
                    log.fenced += 1;
                }
                stored.extend(leading.step_down(&e));
                // What the broker still holds of this leader lands, in order, up to a point:
                // none of it may count.
                log.crash(rng);
                leads = false;
                break;
            }
        }
        stored.extend(leading.take_stored());
        node.flusher.flush();
        for store in stored {
            store
                .now_or_never()
                .expect("a flushed group has its answer");
        }
        leads
    }

    /// Another node takes the partition over. This one runs on as a zombie until it writes
    /// (its record lands after the new epoch and is refused) or is stopped; the new leader
    /// starts on a fresh disk, from the log alone.
    pub(super) fn hand_over(&mut self) {
        let Some(log) = self.log.as_mut() else {
            return;
        };
        log.takeovers += 1;
        let incarnation = self.rng.next_u64();
        log.append_epoch(incarnation);
        self.fresh_disk = true;
        // The zombie goes on with what it has (and what arrives meanwhile).
        self.pump();
        if self.fresh_disk {
            // It wrote nothing: it learns of the new epoch and steps down.
            self.crash();
        }
    }
}
