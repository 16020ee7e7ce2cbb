//! The cluster group's description (DescribeGroups): who its members are, named by their
//! `client.id`, which is their node id. Each node plans leaders and standbys from it alike
//! (`assignment.rs`).

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

use super::assignment::Members;

/// The group's members, when the group is stable and every one of `partitions` of `topic` is
/// assigned to one of them; `None` while it rebalances (ask again later).
pub(super) fn describe<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    group: &str,
    topic: &str,
    partitions: u32,
) -> Result<Option<Members>, String> {
    let list = consumer
        .fetch_group_list(Some(group), Duration::from_secs(2))
        .map_err(|e| format!("cannot describe the cluster's group: {e}"))?;
    let Some(info) = list.groups().iter().find(|g| g.name() == group) else {
        return Ok(None);
    };
    if info.state() != "Stable" {
        return Ok(None);
    }
    let mut members = Members::new();
    let mut assigned = BTreeSet::new();
    for member in info.members() {
        assigned.extend(decode_assignment(
            member.assignment().unwrap_or_default(),
            topic,
        )?);
        members.insert(member.client_id().to_owned());
    }
    Ok((assigned.len() == partitions as usize).then_some(members))
}

/// Most topics and partitions one member's assignment may name (the brokers' bytes are read
/// as hostile input: a count past these is refused, not allocated).
const MAX_ENTRIES: usize = 1 << 16;

/// The partitions of `topic` in a member's assignment, encoded by Kafka's consumer protocol
/// (`ConsumerProtocolAssignment`: version, then per topic its name and partitions, then
/// user data, which is not read).
pub(super) fn decode_assignment(bytes: &[u8], topic: &str) -> Result<BTreeSet<u32>, String> {
    let mut input = Input(bytes);
    let mut found = BTreeSet::new();
    if bytes.is_empty() {
        return Ok(found);
    }
    input.i16()?;
    let topics = input.count()?;
    for _ in 0..topics {
        let name_len = usize::try_from(input.i16()?)
            .map_err(|_| "a topic without a name in a member's assignment".to_owned())?;
        let ours = input.take(name_len)? == topic.as_bytes();
        let count = input.count()?;
        for _ in 0..count {
            let p = input.i32()?;
            if ours && let Ok(p) = u32::try_from(p) {
                found.insert(p);
            }
        }
    }
    Ok(found)
}

/// Big-endian reads off the front of a byte string; each fails past its end.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("a member's assignment ends early".to_owned());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn i16(&mut self) -> Result<i16, String> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32, String> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// An array's length: -1 (null) is none; more than [`MAX_ENTRIES`] is refused.
    fn count(&mut self) -> Result<usize, String> {
        match self.i32()? {
            -1 => Ok(0),
            n => usize::try_from(n)
                .ok()
                .filter(|n| *n <= MAX_ENTRIES)
                .ok_or_else(|| format!("a member's assignment counts {n} entries")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(topics: &[(&str, &[i32])]) -> Vec<u8> {
        let mut out = 1i16.to_be_bytes().to_vec();
        out.extend((topics.len() as i32).to_be_bytes());
        for (name, partitions) in topics {
            out.extend((name.len() as i16).to_be_bytes());
            out.extend(name.as_bytes());
            out.extend((partitions.len() as i32).to_be_bytes());
            for p in *partitions {
                out.extend(p.to_be_bytes());
            }
        }
        out.extend((-1i32).to_be_bytes());
        out
    }

    #[test]
    fn an_assignment_names_the_partitions_of_its_topic() {
        let bytes = assignment(&[("other", &[9]), ("sluice.leaders", &[0, 3])]);
        assert_eq!(
            decode_assignment(&bytes, "sluice.leaders").unwrap(),
            BTreeSet::from([0, 3])
        );
        assert!(decode_assignment(&[], "t").unwrap().is_empty());
    }

    #[test]
    fn a_damaged_assignment_is_refused_without_a_panic() {
        let bytes = assignment(&[("sluice.leaders", &[0, 3])]);
        for cut in 1..bytes.len() - 4 {
            assert!(decode_assignment(&bytes[..cut], "sluice.leaders").is_err());
        }
        let mut huge = 0i16.to_be_bytes().to_vec();
        huge.extend(i32::MAX.to_be_bytes());
        assert!(
            decode_assignment(&huge, "t")
                .unwrap_err()
                .contains("entries")
        );
        let mut nameless = 0i16.to_be_bytes().to_vec();
        nameless.extend(1i32.to_be_bytes());
        nameless.extend((-1i16).to_be_bytes());
        assert!(decode_assignment(&nameless, "t").is_err());
    }
}
