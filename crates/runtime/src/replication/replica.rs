//! What a node knows of one partition's log and its part in it: read up to where, stored up to
//! where, led here or not, given up on or not; and the rules that move that, whatever carries
//! the log: a record read ([`Replica::read`]), a takeover begun and won, a leader stepping
//! down, a partition given up on, a rewind to what the store holds. The Kafka provider
//! (`sluice-kafka-log`) keeps one per partition behind a lock and runs its loops over them; the
//! partition simulator's replica reads its log through the same rules.

use crate::replication::follow::{Followed, follow};
use sluice_core::errors::CodedError;
use sluice_store::storage::fencing::{Position, Verdict};
use sluice_store::storage::record::{Leader, Record};
use sluice_store::storage::writer::WriteSet;

/// One partition as this node follows (and perhaps leads) it.
#[derive(Debug, Clone)]
pub struct Replica {
    /// Read and admitted (in memory; ahead of the store while a batch commits).
    seen: Position,
    /// The offset of the next record the store has not got (stored by the replica reader or,
    /// while leading, by the leader).
    stored: i64,
    /// `Some(incarnation)` while this node leads the partition.
    leading: Option<u64>,
    /// A takeover runs.
    taking_over: bool,
    /// The log's end as the reader last saw it (`-1`: not yet).
    end: i64,
    /// Why this node stopped following the partition (a gap no snapshot covers, a damaged
    /// record): it is neither applied nor led here again until the node restarts.
    broken: Option<CodedError>,
    /// What it needed was deleted: it waits for a snapshot ([`Replica::caught_up`]), reading
    /// nothing meanwhile.
    catching_up: bool,
    /// This node keeps the partition in its store (it leads it or stands by for it). Not
    /// held, its log is not read here at all: its leader is learnt from the leaders'
    /// announcements ([`Replica::announce`]).
    held: bool,
    /// The newest leader announced (a takeover's winner publishes itself once it won), which
    /// may be ahead of the log read here, or the only news of a partition not held.
    announced: Leader,
}

/// What reading one record asks of the node.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// Read before (a rewind delivers it again), or the partition was given up on: nothing.
    Nothing,
    /// The partition cannot be followed past this record: it is given up on now (`why` says
    /// so); `stop_leading` when this node led it.
    GaveUp {
        /// Why.
        why: CodedError,
        /// This node led the partition: its writer must stop.
        stop_leading: bool,
    },
    /// Records the store needs were deleted (a snapshot covers them): the node loads the
    /// newest snapshot that reaches `from` and reads on from its end ([`Replica::caught_up`]),
    /// or, with none, gives the partition up with `gone`.
    CatchUp {
        /// The first offset the log still has.
        from: i64,
        /// What to give up with when no snapshot reaches `from` (CLU0004).
        gone: CodedError,
    },
    /// Read.
    Read {
        /// The record made a new leader (this node or another): where its doors are now.
        new_leader: Option<Leader>,
        /// This node led the partition and another node's epoch was accepted after its own:
        /// its writer must stop before it writes anything more.
        stop_leading: bool,
        /// Not led here: the position moved (and the record's writes, when they count,
        /// joined the set), so the position is stored with the set.
        store_position: bool,
    },
}

/// What the group's wish for a partition asks of this node.
#[derive(Debug, PartialEq, Eq)]
pub enum Wish {
    /// Nothing to do.
    Nothing,
    /// Take it over (the takeover is now running).
    TakeOver,
    /// Given to another node: stop writing before that one takes over.
    StepDown,
    /// Given here, but this node will not lead a partition it gave up on.
    Refuse,
}

impl Replica {
    /// A partition whose store holds the log up to `position`.
    pub fn at(position: Position) -> Self {
        Self {
            stored: position.next,
            seen: position,
            leading: None,
            taking_over: false,
            end: -1,
            broken: None,
            catching_up: false,
            held: true,
            announced: Leader::default(),
        }
    }

