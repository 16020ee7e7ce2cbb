//! Epoch fencing (`docs/cluster.md`): which records of a partition's log count, and where a
//! node's store keeps its position in each partition's log.

use redb::ReadableDatabase;

use super::record::{Leader, Record, bad};
use super::write_set::WriteSet;
use sluice_core::errors::{Code, CodedError};

// Where this node's store is in each partition's log. Key: partition (u32 BE). Value: a
// `Position` as `Position::encode` writes it.
use crate::schema::CLUSTER_LOG as POSITIONS;

/// What a reader does with a record, by the fencing rule of `docs/cluster.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// An epoch record that takes the partition over.
    Accepted,
    /// Writes of the current leader, landed where it meant them: apply them.
    Apply,
    /// A stale epoch record, writes of a leader that is not the current one, or writes that
    /// landed elsewhere than their leader meant (a record of its before them was lost).
    Ignore,
}

/// A partition's log read so far: the next offset to read and who leads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Position {
    /// The offset of the next record to read.
    pub next: i64,
    /// The current leader (epoch 0: none yet).
    pub leader: Leader,
}

impl Position {
    /// Reads the record at `offset`: what to do with it, and the position after it.
    pub fn admit(&mut self, offset: i64, record: &Record) -> Verdict {
        self.next = offset.saturating_add(1);
        match record {
            Record::Epoch(leader) if leader.epoch > self.leader.epoch => {
                self.leader = leader.clone();
                Verdict::Accepted
            }
            Record::Epoch(_) => Verdict::Ignore,
            Record::Writes {
                epoch,
                incarnation,
                at,
                ..
            } if *epoch == self.leader.epoch
                && *incarnation == self.leader.incarnation
                && self.leader.epoch > 0
                && at.is_none_or(|at| at == offset) =>
            {
                Verdict::Apply
            }
            Record::Writes { .. } => Verdict::Ignore,
        }
    }

    /// The row's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.next.to_be_bytes());
        out.extend_from_slice(&Record::Epoch(self.leader.clone()).encode());
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, CodedError> {
        let (next, rest) = bytes
            .split_first_chunk::<8>()
            .ok_or_else(|| bad("a position row shorter than 8 bytes"))?;
        let Record::Epoch(leader) = Record::decode(rest, usize::MAX)? else {
            return Err(bad("a position row without its leader"));
        };
        Ok(Self {
            next: i64::from_be_bytes(*next),
            leader,
        })
    }

    /// Writes this position of `partition` with `writes`, in the same transaction.
    pub fn save(&self, partition: u32, writes: &mut WriteSet) {
        writes.put(POSITIONS, &partition.to_be_bytes(), self.encode());
    }

    /// The stored position of partition `p` in `txn` (`None`: never read).
    pub fn load_in(txn: &redb::ReadTransaction, p: u32) -> Result<Option<Position>, CodedError> {
        let table = match txn.open_table(POSITIONS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(read_failed(e)),
        };
        let row =
            redb::ReadableTable::get(&table, p.to_be_bytes().as_slice()).map_err(read_failed)?;
        row.map(|value| Position::decode(value.value())).transpose()
    }

    /// The stored position of every partition (a partition never read is absent).
    pub fn load_all(
        db: &redb::Database,
    ) -> Result<std::collections::HashMap<u32, Position>, CodedError> {
        let txn = db.begin_read().map_err(read_failed)?;
        let table = match txn.open_table(POSITIONS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Default::default()),
            Err(e) => return Err(read_failed(e)),
        };
        let mut all = std::collections::HashMap::new();
        for row in redb::ReadableTable::iter(&table).map_err(read_failed)? {
            let (key, value) = row.map_err(read_failed)?;
            let partition = <[u8; 4]>::try_from(key.value())
                .map(u32::from_be_bytes)
                .map_err(|_| bad("a position row whose key is not a partition"))?;
            all.insert(partition, Position::decode(value.value())?);
        }
        Ok(all)
    }
}

