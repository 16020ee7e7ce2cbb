//! A partition leader's way from its stage to the partition log (cluster mode,
//! `docs/cluster.md`): up to `cluster.records-in-flight` records appended and not yet confirmed,
//! in order. A record's sets are stored, and answered, only once the log confirmed it landed
//! at the offset it was meant for; an empty group is answered behind every record before it.
//!
//! It does no I/O: the server drives it with Kafka's idempotent producer (which keeps the
//! records of one partition in the order they were handed to it), the partition simulator
//! with its simulated broker. Both run this same code.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use super::changes::Changes;
use super::fencing::Position;
use super::record::Leader;
use super::writer::{Group, WriteSet, Writer};
use sluice_core::errors::{Code, CodedError};

/// Most records one leader may have in flight; Kafka's idempotent producer keeps a partition's
/// order for up to five requests in flight.
pub const MAX_RECORDS_IN_FLIGHT: usize = 5;

/// A confirmed group on its way into the local store: its sets are answered when it ends.
pub type Stored = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A group taken from the stage and not yet stored.
enum Slot {
    /// Its record was handed to the log.
    Record(Group),
    /// It writes nothing; it waits for the records before it.
    Empty(Group),
}

/// One leader's records in flight. See the module documentation.
pub struct Pipeline {
    partition: u32,
    leader: Leader,
    /// The offset the oldest record in flight must land at.
    next: i64,
    slots: VecDeque<Slot>,
    /// How many of `slots` are records.
    records: usize,
    max_records: usize,
    /// The local store's writer, which the confirmed groups go to.
    writer: Writer,
    stored: Vec<Stored>,
    /// Where what each confirmed record writes is noted for the next snapshot.
    changes: Option<std::sync::Arc<Changes>>,
}

impl Pipeline {
    /// The pipeline of `leader` on `partition`, whose next record must land at `next`, with at
    /// most `max_records` records in flight (clamped to 1..=[`MAX_RECORDS_IN_FLIGHT`]).
    pub fn new(
        partition: u32,
        leader: Leader,
        next: i64,
        max_records: usize,
        writer: Writer,
    ) -> Self {
        Self {
            partition,
            leader,
            next,
            slots: VecDeque::new(),
            records: 0,
            max_records: max_records.clamp(1, MAX_RECORDS_IN_FLIGHT),
            writer,
            stored: Vec::new(),
            changes: None,
        }
    }

    /// Notes in `changes` what every record confirmed from now on writes (for the
    /// partition's incremental snapshots).
    pub fn noting(mut self, changes: std::sync::Arc<Changes>) -> Self {
        self.changes = Some(changes);
        self
    }

    /// Whether another record may be handed to the log.
    pub fn has_room(&self) -> bool {
        self.records < self.max_records
    }

    /// How many records wait for the log's answer.
    pub fn in_flight(&self) -> usize {
        self.records
    }

    /// Takes `group` from the stage: the record to hand to the log now, right behind every
    /// record this pipeline handed out before, or `None` for a group that writes nothing (it
    /// is answered behind the records in flight).
    pub fn push(&mut self, group: Group) -> Option<Vec<u8>> {
        if group.is_empty() {
            if self.slots.is_empty() {
                self.store(group, WriteSet::default());
            } else {
                self.slots.push_back(Slot::Empty(group));
            }
            return None;
        }
        let at = self.next.saturating_add(self.records as i64);
        let record = group.record(self.leader.epoch, self.leader.incarnation, at);
        self.slots.push_back(Slot::Record(group));
        self.records += 1;
        Some(record)
    }