    /// Reads `payload`, the record at `offset` of partition `p`'s log (at most `max_record`
    /// bytes) by the replica's rule ([`follow`]). Not led here, a record that counts adds its
    /// writes to `writes`.
    pub fn read(
        &mut self,
        p: u32,
        offset: i64,
        payload: &[u8],
        max_record: usize,
        writes: &mut WriteSet,
    ) -> Read {
        if self.broken.is_some() || self.catching_up {
            return Read::Nothing;
        }
        // Only a partition kept here and led elsewhere has its writes applied: the others'
        // records are read for their epochs, their writes left undecoded.
        let applies = self.held && self.leading.is_none();
        let (verdict, record) =
            match follow(&mut self.seen, p, offset, payload, max_record, applies) {
                Followed::Before => return Read::Nothing,
                // Not kept here, what was deleted is nobody's loss: the reader reads on.
                Followed::Gap(_) if !self.held && self.leading.is_none() => {
                    self.seen.next = offset;
                    return self.read(p, offset, payload, max_record, writes);
                }
                // Led here, the records deleted were this leader's own, below what it stored (it
                // deletes only what its snapshot covers): the reader, behind, reads on.
                Followed::Gap(_) if self.leading.is_some() => {
                    self.seen.next = offset;
                    return self.read(p, offset, payload, max_record, writes);
                }
                Followed::Gap(gone) => {
                    self.catching_up = true;
                    return Read::CatchUp { from: offset, gone };
                }
                Followed::Broken(why) => {
                    let stop_leading = self.give_up(why.clone());
                    return Read::GaveUp { why, stop_leading };
                }
                Followed::Read(verdict, record) => (verdict, record),
            };
        let accepted = verdict == Verdict::Accepted;
        // A reader behind the announcements (catching up, or after a rewind) does not move the
        // placement back to an older leader.
        let new_leader = (accepted && self.seen.leader.epoch >= self.announced.epoch)
            .then(|| self.seen.leader.clone());
        match self.leading {
            Some(incarnation) => Read::Read {
                new_leader,
                stop_leading: accepted && self.seen.leader.incarnation != incarnation,
                store_position: false,
            },
            None if !self.held => Read::Read {
                new_leader,
                stop_leading: false,
                store_position: false,
            },
            None => {
                if let (
                    Verdict::Apply,
                    Record::Writes {
                        writes: mut set, ..
                    },
                ) = (verdict, record)
                {
                    writes.append(&mut set);
                }
                Read::Read {
                    new_leader,
                    stop_leading: false,
                    store_position: true,
                }
            }
        }
    }

    /// Stops following the partition for good (until the node restarts): never applied nor
    /// led here again. True when this node led it (its writer must stop).
    pub fn give_up(&mut self, why: CodedError) -> bool {
        self.broken = Some(why);
        self.leading.is_some()
    }

    /// Why the partition was given up on, if it was.
    pub fn broken(&self) -> Option<&CodedError> {
        self.broken.as_ref()
    }

    /// Whether this node leads the partition.
    pub fn leads(&self) -> bool {
        self.leading.is_some()
    }

    /// The offset of the next record the reader is to read. It stands still while this node
    /// leads: a leader's reader does not read its own records back (`kafka-log`'s reader pauses
    /// the partition until the rewind after its step-down).
    pub fn read_next(&self) -> i64 {
        self.seen.next
    }

    /// The group wants the partition here (`wanted`) or elsewhere: what that asks now.
    pub fn wish(&mut self, wanted: bool) -> Wish {
        if self.broken.is_some() {
            return if wanted { Wish::Refuse } else { Wish::Nothing };
        }
        match (wanted, self.leading.is_some()) {
            (true, false) if !self.taking_over => {
                self.taking_over = true;
                Wish::TakeOver
            }
            (false, true) => Wish::StepDown,
            _ => Wish::Nothing,
        }
    }

    /// The epoch a takeover appends: one past the newest one known, read or announced (a
    /// node that did not read the partition's log before it was given it knows the newest
    /// epoch from the announcements, so its first try is not fenced by its own ignorance).
    pub fn next_epoch(&self) -> u64 {
        self.leader().epoch.saturating_add(1)
    }

    /// `leader` announced itself as the partition's leader. Newer than anything known, it is
    /// the leader from now on: the placement moves to it (the first of the pair), and a leader
    /// here whose epoch it passed steps down (the second) before the log tells it so.
    pub fn announce(&mut self, leader: Leader) -> (bool, bool) {
        if leader.epoch <= self.leader().epoch {
            return (false, false);
        }
        let stop_leading = self.leading.is_some_and(|incarnation| {
            leader.incarnation != incarnation && leader.epoch > self.seen.leader.epoch
        });
        self.announced = leader;
        (true, stop_leading)
    }

