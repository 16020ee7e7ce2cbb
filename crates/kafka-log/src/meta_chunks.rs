//! Metadata changes larger than one record (`cluster.max-record-bytes`): a plugin carrying a
//! language runtime is about 18 MiB, and the meta topic publishes a group's tables whole. Such
//! a change goes out as consecutive chunk records keyed `<group key>#<index>`; every reader
//! assembles them and applies the change at its last chunk's offset, the same order as a
//! change of one record.
//!
//! Compaction keeps the newest record of each key. A chunk is only ever replaced by the same
//! index of a newer change, whose chunk 0 came before it and replaced this change's chunk 0
//! too; so a chunk met without the start of its change is a leftover and skipped, and a change
//! whose chunk 0 is read is whole unless its publisher stopped half-way. That publisher's next
//! change abandons it.

use sluice_core::errors::{Code, CodedError};

/// First byte of a chunk record (a whole snapshot starts with its format version, 1).
const MAGIC: u8 = 0xC7;
/// Most chunks one change may have: with the default 8 MiB records, 384 MiB of metadata.
pub(crate) const MAX_CHUNKS: u32 = 64;

/// One chunk record as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chunk<'a> {
    /// The node that published it.
    pub publisher: &'a str,
    /// Which of that node's changes.
    pub change: u64,
    pub index: u32,
    pub count: u32,
    pub data: &'a [u8],
}

fn bad(why: impl std::fmt::Display) -> CodedError {
    CodedError::new(
        Code::CLU0004,
        format!("a chunk record in the meta topic is malformed: {why}"),
    )
}

/// The records of `bytes` (a snapshot of group `key`) in pieces of at most `chunk` bytes:
/// each record's key and payload.
pub(crate) fn split(
    bytes: &[u8],
    key: &str,
    publisher: &str,
    change: u64,
    chunk: usize,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let pieces: Vec<&[u8]> = bytes.chunks(chunk.max(1)).collect();
    let count = u32::try_from(pieces.len())
        .ok()
        .filter(|n| *n <= MAX_CHUNKS)
        .ok_or_else(|| {
            format!(
                "{} bytes of metadata need {} records of cluster.max-record-bytes; at most {MAX_CHUNKS} are taken",
                bytes.len(),
                pieces.len()
            )
        })?;
    let name = u8::try_from(publisher.len()).map_err(|_| "the node name is too long")?;
    Ok(pieces
        .into_iter()
        .zip(0u32..)
        .map(|(data, index)| {
            let mut payload = Vec::with_capacity(data.len() + 18 + publisher.len());
            payload.push(MAGIC);
            payload.push(name);
            payload.extend_from_slice(publisher.as_bytes());
            payload.extend_from_slice(&change.to_be_bytes());
            payload.extend_from_slice(&index.to_be_bytes());
            payload.extend_from_slice(&count.to_be_bytes());
            payload.extend_from_slice(data);
            (format!("{key}#{index}"), payload)
        })
        .collect())
}

/// The chunk `payload` holds, or `None` when it is a whole snapshot.
pub(crate) fn parse(payload: &[u8]) -> Result<Option<Chunk<'_>>, CodedError> {
    let Some((&MAGIC, rest)) = payload.split_first() else {
        return Ok(None);
    };
    let ends_early = || bad("it ends early");
    let (&name, rest) = rest.split_first().ok_or_else(ends_early)?;
    let (publisher, rest) = rest
        .split_at_checked(usize::from(name))
        .ok_or_else(ends_early)?;
    let publisher =
        std::str::from_utf8(publisher).map_err(|_| bad("the node name is not UTF-8"))?;
    let (change, rest) = rest.split_first_chunk::<8>().ok_or_else(ends_early)?;
    let (index, rest) = rest.split_first_chunk::<4>().ok_or_else(ends_early)?;
    let (count, data) = rest.split_first_chunk::<4>().ok_or_else(ends_early)?;
    let chunk = Chunk {
        publisher,
        change: u64::from_be_bytes(*change),
        index: u32::from_be_bytes(*index),
        count: u32::from_be_bytes(*count),
        data,
    };
    if chunk.count == 0 || chunk.count > MAX_CHUNKS || chunk.index >= chunk.count {
        return Err(bad(format!(
            "chunk {} of {} (at most {MAX_CHUNKS})",
            chunk.index, chunk.count
        )));
    }
    Ok(Some(chunk))
}

