//! The epochs topic: who leads each partition, announced by the node that won its takeover.
//! One compacted partition keyed by the Sluice partition's number, so it holds one small record
//! per partition (its newest leader) and every node reads all of it in a few kilobytes.
//!
//! It is how a node learns the leaders of the partitions whose log it does not read (those it
//! neither leads nor stands by for): the replica reader reads only the partitions this node
//! keeps, so a node's intake from the brokers follows its share of the cluster rather than the
//! cluster's whole write rate. The log's epoch records stay the only truth that fences a
//! leader; an announcement only routes requests, and, newer than a leader here, makes it step
//! down before its next write would find out.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use tokio::sync::watch;

use super::{Shared, lock};
use sluice_core::errors::{Code, CodedError};
use sluice_store::storage::record::{Leader, Record};

/// How often a failed announcement is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// The longest an idle epochs reader's fetch waits at the broker: the broker answers at once
/// when a record arrives, so this costs no latency, only idle fetches.
const FETCH_WAIT_MS: &str = "500";

/// The key of partition `p`'s announcements.
fn key(p: u32) -> [u8; 4] {
    p.to_be_bytes()
}

/// Announces `leader` as partition `p`'s leader, trying again until the brokers take it or this
/// node no longer leads `p` as `leader` (a newer leader announces itself).
pub(super) async fn announce(shared: Arc<Shared>, p: u32, leader: Leader) {
    let payload = Record::Epoch(leader.clone()).encode();
    let key = key(p);
    loop {
        let still_leading = {
            let replica = lock(&shared.partitions[p as usize]);
            replica.leads() && *replica.leader() == leader
        };
        if !still_leading {
            return;
        }
        let record = FutureRecord::to(&shared.settings.epochs_topic)
            .partition(0)
            .key(&key[..])
            .payload(&payload[..]);
        match shared
            .producer
            .send(record, shared.settings.write_timeout)
            .await
        {
            Ok(_) => return,
            Err((e, _)) => {
                tracing::warn!(partition = p, error = %e, "cannot announce this node as the partition's leader; trying again");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Follows the epochs topic until `stopping` turns true: each announcement newer than what this
/// node knows moves the partition's placement, and makes a leader here that it passed step
/// down.
pub(super) fn follow(shared: &Shared, stopping: &watch::Receiver<bool>) {
    if let Err(e) = read(shared, stopping) {
        if shared.store.is_closed() || *stopping.borrow() {
            return;
        }
        tracing::error!(error.code = ?e.code, error = %e, "the epochs reader stopped");
        shared.store.health().fail(e);
    }
}

fn read(shared: &Shared, stopping: &watch::Receiver<bool>) -> Result<(), CodedError> {
    let settings = &shared.settings;
    let consumer = settings.reader_with(
        &settings.epochs_topic,
        &settings.replica_group(&settings.epochs_topic),
        FETCH_WAIT_MS,
    )?;
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(&settings.epochs_topic, 0, rdkafka::Offset::Beginning)
        .and_then(|()| consumer.assign(&assignment))
        .map_err(|e| failed(format!("cannot assign the epochs topic: {e}")))?;
    // The topic's end when this reader started: read up to it, every leader announced before
    // is known (`Shared::epochs_read`).
    let mut end = None;
    // The offset after the last record read.
    let mut read_to = -1;
    while !*stopping.borrow() {
        let reading = !shared.epochs_read.load(Ordering::Acquire);
        if reading && end.is_none() {
            end = consumer
                .fetch_watermarks(&settings.epochs_topic, 0, Duration::from_secs(2))
                .map_err(|e| tracing::warn!(error = %e, "cannot read the end of the epochs topic"))
                .ok()
                .map(|(_, high)| high);
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => tracing::warn!(error = %e, "reading the epochs topic"),
            Some(Ok(message)) => {
                read_to = message.offset() + 1;
                let read = announced(
                    message.key(),
                    message.payload(),
                    settings.partitions,
                    settings.max_record,
                );
                match read {
                    Ok((p, leader)) => apply(shared, p, leader),
                    // Someone else's record, or a damaged one: routing goes on from the log
                    // and the next announcement.
                    Err(why) => {
                        tracing::warn!(offset = message.offset(), error = %why, "passed over a record of the epochs topic");
                    }
                }
            }
        }
        if reading && let Some(high) = end {
            // Past the topic's newest record when this reader started (compaction never drops
            // a key's newest record, and the topic's newest is one), or nothing is left there.
            let empty = || {
                consumer
                    .fetch_watermarks(&settings.epochs_topic, 0, Duration::from_secs(2))
                    .is_ok_and(|(low, _)| low >= high)
            };
            if read_to >= high || (read_to < 0 && empty()) {
                tracing::info!(
                    end = high,
                    "read the epochs topic to its end: every partition's leader is known"
                );
                shared.epochs_read.store(true, Ordering::Release);
            }
        }
    }
    Ok(())
}

/// The partition and leader an epochs record announces.
fn announced(
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
    partitions: u32,
    max_record: usize,
) -> Result<(u32, Leader), String> {
    let p = key
        .and_then(|k| <[u8; 4]>::try_from(k).ok())
        .map(u32::from_be_bytes)
        .filter(|p| *p < partitions)
        .ok_or("its key is not one of this cluster's partitions")?;
    match Record::decode(payload.unwrap_or_default(), max_record) {
        Ok(Record::Epoch(leader)) if leader.epoch > 0 => Ok((p, leader)),
        Ok(_) => Err("it is not an epoch record".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// What an announcement of `leader` for partition `p` changes here.
fn apply(shared: &Shared, p: u32, leader: Leader) {
    let (ingress, admin) = (leader.ingress.clone(), leader.admin.clone());
    let node = leader.node.clone();
    let (moved, stop_leading) = lock(&shared.partitions[p as usize]).announce(leader);
    if moved {
        shared.placement.set_leader(p as usize, ingress, admin);
    }
    if stop_leading {
        tracing::warn!(partition = p, node = %node, "another node announced itself the partition's leader; stepping down");
        let _ = shared.leads[p as usize].send(None);
    }
}

fn failed(message: String) -> CodedError {
    CodedError::new(Code::CLU0002, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_name_a_partition_of_the_cluster_and_carry_an_epoch_record() {
        let read = |key: Option<&[u8]>, payload: Option<&[u8]>| announced(key, payload, 4, 1 << 20);
        let leader = Leader {
            epoch: 3,
            incarnation: 9,
            node: "n2".into(),
            ingress: "http://n2:8080".into(),
            admin: "http://n2:9070".into(),
        };
        let payload = Record::Epoch(leader.clone()).encode();
        assert_eq!(read(Some(&key(3)), Some(&payload)), Ok((3, leader)));
        assert!(read(Some(&key(4)), Some(&payload)).is_err());
        assert!(read(Some(b"x"), Some(&payload)).is_err());
        assert!(read(None, Some(&payload)).is_err());
        assert!(read(Some(&key(0)), Some(b"\x01\x09garbage")).is_err());
        assert!(read(Some(&key(0)), None).is_err());
        let zero = Record::Epoch(Leader::default()).encode();
        assert!(read(Some(&key(0)), Some(&zero)).is_err());
    }
}