    /// Whether the store holds the log past `offset` (a takeover's epoch record), or the
    /// partition was given up on (waiting longer is no use).
    pub fn stored_past(&self, offset: i64) -> bool {
        self.stored > offset || self.broken.is_some()
    }

    /// The takeover's epoch record `leader` was read back as the partition's leader and
    /// nothing came between: this node leads from now on. False when another node's epoch came
    /// first, or was announced with a newer epoch (or the partition was given up on): the
    /// takeover tries again.
    pub fn win(&mut self, leader: &Leader) -> bool {
        let won = self.seen.leader == *leader
            && self.announced.epoch <= leader.epoch
            && self.leading.is_none()
            && self.broken.is_none();
        if won {
            self.leading = Some(leader.incarnation);
            self.taking_over = false;
        }
        won
    }

    /// The takeover ended without leading (the group moved the partition, or it was given up
    /// on).
    pub fn takeover_ended(&mut self) {
        self.taking_over = false;
    }

    /// Adds the position read so far to `writes` when not led here (a leader stores its own);
    /// the offset the store holds up to once they commit ([`Replica::stored_up_to`]).
    pub fn save(&self, p: u32, writes: &mut WriteSet) -> Option<i64> {
        if self.leading.is_some() || !self.held {
            return None;
        }
        self.seen.save(p, writes);
        Some(self.seen.next)
    }

    /// The store holds the log up to `next`.
    pub fn stored_up_to(&mut self, next: i64) {
        self.stored = self.stored.max(next);
    }

    /// The leader here stopped: the partition is read again from `position`, what the store
    /// holds.
    pub fn rewind(&mut self, position: Position) {
        self.stored = position.next;
        // The position read back may name an older leader than one this node read from the
        // log after it (a partition released and kept again starts from nothing, a snapshot
        // from its own): the newer stays known, as if announced, or the node would route to
        // and plan with a leader long gone.
        let known = std::mem::replace(&mut self.seen, position).leader;
        if known.epoch > self.seen.leader.epoch && known.epoch > self.announced.epoch {
            self.announced = known;
        }
        self.leading = None;
        self.catching_up = false;
    }

    /// The store holds a snapshot of the partition at `position`: it is read on from there.
    pub fn caught_up(&mut self, position: Position) {
        self.rewind(position);
    }

    /// The log ends at `end` (its next offset), as last asked.
    pub fn note_end(&mut self, end: i64) {
        self.end = end;
    }

    /// The log of partition `p` now starts at `start`, as last asked. Past what this replica
    /// read, the records it needs were deleted, whether or not a record follows yet (a
    /// partition idle since its snapshot has none): it catches up as after a gap.
    pub fn note_start(&mut self, p: u32, start: i64) -> Option<Read> {
        if start <= self.seen.next
            || !self.held
            || self.leading.is_some()
            || self.catching_up
            || self.broken.is_some()
        {
            return None;
        }
        self.catching_up = true;
        Some(Read::CatchUp {
            from: start,
            gone: crate::replication::follow::gone(p, start, self.seen.next),
        })
    }

    /// Whether this node keeps the partition in its store.
    pub fn held(&self) -> bool {
        self.held
    }

    /// This node no longer keeps the partition (it neither leads it nor stands by for it):
    /// true when that is so now, and the caller deletes its rows and position from the store.
    /// A partition led here, or being taken over, stays.
    pub fn release(&mut self) -> bool {
        if !self.held || self.leading.is_some() || self.taking_over {
            return false;
        }
        self.held = false;
        self.stored = 0;
        self.catching_up = false;
        true
    }

    /// This node keeps the partition again: true when it did not, and the caller rewinds it
    /// to what the store holds (nothing after a release: the newest snapshot and the tail).
    pub fn hold(&mut self) -> bool {
        if self.held {
            return false;
        }
        self.held = true;
        true
    }

    /// The newest leader known: read from the log or announced.
    pub fn leader(&self) -> &Leader {
        if self.announced.epoch > self.seen.leader.epoch {
            &self.announced
        } else {
            &self.seen.leader
        }
    }

    /// The offset of the next record the store has not got.
    pub fn stored(&self) -> i64 {
        self.stored
    }

