//! Leading partitions: the takeover (an epoch record, then the log read up to it) and, while a
//! partition is led here, its log writer: every group of the partition's write sets becomes
//! one record, stored only once Kafka put it right after the leader's previous record.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::FutureRecord;
use tokio::sync::watch;

use super::{Shared, lock};
use crate::errors::{Code, CodedError};
use crate::ids::InvocationId;
use crate::storage::log::{Leader, Position, Record};
use crate::storage::writer::{Staged, WriteSet, Writer};

/// How often the wanted partitions are checked again (a takeover that lost a race retries).
const RECHECK: Duration = Duration::from_secs(1);

/// Keeps this node leading the partitions the group gives it, and only those.
pub(super) async fn reconcile(shared: Arc<Shared>, mut desired: watch::Receiver<BTreeSet<u32>>) {
    // Partitions given here that this node refused to lead (said once per refusal).
    let mut refused = BTreeSet::new();
    loop {
        let wanted = desired.borrow_and_update().clone();
        for p in 0..shared.settings.partitions {
            let mut state = lock(&shared.partitions[p as usize]);
            let want = wanted.contains(&p);
            if let Some(why) = &state.broken {
                if want && refused.insert(p) {
                    tracing::error!(partition = p, error.code = ?why.code, error = %why, "the group gives this node the partition, but it will not lead it: its replica is broken");
                }
                continue;
            }
            if want && state.leading.is_none() && !state.taking_over {
                state.taking_over = true;
                tokio::spawn(take_over(Arc::clone(&shared), p, desired.clone()));
            } else if !want && state.leading.is_some() {
                // Given to another node: stop writing before it takes over.
                let _ = shared.leads[p as usize].send(None);
            }
        }
        tokio::select! {
            changed = desired.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(RECHECK) => {}
        }
    }
}

/// Appends `record` to partition `p` of the log; its offset.
async fn produce(shared: &Shared, p: u32, record: &[u8]) -> Result<i64, CodedError> {
    let sent = shared
        .producer
        .send(
            FutureRecord::<(), [u8]>::to(&shared.settings.log_topic)
                .partition(p as i32)
                .payload(record),
            Duration::from_secs(10),
        )
        .await;
    sent.map(|delivery| delivery.offset).map_err(|(e, _)| {
        CodedError::new(
            Code::CLU0001,
            format!("partition {p}: the log did not take a record: {e}"),
        )
    })
}

/// Takes partition `p` over while the group wants it here.
async fn take_over(shared: Arc<Shared>, p: u32, desired: watch::Receiver<BTreeSet<u32>>) {
    let slot = &shared.partitions[p as usize];
    while desired.borrow().contains(&p) && lock(slot).broken.is_none() {
        let epoch = lock(slot).seen.leader.epoch.saturating_add(1);
        let leader = Leader {
            epoch,
            // The random low bits of a fresh ULID.
            incarnation: InvocationId::new_uuid() as u64,
            node: shared.settings.node.clone(),
            ingress: shared.settings.ingress.clone(),
            admin: shared.settings.admin.clone(),
        };
        let at = match produce(&shared, p, &Record::Epoch(leader.clone()).encode()).await {
            Ok(at) => at,
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "cannot append an epoch record; trying again");
                tokio::time::sleep(RECHECK).await;
                continue;
            }
        };
        // The reader stores everything before the epoch record, and the record itself.
        loop {
            let progress = shared.progress.notified();
            let done = {
                let state = lock(slot);
                state.stored > at || state.broken.is_some()
            };
            if done {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), progress).await;
        }
        let won = {
            let _hand_over = lock(&shared.hand_over);
            let mut state = lock(slot);
            let won =
                state.seen.leader == leader && state.leading.is_none() && state.broken.is_none();
            if won {
                state.leading = Some(leader.incarnation);
                state.taking_over = false;
            }
            won
        };
        if won {
            tracing::info!(partition = p, epoch, offset = at, "took the partition over");
            let (writer, staged) = Writer::staged();
            let _ = shared.leads[p as usize].send(Some(writer));
            shared.placement.set_here(p as usize, true);
            tokio::spawn(lead(Arc::clone(&shared), p, leader, at + 1, staged));
            return;
        }
        tracing::info!(
            partition = p,
            epoch,
            "another node's epoch came first; trying again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lock(slot).taking_over = false;
}

/// Writes partition `p`'s groups to its log, from offset `next`, until it steps down.
async fn lead(shared: Arc<Shared>, p: u32, leader: Leader, mut next: i64, mut staged: Staged) {
    let mut lead = shared.leads[p as usize].subscribe();
    let inbox = {
        let (shared, lead) = (Arc::clone(&shared), lead.clone());
        tokio::task::spawn_blocking(move || {
            super::inbox::deliver(&shared, p, &shared.runtime, &lead);
        })
    };
    let mut stores = tokio::task::JoinSet::new();
    let why = loop {
        let group = tokio::select! {
            group = staged.next_group(shared.settings.max_record / 2) => group,
            _ = lead.wait_for(Option::is_none) => None,
        };
        let Some(group) = group else {
            break "it stepped down".to_owned();
        };
        if group.is_empty() {
            // Nothing for the log; answered in order behind the stores before it.
            stores.spawn(group.store(&shared.writer, WriteSet::default()));
            continue;
        }
        let record = group.record(leader.epoch, leader.incarnation);
        match produce(&shared, p, &record).await {
            Ok(at) if at == next => {
                next += 1;
                let mut position = WriteSet::default();
                Position {
                    next,
                    leader: leader.clone(),
                }
                .save(p, &mut position);
                stores.spawn(group.store(&shared.writer, position));
                while stores.try_join_next().is_some() {}
            }
            Ok(at) => {
                let why = format!(
                    "its record landed at offset {at}, not {next}: another node appended to the log"
                );
                group.fail(&lost(p, &why));
                break why;
            }
            Err(e) => {
                group.fail(&e);
                break e.message;
            }
        }
    };
    tracing::warn!(partition = p, why, "stopped leading the partition");
    shared.placement.set_here(p as usize, false);
    let _ = shared.leads[p as usize].send(None);
    staged.close(&lost(p, &why));
    while stores.join_next().await.is_some() {}
    let _ = inbox.await;
    // The reader takes the partition back from what the store holds.
    lock(&shared.rewinds).push(p);
}

fn lost(p: u32, why: &str) -> CodedError {
    CodedError::new(
        Code::CLU0001,
        format!("partition {p} is no longer led by this node ({why}); retry"),
    )
}