fn read_failed(e: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::RT0009, format!("cannot read the log positions: {e}"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn leader(epoch: u64, incarnation: u64) -> Record {
        Record::Epoch(Leader {
            epoch,
            incarnation,
            ..Leader::default()
        })
    }

    fn writes(epoch: u64, incarnation: u64) -> Record {
        Record::Writes {
            epoch,
            incarnation,
            at: None,
            writes: WriteSet::default(),
        }
    }

    fn writes_at(epoch: u64, incarnation: u64, at: i64) -> Record {
        Record::Writes {
            epoch,
            incarnation,
            at: Some(at),
            writes: WriteSet::default(),
        }
    }

    #[test]
    fn a_leaders_record_counts_only_where_it_meant_to_land() {
        let mut at = Position::default();
        assert_eq!(at.admit(0, &leader(1, 10)), Verdict::Accepted);
        assert_eq!(at.admit(1, &writes_at(1, 10, 1)), Verdict::Apply);
        // The record meant for offset 2 was lost (a failed produce); the ones sent behind it
        // landed one early: none of them counts, or the state would miss the lost writes.
        assert_eq!(at.admit(2, &writes_at(1, 10, 3)), Verdict::Ignore);
        assert_eq!(at.admit(3, &writes_at(1, 10, 4)), Verdict::Ignore);
        // The next leader's records count again.
        assert_eq!(at.admit(4, &leader(2, 20)), Verdict::Accepted);
        assert_eq!(at.admit(5, &writes_at(2, 20, 5)), Verdict::Apply);
    }

    #[test]
    fn only_the_current_leaders_writes_count() {
        let mut at = Position::default();
        // Nobody leads yet: writes are ignored.
        assert_eq!(at.admit(0, &writes(0, 0)), Verdict::Ignore);
        assert_eq!(at.admit(1, &leader(1, 10)), Verdict::Accepted);
        assert_eq!(at.admit(2, &writes(1, 10)), Verdict::Apply);
        // A second epoch record of the same number (a race) loses.
        assert_eq!(at.admit(3, &leader(1, 11)), Verdict::Ignore);
        assert_eq!(at.admit(4, &writes(1, 11)), Verdict::Ignore);
        // A takeover; the old leader is now a zombie.
        assert_eq!(at.admit(5, &leader(2, 20)), Verdict::Accepted);
        assert_eq!(at.admit(6, &writes(1, 10)), Verdict::Ignore);
        assert_eq!(at.admit(7, &writes(2, 20)), Verdict::Apply);
        assert_eq!(at.next, 8);
    }

    #[test]
    fn positions_are_stored_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::storage::Store::open(dir.path()).unwrap();
        let position = Position {
            next: 42,
            leader: Leader {
                epoch: 2,
                incarnation: 5,
                node: "n2".into(),
                ..Leader::default()
            },
        };
        let mut set = WriteSet::default();
        position.save(3, &mut set);
        set.commit_now(&store);
        let all = store.with_db(Position::load_all).unwrap().unwrap();
        assert_eq!(all.get(&3), Some(&position));
    }

    proptest! {
        /// A reader that resumes from a stored position (a replica restarting from its store,
        /// a new leader's takeover) agrees with one that read the whole log on every verdict
        /// after it, whatever the log holds: the rule reads nothing but the log and what the
        /// stored position keeps. It fails if the position's row forgets state the rule uses.
        #[test]
        fn readers_agree(
            log in proptest::collection::vec((0..3u8, 0..4u64, 0..3u64, 0..40i64), 0..40),
            resume in 0..40usize,
        ) {
            let records: Vec<Record> = log
                .into_iter()
                .map(|(kind, epoch, incarnation, at)| match kind {
                    0 => leader(epoch, incarnation),
                    1 => writes(epoch, incarnation),
                    _ => writes_at(epoch, incarnation, at),
                })
                .collect();
            let mut whole = Position::default();
            let mut resumed: Option<Position> = None;
            let mut epochs = Vec::new();
            for (offset, record) in records.iter().enumerate() {
                if offset == resume {
                    let row = whole.encode();
                    resumed = Some(Position::decode(&row).unwrap());
                }
                let verdict = whole.admit(offset as i64, record);
                if let Some(resumed) = resumed.as_mut() {
                    prop_assert_eq!(&verdict, &resumed.admit(offset as i64, record));
                    prop_assert_eq!(&whole.leader, &resumed.leader);
                }
                if verdict == Verdict::Accepted {
                    epochs.push(whole.leader.epoch);
                }
            }
            // Accepted epochs only grow.
            prop_assert!(epochs.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