    /// The log's end as last asked (`-1`: not yet).
    pub fn end(&self) -> i64 {
        self.end
    }

    /// Records the store is behind the log's end (0 while led here or before the end is
    /// known: a leader stores what it writes).
    pub fn lag(&self) -> i64 {
        if self.leading.is_some() || !self.held || self.end < 0 {
            0
        } else {
            self.end.saturating_sub(self.stored).max(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::errors::Code;
    use sluice_store::schema::INVOCATIONS;

    fn leader(epoch: u64, incarnation: u64) -> Leader {
        Leader {
            epoch,
            incarnation,
            ..Leader::default()
        }
    }

    fn epoch(epoch: u64, incarnation: u64) -> Vec<u8> {
        Record::Epoch(leader(epoch, incarnation)).encode()
    }

    fn writes(epoch: u64, incarnation: u64, at: i64) -> Vec<u8> {
        let mut set = WriteSet::default();
        set.put(INVOCATIONS, b"k", b"v".to_vec());
        Record::Writes {
            epoch,
            incarnation,
            at: Some(at),
            writes: set,
        }
        .encode()
    }

    /// A replica of a fresh log that took it over as epoch 1 (incarnation 7).
    fn leading_epoch_1() -> (Replica, WriteSet) {
        let mut replica = Replica::at(Position::default());
        let mut set = WriteSet::default();
        assert_eq!(replica.wish(true), Wish::TakeOver);
        replica.read(0, 0, &epoch(1, 7), usize::MAX, &mut set);
        assert!(replica.win(&leader(1, 7)));
        (replica, set)
    }

    #[test]
    fn a_replica_applies_its_leaders_writes_and_stores_its_position_with_them() {
        let mut replica = Replica::at(Position::default());
        let mut set = WriteSet::default();
        let read = replica.read(0, 0, &epoch(1, 7), usize::MAX, &mut set);
        assert_eq!(
            read,
            Read::Read {
                new_leader: Some(leader(1, 7)),
                stop_leading: false,
                store_position: true
            }
        );
        replica.read(0, 1, &writes(1, 7, 1), usize::MAX, &mut set);
        assert_eq!(set.len(), 1, "the leader's write joined the set");
        // Read again after a rewind: nothing changes.
        assert_eq!(
            replica.read(0, 1, &writes(1, 7, 1), usize::MAX, &mut set),
            Read::Nothing
        );
        assert_eq!(replica.save(0, &mut set), Some(2));
        assert_eq!(set.len(), 2, "the position goes with the writes");
        replica.stored_up_to(2);
        replica.note_end(5);
        assert_eq!(replica.lag(), 3);
    }

    #[test]
    fn a_rewind_to_an_older_position_keeps_the_newest_leader_known() {
        let mut replica = Replica::at(Position::default());
        let mut set = WriteSet::default();
        replica.read(0, 0, &epoch(1, 7), usize::MAX, &mut set);
        replica.read(0, 1, &epoch(2, 8), usize::MAX, &mut set);
        // Released and kept again: read from nothing.
        replica.rewind(Position::default());
        assert_eq!(*replica.leader(), leader(2, 8));
        assert_eq!(replica.next_epoch(), 3);
        // Reading the log again from its start moves nothing back.
        let read = replica.read(0, 0, &epoch(1, 7), usize::MAX, &mut set);
        assert!(
            matches!(
                read,
                Read::Read {
                    new_leader: None,
                    ..
                }
            ),
            "{read:?}"
        );
        assert_eq!(*replica.leader(), leader(2, 8));
    }

    #[test]
    fn a_zombies_writes_after_a_newer_epoch_count_nowhere() {
        let mut replica = Replica::at(Position::default());
        let mut set = WriteSet::default();
        replica.read(0, 0, &epoch(1, 7), usize::MAX, &mut set);
        replica.read(0, 1, &epoch(2, 8), usize::MAX, &mut set);
        let read = replica.read(0, 2, &writes(1, 7, 2), usize::MAX, &mut set);
        assert!(matches!(read, Read::Read { .. }), "{read:?}");
        assert!(set.is_empty(), "the fenced leader's write was applied");
    }

    #[test]
    fn a_takeover_is_won_only_by_the_epoch_read_back_last() {
        let mut replica = Replica::at(Position::default());
        assert_eq!(replica.wish(true), Wish::TakeOver);
        assert_eq!(replica.wish(true), Wish::Nothing, "one takeover at a time");
        assert_eq!(replica.next_epoch(), 1);
        let mine = leader(1, 7);
        let mut set = WriteSet::default();
        replica.read(
            0,
            0,
            &Record::Epoch(mine.clone()).encode(),
            usize::MAX,
            &mut set,
        );
        // Another node's epoch came after it: this takeover lost.
        replica.read(0, 1, &epoch(2, 8), usize::MAX, &mut set);
        assert!(!replica.stored_past(1), "the store does not hold it yet");
        replica.stored_up_to(2);
        assert!(replica.stored_past(1));
        assert!(!replica.win(&mine));
        assert_eq!(replica.next_epoch(), 3);
        let mine = leader(3, 9);
        replica.read(
            0,
            2,
            &Record::Epoch(mine.clone()).encode(),
            usize::MAX,
            &mut set,
        );
        assert!(replica.win(&mine));
        assert!(replica.leads());
        assert_eq!(replica.lag(), 0, "a leader stores what it writes");
        assert_eq!(
            replica.save(0, &mut set),
            None,
            "a leader stores its own position"
        );
        assert_eq!(replica.wish(false), Wish::StepDown);
    }

    #[test]
    fn a_leader_steps_down_when_another_nodes_epoch_is_read_after_its_own() {
        let (mut replica, mut set) = leading_epoch_1();
        // Its own writes read back change nothing.
        let own = replica.read(0, 1, &writes(1, 7, 1), usize::MAX, &mut set);
        assert_eq!(
            own,
            Read::Read {
                new_leader: None,
                stop_leading: false,
                store_position: false
            }
        );
        let other = replica.read(0, 2, &epoch(2, 8), usize::MAX, &mut set);
        assert_eq!(
            other,
            Read::Read {
                new_leader: Some(leader(2, 8)),
                stop_leading: true,
                store_position: false
            }
        );
        assert!(set.is_empty(), "a leader applies nothing it reads back");
        // It stopped: read again from what the store holds.
        replica.rewind(Position::default());
        assert!(!replica.leads());
        assert_eq!(replica.stored(), 0);
    }

    #[test]
    fn a_gap_asks_for_a_snapshot_and_reads_on_from_its_end() {
        let mut replica = Replica::at(Position::default());
        let mut set = WriteSet::default();
        replica.read(0, 0, &epoch(1, 7), usize::MAX, &mut set);
        let Read::CatchUp { from, gone } =
            replica.read(0, 5, &writes(1, 7, 5), usize::MAX, &mut set)
        else {
            panic!("a gap must ask for a snapshot")
        };
        assert_eq!((from, gone.code), (5, Some(Code::CLU0004)));
        // Nothing more is read until the snapshot is in the store.
        assert_eq!(
            replica.read(0, 6, &writes(1, 7, 6), usize::MAX, &mut set),
            Read::Nothing
        );
        let snapshot = Position {
            next: 6,
            leader: leader(1, 7),
        };
        replica.caught_up(snapshot);
        assert_eq!(replica.stored(), 6);
        assert!(matches!(
            replica.read(0, 6, &writes(1, 7, 6), usize::MAX, &mut set),
            Read::Read {
                store_position: true,
                ..
            }
        ));
        assert_eq!(set.len(), 1, "the leader's writes after the snapshot count");
    }

    #[test]
    fn a_log_whose_start_passed_what_was_read_asks_for_a_snapshot_with_no_record_after_it() {
        let mut replica = Replica::at(Position::default());
        assert_eq!(replica.note_start(0, 0), None, "nothing deleted");
        let Some(Read::CatchUp { from, gone }) = replica.note_start(0, 7) else {
            panic!("a deleted head must ask for a snapshot")
        };
        assert_eq!((from, gone.code), (7, Some(Code::CLU0004)));
        assert_eq!(replica.note_start(0, 9), None, "asked once");
        replica.caught_up(Position {
            next: 9,
            leader: leader(1, 7),
        });
        assert_eq!(replica.note_start(0, 9), None, "caught up");
        let (mut led, _) = leading_epoch_1();
        assert_eq!(
            led.note_start(0, 5),
            None,
            "a leader deletes only what it stored"
        );
    }

    #[test]
    fn a_partition_not_held_here_tracks_its_leader_and_stores_nothing() {
        let mut replica = Replica::at(Position::default());
        let mut set = WriteSet::default();
        replica.read(0, 0, &epoch(1, 7), usize::MAX, &mut set);
        replica.read(0, 1, &writes(1, 7, 1), usize::MAX, &mut set);
        assert!(replica.release(), "neither led nor being taken over");
        assert!(!replica.release(), "released once");
        set = WriteSet::default();
        // Its writes are passed over, a deleted head too; a new leader is still known.
        assert_eq!(
            replica.read(0, 2, &writes(1, 7, 2), usize::MAX, &mut set),
            Read::Read {
                new_leader: None,
                stop_leading: false,
                store_position: false
            }
        );
        assert_eq!(
            replica.read(0, 9, &epoch(2, 8), usize::MAX, &mut set),
            Read::Read {
                new_leader: Some(leader(2, 8)),
                stop_leading: false,
                store_position: false
            }
        );
        assert!(set.is_empty(), "nothing of it is stored");
        assert_eq!(replica.save(0, &mut set), None);
        assert_eq!(replica.note_start(0, 20), None, "nothing to catch up");
        assert_eq!(replica.lag(), 0);
        assert_eq!(replica.stored(), 0, "the store holds none of it");
        // Held again, it is read from what the store holds: nothing, so the newest snapshot.
        assert!(replica.hold());
        assert!(!replica.hold(), "held once");
        replica.rewind(Position::default());
        assert!(matches!(
            replica.read(0, 20, &writes(2, 8, 20), usize::MAX, &mut set),
            Read::CatchUp { from: 20, .. }
        ));
        // A partition led here is kept.
        let (mut led, _) = leading_epoch_1();
        assert!(!led.release());
        assert!(led.held());
    }

    #[test]
    fn a_leader_reads_past_its_own_records_it_deleted() {
        let (mut replica, mut set) = leading_epoch_1();
        assert!(matches!(
            replica.read(0, 9, &writes(1, 7, 9), usize::MAX, &mut set),
            Read::Read {
                stop_leading: false,
                ..
            }
        ));
        assert!(replica.leads());
    }

    #[test]
    fn a_gap_no_snapshot_covers_gives_the_partition_up_for_good() {
        let mut replica = Replica::at(Position::default());
        let mut set = WriteSet::default();
        let Read::CatchUp { gone, .. } = replica.read(0, 5, &epoch(2, 8), usize::MAX, &mut set)
        else {
            panic!("a gap must ask for a snapshot")
        };
        assert!(!replica.give_up(gone), "it did not lead the partition");
        assert_eq!(replica.broken().and_then(|e| e.code), Some(Code::CLU0004));
        assert_eq!(replica.wish(true), Wish::Refuse);
        assert!(replica.stored_past(i64::MAX - 1), "no takeover waits on it");
    }

    #[test]
    fn an_announced_leader_routes_fences_a_leader_here_and_is_never_moved_back_by_the_log() {
        // Not read here: the announcement alone names the leader and the next epoch.
        let mut replica = Replica::at(Position::default());
        assert_eq!(replica.announce(leader(2, 8)), (true, false));
        assert_eq!(replica.leader(), &leader(2, 8));
        assert_eq!(replica.next_epoch(), 3, "a takeover here starts past it");
        assert_eq!(
            replica.announce(leader(1, 7)),
            (false, false),
            "an older one changes nothing"
        );
        // Read behind the announcement, an older epoch does not move the placement back.
        let mut set = WriteSet::default();
        assert_eq!(
            replica.read(0, 0, &epoch(1, 7), usize::MAX, &mut set),
            Read::Read {
                new_leader: None,
                stop_leading: false,
                store_position: true
            }
        );
        assert_eq!(replica.leader(), &leader(2, 8));
        // A takeover whose epoch the announcement passed does not win.
        assert_eq!(replica.wish(true), Wish::TakeOver);
        assert!(!replica.win(&leader(1, 7)));
        // A leader here steps down when another's newer epoch is announced; its own is news
        // to no one.
        let (mut led, _) = leading_epoch_1();
        assert_eq!(led.announce(leader(1, 7)), (false, false));
        assert_eq!(led.announce(leader(2, 8)), (true, true));
    }
}