    /// The log's answer for the oldest record in flight: the offset it landed at, or why it
    /// did not land. An error means this node no longer leads: every group in flight has
    /// been answered with it, and the pipeline is empty.
    pub fn landed(&mut self, result: Result<i64, CodedError>) -> Result<(), CodedError> {
        let group = match self.slots.pop_front() {
            Some(Slot::Record(group)) => group,
            other => {
                // An answer for a record never handed out: the caller's bug, but not one to
                // acknowledge anything on.
                if let Some(Slot::Empty(group)) = other {
                    self.slots.push_front(Slot::Empty(group));
                }
                let error = lost(self.partition, "the log answered a record never appended");
                self.fail_all(&error);
                return Err(error);
            }
        };
        self.records -= 1;
        let error = match result {
            Ok(at) if at == self.next => {
                if let Some(changes) = &self.changes {
                    changes.note(at, &group);
                }
                self.next = at.saturating_add(1);
                let mut position = WriteSet::default();
                Position {
                    next: self.next,
                    leader: self.leader.clone(),
                }
                .save(self.partition, &mut position);
                self.store(group, position);
                while let Some(Slot::Empty(_)) = self.slots.front() {
                    let Some(Slot::Empty(group)) = self.slots.pop_front() else {
                        unreachable!("just looked")
                    };
                    self.store(group, WriteSet::default());
                }
                return Ok(());
            }
            Ok(at) => lost(
                self.partition,
                &format!(
                    "its record landed at offset {at}, not {}: another node appended to the log",
                    self.next
                ),
            ),
            Err(e) => e,
        };
        group.fail(&error);
        self.fail_all(&error);
        Err(error)
    }

    /// Answers every group in flight with `error` (the leader steps down).
    pub fn fail_all(&mut self, error: &CodedError) {
        for slot in self.slots.drain(..) {
            match slot {
                Slot::Record(group) | Slot::Empty(group) => group.fail(error),
            }
        }
        self.records = 0;
    }

    /// The groups confirmed since the last call, each handed to the local writer in log
    /// order; run them to answer their sets.
    pub fn take_stored(&mut self) -> Vec<Stored> {
        std::mem::take(&mut self.stored)
    }

    fn store(&mut self, group: Group, extra: WriteSet) {
        self.stored.push(Box::pin(group.store(&self.writer, extra)));
    }
}

