//! How a replica reads a partition's log, record by record, whatever carries it: a gap before a
//! record means what this replica needed was deleted (a snapshot covers it, or nothing does),
//! and a record that does not decode stops following the partition (its store would miss
//! writes); otherwise the fencing rule (`storage::fencing`) says whether the record counts.
//! The Kafka replica reader (`sluice-kafka-log`'s `reader.rs`) and the partition simulator's
//! catch-up both read through [`follow`].

use sluice_core::errors::{Code, CodedError};
use sluice_store::storage::fencing::{Position, Verdict};
use sluice_store::storage::record::Record;

/// What reading one record did.
#[derive(Debug)]
pub enum Followed {
    /// Read before (a rewind delivers it again): nothing changes.
    Before,
    /// Records before this one that the replica needs are gone (deleted once a snapshot covered
    /// them): nothing was read; `gone` says which, as CLU0004 if no snapshot covers them.
    Gap(CodedError),
    /// The partition cannot be followed past here (a damaged record, CLU0003).
    Broken(CodedError),
    /// Read: the fencing rule's verdict on it, and the record.
    Read(Verdict, Record),
}

/// Reads `payload`, the record at `offset` of `partition`'s log (at most `max_record` bytes),
/// with `seen` the position read so far, which moves past it. Without `writes`, a write set
/// record's writes are left unread (its record holds an empty set): the replica applies none.
pub fn follow(
    seen: &mut Position,
    partition: u32,
    offset: i64,
    payload: &[u8],
    max_record: usize,
    writes: bool,
) -> Followed {
    if offset < seen.next {
        return Followed::Before;
    }
    if offset > seen.next {
        // Kafka numbers a partition's records without holes (the topics are neither compacted
        // nor transactional), so a jump means records this replica needed are gone.
        return Followed::Gap(gone(partition, offset, seen.next));
    }
    let decoded = if writes {
        Record::decode(payload, max_record)
    } else {
        Record::decode_header(payload, max_record)
    };
    match decoded {
        Ok(record) => Followed::Read(seen.admit(offset, &record), record),
        Err(e) => Followed::Broken(CodedError::new(
            Code::CLU0003,
            format!("partition {partition}, offset {offset}: {}", e.message),
        )),
    }
}

/// What a replica of `partition` gives up with when the log goes on at `at` while its store
/// needs `needs`, and no snapshot covers what lies between (CLU0004).
pub fn gone(partition: u32, at: i64, needs: i64) -> CodedError {
    CodedError::new(
        Code::CLU0004,
        format!(
            "partition {partition}: the log goes on at offset {at} but this node's store needs offset {needs}: records it never read were deleted, and no snapshot covers them (topic retention, or snapshots deleted?)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_store::storage::record::Leader;
    use sluice_store::storage::writer::WriteSet;

    fn epoch(epoch: u64) -> Vec<u8> {
        Record::Epoch(Leader {
            epoch,
            incarnation: epoch,
            ..Leader::default()
        })
        .encode()
    }

    #[test]
    fn a_leaders_writes_count_and_a_reread_record_changes_nothing() {
        let mut seen = Position::default();
        assert!(matches!(
            follow(&mut seen, 0, 0, &epoch(1), usize::MAX, true),
            Followed::Read(Verdict::Accepted, _)
        ));
        let writes = Record::Writes {
            epoch: 1,
            incarnation: 1,
            at: Some(1),
            writes: WriteSet::default(),
        }
        .encode();
        assert!(matches!(
            follow(&mut seen, 0, 1, &writes, usize::MAX, true),
            Followed::Read(Verdict::Apply, _)
        ));
        assert!(matches!(
            follow(&mut seen, 0, 1, &writes, usize::MAX, true),
            Followed::Before
        ));
        assert_eq!(seen.next, 2);
    }

    #[test]
    fn a_gap_is_said_as_clu0004_and_a_damaged_record_is_clu0003() {
        let mut seen = Position::default();
        let Followed::Gap(gap) = follow(&mut seen, 3, 5, &epoch(1), usize::MAX, true) else {
            panic!("a gap must be said")
        };
        assert_eq!(gap.code, Some(Code::CLU0004));
        assert!(gap.message.contains("needs offset 0"), "{gap}");
        let Followed::Broken(damaged) = follow(&mut seen, 3, 0, b"\x01\x09", usize::MAX, true)
        else {
            panic!("a damaged record must stop following")
        };
        assert_eq!(damaged.code, Some(Code::CLU0003));
        assert!(
            damaged.message.starts_with("partition 3, offset 0"),
            "{damaged}"
        );
        assert_eq!(seen.next, 0, "nothing was read");
    }
}