/// A change whose chunks are coming in.
#[derive(Debug)]
struct Pending {
    publisher: String,
    change: u64,
    /// Where its chunk 0 is: a restart reads again from there.
    first: i64,
    count: u32,
    next: u32,
    bytes: Vec<u8>,
}

/// Puts chunked changes back together, in the topic's order.
#[derive(Debug)]
pub(crate) struct Assembler {
    pending: Vec<Pending>,
    /// The largest change taken whole.
    max_bytes: usize,
}

impl Assembler {
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            pending: Vec::new(),
            max_bytes,
        }
    }

    /// Takes `chunk`, read at `offset`; the whole change once its last chunk came.
    pub(crate) fn take(&mut self, offset: i64, chunk: &Chunk<'_>) -> Option<Vec<u8>> {
        if chunk.index == 0 {
            // A node publishes one change at a time: an unfinished one of its is dead.
            if let Some(at) = self
                .pending
                .iter()
                .position(|p| p.publisher == chunk.publisher)
            {
                let dead = self.pending.swap_remove(at);
                tracing::warn!(node = %dead.publisher, offset = dead.first, "a metadata change in the meta topic was never finished (its node stopped half-way); skipped");
            }
            self.pending.push(Pending {
                publisher: chunk.publisher.to_owned(),
                change: chunk.change,
                first: offset,
                count: chunk.count,
                next: 0,
                bytes: Vec::new(),
            });
        }
        let at = self
            .pending
            .iter()
            .position(|p| p.publisher == chunk.publisher && p.change == chunk.change)?;
        let pending = &mut self.pending[at];
        if pending.next != chunk.index
            || pending.count != chunk.count
            || pending.bytes.len() + chunk.data.len() > self.max_bytes
        {
            let dead = self.pending.swap_remove(at);
            tracing::warn!(node = %dead.publisher, offset, "a chunked metadata change in the meta topic is out of order or too large; skipped");
            return None;
        }
        pending.bytes.extend_from_slice(chunk.data);
        pending.next += 1;
        if pending.next < pending.count {
            return None;
        }
        Some(self.pending.swap_remove(at).bytes)
    }

    /// Where a restart must read again from: the first chunk of the oldest unfinished change.
    pub(crate) fn resume_from(&self) -> Option<i64> {
        self.pending.iter().map(|p| p.first).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(bytes: &[u8], publisher: &str, change: u64, chunk: usize) -> Vec<Vec<u8>> {
        split(bytes, "plugins", publisher, change, chunk)
            .unwrap()
            .into_iter()
            .map(|(_, payload)| payload)
            .collect()
    }

    #[test]
    fn a_split_change_is_keyed_by_index_and_assembles_whole() {
        let bytes: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let split = split(&bytes, "plugins,plugin_specs", "n1", 7, 300).unwrap();
        let keys: Vec<&str> = split.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "plugins,plugin_specs#0",
                "plugins,plugin_specs#1",
                "plugins,plugin_specs#2",
                "plugins,plugin_specs#3"
            ]
        );
        let mut assembler = Assembler::new(1 << 20);
        let mut whole = None;
        for (offset, (_, payload)) in (10..).zip(&split) {
            let chunk = parse(payload).unwrap().unwrap();
            assert_eq!((chunk.publisher, chunk.change, chunk.count), ("n1", 7, 4));
            assert!(whole.is_none());
            whole = assembler.take(offset, &chunk);
            if whole.is_none() {
                assert_eq!(assembler.resume_from(), Some(10));
            }
        }
        assert_eq!(whole.unwrap(), bytes);
        assert_eq!(assembler.resume_from(), None);
    }

    #[test]
    fn a_whole_snapshot_is_not_a_chunk() {
        assert_eq!(parse(&[1, 0, 0, 0, 0]).unwrap(), None);
        assert_eq!(parse(&[]).unwrap(), None);
    }

    #[test]
    fn interleaved_changes_of_two_nodes_each_assemble() {
        let (a, b) = (vec![1u8; 500], vec![2u8; 500]);
        let (ra, rb) = (records(&a, "n1", 1, 200), records(&b, "n2", 1, 200));
        let order = [&ra[0], &rb[0], &ra[1], &rb[1], &rb[2], &ra[2]];
        let mut assembler = Assembler::new(1 << 20);
        let done: Vec<(i64, Vec<u8>)> = (0..)
            .zip(order)
            .filter_map(|(offset, payload)| {
                let chunk = parse(payload).unwrap().unwrap();
                assembler.take(offset, &chunk).map(|bytes| (offset, bytes))
            })
            .collect();
        assert_eq!(done, [(4, b), (5, a)]);
    }

    #[test]
    fn leftovers_of_compaction_and_unfinished_changes_are_skipped() {
        let old = records(&[9u8; 900], "n1", 1, 300);
        let new = records(&[8u8; 300], "n1", 2, 300);
        let mut assembler = Assembler::new(1 << 20);
        // Compaction replaced the old change's chunk 0 by the new one's; its chunks 1 and 2 stay.
        assert_eq!(assembler.take(0, &parse(&old[1]).unwrap().unwrap()), None);
        assert_eq!(assembler.take(1, &parse(&old[2]).unwrap().unwrap()), None);
        assert_eq!(assembler.resume_from(), None);
        assert_eq!(
            assembler.take(2, &parse(&new[0]).unwrap().unwrap()),
            Some(vec![8u8; 300])
        );
        // A node that stopped after chunk 0: its next change abandons the unfinished one.
        let unfinished = records(&[7u8; 600], "n1", 3, 300);
        assert_eq!(
            assembler.take(3, &parse(&unfinished[0]).unwrap().unwrap()),
            None
        );
        assert_eq!(assembler.resume_from(), Some(3));
        let next = records(&[6u8; 600], "n1", 4, 300);
        assert_eq!(assembler.take(4, &parse(&next[0]).unwrap().unwrap()), None);
        assert_eq!(assembler.resume_from(), Some(4));
        assert_eq!(
            assembler.take(5, &parse(&next[1]).unwrap().unwrap()),
            Some(vec![6u8; 600])
        );
    }

    #[test]
    fn hostile_chunks_are_refused_or_bounded() {
        let payload = records(&[1u8; 10], "n1", 1, 10).remove(0);
        // Cut short anywhere in its header.
        for end in 1..payload.len() - 10 {
            assert!(parse(&payload[..end]).is_err(), "{end}");
        }
        // A count beyond the cap, an index past the count.
        let mut many = payload.clone();
        let count_at = 2 + 2 + 8 + 4;
        many[count_at..count_at + 4].copy_from_slice(&(MAX_CHUNKS + 1).to_be_bytes());
        assert!(parse(&many).is_err());
        let mut past = payload.clone();
        past[count_at - 4..count_at].copy_from_slice(&5u32.to_be_bytes());
        assert!(parse(&past).is_err());
        // A change larger than the assembler takes is dropped, not kept growing.
        let big = records(&[1u8; 1000], "n1", 2, 100);
        let mut assembler = Assembler::new(500);
        let done: Vec<_> = (0..)
            .zip(&big)
            .filter_map(|(offset, p)| assembler.take(offset, &parse(p).unwrap().unwrap()))
            .collect();
        assert!(done.is_empty());
        assert_eq!(assembler.resume_from(), None);
        // More chunks than the cap cannot be written.
        assert!(split(&[0u8; 100], "k", "n1", 1, 1).is_err());
    }
}