/// The answer of a set this leader can no longer write: `why` it stopped.
pub fn lost(partition: u32, why: &str) -> CodedError {
    CodedError::new(
        Code::CLU0001,
        format!("partition {partition} is no longer led by this node ({why}); retry"),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::schema;
    use crate::storage::Store;
    use crate::storage::fencing::Verdict;
    use crate::storage::record::Record;
    use crate::storage::writer::Commit;

    fn set(key: &[u8]) -> WriteSet {
        let mut writes = WriteSet::default();
        writes.put(schema::INVOCATIONS, key, b"v".to_vec());
        writes
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        store: Arc<Store>,
        flusher: crate::storage::writer::Flusher,
        stage: Writer,
        staged: crate::storage::writer::Staged,
        pipeline: Pipeline,
    }

    fn fixture(max_records: usize) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let (redb, flusher) = Writer::manual(Arc::clone(&store));
        let (stage, staged) = Writer::staged();
        let leader = Leader {
            epoch: 1,
            incarnation: 7,
            ..Leader::default()
        };
        Fixture {
            _dir: dir,
            store,
            flusher,
            stage,
            staged,
            pipeline: Pipeline::new(0, leader, 1, max_records, redb),
        }
    }

    impl Fixture {
        /// Queues `writes` and takes it as a group of its own.
        fn push(&mut self, writes: WriteSet) -> (Commit, Option<Vec<u8>>) {
            let answer = self.stage.commit(writes);
            let group = self.staged.try_group(usize::MAX).unwrap();
            (answer, self.pipeline.push(group))
        }

        fn store(&mut self) {
            let stored = self.pipeline.take_stored();
            self.flusher.flush();
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            for mut store in stored {
                assert!(store.as_mut().poll(&mut cx).is_ready(), "flushed");
            }
        }
    }

    fn answer(commit: &mut Commit) -> Option<Result<(), CodedError>> {
        commit.try_recv().ok()
    }

    #[test]
    fn records_name_their_offsets_and_are_answered_in_order_once_they_landed() {
        let mut f = fixture(3);
        let (mut a, ra) = f.push(set(b"a"));
        let (mut b, rb) = f.push(set(b"b"));
        let (mut empty, none) = f.push(WriteSet::default());
        assert!(none.is_none());
        let (_c, rc) = f.push(set(b"c"));
        assert!(!f.pipeline.has_room(), "three records in flight");
        for (bytes, at) in [(ra, 1), (rb, 2), (rc, 3)] {
            let record = Record::decode(&bytes.unwrap(), usize::MAX).unwrap();
            assert!(matches!(record, Record::Writes { at: Some(x), .. } if x == at));
        }
        f.store();
        assert!(answer(&mut a).is_none(), "nothing landed yet");
        f.pipeline.landed(Ok(1)).unwrap();
        f.store();
        assert_eq!(answer(&mut a), Some(Ok(())));
        assert!(answer(&mut empty).is_none(), "the empty set waits for b");
        f.pipeline.landed(Ok(2)).unwrap();
        f.store();
        assert_eq!(answer(&mut b), Some(Ok(())));
        assert_eq!(answer(&mut empty), Some(Ok(())));
        assert_eq!(f.pipeline.in_flight(), 1);
        let position = f
            .store
            .with_db(Position::load_all)
            .unwrap()
            .unwrap()
            .remove(&0)
            .unwrap();
        assert_eq!(position.next, 3);
    }

    #[test]
    fn a_record_that_landed_elsewhere_fails_every_set_in_flight() {
        let mut f = fixture(5);
        let (mut a, _) = f.push(set(b"a"));
        let (mut b, _) = f.push(set(b"b"));
        let (mut empty, _) = f.push(WriteSet::default());
        // Another node's epoch record took offset 1.
        let err = f.pipeline.landed(Ok(2)).unwrap_err();
        assert_eq!(err.code, Some(Code::CLU0001));
        assert!(err.message.contains("landed at offset 2, not 1"), "{err}");
        f.store();
        for commit in [&mut a, &mut b, &mut empty] {
            assert_eq!(
                answer(commit).unwrap().unwrap_err().code,
                Some(Code::CLU0001)
            );
        }
        assert_eq!(f.pipeline.in_flight(), 0);
        assert!(f.pipeline.has_room());
    }

    #[test]
    fn a_refused_record_fails_it_and_every_record_behind_it() {
        let mut f = fixture(2);
        let (mut a, _) = f.push(set(b"a"));
        let (mut b, _) = f.push(set(b"b"));
        f.pipeline.landed(Ok(1)).unwrap();
        let refused = CodedError::new(Code::CLU0001, "the broker refused");
        assert_eq!(f.pipeline.landed(Err(refused.clone())), Err(refused));
        f.store();
        assert_eq!(answer(&mut a), Some(Ok(())));
        assert!(answer(&mut b).unwrap().is_err());
        // An answer for nothing in flight is refused, not acknowledged.
        assert!(f.pipeline.landed(Ok(2)).is_err());
    }

    #[test]
    fn an_empty_group_with_nothing_in_flight_is_answered_at_once() {
        let mut f = fixture(1);
        let (mut empty, record) = f.push(WriteSet::default());
        assert!(record.is_none());
        f.store();
        assert_eq!(answer(&mut empty), Some(Ok(())));
    }

    #[test]
    fn records_behind_a_lost_one_count_nowhere() {
        // What the fencing rule makes of a pipeline whose second record was lost while the
        // third landed in its place.
        let mut f = fixture(3);
        let (_, r1) = f.push(set(b"a"));
        let (_, _lost) = f.push(set(b"b"));
        let (_, r3) = f.push(set(b"c"));
        let mut position = Position::default();
        let epoch = Record::Epoch(Leader {
            epoch: 1,
            incarnation: 7,
            ..Leader::default()
        });
        assert_eq!(position.admit(0, &epoch), Verdict::Accepted);
        let r1 = Record::decode(&r1.unwrap(), usize::MAX).unwrap();
        let r3 = Record::decode(&r3.unwrap(), usize::MAX).unwrap();
        assert_eq!(position.admit(1, &r1), Verdict::Apply);
        assert_eq!(position.admit(2, &r3), Verdict::Ignore);
    }
}
