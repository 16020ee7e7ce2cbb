//! Cluster mode in the simulator (`docs/cluster.md`): half the runs write through a partition
//! log first. The log is kept whole (Kafka's `acks=all` keeps what it acknowledged); a node's
//! store is a replica of it; a write set is stored, and anything about it acknowledged, only
//! once its record landed right after the leader's previous one. Leadership changes: another
//! node appends its epoch, the old leader runs on as a zombie whose records land after that
//! epoch (they must count nowhere and acknowledge nothing), and the new leader rebuilds its
//! store from the log on a fresh disk. A crash restarts the node on its own disk, caught up
//! from the log, under a new epoch.

use futures_util::FutureExt as _;

use super::*;
use crate::storage::log::{Leader, Position, Record, Verdict};
use crate::storage::writer::{Staged, WriteSet};

/// The one partition's log.
#[derive(Default)]
pub(super) struct SimLog {
    records: Vec<Vec<u8>>,
    /// Leadership changes so far.
    pub(super) takeovers: u64,
    /// Records of a fenced leader (each must have been refused).
    pub(super) fenced: u64,
}

/// A node's part in the log: the leader it is and where its next record must land.
pub(super) struct Leading {
    leader: Leader,
    next: i64,
    staged: Staged,
    redb: Writer,
}

fn lost() -> CodedError {
    CodedError::new(
        Code::CLU0001,
        "another record came before this one: this node no longer leads",
    )
}

impl SimLog {
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

    /// Applies what `store` has not read yet, by the fencing rule.
    fn catch_up(&self, store: &Store) {
        let mut position = store
            .with_db(Position::load_all)
            .expect("the store is open")
            .expect("positions read back")
            .remove(&0)
            .unwrap_or_default();
        let mut writes = WriteSet::default();
        let from = usize::try_from(position.next).unwrap_or(0);
        for (offset, bytes) in self.records.iter().enumerate().skip(from) {
            let record = Record::decode(bytes, usize::MAX).expect("the log holds records");
            if position.admit(offset as i64, &record) == Verdict::Apply
                && let Record::Writes {
                    writes: mut set, ..
                } = record
            {
                writes.append(&mut set);
            }
        }
        position.save(0, &mut writes);
        writes.commit_now(store);
    }
}

impl World {
    /// The store of a node taking the partition over: caught up with the log, under a new
    /// epoch of its own; its partition writes through the answer.
    pub(super) fn take_over(
        &mut self,
        store: &Arc<Store>,
        redb: Writer,
    ) -> Option<(Writer, Leading)> {
        let incarnation = self.rng.next_u64();
        let log = self.log.as_mut()?;
        let leader = log.append_epoch(incarnation);
        log.catch_up(store);
        let next = log.records.len() as i64;
        let (writer, staged) = Writer::staged();
        Some((
            writer,
            Leading {
                leader,
                next,
                staged,
                redb,
            },
        ))
    }

    /// Moves the partition's waiting sets through the log and on to the store; false when a
    /// record landed after another's epoch (this node is a zombie: nothing of it counts).
    pub(super) fn through_log(&mut self) -> bool {
        let node = self.node.as_mut().expect("the node runs");
        let log = self.log.as_mut().expect("cluster mode");
        let Some(leading) = node.leading.as_mut() else {
            node.flusher.flush();
            return true;
        };
        let mut stores = Vec::new();
        let mut fenced = false;
        while let Some(group) = leading.staged.try_group(usize::MAX) {
            if group.is_empty() {
                stores.push(group.store(&leading.redb, WriteSet::default()).boxed());
                continue;
            }
            let at = log.records.len() as i64;
            log.records
                .push(group.record(leading.leader.epoch, leading.leader.incarnation));
            if at != leading.next {
                log.fenced += 1;
                group.fail(&lost());
                leading.staged.close(&lost());
                fenced = true;
                break;
            }
            leading.next += 1;
            let mut position = WriteSet::default();
            Position {
                next: leading.next,
                leader: leading.leader.clone(),
            }
            .save(0, &mut position);
            stores.push(group.store(&leading.redb, position).boxed());
        }
        node.flusher.flush();
        for store in stores {
            store
                .now_or_never()
                .expect("a flushed group has its answer");
        }
        !fenced
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
