//! Attempt message: one message of a running attempt. Only the current attempt's count, and
//! none after it broke a rule. A message is checked (a promise command's target, in cluster
//! mode its size against a log record's), journaled with what it asks for answered
//! (`journal.rs`), and a promise command then settles or waits on its promise.

use std::sync::Arc;

use super::super::journal::{Reads, journal_message, needs_saved, save};
use super::super::live::Live;
use super::super::model::effect::Effect;
use super::super::model::phase::Journaled;
use super::super::parts::dormant::HeldMemory;
use super::super::task::Partition;
use super::super::workflow_promises as promises;
use sluice_config::WorkerConfig;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_protocol::Message;
use sluice_store::storage::writer::WriteSet;

/// CLU0005: a message of `len` bytes from a deployment, over the `limit` a log record allows.
pub(in super::super) fn too_large_for_a_record(len: usize, limit: usize) -> CodedError {
    CodedError::new(
        Code::CLU0005,
        format!(
            "the handler sent a value of {len} bytes; in cluster mode one value may be at most {limit} bytes ({})",
            sluice_config::RECORD_VALUE_RULE
        ),
    )
}

/// Counts a message of `len` bytes into its running attempt's journal: JNL0001 when it would
/// take the invocation's journal past `worker.max-journal-entries` or `max-journal-bytes`, or
/// the running attempts' journals past `worker.running-journals-budget`.
fn journal_room(
    live: &mut Live,
    held: &Arc<HeldMemory>,
    worker: &WorkerConfig,
    len: usize,
) -> Result<(), CodedError> {
    let entries = u64::try_from(live.journal.len())
        .unwrap_or(u64::MAX)
        .saturating_add(u64::from(live.rested));
    if entries >= u64::from(worker.max_journal_entries) {
        return Err(CodedError::new(
            Code::JNL0001,
            format!(
                "the journal holds {entries} entries, the most worker.max-journal-entries allows"
            ),
        ));
    }
    // The journal's bytes are summed once per attempt, at its first message.
    let summed = match live.attempt_mut().and_then(|r| r.journaled.as_ref()) {
        Some(_) => 0,
        None => live.journal.iter().map(|f| f.payload.len() as u64).sum(),
    };
    let Some(running) = live.attempt_mut() else {
        return Ok(());
    };
    let journaled = running
        .journaled
        .get_or_insert_with(|| Journaled::new(summed, Arc::clone(held)));
    let len = u64::try_from(len).unwrap_or(u64::MAX);
    let max = worker.max_journal_bytes.0;
    if journaled.bytes.saturating_add(len) > max {
        return Err(CodedError::new(
            Code::JNL0001,
            format!(
                "the journal holds {} bytes; a message of {len} more would go past worker.max-journal-bytes ({max})",
                journaled.bytes
            ),
        ));
    }
    if !journaled.add(len) {
        return Err(CodedError::new(
            Code::JNL0001,
            format!(
                "running attempts' journals hold {} bytes; a message of {len} more would go past worker.running-journals-budget ({})",
                held.running_journal_bytes(),
                worker.running_journals_budget.0
            ),
        ));
    }
    Ok(())
}

impl Partition {
    /// The deployment answered attempt `attempt` of `id`: its paced drain counts it as a
    /// success once, now.
    pub(in super::super) fn attempt_answered(&mut self, id: InvocationId, attempt: u32) {
        let now = self.outside.driver.now_ms();
        let Some(running) = self.live.get_mut(&id).and_then(|l| l.current(attempt)) else {
            return;
        };
        if running.answered {
            return;
        }
        running.answered = true;
        self.admission.scheduler.report(
            &running.permit,
            sluice_flow::pacing::Signal::Answered,
            now,
        );
    }

    pub(in super::super) fn attempt_message(
        &mut self,
        id: InvocationId,
        attempt: u32,
        message: Message,
        ack: bool,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let promise = promises::is_promise_command(&message).then(|| message.clone());
        let checked = match (&promise, self.live.get(&id)) {
            (Some(_), Some(live)) => self.check_promise_target(&live.record().target),
            _ => Ok(()),
        };
        if let Some(live) = self.live.get_mut(&id)
            && live.current(attempt).is_some()
        {
            // Cluster mode: a value no log record can hold fails the invocation
            // (CLU0005), never the partition's next write.
            let checked = checked.and_then(|()| match self.outside.config.record_value_limit() {
                Some(limit) => match message.encoded_len() {
                    len if len > limit => Err(too_large_for_a_record(len, limit)),
                    _ => Ok(()),
                },
                None => Ok(()),
            });
            let checked = checked.and_then(|()| {
                journal_room(
                    live,
                    self.resting.held(),
                    &self.outside.config.worker,
                    message.encoded_len(),
                )
            });
            if let Err(e) = checked {
                live.violate(e);
                return Ok(());
            }
            if live.unsaved && needs_saved(&message, ack) {
                save(live, writes)?;
            }
            let reads = Reads {
                store: &self.outside.store,
                registry: &self.outside.registry,
                inherit_scope: self.outside.config.flow.inherit_scope,
                now: self.outside.driver.now_ms(),
            };
            journal_message(&reads, live, writes, message, ack, effects)?;
            if let Some(promise) = promise {
                self.promise_command(id, &promise, writes, effects)?;
            }
        }
        Ok(())
    }
}
