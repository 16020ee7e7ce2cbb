//! A partition led here, over any [`PartitionLog`]: the sets its partition queued wait in the
//! stage, each group of them becomes one record handed to the log (up to
//! `cluster.records-in-flight` at once, `storage::pipeline`), and a group is stored, and its sets
//! answered, only once the log confirmed its record landed right after the one before.
//!
//! The server runs [`Leading::run`] over a Kafka partition (`sluice-kafka-log`); the partition
//! simulator steps the same type over its simulated broker ([`Leading::send_waiting`],
//! [`Leading::landed`]), so both run this code.

use std::future::Future;

use tokio::task::JoinSet;

use sluice_core::errors::CodedError;
use sluice_store::storage::log::{PartitionLog, confirm};
use sluice_store::storage::pipeline::{Pipeline, Stored, lost};
use sluice_store::storage::writer::{Group, Staged};

/// A partition this node leads: its stage, its records in flight and its log.
pub struct Leading<L> {
    partition: u32,
    pipeline: Pipeline,
    staged: Staged,
    log: L,
    /// Most bytes of writes one group takes (its record stays under the log's maximum).
    max_group: usize,
}

impl<L: PartitionLog> Leading<L> {
    /// Leads `partition`: the sets queued on `staged` go through `pipeline` to `log`, at most
    /// `max_group` bytes of writes per record.
    pub fn new(
        partition: u32,
        pipeline: Pipeline,
        staged: Staged,
        log: L,
        max_group: usize,
    ) -> Self {
        Self {
            partition,
            pipeline,
            staged,
            log,
            max_group,
        }
    }

    /// The log.
    pub fn log(&mut self) -> &mut L {
        &mut self.log
    }

    /// How many records wait for the log's answer.
    pub fn in_flight(&self) -> usize {
        self.pipeline.in_flight()
    }

    /// Hands the log one record per group waiting now, while the pipeline has room (it does
    /// not wait for a set). An error means the log refused one: this node no longer leads.
    pub async fn send_waiting(&mut self) -> Result<(), CodedError> {
        while self.pipeline.has_room() {
            let Some(group) = self.staged.try_group(self.max_group) else {
                break;
            };
            self.send(group).await?;
        }
        Ok(())
    }

    async fn send(&mut self, group: Group) -> Result<(), CodedError> {
        if let Some(record) = self.pipeline.push(group)
            && let Err(e) = self.log.append(&record).await
        {
            self.pipeline.fail_all(&e);
            return Err(e);
        }
        Ok(())
    }

    /// The log's confirmation of the oldest record in flight. An error means this node no
    /// longer leads: every group in flight was answered with it.
    pub fn landed(&mut self, confirmed: Result<u64, CodedError>) -> Result<(), CodedError> {
        let p = self.partition;
        let at = confirmed.and_then(|at| {
            i64::try_from(at).map_err(|_| lost(p, "the log answered a position past i64"))
        });
        self.pipeline.landed(at)
    }

    /// The groups confirmed since the last call, each handed to the local writer in log
    /// order; run them to answer their sets.
    pub fn take_stored(&mut self) -> Vec<Stored> {
        self.pipeline.take_stored()
    }

    /// Writes until `stepped_down` resolves, the stage closes or the log refuses a record;
    /// why it stopped. Confirmed groups are stored on `stores`.
    pub async fn run(
        &mut self,
        stepped_down: impl Future<Output = ()>,
        stores: &mut JoinSet<()>,
    ) -> String {
        let mut stepped_down = std::pin::pin!(stepped_down);
        loop {
            tokio::select! {
                biased;
                () = &mut stepped_down => return "it stepped down".to_owned(),
                landed = confirm(&mut self.log), if self.log.unconfirmed() > 0 => {
                    if let Err(e) = self.landed(landed) {
                        return e.message;
                    }
                }
                group = self.staged.next_group(self.max_group), if self.pipeline.has_room() => {
                    let Some(group) = group else {
                        return "it stepped down".to_owned();
                    };
                    if let Err(e) = self.send(group).await {
                        return e.message;
                    }
                }
            }
            for stored in self.pipeline.take_stored() {
                stores.spawn(stored);
            }
            while stores.try_join_next().is_some() {}
        }
    }

    /// Steps down because of `error`: every group in flight and every set waiting or queued
    /// later is answered with it. The groups confirmed before, to store.
    pub fn step_down(&mut self, error: &CodedError) -> Vec<Stored> {
        self.pipeline.fail_all(error);
        self.staged.close(error);
        self.pipeline.take_stored()
    }
}
